"""The simulator through the official `ollama` Python client: every answer must parse in the
client's own types (pydantic), and carry what real Ollama sends (as its own source answers)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import aiohttp
import ollama
import pytest
from conftest import eventually
from pydantic import BaseModel

from gpuq.demo.server import BUSY

THINKER = "deepseek-r1:32b"
PLAIN = "llama3.2:latest"
EMBEDDER = "nomic-embed-text:latest"
ASK = [{"role": "user", "content": "write a haiku about queues"}]


@pytest.fixture
async def node(fakes):
    fake = await fakes(THINKER, PLAIN, EMBEDDER, tokens=6)
    client = ollama.AsyncClient(host=fake.url)
    yield fake, client
    await client.close()


async def raw_lines(fake, path: str, body: dict) -> list[dict]:
    async with aiohttp.ClientSession() as session, session.post(fake.url + path, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return [json.loads(line) for line in (await resp.text()).splitlines()]


async def test_a_chat_without_streaming_is_one_object_with_the_final_metrics(node):
    fake, client = node
    reply = await client.chat(model=PLAIN, messages=ASK)  # the client's default: stream false
    assert isinstance(reply, ollama.ChatResponse)
    assert reply.done and reply.done_reason == "stop"
    assert reply.message.role == "assistant" and len(reply.message.content.split()) == 6
    assert reply.message.thinking is None  # llama3.2 cannot think
    assert reply.eval_count == 6 and reply.prompt_eval_count > 0
    assert reply.total_duration >= reply.load_duration > 0 and reply.eval_duration > 0
    assert fake.requests[-1]["stream"] is False


async def test_a_streamed_chat_ends_with_one_done_chunk_holding_the_metrics(node):
    _, client = node
    chunks = [c async for c in await client.chat(model=PLAIN, messages=ASK, stream=True)]
    assert [c.done for c in chunks] == [False] * 6 + [True]
    assert all(c.eval_count is None for c in chunks[:-1])  # metrics are omitempty
    final = chunks[-1]
    assert final.message.content == "" and final.done_reason == "stop" and final.eval_count == 6
    whole = await client.chat(model=PLAIN, messages=ASK)
    assert "".join(c.message.content for c in chunks) == whole.message.content


async def test_generate_streams_response_on_every_chunk_and_answers_whole_when_asked(node):
    fake, client = node
    lines = await raw_lines(fake, "/api/generate", {"model": PLAIN, "prompt": "hello"})  # stream is the default
    assert all("response" in line for line in lines) and lines[-1]["done"] is True
    assert len(lines[-1]["context"]) > 0 and lines[-1]["response"] == ""
    parts = [p async for p in await client.generate(model=PLAIN, prompt="hello", system="be brief", stream=True)]
    assert all(isinstance(p, ollama.GenerateResponse) for p in parts)
    whole = await client.generate(model=PLAIN, prompt="hello", system="be brief", suffix="")
    assert whole.response == "".join(p.response for p in parts) and whole.context
    raw = await client.generate(model=PLAIN, prompt="[INST] hi [/INST]", raw=True, images=[b"\x89PNG"])
    assert raw.response and raw.context is None  # raw mode sends no context
    with pytest.raises(ollama.ResponseError) as bad:
        await client.generate(model=PLAIN, prompt="hi", raw=True, system="no")
    assert (bad.value.status_code, bad.value.error) == (400, "raw mode does not support template, system, or context")


async def test_a_thinking_model_thinks_by_default_then_answers(node):
    fake, client = node
    chunks = [c async for c in await client.chat(model=THINKER, messages=ASK, stream=True)]
    thinking = [c for c in chunks if c.message.thinking]
    answer = [c for c in chunks if c.message.content]
    assert thinking and answer and chunks.index(thinking[-1]) < chunks.index(answer[0])
    assert all(c.message.content == "" for c in thinking)  # reasoning first, content empty meanwhile
    whole = await client.generate(model=THINKER, prompt="hello")
    assert whole.thinking and len(whole.response.split()) == 6
    assert whole.eval_count == len(whole.thinking.split()) + 6
    off = await client.chat(model=THINKER, messages=ASK, think=False)
    assert off.message.thinking is None and off.message.content
    low = await client.chat(model=THINKER, messages=ASK, think="low")
    high = await client.chat(model=THINKER, messages=ASK, think="high")
    assert len(high.message.thinking.split()) > len(low.message.thinking.split()) > 0
    fake.script.thinking_tokens = 0  # this fake's model answers without reasoning
    quiet = await client.chat(model=THINKER, messages=ASK)
    assert quiet.message.thinking is None and quiet.message.content


async def test_gpt_oss_thinks_even_when_asked_not_to(fakes):
    fake = await fakes("gpt-oss:20b", tokens=3)
    client = ollama.AsyncClient(host=fake.url)
    try:
        reply = await client.chat(model="gpt-oss:20b", messages=ASK, think=False)
        assert reply.message.thinking and len(reply.message.content.split()) == 3
    finally:
        await client.close()


async def test_think_on_a_model_that_cannot_think_is_refused_as_ollama_does(node):
    _, client = node
    for think in (True, "medium"):
        with pytest.raises(ollama.ResponseError) as refused:
            await client.chat(model=PLAIN, messages=ASK, think=think)
        assert (refused.value.status_code, refused.value.error) == (400, '"llama3.2:latest" does not support thinking')
    with pytest.raises(ollama.ResponseError) as refused:
        await client.generate(model="LLAMA3.2", prompt="hi", think=True)
    assert refused.value.error == '"LLAMA3.2" does not support thinking'  # the name as asked
    assert (await client.chat(model=PLAIN, messages=ASK, think=False)).message.content


class Verdict(BaseModel):
    verdict: str
    score: int
    tags: list[str]


async def test_structured_output_is_clean_json_after_unconstrained_thinking(node):
    _, client = node
    reply = await client.chat(model=THINKER, messages=ASK, format=Verdict.model_json_schema())
    assert reply.message.thinking  # the reasoning runs first, outside the schema
    Verdict.model_validate_json(reply.message.content)
    parts = [p async for p in await client.generate(model=PLAIN, prompt="hi", format="json", stream=True)]
    assert isinstance(json.loads("".join(p.response for p in parts)), dict)


async def test_num_predict_cuts_the_reply_and_num_ctx_truncates_the_prompt(node):
    _, client = node
    cut = await client.chat(model=PLAIN, messages=ASK, options={"num_predict": 3, "temperature": 0.2, "seed": 7})
    assert (cut.done_reason, cut.eval_count, len(cut.message.content.split())) == ("length", 3, 3)
    spent = await client.chat(model=THINKER, messages=ASK, options={"num_predict": 2})
    assert spent.done_reason == "length" and spent.message.content == ""  # all of it went on thinking
    long = [{"role": "user", "content": "word " * 2000}]
    full = await client.chat(model=PLAIN, messages=long)
    small = await client.chat(model=PLAIN, messages=long, options={"num_ctx": 256})
    assert full.prompt_eval_count > 256 >= small.prompt_eval_count > 0
    assert (await client.ps()).models[0].context_length == 256
    ignored = await client.chat(model=PLAIN, messages=ASK, options={"mirostat": 2, "no_such_option": True})
    assert ignored.done_reason == "stop"  # unknown keys are only logged
    with pytest.raises(ollama.ResponseError) as bad:
        await client.chat(model=PLAIN, messages=ASK, options={"num_ctx": "big"})
    assert (bad.value.status_code, bad.value.error) == (500, 'option "num_ctx" must be of type integer')


async def test_list_and_show_describe_each_model_like_ollama(node):
    fake, client = node
    listed = await client.list()
    assert [m.model for m in listed.models] == [THINKER, PLAIN, EMBEDDER]
    assert all(m.size > 0 and m.modified_at and m.details.family for m in listed.models)
    async with aiohttp.ClientSession() as session, session.get(fake.url + "/api/tags") as resp:
        tags = {m["name"]: m for m in (await resp.json())["models"]}
    assert tags[THINKER]["capabilities"] == ["completion", "tools", "thinking"]
    assert tags[EMBEDDER]["capabilities"] == ["embedding"]
    assert tags[THINKER]["details"]["context_length"] == 131072
    shown = await client.show("deepseek-r1:32b")
    assert shown.capabilities == ["completion", "tools", "thinking"]
    assert shown.modelinfo["qwen2.context_length"] == 131072 and shown.modelinfo["general.architecture"] == "qwen2"
    assert "temperature" in shown.parameters and "{{" in shown.template and shown.modified_at
    assert shown.details.parameter_size == "32.8B" and shown.details.quantization_level == "Q4_K_M"
    assert (await client.show("nomic-embed-text")).capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as missing:
        await client.show("nope")
    assert (missing.value.status_code, missing.value.error) == (404, "model 'nope:latest' not found")


async def test_a_template_implies_the_capabilities_shown_as_ollama_derives_them(fakes):
    # Ollama derives tools and insert from the template's variables (server/images.go
    # goTemplateCapabilities); Continue offers fill-in-the-middle only when /api/show's template
    # has ".Suffix" (core/llm/llms/Ollama.ts).
    fake = await fakes("qwen2.5-coder:7b", "qwen3-coder:30b", "deepseek-r1:32b", "gemma3:4b")
    async with ollama.AsyncClient(host=fake.url) as client:
        for model in ("qwen2.5-coder:7b", "qwen3-coder:30b", "deepseek-r1:32b", "gemma3:4b"):
            shown = await client.show(model)
            assert ("insert" in shown.capabilities) == (".Suffix" in shown.template), model
            assert ("tools" in shown.capabilities) == (".Tools" in shown.template), model
            assert ("thinking" in shown.capabilities) == ("<think>" in shown.template), model
        assert "insert" in (await client.show("qwen2.5-coder:7b")).capabilities


async def test_ps_reports_expiry_from_keep_alive_and_names_in_short_form(node):
    fake, client = node
    assert (await client.ps()).models == []
    await client.chat(model="registry.ollama.ai/library/LLama3.2", messages=ASK, keep_alive="10m")
    await client.chat(model=THINKER, messages=ASK, keep_alive=-1)
    [forever, ten] = (await client.ps()).models
    assert (forever.name, ten.name) == (THINKER, PLAIN)  # the longest time left first
    left = ten.expires_at - datetime.now(UTC)
    assert timedelta(minutes=9) < left <= timedelta(minutes=10)
    assert forever.expires_at.year > 2200
    assert ten.size_vram == ten.size > 0 and ten.context_length == 4096 and ten.details.family == "llama"


async def test_keep_alive_zero_unloads_and_the_model_leaves_ps(node):
    fake, client = node
    await client.generate(model=PLAIN, prompt="hi")
    assert [m.model for m in (await client.ps()).models] == [PLAIN]
    gone = await client.generate(model=PLAIN, prompt="", keep_alive=0)
    assert gone.done and gone.done_reason == "unload" and gone.response == ""

    async def listed():
        return [m.model for m in (await client.ps()).models]

    async def left():
        return await listed() == []

    await eventually(left, what="the model to leave /api/ps")  # the unload is asynchronous
    loaded = await client.chat(model=PLAIN, messages=[])
    assert loaded.done_reason == "load" and await listed() == [PLAIN]
    await client.chat(model=PLAIN, messages=ASK, keep_alive=0)  # the job itself unloads when it ends
    assert await listed() == []


async def test_a_cold_model_pays_its_load_time_and_a_warm_one_does_not(node):
    fake, client = node
    fake.script.load_delay_s = 0.3
    cold = await client.generate(model=PLAIN, prompt="hi")
    warm = await client.generate(model=PLAIN, prompt="hi")
    assert cold.load_duration >= 0.3e9 > warm.load_duration
    fake.script.busy = True  # a full queue refuses only what would have to load first
    await client.generate(model=PLAIN, prompt="hi")
    with pytest.raises(ollama.ResponseError) as busy:
        await client.generate(model=THINKER, prompt="hi")
    assert (busy.value.status_code, busy.value.error) == (503, BUSY)


async def test_embed_returns_unit_vectors_and_a_chat_model_cannot_embed(node):
    _, client = node
    out = await client.embed(model="nomic-embed-text", input=["first", "second"])
    assert isinstance(out, ollama.EmbedResponse) and out.model == "nomic-embed-text"
    assert [len(v) for v in out.embeddings] == [768, 768]
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in out.embeddings)
    assert out.prompt_eval_count > 0 and out.load_duration > 0
    short = await client.embed(model=EMBEDDER, input="first", dimensions=64)
    assert len(short.embeddings[0]) == 64
    legacy = await client.embeddings(model=EMBEDDER, prompt="first")
    assert isinstance(legacy, ollama.EmbeddingsResponse) and len(legacy.embedding) == 768
    with pytest.raises(ollama.ResponseError) as refused:
        await client.embed(model=PLAIN, input="x")
    assert (refused.value.status_code, refused.value.error) == (
        501,
        "This server does not support embeddings. Start it with `--embeddings`",
    )
    with pytest.raises(ollama.ResponseError) as refused:
        await client.chat(model=EMBEDDER, messages=ASK)
    assert (refused.value.status_code, refused.value.error) == (400, '"nomic-embed-text:latest" does not support chat')


async def test_errors_carry_ollamas_status_and_text(node):
    fake, client = node
    for call in (client.chat(model="qwen9:7b", messages=ASK), client.generate(model="qwen9:7b", prompt="x")):
        with pytest.raises(ollama.ResponseError) as missing:
            await call
        assert (missing.value.status_code, missing.value.error) == (404, "model 'qwen9:7b' not found")
    with pytest.raises(ollama.ResponseError) as missing:
        await client.embed(model="qwen9:7b", input="x")
    assert missing.value.error == 'model "qwen9:7b" not found, try pulling it first'
    cases = [
        ("/api/chat", b"", 400, "missing request body"),
        ("/api/chat", b'{"model": ', 400, "unexpected EOF"),
        ("/api/chat", b"{model}", 400, "invalid character 'm' looking for beginning of object key string"),
        ("/api/chat", b"{}", 400, "model is required"),
        ("/api/generate", b"{}", 404, "model '' not found"),
        (
            "/api/chat",
            b'{"model": 5}',
            400,
            "json: cannot unmarshal number into Go struct field ChatRequest.model of type string",
        ),
        (
            "/api/chat",
            json.dumps({"model": PLAIN, "messages": ASK, "keep_alive": "300"}).encode(),
            400,
            'time: missing unit in duration "300"',
        ),
        (
            "/api/chat",
            json.dumps({"model": PLAIN, "think": "lots"}).encode(),
            400,
            'invalid think value: "lots" (must be "high", "medium", "low", "max", true, or false)',
        ),
        ("/api/chat", json.dumps({"model": "bad name!", "messages": ASK}).encode(), 400, "invalid model name"),
        (
            "/api/generate",
            json.dumps({"model": PLAIN, "prompt": "hi", "format": "xml"}).encode(),
            500,
            'invalid format: "\\"xml\\""; expected "json" or a valid JSON Schema object',
        ),
    ]
    async with aiohttp.ClientSession() as session:
        for path, body, status, message in cases:
            async with session.post(fake.url + path, data=body) as resp:
                assert (resp.status, await resp.json()) == (status, {"error": message}), body
        async with session.get(fake.url + "/api/version") as resp:
            assert [int(p) for p in (await resp.json())["version"].split(".")] >= [0, 12, 4]
        async with session.head(fake.url + "/") as head, session.get(fake.url + "/") as root:
            assert head.status == 200 and await root.text() == "Ollama is running"
        async with session.post(fake.url + "/api/tags") as wrong:
            assert (wrong.status, await wrong.text()) == (405, "405 method not allowed")


async def test_a_model_needs_no_tag_and_no_registry_prefix_and_ignores_case(node):
    fake, client = node
    for name in ("llama3.2", "LLAMA3.2:Latest", "registry.ollama.ai/library/llama3.2:latest"):
        reply = await client.chat(model=name, messages=ASK)
        assert reply.model == name and reply.message.content  # the name is echoed as asked
    assert [m.model for m in (await client.ps()).models] == [PLAIN]  # one model, in short form


async def test_a_client_that_leaves_mid_stream_ends_the_generation_without_a_traceback(fakes, caplog):
    """A router aborting a preempted or deleted job is routine: the simulator (also `make run`'s
    demo nodes) stops generating and logs no "Error handling request" traceback for it."""
    fake = await fakes(PLAIN, tokens=200, token_delay_s=0.02)
    async with aiohttp.ClientSession() as session:
        async with session.post(fake.url + "/api/chat", json={"model": PLAIN, "messages": ASK}) as resp:
            assert json.loads(await resp.content.readline())["done"] is False
            resp.connection.transport.abort()  # gone, as an aborted request goes
        await eventually(lambda: fake.disconnects == 1, what="the simulator to see the client leave")
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records]


async def test_a_client_that_leaves_releases_its_runner_at_once_and_the_unload_follows(fakes):
    """Ollama cancels a request's context when its client closes the connection: the generation
    stops then, not at its next token, so an unload asked right after frees the VRAM at once (a
    slow model's next token can be seconds away; the router's unload check waits 2 s in tests)."""
    fake = await fakes(PLAIN, tokens=100, token_delay_s=30)
    client = ollama.AsyncClient(host=fake.url)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(fake.url + "/api/chat", json={"model": PLAIN, "messages": ASK}) as resp:
                assert json.loads(await resp.content.readline())["done"] is False
                resp.connection.transport.abort()
            await eventually(lambda: fake.disconnects == 1, 5, what="the simulator to see the client leave")
        gone = await client.generate(model=PLAIN, prompt="", keep_alive=0)
        assert gone.done_reason == "unload"

        async def left():
            return not (await client.ps()).models

        await eventually(left, 5, what="the model to leave /api/ps (no request holds it now)")
    finally:
        await client.close()
