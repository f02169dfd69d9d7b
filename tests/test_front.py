"""The front door with the real clients: the official `ollama` and `openai` Python SDKs, pointed
at the real daemon's second listener (router.ollama_listen), with simulated Ollama nodes on
loopback behind it. Every call is a job: queued, visible, deletable."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sqlite3
from collections.abc import Awaitable, Callable

import aiohttp
import ollama
import openai
import pytest
from conftest import eventually, free_port, node_table

CHAT_MODEL = "qwen3-coder:30b"
EMBED_MODEL = "nomic-embed-text:latest"


class FrontLab:
    def __init__(self, daemon, url: str, fakes: dict):
        self.daemon = daemon
        self.url = url
        self.fakes = fakes
        self.clients: list = []

    def ollama(self, **kwargs) -> ollama.AsyncClient:
        self.clients.append(ollama.AsyncClient(host=self.url, **kwargs))
        return self.clients[-1]

    def openai(self, api_key: str = "unused", **kwargs) -> openai.AsyncOpenAI:
        self.clients.append(openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kwargs))
        return self.clients[-1]

    async def models_ready(self) -> bool:
        async with self.daemon.session.get(self.url + "/api/tags") as resp:
            return resp.status == 200 and bool((await resp.json())["models"])

    async def hold_node_1(self, prompt: str) -> asyncio.Task:
        """A slow call that holds node-1 (400 tokens, 50 ms each); calls after it wait in its queue."""
        fake = self.fakes["node-1"]
        fake.script.token_delay_s, fake.script.tokens = 0.05, 400
        call = asyncio.create_task(self.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": prompt}]))
        # Its job running, not merely a request in flight (an aborted one may linger at the fake).
        await self.job_with(prompt, "running")
        return call

    async def delete_mid_stream(
        self, prompt: str, read: Callable[[list], Awaitable[None]], enough: Callable[[list], bool]
    ) -> tuple[dict, BaseException, list]:
        """A client streams a slow reply to `prompt` (`read(got)` appends what it receives); its
        job is deleted once `enough(got)`. Returns the job, what `read` raised and what it got."""
        fake = self.fakes["node-1"]
        fake.script.token_delay_s, fake.script.tokens = 0.05, 400
        got: list = []
        reading = asyncio.create_task(read(got))
        job = await self.job_with(prompt, "running")
        await eventually(lambda: enough(got), what="part of the reply to reach the client")
        assert (await self.daemon.cli("delete", job["id"])).code == 0
        with pytest.raises(Exception) as exc:
            await reading
        return job, exc.value, got

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    async def jobs(self) -> list[dict]:
        return (await self.daemon.get("/api/jobs?limit=1000"))["jobs"]

    async def job_with(self, prompt: str, *states: str) -> dict:
        async def found():
            for job in await self.jobs():
                if job["prompt_excerpt"] == prompt and (not states or job["state"] in states):
                    return job
            return None

        return await eventually(found, 15, what=f"a job with prompt {prompt!r} in {states or 'any state'}")


async def start_front_lab(fakes, daemon_factory, **router) -> FrontLab:
    chat = await fakes(CHAT_MODEL)
    critique = await fakes("deepseek-r1:32b")
    other = await fakes("llama3.2:latest", EMBED_MODEL)
    port = free_port()
    daemon = await daemon_factory(
        [
            node_table("node-1", chat, 1, ["task", "critique"], CHAT_MODEL),
            node_table("node-2", critique, 2, ["critique"], "deepseek-r1:32b"),
            node_table("node-3", other, 3, ["task"], "llama3.2:latest"),
        ],
        ollama_listen=f"127.0.0.1:{port}",
        stall_timeout="60s",
        **router,
    )
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {router['token']}"} if router.get("token") else {}

    async def answers():
        try:
            async with daemon.session.get(url + "/") as resp:
                return resp.status == 200 and await resp.text() == "Ollama is running"
        except aiohttp.ClientError:
            return False

    await eventually(answers, 10, what="the front door to answer")
    lab = FrontLab(daemon, url, {"node-1": chat, "node-2": critique, "node-3": other})

    async def models_known():  # every task node's /api/tags has been read once (node-2 takes no tasks)
        async with daemon.session.get(url + "/api/tags", headers=auth) as resp:
            return {m["model"] for m in (await resp.json())["models"]} >= {CHAT_MODEL, "llama3.2:latest", EMBED_MODEL}

    await eventually(models_known, 10, what="the nodes' models to be known")
    return lab


async def start_thinking_lab(fakes, daemon_factory) -> FrontLab:
    """One task node, node-1, with a thinking model (qwen3:8b), behind the front door."""
    node = await fakes("qwen3:8b")
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", node, 1, ["task"], "qwen3:8b")], ollama_listen=f"127.0.0.1:{port}"
    )
    lab = FrontLab(daemon, f"http://127.0.0.1:{port}", {"node-1": node})
    await eventually(lambda: lab.models_ready(), 10, what="the front door to know qwen3:8b")
    return lab


@pytest.fixture
async def front(fakes, daemon_factory):
    lab = await start_front_lab(fakes, daemon_factory)
    yield lab
    await lab.close()


# -- the ollama client --------------------------------------------------------------------------


async def test_ollama_chat_and_generate_stream_and_not_each_a_job(front):
    client = front.ollama()
    reply = await client.chat(
        model=CHAT_MODEL,
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
    )
    assert reply.done and reply.done_reason == "stop" and reply.message.role == "assistant"
    assert reply.message.content.strip() and reply.eval_count == len(reply.message.content.split())

    parts = [
        p
        async for p in await client.chat(
            model=CHAT_MODEL, stream=True, messages=[{"role": "user", "content": "stream it"}]
        )
    ]
    assert len(parts) > 2 and parts[-1].done and not any(p.done for p in parts[:-1])
    streamed = "".join(p.message.content for p in parts)

    generated = await client.generate(model=CHAT_MODEL, prompt="say hi")
    assert generated.response.strip() and generated.done
    pieces = [p async for p in await client.generate(model=CHAT_MODEL, prompt="say hi slowly", stream=True)]
    assert all(p.response is not None for p in pieces) and pieces[-1].done

    # Each call is a durable job, visible like any: prompt = the last user message, the whole
    # request kept, the actor names the API and the client.
    job = await front.job_with("stream it", "done")
    assert job["kind"] == "task" and job["node"] == "node-1" and job["model"] == CHAT_MODEL
    detail = await front.daemon.job(job["id"])
    assert detail["output"] == streamed
    assert detail["endpoint"] == "/api/chat"
    assert detail["request"]["path"] == "/api/chat" and detail["request"]["body"]["stream"] is True
    assert detail["request"]["user_agent"].startswith("ollama-python/")
    assert detail["events"][0]["actor"] == "ollama 127.0.0.1"
    assert (await front.job_with("hello there", "done"))["kind"] == "task"
    assert (await front.job_with("say hi", "done"))["node"] == "node-1"
    queue = await front.daemon.cli("queue")
    assert queue.code == 0
    shown = await front.daemon.cli("show", job["id"])
    assert shown.code == 0 and "via: /api/chat (front door), client ollama-python/" in shown.out


async def test_the_node_gets_the_request_with_its_own_unload_policy(front):
    await front.ollama().chat(
        model=CHAT_MODEL,
        keep_alive="1h",
        options={"temperature": 0.1, "num_ctx": 2048},
        format="json",
        messages=[{"role": "user", "content": "as json"}],
    )
    sent = [r for r in front.fakes["node-1"].requests if r.get("messages")][-1]
    # The client's "1h" holds the model no longer than [front] max_keep_alive (30m), and only
    # while nothing else waits for the node (tests/test_warm_models.py).
    assert sent["keep_alive"] == 1800 and sent["stream"] is True
    assert sent["options"] == {"temperature": 0.1, "num_ctx": 2048} and sent["format"] == "json"
    assert sent["messages"] == [{"role": "user", "content": "as json"}]
    job = await front.job_with("as json", "done")
    assert (await front.daemon.job(job["id"]))["request"]["body"]["keep_alive"] == "1h"  # kept as asked


async def test_list_show_ps_version(front):
    client = front.ollama()
    listed = await client.list()
    assert sorted(m.model for m in listed.models) == sorted([CHAT_MODEL, "llama3.2:latest", EMBED_MODEL])
    async with front.daemon.session.get(front.url + "/api/tags") as resp:
        raw = await resp.json()
    assert all(m["name"] == m["model"] for m in raw["models"])  # Continue reads name, Open WebUI model
    shown = await client.show(CHAT_MODEL)
    assert shown.modelinfo is not None
    assert "completion" in (shown.capabilities or ["completion"])
    with pytest.raises(ollama.ResponseError) as exc:
        await client.show("absent:1b")
    assert exc.value.status_code == 404 and exc.value.error == "model 'absent:1b' not found"
    assert (await client.ps()).models == []
    async with front.daemon.session.get(front.url + "/api/version") as resp:
        assert await resp.json() == {"version": front.fakes["node-1"].version}


async def test_ps_shows_what_a_node_has_loaded(front):
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.05, 100
    client = front.ollama()
    call = asyncio.create_task(client.chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "long"}]))
    await eventually(lambda: fake.in_flight == 1, what="the call to run")
    loaded = await client.ps()
    assert [m.model for m in loaded.models] == [CHAT_MODEL]
    fake.script.token_delay_s = 0
    await call


async def test_embeddings_are_jobs_of_their_own_kind(front):
    client = front.ollama()
    embedded = await client.embed(model=EMBED_MODEL, input=["first text", "second text"])
    assert len(embedded.embeddings) == 2 and len(embedded.embeddings[0]) > 10
    legacy = await client.embeddings(model=EMBED_MODEL, prompt="old style")
    assert len(legacy.embedding) > 10
    job = await front.job_with("first text\nsecond text", "done")
    assert job["kind"] == "embed" and job["node"] == "node-3"  # the task node that has the model
    oa = await front.openai().embeddings.create(model=EMBED_MODEL, input=["first text"])  # base64 by default
    assert oa.data[0].embedding == pytest.approx(embedded.embeddings[0], rel=1e-6)
    assert (await front.job_with("first text", "done"))["kind"] == "embed"


async def test_a_model_no_node_has_is_404_as_ollama_says_and_no_job(front):
    before = len(await front.jobs())
    with pytest.raises(ollama.ResponseError) as exc:
        await front.ollama().chat(model="mistral:7b", messages=[{"role": "user", "content": "x"}])
    assert (exc.value.status_code, exc.value.error) == (404, "model 'mistral:7b' not found")
    with pytest.raises(ollama.ResponseError) as exc:
        await front.ollama().generate(model="mistral:7b", prompt="x")
    assert exc.value.status_code == 404
    with pytest.raises(openai.NotFoundError) as exc:
        await front.openai().chat.completions.create(model="mistral:7b", messages=[{"role": "user", "content": "x"}])
    assert exc.value.body["message"] == "model 'mistral:7b' not found"
    # A critique-only node's model is not a task node's: the front door runs tasks.
    with pytest.raises(ollama.ResponseError) as exc:
        await front.ollama().chat(model="deepseek-r1:32b", messages=[{"role": "user", "content": "x"}])
    assert exc.value.status_code == 404
    assert len(await front.jobs()) == before


async def test_a_node_failing_mid_stream_ends_the_clients_stream_with_its_error(front):
    fake = front.fakes["node-1"]
    fake.script.error_after = 3
    parts = []
    with pytest.raises(ollama.ResponseError) as exc:
        async for part in await front.ollama().chat(
            model=CHAT_MODEL, stream=True, messages=[{"role": "user", "content": "breaks"}]
        ):
            parts.append(part)
    assert len(parts) == 3 and exc.value.error.startswith("an error was encountered while running the model")
    job = await front.daemon.wait_state((await front.job_with("breaks"))["id"], "failed")
    assert job["error"] == exc.value.error and job["output"] == "".join(p.message.content for p in parts)


async def test_an_unload_call_is_answered_without_a_job(front):
    """Open WebUI unloads with generate {prompt: "", keep_alive: 0}; gpuq unloads after each job."""
    async with front.daemon.session.post(
        front.url + "/api/generate", json={"model": CHAT_MODEL, "prompt": "", "keep_alive": 0}
    ) as resp:
        body = await resp.json()
    assert resp.status == 200 and body["done_reason"] == "unload" and body["response"] == ""
    assert (await front.ollama().chat(model=CHAT_MODEL, messages=[])).done_reason == "load"
    assert await front.jobs() == [] and front.fakes["node-1"].chat_requests == []


# -- the openai client ----------------------------------------------------------------------------


async def test_openai_chat_stream_and_not_and_models(front):
    client = front.openai()
    completion = await client.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "hello from openai"}]
    )
    job = await front.job_with("hello from openai", "done")
    assert completion.id == f"chatcmpl-{job['id']}" and completion.object == "chat.completion"
    assert completion.choices[0].finish_reason == "stop" and completion.choices[0].message.content.strip()
    assert completion.usage.completion_tokens == len(completion.choices[0].message.content.split())
    assert job["endpoint"] == "/v1/chat/completions"
    assert (await front.daemon.job(job["id"]))["events"][0]["actor"] == "openai 127.0.0.1"

    stream = await client.chat.completions.create(
        model=CHAT_MODEL,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "stream from openai"}],
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(text.split())
    job = await front.job_with("stream from openai", "done")
    assert (await front.daemon.job(job["id"]))["output"] == text

    models = [m async for m in client.models.list()]
    assert {m.id for m in models} == {CHAT_MODEL, "llama3.2:latest", EMBED_MODEL}
    assert {m.owned_by for m in models} == {"library"}


async def test_openai_completions_and_one_model(front):
    client = front.openai()
    completion = await client.completions.create(model=CHAT_MODEL, prompt="def add(a, b):", max_tokens=64)
    assert completion.object == "text_completion" and completion.choices[0].text.strip()
    job = await front.job_with("def add(a, b):", "done")
    assert completion.id == f"cmpl-{job['id']}" and job["endpoint"] == "/v1/completions"
    sent = [r for r in front.fakes["node-1"].requests if r.get("prompt") == "def add(a, b):"][-1]
    # OpenAI's API carries no keep_alive: [front] keep_alive's 5m, Ollama's own default
    assert sent["options"]["num_predict"] == 64 and sent["stream"] is True and sent["keep_alive"] == 300
    pieces = [c async for c in await client.completions.create(model=CHAT_MODEL, prompt="stream it", stream=True)]
    assert "".join(c.choices[0].text for c in pieces).strip() and pieces[-1].choices[0].finish_reason == "stop"
    card = await client.models.retrieve(CHAT_MODEL)
    assert (card.id, card.owned_by) == (CHAT_MODEL, "library")
    with pytest.raises(openai.NotFoundError):
        await client.models.retrieve("absent:1b")


async def test_openai_json_schema_becomes_ollamas_format(front):
    schema = {"type": "object", "properties": {"findings": {"type": "array"}}, "required": ["findings"]}
    completion = await front.openai().chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": "structured"}],
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    )
    assert "findings" in json.loads(completion.choices[0].message.content)
    sent = [r for r in front.fakes["node-1"].requests if r.get("messages")][-1]
    assert sent["format"] == schema and sent["options"]["temperature"] == 1.0


async def test_a_thinking_models_reasoning_reaches_each_client_as_its_api_gives_it(fakes, daemon_factory):
    """Ollama's `thinking` (on by default for a thinking model), OpenAI's `reasoning`; the job
    keeps it apart from the answer, as for gpuq's own jobs."""
    lab = await start_thinking_lab(fakes, daemon_factory)
    daemon = lab.daemon
    try:
        reply = await lab.ollama().chat(model="qwen3:8b", messages=[{"role": "user", "content": "think first"}])
        assert reply.message.thinking and reply.message.content
        job = await daemon.job((await lab.job_with("think first", "done"))["id"])
        assert job["thinking"] == reply.message.thinking and job["output"] == reply.message.content

        parts = [p async for p in await lab.ollama().generate(model="qwen3:8b", prompt="think aloud", stream=True)]
        assert "".join(p.thinking or "" for p in parts) and "".join(p.response for p in parts)

        completion = await lab.openai().chat.completions.create(
            model="qwen3:8b", messages=[{"role": "user", "content": "reason please"}]
        )
        message = completion.choices[0].message
        assert message.content and message.model_extra["reasoning"]
        stream = await lab.openai().chat.completions.create(
            model="qwen3:8b", stream=True, messages=[{"role": "user", "content": "reason in a stream"}]
        )
        deltas = [c.choices[0].delta async for c in stream if c.choices]
        reasoning = "".join((d.model_extra or {}).get("reasoning") or "" for d in deltas)
        content = "".join(d.content or "" for d in deltas)
        assert reasoning and content
        job = await daemon.job((await lab.job_with("reason in a stream", "done"))["id"])
        assert (job["thinking"], job["output"]) == (reasoning, content)

        no_think = await lab.ollama().chat(
            model="qwen3:8b", think=False, messages=[{"role": "user", "content": "no thinking"}]
        )
        assert not no_think.message.thinking and no_think.message.content
    finally:
        await lab.close()


# -- the queue ------------------------------------------------------------------------------------


async def test_three_calls_for_one_model_queue_on_its_node_one_at_a_time(front):
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.01, 20
    client = front.ollama()
    calls = [client.chat(model=CHAT_MODEL, messages=[{"role": "user", "content": f"call {i}"}]) for i in range(3)]
    replies = await asyncio.gather(*calls)
    assert all(r.done and r.message.content for r in replies)
    assert fake.max_in_flight == 1 and front.fakes["node-3"].chat_requests == []
    jobs = [await front.job_with(f"call {i}", "done") for i in range(3)]
    assert {j["node"] for j in jobs} == {"node-1"}
    detail = [await front.daemon.job(j["id"]) for j in jobs]
    runs = sorted((d["runs"][0]["started_at"], d["runs"][0]["finished_at"]) for d in detail)
    assert all(runs[i][1] <= runs[i + 1][0] for i in range(2))  # one after another


async def test_a_client_that_leaves_while_queued_cancels_its_job_before_ollama_sees_it(front):
    fake = front.fakes["node-1"]
    first = await front.hold_node_1("busy")
    waiting = asyncio.create_task(
        front.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "gave up"}])
    )
    job = await front.job_with("gave up", "queued")
    waiting.cancel()  # the client closes its connection
    with pytest.raises(asyncio.CancelledError):
        await waiting
    cancelled = await front.daemon.wait_state(job["id"], "cancelled")
    assert cancelled["error"] == "client disconnected"
    assert cancelled["events"][-1]["actor"] == "ollama 127.0.0.1"
    assert cancelled["events"][-1]["reason"] == "client disconnected"
    assert cancelled["runs"] == []
    fake.script.token_delay_s = 0
    await first
    assert not any(m.get("content") == "gave up" for r in fake.requests for m in r.get("messages") or [])
    # Only by explicit request, it runs for no one: its output on its page.
    assert (await front.daemon.cli("retry", job["id"])).code == 0
    done = await front.daemon.wait_state(job["id"], "done")
    assert done["output"] and any(m.get("content") == "gave up" for r in fake.requests for m in r.get("messages") or [])


async def test_a_client_that_leaves_while_running_aborts_the_run(front):
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.05, 400
    stream = await front.ollama().chat(model=CHAT_MODEL, stream=True, messages=[{"role": "user", "content": "leave"}])
    async for _ in stream:
        break
    await stream.aclose()  # closes the response: the connection goes
    job = await front.job_with("leave")
    cancelled = await front.daemon.wait_state(job["id"], "cancelled")
    assert cancelled["error"] == "client disconnected"
    # Its worker commits the cancel with the output so far (one commit): the client is named,
    # and what the node had sent is kept.
    assert cancelled["events"][-1]["actor"] == "ollama 127.0.0.1"
    assert cancelled["output"] and cancelled["runs"][-1]["state"] == "cancelled"
    # The request is aborted; the model stays loaded for the call's keep_alive ([front]
    # keep_alive, 5m, when it sends none), as Ollama keeps it after a cancelled request.
    await eventually(lambda: fake.disconnects == 1, what="Ollama's request aborted")

    async def warm():
        node = next(n for n in (await front.daemon.get("/api/nodes"))["nodes"] if n["name"] == "node-1")
        return node["warm"] and node["warm"]["model"] == CHAT_MODEL

    await eventually(warm, what="the model kept warm for the call's keep_alive")
    assert CHAT_MODEL in fake.loaded
    # A client that asked for no keep_alive: its model leaves with it.
    stream = await front.ollama().chat(
        model=CHAT_MODEL, stream=True, keep_alive=0, messages=[{"role": "user", "content": "leave cold"}]
    )
    async for _ in stream:
        break
    await stream.aclose()
    job = await front.job_with("leave cold")
    await front.daemon.wait_state(job["id"], "cancelled")
    await eventually(
        lambda: fake.disconnects == 2 and CHAT_MODEL not in fake.loaded,
        what="Ollama's request aborted and the model unloaded",
    )


async def test_delete_ends_the_clients_stream_with_an_error_naming_it(front):
    fake = front.fakes["node-1"]

    async def read(got):  # the ollama client sends its request when the stream is first read
        async for part in await front.ollama().chat(
            model=CHAT_MODEL, stream=True, messages=[{"role": "user", "content": "doomed"}]
        ):
            got.append(part)

    job, raised, got = await front.delete_mid_stream("doomed", read, lambda got: len(got) >= 2)
    assert isinstance(raised, ollama.ResponseError)
    assert raised.error == f"gpuq job {job['id']} was deleted by cli 127.0.0.1: request canceled"
    assert not got[-1].done

    # Waiting, not yet running: the call ends with its status, in OpenAI's shape too.
    fake.script.token_delay_s = 0.05
    # (the deleted call's request may still be in flight at the fake: wait for this job to run)
    first = asyncio.create_task(front.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "hold"}]))
    await front.job_with("hold", "running")
    queued = asyncio.create_task(
        front.openai().chat.completions.create(
            model=CHAT_MODEL, messages=[{"role": "user", "content": "queued then deleted"}]
        )
    )
    waiting = await front.job_with("queued then deleted", "queued")
    assert (await front.daemon.cli("delete", waiting["id"])).code == 0
    with pytest.raises(openai.APIStatusError) as exc:
        await queued
    assert exc.value.status_code == 410 and exc.value.body["code"] == "job_cancelled"
    assert exc.value.response.headers["x-should-retry"] == "false"
    assert "was deleted" in exc.value.body["message"]
    fake.script.token_delay_s = 0
    await first


async def test_preempt_ends_the_interrupted_clients_stream_and_its_job(front):
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.05, 400
    stream = await front.openai().chat.completions.create(
        model=CHAT_MODEL, stream=True, messages=[{"role": "user", "content": "victim"}]
    )
    victim = await front.job_with("victim", "running")
    urgent = (await front.daemon.submit("task", "urgent", node="node-1"))[0]["id"]
    preempted = False
    with pytest.raises(openai.APIError) as exc:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and not preempted:
                assert (await front.daemon.cli("preempt", urgent)).code == 0
                preempted = True
    assert exc.value.body["code"] == "job_preempted" and f"preempted by {urgent}" in exc.value.body["message"]
    ended = await front.daemon.wait_state(victim["id"], "cancelled")  # no client is left to run it for
    assert "preempted by" in ended["error"]
    fake.script.token_delay_s = 0
    await front.daemon.wait_state(urgent, "done")


async def test_moving_a_call_to_a_node_without_its_model_is_409_naming_it(front):
    fake = front.fakes["node-1"]
    first = await front.hold_node_1("one")
    second = asyncio.create_task(front.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "two"}]))
    waiting = await front.job_with("two", "queued")
    res = await front.daemon.cli("move", waiting["id"], "--node", "node-3")
    assert res.code != 0
    assert f"error 409 model '{CHAT_MODEL}' is not installed on node node-3" in res.err
    assert (await front.daemon.job(waiting["id"]))["node"] == "node-1"
    fake.script.token_delay_s = 0
    await asyncio.gather(first, second)


async def test_responses_carry_the_job_and_its_preview(front):
    async with front.daemon.session.post(
        front.url + "/api/chat", json={"model": CHAT_MODEL, "messages": [{"role": "user", "content": "headers"}]}
    ) as resp:
        await resp.read()
    job = await front.job_with("headers")
    assert resp.headers["X-Gpuq-Job"] == job["id"]
    assert resp.headers["X-Gpuq-Preview"] == f"{front.daemon.url}/jobs/{job['id']}"
    assert resp.headers["X-Gpuq-Node"] == "node-1"
    assert resp.headers["Content-Type"] == "application/x-ndjson"


async def test_the_router_restarting_cancels_calls_whose_clients_are_gone(front):
    fake = front.fakes["node-1"]
    first = await front.hold_node_1("a")
    second = asyncio.create_task(front.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "b"}]))
    waiting = await front.job_with("b", "queued")
    await front.daemon.kill()
    for call in (first, second):
        with pytest.raises((ollama.ResponseError, ConnectionError, Exception)):
            await call
    fake.script.token_delay_s = 0
    await front.daemon.start()
    job = await front.daemon.wait_state(waiting["id"], "cancelled")
    assert job["error"].startswith("client gone: the router restarted while it waited")
    assert not any(m.get("content") == "b" for r in fake.requests for m in r.get("messages") or [])


async def test_a_router_stopping_tells_waiting_clients_and_cancels_their_jobs(front):
    fake = front.fakes["node-1"]
    running = await front.hold_node_1("r")
    waiting = asyncio.create_task(
        front.openai().chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "w"}])
    )
    job = await front.job_with("w", "queued")
    await front.daemon.kill(signal.SIGTERM)
    with pytest.raises(openai.APIStatusError) as exc:
        await waiting
    assert exc.value.status_code == 503 and exc.value.body["code"] == "router_shutdown"
    with pytest.raises(ollama.ResponseError) as exc:
        await running
    assert exc.value.status_code == 503
    assert front.daemon.proc.returncode == 0
    fake.script.token_delay_s = 0
    await front.daemon.start()
    assert (await front.daemon.job(job["id"]))["error"] == "router shut down while its client waited"


async def test_an_openai_stream_opens_at_once_while_its_job_waits(front):
    fake = front.fakes["node-1"]
    first = await front.hold_node_1("1st")
    async with front.daemon.session.post(
        front.url + "/v1/chat/completions",
        json={"model": CHAT_MODEL, "stream": True, "messages": [{"role": "user", "content": "2nd"}]},
    ) as resp:
        # Headers (and its job's id) before it runs: the SDK's read timeout counts from here,
        # and comments keep the wait alive.
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        job = await front.daemon.job(resp.headers["X-Gpuq-Job"])
        assert job["state"] == "queued" and job["prompt"] == "2nd"
        fake.script.token_delay_s = 0
        events = (await resp.read()).decode().split("\n\n")
    assert events[-2] == "data: [DONE]"
    await first


# -- access ---------------------------------------------------------------------------------------


@pytest.fixture
async def token_lab(fakes, daemon_factory):
    lab = await start_front_lab_with_token(fakes, daemon_factory, "s3cret")
    yield lab
    await lab.close()


async def test_the_token_is_required_and_accepted(token_lab):
    lab = token_lab
    with pytest.raises(ollama.ResponseError) as exc:
        await lab.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "no token"}])
    assert exc.value.status_code == 401 and "missing or wrong token" in exc.value.error
    with pytest.raises(openai.AuthenticationError) as exc:
        await lab.openai(api_key="wrong").chat.completions.create(
            model=CHAT_MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert exc.value.body["code"] == "invalid_api_key"
    reply = await lab.ollama(headers={"Authorization": "Bearer s3cret"}).chat(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "with token"}]
    )
    assert reply.done
    completion = await lab.openai(api_key="s3cret").chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "with key"}]
    )
    assert completion.choices[0].message.content
    async with lab.daemon.session.get(lab.url + "/") as resp:  # clients probe it without a token
        assert resp.status == 200
    async with lab.daemon.session.get(
        lab.url + "/api/tags", headers={"Host": "evil.example:80", "Authorization": "Bearer s3cret"}
    ) as resp:
        assert resp.status == 421 and "is not one of this router's names" in (await resp.json())["error"]


async def start_front_lab_with_token(fakes, daemon_factory, token: str) -> FrontLab:
    chat = await fakes(CHAT_MODEL)
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", chat, 1, ["task"], CHAT_MODEL)], ollama_listen=f"127.0.0.1:{port}", token=token
    )
    lab = FrontLab(daemon, f"http://127.0.0.1:{port}", {"node-1": chat})

    async def ready():
        try:
            async with daemon.session.get(lab.url + "/api/tags", headers={"Authorization": f"Bearer {token}"}) as r:
                return r.status == 200 and (await r.json())["models"]
        except aiohttp.ClientError:
            return False

    await eventually(ready, 10, what="the front door to know the node's models")
    return lab


async def test_a_nodes_own_refusal_reaches_the_client_with_its_status_and_fails_the_job(front):
    """What the router cannot know before the run (the node refuses the model's load) reaches the
    client with the node's status and words, and the job is failed with them, never retried."""
    message = "llama-server reported out-of-memory during startup: cudaMalloc failed"
    front.fakes["node-1"].script.load_error = (500, message)
    with pytest.raises(ollama.ResponseError) as exc:
        await front.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "too big?"}])
    assert (exc.value.status_code, exc.value.error) == (500, message)
    job = await front.daemon.wait_state((await front.job_with("too big?"))["id"], "failed")
    assert job["error"] == message and len(job["runs"]) == 1
    with pytest.raises(openai.InternalServerError) as err:
        await (
            front.openai()
            .with_options(max_retries=0)
            .chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "too big again?"}])
        )
    assert err.value.body["message"] == message


async def test_bad_requests_get_each_apis_error_shape(front):
    session = front.daemon.session
    cases = [
        ("/api/chat", b"", 400, {"error": "missing request body"}),
        ("/api/chat", b"{", 400, None),
        ("/api/chat", json.dumps({"messages": []}).encode(), 400, {"error": "model is required"}),
        (
            "/api/generate",
            json.dumps({"model": CHAT_MODEL, "prompt": "x", "keep_alive": "300"}).encode(),
            400,
            {"error": 'time: missing unit in duration "300"'},
        ),
        ("/api/push", json.dumps({"model": "x"}).encode(), 501, None),
        # Not JSON (Go's parser refuses them); taken as JSON they reached the node as null.
        (
            "/api/chat",
            b'{"model": "' + CHAT_MODEL.encode() + b'", "messages": [], "options": {"temperature": NaN}}',
            400,
            {"error": "invalid character in JSON: NaN is not a JSON value"},
        ),
        (
            "/api/generate",
            b'{"model": "' + CHAT_MODEL.encode() + b'", "prompt": "x", "options": {"top_p": 1e999}}',
            400,
            {"error": "invalid character in JSON: the number 1e999 is out of range"},
        ),
    ]
    for path, raw, status, body in cases:
        async with session.post(front.url + path, data=raw) as resp:
            got = await resp.json()
        assert resp.status == status, (path, got)
        assert isinstance(got["error"], str)
        if body is not None:
            assert got == body
    async with session.post(front.url + "/v1/chat/completions", json={"model": CHAT_MODEL, "messages": []}) as resp:
        got = await resp.json()
    assert resp.status == 400 and got == {
        "error": {
            "message": "[] is too short - 'messages'",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }
    assert await front.jobs() == []


async def test_embeddings_through_openai_as_floats(front):
    reply = await front.openai().embeddings.create(model=EMBED_MODEL, input="one", encoding_format="float")
    assert reply.object == "list" and reply.model == EMBED_MODEL and len(reply.data[0].embedding) > 10
    assert reply.usage.prompt_tokens > 0


def test_migration_keeps_every_row_and_allows_embed(tmp_path):
    """The job table is rebuilt for the new kind: rows, references, indexes, triggers and views
    come through, and the kind's CHECK still refuses what it should."""
    import asyncio as aio

    from gpuq.store import Store

    path = tmp_path / "gpuq.db"
    db = sqlite3.connect(path)
    from gpuq.store import MIGRATIONS_DIR

    db.execute(
        "CREATE TABLE schema_migration (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    for f in sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql")):
        if f.name.startswith("006"):
            break
        db.executescript(f.read_text())
        db.execute("INSERT INTO schema_migration VALUES (?, ?, 'then')", (int(f.name[:3]), f.stem))
    db.execute(
        "INSERT INTO job (id, kind, node, model, prompt, position, placement, created_at, state, run_id,"
        " finished_at) VALUES ('1-aaaaaaaa', 'task', 'n1', 'm', 'p', 1024, 'asked', 'now', 'done', 1, 'now')"
    )
    db.execute(
        "INSERT INTO run (id, job_id, node, model, state, started_at, progress_at, finished_at, output)"
        " VALUES (1, '1-aaaaaaaa', 'n1', 'm', 'done', 'now', 'now', 'now', 'result')"
    )
    db.execute(
        "INSERT INTO job (id, kind, node, model, prompt, position, placement, created_at, parent_id,"
        " subject_from_parent) VALUES ('1-bbbbbbbb', 'critique', 'n2', 'm', 'c', 1024, 'fan-out', 'now',"
        " '1-aaaaaaaa', 1)"
    )
    db.execute("INSERT INTO event (job_id, at, to_state, actor) VALUES ('1-aaaaaaaa', 'now', 'queued', 'cli')")
    db.commit()
    db.close()

    store = Store(path)
    aio.run(store.open())
    aio.run(store.close())
    db = sqlite3.connect(path)
    assert db.execute("SELECT id, kind, state, run_id FROM job ORDER BY id").fetchall() == [
        ("1-aaaaaaaa", "task", "done", 1),
        ("1-bbbbbbbb", "critique", "queued", None),
    ]
    assert db.execute("SELECT id FROM ready_job").fetchall() == [("1-bbbbbbbb",)]  # the parent is done
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'job'")}
    assert {"job_queue", "job_one_running_per_node", "job_parent", "job_created", "job_state_node"} <= indexes
    with pytest.raises(sqlite3.IntegrityError, match="a critique never runs on its parent task's node"):
        db.execute("UPDATE job SET node = 'n1' WHERE id = '1-bbbbbbbb'")
    db.execute(
        "INSERT INTO job (id, kind, node, model, prompt, position, placement, created_at, endpoint, request)"
        " VALUES ('2-cccccccc', 'embed', 'n1', 'e', 'x', 2048, 'asked', 'now', '/api/embed', '{}')"
    )
    for bad in (("3-dddddddd", "chat", "/api/chat", "{}"), ("4-eeeeeeee", "embed", None, None)):
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            db.execute(
                "INSERT INTO job (id, kind, node, model, prompt, position, placement, created_at, endpoint,"
                " request) VALUES (?, ?, 'n1', 'e', 'x', 4096, 'asked', 'now', ?, ?)",
                bad,
            )
    db.close()


async def test_a_taken_front_door_port_stops_the_router_before_it_starts(fakes, daemon_factory):
    import socket

    chat = await fakes(CHAT_MODEL)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        daemon = await daemon_factory(
            [node_table("node-1", chat, 1, ["task"], CHAT_MODEL)], start=False, ollama_listen=f"127.0.0.1:{port}"
        )
        proc = await asyncio.create_subprocess_exec(
            *daemon.command,
            "serve",
            "--config",
            str(daemon.config),
            stderr=asyncio.subprocess.PIPE,
            cwd=str(daemon.config.parent),
        )
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: address already in use (router.ollama_listen)" in err.decode()
    assert not (daemon.config.parent / "gpuq.db").exists()  # nothing was touched


def test_front_door_config_errors(tmp_path):
    from gpuq.config import parse_config
    from gpuq.errors import ConfigError

    with pytest.raises(ConfigError, match="router.ollama_listen: expected 'host:port'"):
        parse_config({"router": {"ollama_listen": "11435"}}, tmp_path)
    with pytest.raises(ConfigError, match="router.ollama_listen: 127.0.0.1:8750 is router.listen already"):
        parse_config({"router": {"ollama_listen": "127.0.0.1:8750"}}, tmp_path)
    settings = parse_config(
        {"router": {"ollama_listen": "0.0.0.0:11435", "public_url": "http://100.64.0.5:8750"}}, tmp_path
    )
    assert settings.ollama_url == "http://100.64.0.5:11435"


# -- text that cannot be stored -----------------------------------------------------------------

SURROGATE = "it holds a lone surrogate (\\ud800)"  # the message's end: the escape, as text
# path: (raw JSON body with the escape "\ud800" as sent on the wire, the field it names)
HALF_A_CHARACTER = {
    "/api/chat": (
        b'{"model": "qwen3-coder:30b", "messages": [{"role": "user", "content": "half \\ud800"}]}',
        "messages[0].content",
    ),
    "/api/generate": (b'{"model": "qwen3-coder:30b", "prompt": "\\ud800", "stream": false}', "prompt"),
    "/v1/chat/completions": (
        b'{"model": "qwen3-coder:30b", "messages": [{"role": "system", "content": "ok"},'
        b' {"role": "user", "content": [{"type": "text", "text": "a\\ud800"}]}]}',
        "messages[1].content[0].text",
    ),
    "/v1/responses": (
        b'{"model": "qwen3-coder:30b", "input": [{"role": "user", "content": "\\ud800"}]}',
        "input[0].content",
    ),
    "/v1/messages": (
        b'{"model": "qwen3-coder:30b", "max_tokens": 64, "messages": [{"role": "user", "content": "x\\ud800y"}]}',
        "messages[0].content",
    ),
}


async def test_a_lone_surrogate_is_a_400_in_each_apis_own_shape_and_stores_nothing(front):
    """JSON may escape half a UTF-16 pair; no such text can be stored or sent to a node. Each API
    answers 400 naming the field, in its own error shape (it was a 500 'internal error')."""
    got = {}
    for path, (raw, _field) in HALF_A_CHARACTER.items():
        async with front.daemon.session.post(
            front.url + path, data=raw, headers={"Content-Type": "application/json"}
        ) as resp:
            got[path] = (resp.status, await resp.json(), resp.headers.get("x-should-retry"))
    said = {path: f"field '{field}' is not valid text: {SURROGATE}" for path, (_, field) in HALF_A_CHARACTER.items()}
    assert got["/api/chat"] == (400, {"error": said["/api/chat"]}, None)
    assert got["/api/generate"] == (400, {"error": said["/api/generate"]}, None)
    for path in ("/v1/chat/completions", "/v1/responses"):
        assert got[path] == (
            400,
            {"error": {"message": said[path], "type": "invalid_request_error", "param": None, "code": None}},
            "false",
        ), path
    status, body, retry = got["/v1/messages"]
    assert (status, retry, body["type"], body["error"]) == (
        400,
        "false",
        "error",
        {"type": "invalid_request_error", "message": said["/v1/messages"]},
    )
    # Nothing was stored or sent, and the router's own API says the same in its words.
    assert await front.jobs() == [] and front.fakes["node-1"].chat_requests == []
    status, body = await front.daemon.request("POST", "/api/jobs", raw=b'{"kind": "task", "prompt": "\\ud800"}')
    assert (status, body) == (
        400,
        {"error": {"status": 400, "message": f"field 'prompt' is not valid text: {SURROGATE}"}},
    )


async def test_a_client_that_stops_reading_mid_stream_gets_every_line_once_it_reads_again(front):
    """A client that stops reading mid-stream (its socket's buffers full, the router's writes to
    it paused) while the node sends the rest: once it reads again it gets every line, in the
    node's order, to the last (what the call holds in memory, relay.CLIENT_BACKLOG_BYTES, then
    the rest from its spool; issue 44). (The relay writes a chunk from the node's reading task
    while the client keeps up, and queues it for the handler when not.)"""
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.0, 30_000  # ~4 MB of lines, as fast as it goes
    port = int(front.url.rsplit(":", 1)[1])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the router must hold the rest
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
    body = json.dumps({"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hold on"}]}).encode()
    writer.write(
        b"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
    assert head.startswith(b"HTTP/1.1 200") and b"chunked" in head.lower()
    received = bytearray(await asyncio.wait_for(reader.read(1000), 30))  # a little, then nothing
    job = await front.job_with("hold on", "running", "done")
    done = await front.daemon.wait_state(job["id"], "done", timeout=120)  # the node sent it all meanwhile
    while chunk := await asyncio.wait_for(reader.read(1 << 16), 60):
        received += chunk
    writer.close()

    payload, rest = bytearray(), bytes(received)  # undo the chunked transfer encoding
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        payload += rest[:size]
        rest = rest[size + 2 :]
    *lines, last = [json.loads(line) for line in payload.split(b"\n") if line.strip()]
    assert lines and not any(line["done"] for line in lines) and last["done"] is True
    assert "".join(line["message"]["content"] for line in lines) == done["output"]
    assert len(done["output"].split()) == 30_000
