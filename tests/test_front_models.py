"""Model lists and model management on the front door that tell the truth, with the real
clients: the lists hold only what a front-door call can run, /api/pull answers as Ollama does
for a model a task node has, what a model cannot do is refused before it waits in a queue, and
a /v1 error tells the OpenAI and Anthropic SDKs whether to send it again."""

from __future__ import annotations

import json
import sqlite3

import anthropic
import httpx
import httpx2
import ollama
import openai
import pytest
from conftest import eventually, free_port, node_table
from test_front import CHAT_MODEL, EMBED_MODEL, FrontLab, start_front_lab

CRITIQUE_ONLY = "deepseek-r1:32b"  # node-2's only model; node-2 takes critiques only
LOCKED = "the database is locked by another process (database is locked); nothing was changed"


@pytest.fixture
async def front(fakes, daemon_factory):
    lab = await start_front_lab(fakes, daemon_factory, busy_timeout="0.5s")
    yield lab
    await lab.close()


async def critique_node_heard(front) -> None:
    """node-2's /api/tags has been read: /api/show (any node with the model) answers for it."""

    async def shown():
        async with front.daemon.session.post(front.url + "/api/show", json={"model": CRITIQUE_ONLY}) as resp:
            return resp.status == 200

    await eventually(shown, 10, what=f"node-2's {CRITIQUE_ONLY} to be known")


async def test_the_lists_hold_only_models_a_front_door_call_can_run(front):
    await critique_node_heard(front)
    listed = await front.ollama().list()
    assert sorted(m.model for m in listed.models) == sorted([CHAT_MODEL, "llama3.2:latest", EMBED_MODEL])
    assert {m.id async for m in front.openai().models.list()} == {CHAT_MODEL, "llama3.2:latest", EMBED_MODEL}
    assert (await front.openai().models.retrieve("llama3.2:latest")).id == "llama3.2:latest"
    with pytest.raises(openai.NotFoundError) as exc:
        await front.openai().models.retrieve(CRITIQUE_ONLY)
    assert exc.value.body["message"] == f"model '{CRITIQUE_ONLY}' not found"
    # Each listed model runs.
    for model in (CHAT_MODEL, "llama3.2:latest"):
        assert (await front.ollama().chat(model=model, messages=[{"role": "user", "content": "listed"}])).done


async def test_a_pull_of_a_model_a_task_node_has_succeeds_as_ollamas_does(front):
    client = front.ollama()
    whole = await client.pull(CHAT_MODEL)
    assert whole.status == "success"
    streamed = [p.status async for p in await client.pull("llama3.2", stream=True)]
    assert streamed == ["pulling manifest", "verifying sha256 digest", "writing manifest", "success"]
    async with front.daemon.session.post(front.url + "/api/pull", json={"name": EMBED_MODEL}) as resp:
        assert resp.status == 200 and resp.content_type == "application/x-ndjson"
        lines = (await resp.text()).splitlines()
    assert [json.loads(line) for line in lines][-1] == {"status": "success"}
    assert await front.jobs() == []  # a pull makes no GPU work


async def test_a_pull_of_a_model_no_task_node_has_is_a_404_saying_where_to_pull_it(front):
    await critique_node_heard(front)
    client = front.ollama()
    for model in ("mistral:7b", CRITIQUE_ONLY):
        with pytest.raises(ollama.ResponseError) as exc:
            await client.pull(model)
        assert exc.value.status_code == 404
        said = exc.value.error
        assert said.startswith(f"model '{model}' is not on any node that runs front-door calls (node-1: {CHAT_MODEL};")
        assert f"run `ollama pull {model}` on one of them (node-1, node-3)" in said
    with pytest.raises(ollama.ResponseError) as exc:
        await _drain(client, "mistral:7b")
    assert exc.value.status_code == 404


async def _drain(client: ollama.AsyncClient, model: str) -> list:
    return [p async for p in await client.pull(model, stream=True)]


async def test_what_the_model_cannot_do_is_refused_at_once_not_after_the_queue(front):
    # node-1, the only task node with CHAT_MODEL, is busy: a call that reached its queue would
    # wait there for the slow one, then fail. These are refused before any job is stored.
    held = await front.hold_node_1("holds node-1")
    client, oa = front.ollama(), front.openai()

    with pytest.raises(ollama.ResponseError) as exc:
        await client.chat(model=CHAT_MODEL, think=True, messages=[{"role": "user", "content": "think?"}])
    assert (exc.value.status_code, exc.value.error) == (400, f'"{CHAT_MODEL}" does not support thinking')
    with pytest.raises(openai.BadRequestError) as exc:
        await oa.chat.completions.create(
            model=CHAT_MODEL, reasoning_effort="high", messages=[{"role": "user", "content": "think hard?"}]
        )
    assert exc.value.body["message"] == f'"{CHAT_MODEL}" does not support thinking'

    # suffix without the insert capability (scheduleRunner's CheckCapabilities names the full name)
    insert = f"registry.ollama.ai/library/{CHAT_MODEL} does not support insert"
    with pytest.raises(ollama.ResponseError) as exc:
        await client.generate(model=CHAT_MODEL, prompt="def f(", suffix="return 1")
    assert (exc.value.status_code, exc.value.error) == (400, insert)
    with pytest.raises(openai.BadRequestError) as exc:
        await oa.completions.create(model=CHAT_MODEL, prompt="def g(", suffix="return 2")
    assert exc.value.body["message"] == insert

    between = "top_logprobs must be between 0 and 20"
    with pytest.raises(ollama.ResponseError) as exc:
        await client.chat(
            model=CHAT_MODEL, logprobs=True, top_logprobs=21, messages=[{"role": "user", "content": "many logprobs"}]
        )
    assert (exc.value.status_code, exc.value.error) == (400, between)
    with pytest.raises(openai.BadRequestError) as exc:
        await oa.chat.completions.create(
            model=CHAT_MODEL,
            logprobs=True,
            top_logprobs=21,
            messages=[{"role": "user", "content": "many logprobs too"}],
        )
    assert exc.value.body["message"] == between
    with pytest.raises(ollama.ResponseError) as exc:  # an embedding model cannot chat
        await client.chat(model=EMBED_MODEL, messages=[{"role": "user", "content": "chat with an embedder"}])
    assert (exc.value.status_code, exc.value.error) == (400, f'"{EMBED_MODEL}" does not support chat')
    assert [j["prompt_excerpt"] for j in await front.jobs()] == ["holds node-1"]  # none waited in a queue

    # A format Ollama cannot read: its 500, with %q of the raw JSON (llm/llama_server.go).
    for fmt, raw in (("xml", r'"\"xml\""'), (42, '"42"')):
        async with front.daemon.session.post(
            front.url + "/api/generate", json={"model": CHAT_MODEL, "prompt": "in xml", "format": fmt}
        ) as resp:
            assert resp.status == 500
            said = await resp.json()
        assert said == {"error": f'invalid format: {raw}; expected "json" or a valid JSON Schema object'}

    # Nothing was stored or sent; node-1's slow call is untouched.
    assert [j["prompt_excerpt"] for j in await front.jobs()] == ["holds node-1"]
    front.fakes["node-1"].script.token_delay_s = 0
    assert (await held).done
    assert len([r for r in front.fakes["node-1"].requests if r.get("messages") or r.get("prompt")]) == 1


async def test_the_sdks_retry_a_503_and_never_a_refusal(front, tmp_path):
    sent: list[str] = []

    async def count(request: httpx.Request) -> None:
        sent.append(request.url.path)

    # Each SDK's own HTTP client, counting what it sends (the Anthropic SDK's is httpx2).
    oa = openai.AsyncOpenAI(
        base_url=front.url + "/v1",
        api_key="unused",
        max_retries=1,
        http_client=httpx.AsyncClient(event_hooks={"request": [count]}),
    )
    an = anthropic.AsyncAnthropic(
        base_url=front.url,
        api_key="unused",
        max_retries=1,
        http_client=httpx2.AsyncClient(event_hooks={"request": [count]}),
    )
    front.clients += [oa, an]

    # A refusal that would be refused again: sent once, x-should-retry false.
    with pytest.raises(openai.NotFoundError) as exc:
        await oa.chat.completions.create(model="mistral:7b", messages=[{"role": "user", "content": "x"}])
    assert exc.value.response.headers["x-should-retry"] == "false" and len(sent) == 1
    with pytest.raises(anthropic.NotFoundError):
        await an.messages.create(model="mistral:7b", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert len(sent) == 2

    # The store is busy (the sqlite3 shell holds its write lock): a 503 that stored nothing,
    # which each SDK sends once more.
    shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    try:
        sent.clear()
        with pytest.raises(openai.InternalServerError) as exc:
            await oa.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "locked out"}])
        assert exc.value.status_code == 503 and exc.value.body["message"] == LOCKED
        assert exc.value.response.headers["x-should-retry"] == "true"
        assert sent == ["/v1/chat/completions"] * 2
        sent.clear()
        with pytest.raises(anthropic.APIStatusError) as exc:
            await an.messages.create(
                model=CHAT_MODEL, max_tokens=10, messages=[{"role": "user", "content": "locked out too"}]
            )
        assert exc.value.status_code == 503
        assert sent == ["/v1/messages"] * 2
    finally:
        shell.execute("ROLLBACK")
        shell.close()
    # Once the store is free again, the same call runs, once.
    sent.clear()
    done = await oa.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "unlocked"}])
    assert done.choices[0].message.content and sent == ["/v1/chat/completions"]


async def test_a_node_whose_list_says_no_capabilities_is_asked_its_show(fakes, daemon_factory):
    # An Ollama older than capabilities in /api/tags: the refusal reads /api/show's.
    node = await fakes(CHAT_MODEL)
    node.script.raw_bodies["/api/tags"] = json.dumps(
        {
            "models": [
                {
                    "name": CHAT_MODEL,
                    "model": CHAT_MODEL,
                    "modified_at": "2026-01-01T00:00:00Z",
                    "size": 1,
                    "digest": "a" * 64,
                    "details": {"family": "qwen3moe"},
                }
            ]
        }
    )
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", node, 1, ["task"], CHAT_MODEL)], ollama_listen=f"127.0.0.1:{port}"
    )
    lab = FrontLab(daemon, f"http://127.0.0.1:{port}", {"node-1": node})
    try:
        await eventually(lab.models_ready, 10, what="the front door to know the node's model")
        for prompt in ("think?", "think again?"):
            with pytest.raises(ollama.ResponseError) as exc:
                await lab.ollama().chat(model=CHAT_MODEL, think=True, messages=[{"role": "user", "content": prompt}])
            assert (exc.value.status_code, exc.value.error) == (400, f'"{CHAT_MODEL}" does not support thinking')
        assert await lab.jobs() == [] and node.chat_requests == []
        # What it can do runs.
        assert (await lab.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "plain"}])).done
    finally:
        await lab.close()
