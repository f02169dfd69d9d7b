"""Coding agents through the front door, as they really call: Codex CLI (Responses, with its
built-in web_search tool), Claude Code (Messages, its words wrapped in <system-reminder> blocks,
its own default model names, its side calls for a title and its quota), and Ollama as it is (`ollama stop`, model names, zero durations,
/api/status, OLLAMA_ORIGINS, host names), against the real daemon and simulated nodes.

The request shapes are the ones Codex CLI 0.171.0 and Claude Code 2.1.197 sent to this front
door (captured from their own runs, trimmed); where the CLIs are installed (`make agent-clis`,
or GPUQ_CODEX / GPUQ_CLAUDE naming their binaries), they run against it themselves (Claude
Code also in a terminal, a pty, where it makes its title side call)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import signal
import time
import tomllib
from pathlib import Path

import anthropic
import ollama
import openai
import pytest
import tomli_w
from conftest import eventually, free_port, node_table
from playwright.async_api import expect
from test_front import CHAT_MODEL, FrontLab
from test_page import browser, open_queue, page  # noqa: F401 (the page tests' fixtures)
from test_warm_models import MODEL, warm_lab

from gpuq.access.hosts import front_checks_host
from gpuq.config import NodeConfig, Settings, UserConfig
from gpuq.node.calls import CLIENT_LEFT

# -- the agents' own request shapes ------------------------------------------------------------

# Codex CLI 0.171.0 (`codex exec "say hi"`), its /v1/responses body trimmed: its instructions,
# its developer and environment messages, its function tools, and the built-in web_search tool.
CODEX_BODY = {
    "instructions": "You are a coding agent running in the Codex CLI, a terminal-based coding assistant.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>…"}]},
        {
            "type": "message",
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "<environment_context>\n  <cwd>/tmp/work</cwd>\n  <shell>bash</shell>\n</environment_context>",
                }
            ],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "say hi"}]},
    ],
    "tools": [
        {
            "type": "function",
            "name": "exec_command",
            "description": "Runs a command in a PTY",
            "strict": False,
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
        {"type": "web_search", "external_web_access": False},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "reasoning": {"summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "01a23c5b-d657-7491-8912-91eb774d5b5a",
}

REMINDER = (
    "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
    "# currentDate\nToday's date is 2026-12-03.\n</system-reminder>\n"
)


def claude_code_body(model: str, *messages: dict) -> dict:
    """Claude Code 2.1.197's /v1/messages body (`claude -p "say hi"`), trimmed: its tools (client
    tools, no type), thinking and effort, and its messages."""
    return {
        "model": model,
        "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}],
        "messages": list(messages),
        "tools": [
            {
                "name": "Read",
                "description": "Reads a file",
                "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
            },
            # Its WebSearch tool's side call declares Anthropic's server tool.
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
        ],
        "metadata": {"user_id": '{"session_id":"1593ca29-a228-4b1f-845a-a1be9d815bef"}'},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "high"},
        "stream": True,
    }


# Claude Code 2.1.197's side call for the session's title (its `generate_session_title`, made
# beside an interactive turn of 10 characters or more), as it reached this front door from
# `claude` in a terminal, "say hi to the whole team" typed: no tools, no thinking, a system prompt
# asking for a title (trimmed here), a JSON schema of one "title" field.
CLAUDE_TITLE_BODY = {
    "model": "claude-opus-4-8",
    "messages": [
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "<session>\nsay hi to the whole team\n</session>\n\nWrite the title in the language the"
                    " user wrote in, regardless of the language of the examples above.",
                }
            ],
        }
    ],
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.78a; cc_entrypoint=cli;"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
        {
            "type": "text",
            "text": "Generate a concise, sentence-case title (3-7 words) that captures the main topic or goal of"
            ' this coding session. […] Return JSON with a single "title" field.',
        },
    ],
    "tools": [],
    "metadata": {"user_id": '{"device_id":"be24","account_uuid":"","session_id":"b0a1aa6d"}'},
    "max_tokens": 64000,
    "thinking": {"type": "disabled"},
    "output_config": {
        "effort": "high",
        "format": {
            "type": "json_schema",
            "schema": {
                "type": "object",
                "properties": {"title": {"type": "string"}},
                "required": ["title"],
                "additionalProperties": False,
            },
        },
    },
    "stream": True,
}
# Its quota probe (`quota_check` in its source, made at start for a subscriber): one word, one token.
CLAUDE_QUOTA_BODY = {"model": "claude-haiku-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}
CLAUDE_UA = "claude-cli/2.1.197 (external, cli)"

SAY_HI = {"role": "user", "content": [{"type": "text", "text": REMINDER}, {"type": "text", "text": "say hi"}]}


async def claude_turn(client: anthropic.AsyncAnthropic, body: dict) -> anthropic.types.Message:
    """One request as Claude Code makes it: streamed."""
    async with client.messages.stream(**{k: v for k, v in body.items() if k != "stream"}) as stream:
        return await stream.get_final_message()


def anthropic_client(lab: FrontLab) -> anthropic.AsyncAnthropic:
    lab.clients.append(anthropic.AsyncAnthropic(base_url=lab.url, api_key="unused", max_retries=0))
    return lab.clients[-1]


async def job_of(lab: FrontLab, response_id: str) -> dict:
    return await lab.daemon.job(response_id.split("_", 1)[1])


@pytest.fixture
async def lab(fakes, daemon_factory):
    made = await warm_lab(fakes, daemon_factory, front={"model_aliases": {"claude-*": MODEL, "gpt-5*": MODEL}})
    yield made
    await made.close()


# -- agents ---------------------------------------------------------------------------------------


async def test_a_codex_turn_with_web_search_runs_and_is_titled_with_the_persons_words(lab):
    """Codex sends the built-in web_search tool with every turn: the turn runs (the model is not
    offered a tool no server here runs), and the job's title is "say hi", not Codex's
    environment message."""
    client = lab.openai()
    stream = await client.responses.create(model=MODEL, **CODEX_BODY)
    events = [e async for e in stream]
    assert events[-1].type == "response.completed" and events[-1].response.output_text.strip()
    # the client's declaration is echoed, as Ollama echoes it
    assert [t.type for t in events[-1].response.tools] == ["function", "web_search"]
    sent = [r for r in lab.fakes["node-1"].requests if r.get("messages")][-1]
    assert [t["function"]["name"] for t in sent["tools"]] == ["exec_command"]
    job = await job_of(lab, events[-1].response.id)
    assert job["prompt_excerpt"] == "say hi" and job["api"] == "openai"


async def test_claude_codes_turns_are_titled_with_the_persons_words_and_badged_anthropic(lab):
    client = anthropic_client(lab)
    first = await claude_turn(client, claude_code_body(MODEL, SAY_HI))
    assert first.content and first.stop_reason == "end_turn"
    job = await job_of(lab, first.id)
    assert (job["prompt_excerpt"], job["api"], job["endpoint"]) == ("say hi", "anthropic", "/v1/messages")
    sent = [r for r in lab.fakes["node-1"].requests if r.get("messages")][-1]
    assert [t["function"]["name"] for t in sent["tools"]] == ["Read"]  # web_search_20250305 left out
    # The next request of the turn ends with a tool result (a user turn): still "say hi".
    follow = claude_code_body(
        MODEL,
        SAY_HI,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a"}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "file text"},
                {"type": "text", "text": REMINDER},
            ],
        },
    )
    second = await claude_turn(client, follow)
    job = await job_of(lab, second.id)
    assert job["prompt_excerpt"] == "say hi"
    # The queue's and the history's listings carry the same title and API.
    listed = {j["id"]: j for j in await lab.jobs()}
    assert (listed[job["id"]]["prompt_excerpt"], listed[job["id"]]["api"]) == ("say hi", "anthropic")


async def test_claude_codes_side_calls_are_jobs_titled_as_side_calls_with_its_client(lab):
    """Beside a turn, Claude Code asks for the session's title (and, for a subscriber, probes its
    quota): each is a job, its title says it is a side call and what about, its client is
    Claude Code's own User-Agent; the turn itself is titled with the person's words."""
    lab.clients.append(
        anthropic.AsyncAnthropic(
            base_url=lab.url, api_key="unused", max_retries=0, default_headers={"User-Agent": CLAUDE_UA}
        )
    )
    client = lab.clients[-1]
    turn = await claude_turn(client, claude_code_body(MODEL, SAY_HI))
    title = await claude_turn(client, CLAUDE_TITLE_BODY)
    quota = await client.messages.create(**CLAUDE_QUOTA_BODY)
    assert title.content and quota.id
    jobs = {name: await job_of(lab, reply.id) for name, reply in (("turn", turn), ("title", title), ("quota", quota))}
    assert {name: job["prompt_excerpt"] for name, job in jobs.items()} == {
        "turn": "say hi",
        "title": "side call (title): say hi to the whole team",
        "quota": "side call (quota probe)",
    }
    assert all(job["client"] == CLAUDE_UA and job["api"] == "anthropic" for job in jobs.values())
    listed = {j["id"]: j for j in await lab.jobs()}  # the queue and the history show the same
    assert listed[jobs["title"]["id"]]["prompt_excerpt"] == "side call (title): say hi to the whole team"
    shown = await lab.daemon.cli("show", jobs["title"]["id"])
    assert "side call (title): say hi to the whole team" in shown.out and CLAUDE_UA in shown.out, shown.out


async def test_claude_codes_default_model_runs_as_the_aliased_lab_model(lab):
    """Without --model Claude Code asks for its own default (claude-opus-4-8): [front]
    model_aliases gives it the lab's model; the job runs that model and keeps the name asked."""
    client = anthropic_client(lab)
    reply = await claude_turn(client, claude_code_body("claude-opus-4-8", SAY_HI))
    job = await job_of(lab, reply.id)
    assert job["model"] == MODEL and job["request"]["body"]["model"] == "claude-opus-4-8"
    assert [r for r in lab.fakes["node-1"].requests if r.get("messages")][-1]["model"] == MODEL
    # OpenAI's names too ("gpt-5*"), and a name no pattern matches is still Ollama's 404
    chat = await lab.openai().chat.completions.create(model="gpt-5.2", messages=[{"role": "user", "content": "hi"}])
    assert chat.choices[0].message.content
    with pytest.raises(ollama.ResponseError) as missing:
        await lab.ollama().chat(model="mistral:7b", messages=[{"role": "user", "content": "hi"}])
    assert (missing.value.status_code, missing.value.error) == (404, "model 'mistral:7b' not found")


async def test_an_alias_to_a_model_no_node_has_says_so(fakes, daemon_factory):
    lab = await warm_lab(fakes, daemon_factory, front={"model_aliases": {"claude-*": "qwen9:99b"}})
    try:
        with pytest.raises(anthropic.NotFoundError) as exc:
            await anthropic_client(lab).messages.create(
                model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
            )
        message = exc.value.body["error"]["message"]
        assert "model 'qwen9:99b' not found" in message and "asked as 'claude-sonnet-4-5'" in message, message
    finally:
        await lab.close()


async def test_a_reload_changes_the_aliases_at_once(lab):
    client = anthropic_client(lab)
    first = await claude_turn(client, claude_code_body("claude-opus-4-8", SAY_HI))
    assert (await job_of(lab, first.id))["model"] == MODEL
    config = tomllib.loads(lab.daemon.config.read_text())
    config["front"]["model_aliases"] = {"claude-*": "llama3.2"}
    lab.daemon.config.write_text(tomli_w.dumps(config))
    res = await lab.daemon.cli("reload")
    assert res.code == 0, res.err
    second = await claude_turn(client, claude_code_body("claude-opus-4-8", SAY_HI))
    assert (await job_of(lab, second.id))["model"] == "llama3.2"


# -- Ollama as it is ------------------------------------------------------------------------------


async def node_1(lab: FrontLab) -> dict:
    return next(n for n in (await lab.daemon.get("/api/nodes"))["nodes"] if n["name"] == "node-1")


async def front_ps(lab: FrontLab) -> list[str]:
    return [m["model"] for m in (await lab.ollama().ps()).models]


@pytest.mark.parametrize("zero", [0, "0", "-0", "0.0s", "0m0s"])
async def test_ollama_stop_unloads_a_warm_model_verified_and_shown(lab, zero):
    """`ollama stop` (generate with keep_alive 0 and no prompt; Open WebUI's unload too) ends a
    model a call keeps warm: it leaves the node (its /api/ps), and the node says who asked."""
    await lab.ollama().chat(model=MODEL, messages=[{"role": "user", "content": "keep it"}], keep_alive="10m")
    await eventually(lambda: _warm(lab), 10, what="the model to be kept warm")
    assert MODEL in await front_ps(lab)
    reply = await lab.ollama().generate(model=MODEL, keep_alive=zero)
    assert (reply.done, reply.done_reason) == (True, "unload")

    async def gone():
        return MODEL not in await front_ps(lab)

    await eventually(gone, 10, what="the model to leave /api/ps")
    node = await eventually(lambda: _unloaded(lab), 10, what="the node to record the unload")
    assert node["warm"] is None
    record = node["asked_unload"]
    assert record["model"] == MODEL and record["verified"] is True and "ollama 127.0.0.1" in record["by"]


async def test_ollama_stop_during_a_job_of_its_model_unloads_it_as_that_job_ends(lab):
    """`ollama stop` while the node runs a job of that model: the job runs to its end (its
    answer whole), then the model leaves, whatever keep_alive the job asked (Ollama's
    sched.go expireRunner), verified by /api/ps and recorded on the node and in the job's events."""
    fake = lab.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.05, 40
    call = asyncio.create_task(
        lab.ollama().chat(model=MODEL, messages=[{"role": "user", "content": "long one"}], keep_alive="10m")
    )
    running = await lab.job_with("long one", "running")
    reply = await lab.ollama().generate(model=MODEL, keep_alive=0)  # ollama stop, mid-job
    assert (reply.done, reply.done_reason) == (True, "unload")
    assert (await lab.daemon.job(running["id"]))["state"] == "running"  # not cut short
    fake.script.token_delay_s = 0.0
    answer = await call
    assert answer.done and len(answer.message.content) > 0

    async def gone():
        return MODEL not in await front_ps(lab)

    await eventually(gone, 10, what="the model to leave /api/ps after the job")
    node = await eventually(lambda: _unloaded(lab), 10, what="the node to record the unload")
    assert node["warm"] is None  # its keep_alive of 10m is not kept
    record = node["asked_unload"]
    assert record["model"] == MODEL and record["verified"] is True and "ollama 127.0.0.1" in record["by"]
    await lab.job_with("long one", "done")  # its finish is written after the unload
    job = await lab.daemon.job(running["id"])
    notes = [e["reason"] or "" for e in job["events"]]
    assert any(n.startswith(f"unloaded {MODEL} after this job as ollama 127.0.0.1") for n in notes), notes
    # the next call loads it again, and is kept warm as it asks
    await lab.ollama().chat(model=MODEL, messages=[{"role": "user", "content": "again"}], keep_alive="10m")
    await eventually(lambda: _warm(lab), 10, what="the next call's model to be kept warm")


async def test_an_asked_unload_is_shown_by_gpuq_nodes_and_kept_across_a_restart(lab):
    await lab.ollama().chat(model=MODEL, messages=[{"role": "user", "content": "keep it"}], keep_alive="10m")
    await eventually(lambda: _warm(lab), 10, what="the model to be kept warm")
    await lab.ollama().generate(model=MODEL, keep_alive=0)  # ollama stop
    record = (await eventually(lambda: _unloaded(lab), 10, what="the node to record the unload"))["asked_unload"]
    listed = await lab.daemon.cli("nodes")
    assert listed.code == 0, listed.err
    line = next(x for x in listed.out.splitlines() if "last asked unload" in x)
    assert f"last asked unload: {MODEL} at " in line and "by ollama 127.0.0.1" in line and "gone from /api/ps" in line
    await lab.daemon.kill(signal.SIGTERM)
    await lab.daemon.start()
    node = await eventually(lambda: _unloaded(lab), 10, what="the restarted router to show the unload")
    assert node["asked_unload"] == record
    again = await lab.daemon.cli("nodes")
    assert line in again.out.splitlines(), again.out


async def _warm(lab: FrontLab):
    return (await node_1(lab))["warm"]


async def _unloaded(lab: FrontLab):
    node = await node_1(lab)
    return node if node["asked_unload"] else None


async def test_an_unload_of_a_model_not_held_warm_answers_as_ollama_and_touches_nothing(lab):
    reply = await lab.ollama().chat(model="llama3.2", messages=[], keep_alive=0)
    assert reply.done_reason == "unload"
    assert (await node_1(lab))["asked_unload"] is None
    with pytest.raises(ollama.ResponseError) as exc:
        await lab.ollama().generate(model="nope:1b", keep_alive=0)
    assert exc.value.status_code == 404


async def test_model_names_as_ollama_parses_them(lab):
    client = lab.ollama()
    reply = await client.chat(model=f"{MODEL}:local", messages=[{"role": "user", "content": "local one"}])
    assert reply.message.content
    job = await lab.job_with("local one", "done")
    assert job["model"] == MODEL
    assert (await client.show(f"{MODEL}:local")).capabilities  # /api/show reads names so too
    with pytest.raises(ollama.ResponseError) as shown:
        await client.show("gpt-oss:20b-cloud")
    assert shown.value.status_code == 403
    for name in ("gpt-oss:20b-cloud", "kimi-k2:cloud"):
        with pytest.raises(ollama.ResponseError) as cloud:
            await client.chat(model=name, messages=[{"role": "user", "content": "hi"}])
        assert cloud.value.status_code == 403
        assert cloud.value.error.startswith("ollama cloud is disabled: remote model is unavailable")
        assert name in cloud.value.error and "ollama.com" in cloud.value.error
    for name in ("bad name", "a:b:c", "x/y/z/w"):
        with pytest.raises(ollama.ResponseError) as bad:
            await client.generate(model=name, prompt="hi")
        assert (bad.value.status_code, bad.value.error) == (400, "invalid model name")
    with pytest.raises(openai.BadRequestError) as both:
        await lab.openai().chat.completions.create(model="m:local:cloud", messages=[{"role": "user", "content": "x"}])
    assert 'use either :local or :cloud, not both: "m:local:cloud"' in both.value.message
    assert not [j for j in await lab.jobs() if j["prompt_excerpt"] == "hi"]  # refused before any job


async def test_think_on_a_model_that_cannot_and_chat_on_an_embedding_model_are_refused_first(fakes, daemon_factory):
    lab = await warm_lab(fakes, daemon_factory)
    fake = lab.fakes["node-1"]
    fake.capabilities["llama3.2:latest"] = ("completion", "tools")
    fake.capabilities["qwen3:8b"] = ("embedding",)

    async def known():  # the router reads the capabilities from the node's /api/tags, each health check
        async with lab.daemon.session.get(lab.url + "/api/tags") as resp:
            models = (await resp.json())["models"]
        return {m["model"]: m.get("capabilities") for m in models} == {
            MODEL: ["embedding"],
            "llama3.2:latest": ["completion", "tools"],
        }

    try:
        await eventually(known, 10, what="the new capabilities to be known")
        with pytest.raises(ollama.ResponseError) as think:
            await lab.ollama().chat(model="llama3.2", think=True, messages=[{"role": "user", "content": "x"}])
        assert (think.value.status_code, think.value.error) == (400, '"llama3.2" does not support thinking')
        with pytest.raises(ollama.ResponseError) as chat:
            await lab.ollama().chat(model=MODEL, messages=[{"role": "user", "content": "x"}])
        assert (chat.value.status_code, chat.value.error) == (400, f'"{MODEL}" does not support chat')
        assert not [r for r in fake.requests if r.get("messages")] and not await lab.jobs()
    finally:
        await lab.close()


async def test_api_status_is_a_local_server_without_cloud(lab):
    async with lab.daemon.session.get(lab.url + "/api/status") as resp:
        assert resp.status == 200
        assert await resp.json() == {"cloud": {"disabled": True, "source": "config"}}


async def test_ollama_origins_is_read_beside_front_origins(fakes, daemon_factory):
    node = await fakes(CHAT_MODEL)
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", node, 1, ["task"], CHAT_MODEL)],
        ollama_listen=f"127.0.0.1:{port}",
        env={"OLLAMA_ORIGINS": "'https://chat.example.com,chrome-extension://*'"},
    )
    url = f"http://127.0.0.1:{port}/api/tags"
    for origin, status in (
        ("https://chat.example.com", 204),
        ("chrome-extension://abcdef", 204),
        ("https://evil.example.net", 403),
    ):
        headers = {"Origin": origin, "Access-Control-Request-Method": "GET"}
        async with daemon.session.options(url, headers=headers) as resp:
            assert resp.status == status, (origin, resp.status, await resp.text())
            if status == 204:
                assert resp.headers["Access-Control-Allow-Origin"] == origin


async def test_the_front_doors_421_says_when_names_are_checked(lab):
    async with lab.daemon.session.get(lab.url + "/api/tags", headers={"Host": "gpuq:11435"}) as resp:
        assert resp.status == 421
        message = (await resp.json())["error"]
    assert "host 'gpuq'" in message and "router.allowed_hosts" in message
    assert "listens on loopback or where no token guards it" in message


def test_host_names_are_checked_on_loopback_or_where_no_token_guards_the_front_door():
    node = NodeConfig(name="n", url="http://127.0.0.1:11434", rank=1, model="m", roles=("task",))

    def settings(listen: str, **kw) -> Settings:
        return Settings(nodes=(node,), ollama_listen=listen, **kw)

    user = UserConfig(name="ann", token="t0ken", role="member")
    assert front_checks_host(settings("127.0.0.1:11435", token="s3cret"))  # loopback: as Ollama
    assert front_checks_host(settings("[::1]:11435", users=(user,)))
    assert front_checks_host(settings("0.0.0.0:11435"))  # no token: a rebinding page could drive it
    assert front_checks_host(settings("0.0.0.0:11435", token="s3cret", identity="tailscale"))
    assert not front_checks_host(settings("0.0.0.0:11435", token="s3cret"))  # as Ollama: any name
    assert not front_checks_host(settings("192.168.1.20:11435", users=(user,)))


@pytest.mark.browser
async def test_the_page_badges_a_messages_call_anthropic_and_shows_an_asked_unload(lab, page):
    lab.daemon.fakes = lab.fakes
    await open_queue(page, lab.daemon)
    fake = lab.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.05, 200
    call = asyncio.create_task(claude_turn(anthropic_client(lab), claude_code_body(MODEL, SAY_HI)))
    card = page.locator('.col[data-node="node-1"] .card.running')
    await expect(card.locator(".badge.via")).to_have_text("anthropic")
    await expect(card).to_contain_text("say hi")
    fake.script.token_delay_s = 0.0
    await call
    await expect(page.locator('.col[data-node="node-1"] .col-warm')).to_have_count(1)
    await lab.ollama().generate(model=MODEL, keep_alive=0)  # ollama stop
    line = page.locator('.col[data-node="node-1"] .col-unloaded')
    await expect(line).to_contain_text(f"unloaded {MODEL} at ")
    await expect(line).to_contain_text("gone from /api/ps")
    await expect(page.locator('.col[data-node="node-1"] .col-warm')).to_have_count(0)


@pytest.mark.browser
async def test_the_page_shows_the_last_asked_unload_after_a_restart(lab, page):
    await lab.ollama().chat(model=MODEL, messages=[{"role": "user", "content": "keep it"}], keep_alive="10m")
    await eventually(lambda: _warm(lab), 10, what="the model to be kept warm")
    await lab.ollama().generate(model=MODEL, keep_alive=0)  # ollama stop
    await eventually(lambda: _unloaded(lab), 10, what="the node to record the unload")
    await lab.daemon.kill(signal.SIGTERM)
    await lab.daemon.start()
    await open_queue(page, lab.daemon)
    line = page.locator('.col[data-node="node-1"] .col-unloaded')
    await expect(line).to_contain_text(f"unloaded {MODEL} at ")
    await expect(line).to_contain_text("gone from /api/ps")


# -- the real CLIs, where installed ---------------------------------------------------------------

AGENTS = Path(__file__).resolve().parent.parent / ".agents" / "node_modules" / ".bin"


def agent_cli(name: str, env: str) -> str | None:
    given = os.environ.get(env)
    if given:
        return given
    local = AGENTS / name  # the versions make agent-clis pins: another on PATH may ask or draw otherwise
    return str(local) if local.exists() else None


async def run_cli(argv: list[str], env: dict, cwd: Path, timeout: float = 120.0) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace")


async def test_codex_exec_runs_a_turn_through_the_front_door(lab, tmp_path):
    codex = agent_cli("codex", "GPUQ_CODEX")
    if codex is None:
        pytest.skip("Codex CLI not installed (make agent-clis, or GPUQ_CODEX=<its binary>)")
    home = tmp_path / "codex-home"
    home.mkdir()
    provider = f'{{name="gpuq",base_url="{lab.url}/v1",wire_api="responses",env_key="GPUQ_TEST_KEY"}}'
    started = time.time()
    code, out = await run_cli(
        [codex, "exec", "--skip-git-repo-check", "-c", "model_provider=gpuq", "-c", f"model_providers.gpuq={provider}"]
        + ["-m", MODEL, "say hi"],
        {"CODEX_HOME": str(home), "GPUQ_TEST_KEY": "unused"},
        tmp_path,
    )
    assert code == 0, out[-2000:]
    jobs = [j for j in await lab.jobs() if j.get("endpoint") == "/v1/responses"]
    assert jobs and all(j["state"] == "done" and j["prompt_excerpt"] == "say hi" for j in jobs), jobs
    body = (await lab.daemon.job(jobs[0]["id"]))["request"]["body"]
    assert any(t.get("type") == "web_search" for t in body["tools"])  # sent, and the turn ran
    assert time.time() - started < 120


async def test_claude_code_runs_a_turn_with_its_default_model_through_the_alias(lab, tmp_path):
    claude = agent_cli("claude", "GPUQ_CLAUDE")
    if claude is None:
        pytest.skip("Claude Code not installed (make agent-clis, or GPUQ_CLAUDE=<its binary>)")
    code, out = await run_cli(
        [claude, "-p", "say hi"],
        {
            "HOME": str(tmp_path),
            "ANTHROPIC_BASE_URL": lab.url,
            "ANTHROPIC_API_KEY": "unused",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        tmp_path,
    )
    assert code == 0, out[-2000:]

    async def all_ended():  # a side call Claude Code left as it exited ends a moment later
        jobs = [j for j in await lab.jobs() if j.get("endpoint") == "/v1/messages"]
        return jobs if jobs and all(j["state"] not in ("queued", "running") for j in jobs) else None

    jobs = await eventually(all_ended, 20, 0.05, "Claude Code's calls to end")
    assert "done" in [j["state"] for j in jobs if j["prompt_excerpt"] == "say hi"], jobs
    assert all(j["client"].startswith("claude-cli/") for j in jobs), jobs
    assert all(j["api"] == "anthropic" and j["model"] == MODEL for j in jobs), jobs
    assert all(j["state"] == "done" or j["error"] == CLIENT_LEFT for j in jobs), jobs  # dropped as it exited


async def test_claude_codes_title_side_call_from_its_terminal_is_a_side_call_job(lab, tmp_path):
    """Claude Code in a terminal (a pty), a turn typed: beside it, its side call for the
    session's title reaches the front door and its job says so (the shape CLAUDE_TITLE_BODY)."""
    claude = agent_cli("claude", "GPUQ_CLAUDE")
    if claude is None:
        pytest.skip("Claude Code not installed (make agent-clis, or GPUQ_CLAUDE=<its binary>)")
    key = "sk-ant-gpuq-test-0123456789abcdef"  # approved below, so it asks nothing at start
    (tmp_path / ".claude.json").write_text(
        json.dumps(
            {
                "hasCompletedOnboarding": True,
                "theme": "dark",
                "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
                "projects": {str(tmp_path): {"hasTrustDialogAccepted": True, "hasCompletedProjectOnboarding": True}},
            }
        )
    )
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "ANTHROPIC_BASE_URL": lab.url,
        "ANTHROPIC_API_KEY": key,
        "DISABLE_AUTOUPDATER": "1",
        "TERM": "xterm",
    }
    leader, follower = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        claude, stdin=follower, stdout=follower, stderr=follower, cwd=tmp_path, env=env
    )
    os.close(follower)
    os.set_blocking(leader, False)
    screen = bytearray()

    async def shows(text: str) -> bool:
        try:
            while chunk := os.read(leader, 65536):
                screen.extend(chunk)
        except (BlockingIOError, OSError):
            pass
        plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]|\s", "", screen.decode(errors="replace"))
        return text in plain

    async def side_call():
        jobs = [j for j in await lab.jobs() if j["prompt_excerpt"].startswith("side call (title)")]
        return jobs[0] if jobs else None

    try:
        await eventually(lambda: shows("forshortcuts"), 60, what="Claude Code's prompt")
        os.write(leader, b"say hi to the whole team")
        await eventually(lambda: shows("sayhitothewholeteam"), 10, what="the typed words on its prompt")
        os.write(leader, b"\r")
        job = await eventually(side_call, 90, what="Claude Code's title side call")
        turn = await lab.job_with("say hi to the whole team")  # the turn itself (it may come second)
    finally:
        proc.kill()
        await proc.wait()
        os.close(leader)
    assert job["prompt_excerpt"] == "side call (title): say hi to the whole team"
    assert job["client"].startswith("claude-cli/") and job["api"] == "anthropic"
    assert turn["client"] == job["client"] and turn["id"] != job["id"]
