"""Open WebUI and Continue through the front door, replayed from their own source: the requests
they send (headers and bodies, byte for byte where it matters) and the way they read the answer
(their NDJSON and SSE line splitting, the fields they index into), against the real daemon and
the simulated nodes. Neither can be run here, so each replayed request names the client file it
comes from: Open WebUI 0.12.4 (PyPI wheel, open_webui/...), Continue at d0a3c0b (core/...)."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime

import aiohttp
import pytest
from conftest import eventually
from test_front import CHAT_MODEL, EMBED_MODEL, start_front_lab

TOKEN = "s3cret"
FIM_MODEL = "qwen2.5-coder:7b"  # its template has .Suffix: Continue autocompletes with FIM


@pytest.fixture
async def front(fakes, daemon_factory):
    lab = await start_front_lab(fakes, daemon_factory, token=TOKEN)
    yield lab
    await lab.close()


def bearer(**extra: str) -> dict:
    return {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}", **extra}


async def lines_of(resp: aiohttp.ClientResponse) -> list[str]:
    """The body split on '\\n' as it arrives, as both clients do (Open WebUI's
    utils/misc.py stream_chunks_handler, Continue's `buffer.split("\\n")` in Ollama.ts)."""
    buffer, lines = "", []
    async for data in resp.content.iter_any():
        buffer += data.decode()
        *done, buffer = buffer.split("\n")
        lines.extend(done)
    return lines + ([buffer] if buffer else [])


async def router_request(front, method: str, path: str):
    return await front.daemon.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"})


async def router_get(front, path: str):
    status, body = await router_request(front, "GET", path)
    assert status == 200, (status, body)
    return body


async def first_job(front, prompt: str, state: str) -> dict | None:
    return next((j for j in await all_jobs(front) if j["prompt_excerpt"] == prompt and j["state"] == state), None)


async def all_jobs(front) -> list[dict]:
    return (await router_get(front, "/api/jobs?limit=1000"))["jobs"]


async def done_job(front, prompt: str) -> dict:
    return await eventually(lambda: first_job(front, prompt, "done"), 15, what=f"a done job with prompt {prompt!r}")


async def job_detail(front, prompt: str) -> dict:
    return await router_get(front, f"/api/jobs/{(await done_job(front, prompt))['id']}")


# -- Open WebUI, Ollama connection (OLLAMA_BASE_URL, key = the token) ---------------------------


async def test_open_webui_connection_check_and_model_list(front):
    session = front.daemon.session
    # routers/ollama.py verify_connection (l. 241) and get_ollama_versions (l. 551): GET
    # /api/version with the connection's key as Bearer (utils/headers.py l. 220); the lowest
    # version wins, parsed as ints after stripping a 'v' and any '-suffix' (l. 592).
    async with session.get(front.url + "/api/version", headers=bearer()) as r:
        assert r.status == 200
        version = (await r.json())["version"]
    assert tuple(map(int, re.sub(r"^v|-.*", "", version).split(".")))

    # routers/ollama.py send_get_request (l. 67) -> get_all_models (l. 382): GET /api/tags with
    # Content-Type: application/json, read by aiohttp's r.json() (which insists on a JSON
    # content type, else the connection counts as failed); merge_models_lists (l. 347) keys by
    # 'model', and utils/models.py fetch_ollama_models (l. 59) indexes 'model' and 'name'.
    async with session.get(front.url + "/api/tags", headers=bearer()) as r:
        tags = await r.json()
    listed = [{"id": m["model"], "name": m["name"]} for m in tags["models"]]
    assert {m["id"] for m in listed} == {CHAT_MODEL, "llama3.2:latest", EMBED_MODEL}

    # get_ollama_loaded_models (l. 509): GET /api/ps, its 'model' and 'expires_at' read by
    # datetime.fromisoformat to mark a model loaded. Loaded while a call runs:
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.05, 100
    async with session.post(
        front.url + "/api/chat",
        headers=bearer(),
        data=json.dumps(
            {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "keep it busy"}], "stream": True}
        ),
    ) as busy:
        await eventually(lambda: fake.in_flight == 1, what="the call to run")
        async with session.get(front.url + "/api/ps", headers=bearer()) as r:
            loaded = await r.json()
        expires = {m["model"]: int(datetime.fromisoformat(m["expires_at"]).timestamp()) for m in loaded["models"]}
        assert list(expires) == [CHAT_MODEL]
        fake.script.token_delay_s = 0
        await lines_of(busy)

    # show_model_info (l. 865): POST /api/show {"model": id} (ModelNameForm, exclude_none).
    async with session.post(front.url + "/api/show", headers=bearer(), data=json.dumps({"model": CHAT_MODEL})) as r:
        shown = await r.json()
    assert r.status == 200 and shown["capabilities"] and shown["model_info"]


async def test_open_webui_chat_streams_as_it_reads_it(front):
    # utils/chat.py l. 293: convert_payload_openai_to_ollama (utils/payload.py l. 379) makes the
    # body: model, messages, stream, the chat's params as options (apply_params_to_form_data,
    # l. 105), keep_alive and think lifted to the top; metadata is popped by
    # routers/ollama.py generate_chat_completion (l. 1131) before it POSTs /api/chat (l. 1196).
    body = {
        "model": CHAT_MODEL,
        "stream": True,
        "messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "owui says hello"}],
        "options": {"temperature": 0.7, "num_ctx": 4096, "num_predict": None},
        "keep_alive": "5m",
    }
    async with front.daemon.session.post(front.url + "/api/chat", headers=bearer(), data=json.dumps(body)) as r:
        assert r.status == 200  # send_request raises on not r.ok and reads {"error"}
        lines = [line for line in await lines_of(r) if line.strip()]
    # utils/response.py convert_streaming_response_ollama_to_openai (l. 232): every line
    # json-loaded; message.content/thinking/tool_calls, done, done_reason; usage from the last
    # line as int(prompt_eval_count), eval_count / eval_duration (convert_ollama_usage_to_openai).
    text, finish, usage = "", None, None
    for line in lines:
        data = json.loads(line)
        message = data.get("message") or {}
        text += message.get("content") or ""
        if data.get("done"):
            finish = data.get("done_reason")
            usage = {
                "prompt_tokens": int(data.get("prompt_eval_count", 0)),
                "completion_tokens": int(data.get("eval_count", 0)),
                "tokens_per_s": data["eval_count"] / (data["eval_duration"] / 1e9),
            }
    assert finish == "stop" and usage["completion_tokens"] > 0 and usage["prompt_tokens"] > 0
    detail = await job_detail(front, "owui says hello")
    assert detail["output"] == text
    sent = [
        b
        for b in front.fakes["node-1"].requests
        if b.get("messages") and b["messages"][-1]["content"] == "owui says hello"
    ][-1]
    assert sent["options"] == {"temperature": 0.7, "num_ctx": 4096} and sent["keep_alive"] == 300  # its "5m"

    # Native tool calling: after running a tool, convert_messages_openai_to_ollama (payload.py
    # l. 300) sends the assistant's calls with index, id and arguments as an object, content "",
    # and the result as role "tool" with its tool_call_id; tools go as given.
    messages = [
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
            ],
            "content": "",
        },
        {"role": "tool", "content": "rain, 8C", "tool_call_id": "call_1"},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "weather now",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    async with front.daemon.session.post(
        front.url + "/api/chat",
        headers=bearer(),
        data=json.dumps({"model": CHAT_MODEL, "messages": messages, "tools": tools, "stream": True}),
    ) as r:
        assert r.status == 200
        assert json.loads([line for line in await lines_of(r) if line][-1])["done"]
    sent = [b for b in front.fakes["node-1"].requests if b.get("tools")][-1]
    assert sent["messages"] == messages and sent["tools"] == tools


async def test_open_webui_title_generation_is_one_json_reply(front):
    # routers/tasks.py generate_title (payload l. 188): stream False, one user message, the task
    # model's max_tokens (1000) moved to options.num_predict by convert_payload_openai_to_ollama.
    body = {
        "model": CHAT_MODEL,
        "stream": False,
        "options": {"num_predict": 1000},
        "messages": [{"role": "user", "content": "### Task:\nGenerate a concise title"}],
    }
    async with front.daemon.session.post(front.url + "/api/chat", headers=bearer(), data=json.dumps(body)) as r:
        # routers/ollama.py send_request (l. 92), stream=False: `await r.json()`; any exception
        # there (a content type aiohttp does not take for JSON) silently becomes None.
        reply = await r.json()
    # utils/response.py convert_response_ollama_to_openai (l. 210)
    assert reply["message"]["content"].strip() and reply["done_reason"] == "stop"
    assert int(reply.get("eval_count", 0)) == len(reply["message"]["content"].split())
    assert r.headers["X-Gpuq-Job"]


async def test_open_webui_embeddings_and_unload(front):
    # retrieval/utils.py agenerate_ollama_batch_embeddings (l. 1070): POST /api/embed
    # {"input": texts, "model", "truncate": true}; reads data['embeddings'].
    body = {"input": ["owui chunk one", "owui chunk two"], "model": EMBED_MODEL, "truncate": True}
    async with front.daemon.session.post(front.url + "/api/embed", headers=bearer(), json=body) as r:
        assert r.status == 200
        data = await r.json()
    assert len(data["embeddings"]) == 2 and all(isinstance(x, float) for x in data["embeddings"][0])
    job = await done_job(front, "owui chunk one\nowui chunk two")
    assert job["kind"] == "embed"

    # routers/ollama.py unload_model (l. 607): POST /api/generate {"model", "keep_alive": 0,
    # "prompt": ""} per node that has it; answered at once, no job.
    before = len(await all_jobs(front))
    async with front.daemon.session.post(
        front.url + "/api/generate",
        headers=bearer(),
        data=json.dumps({"model": CHAT_MODEL, "keep_alive": 0, "prompt": ""}),
    ) as r:
        assert r.status == 200 and (await r.json())["done_reason"] == "unload"
    assert len(await all_jobs(front)) == before


async def test_open_webui_hears_why_a_model_it_cannot_run_is_not_offered(front):
    # Open WebUI offers every model /api/tags lists (fetch_ollama_models); deepseek-r1:32b is on
    # node-2, which takes critiques only, so it is not listed. A chat naming it anyway fails as
    # send_request reads it (l. 92): HTTPException(status, detail=res['error']), shown as is.
    async with front.daemon.session.get(front.url + "/api/tags", headers=bearer()) as r:
        assert "deepseek-r1:32b" not in [m["model"] for m in (await r.json())["models"]]
    async with front.daemon.session.post(
        front.url + "/api/chat",
        headers=bearer(),
        data=json.dumps({"model": "deepseek-r1:32b", "messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ) as r:
        assert r.status == 404
        error = (await r.json())["error"]
    assert error.startswith("model 'deepseek-r1:32b' not found") and "only node-2 has it" in error
    assert await all_jobs(front) == []


# -- Open WebUI, OpenAI connection (http://host:11435/v1, key = the token) ----------------------


async def test_open_webui_openai_connection_lists_and_streams_with_usage(front):
    session = front.daemon.session
    # routers/openai.py get_models_request (l. 120): GET {url}/models; get_all_models (l. 715)
    # takes response['data'], each model's 'id' (or 'name', l. 746).
    async with session.get(front.url + "/v1/models", headers=bearer()) as r:
        ids = [m.get("id") or m.get("name") for m in (await r.json())["data"]]
    assert CHAT_MODEL in ids

    # main.py l. 1244 asks for usage on every stream; utils/middleware.py (l. 4767 on) reads
    # lines: not 'data:' -> tried as a JSON error line, else skipped; 'data:' -> JSON; a chunk
    # with usage and no choices is usage; finish_reason and delta.content otherwise.
    body = {
        "model": CHAT_MODEL,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "owui via v1"}],
    }
    async with session.post(front.url + "/v1/chat/completions", headers=bearer(), data=json.dumps(body)) as r:
        assert "text/event-stream" in r.headers["Content-Type"]
        lines = await lines_of(r)
    text, finish, usage = "", None, None
    for line in lines:
        if not line or line.isspace() or not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        data = json.loads(payload)
        usage = data.get("usage") or usage
        choices = data.get("choices", [])
        if not choices:
            assert not data.get("error")
            continue
        finish = choices[0].get("finish_reason") or finish
        text += choices[0].get("delta", {}).get("content") or ""
    assert finish == "stop" and usage["completion_tokens"] == len(text.split())
    assert (await job_detail(front, "owui via v1"))["output"] == text


# -- Continue, provider: ollama (apiBase http://host:11435, apiKey = the token) ------------------


def continue_sse(lines: list[str]) -> list[dict]:
    """The events as Continue's streamSse reads them (packages/fetch/src/stream.ts l. 111-124): up
    to "data: [DONE]" or a line starting ": ping"; an event carrying an error throws."""
    events = []
    for line in lines:
        if line.startswith(("data:[DONE]", "data: [DONE]", ": ping")):
            break
        if line.startswith("data:"):
            events.append(json.loads(line[5:].strip()))
            assert not events[-1].get("error")
    return events


def continue_headers() -> dict:
    # core/llm/llms/Ollama.ts: every call sends these two (e.g. ensureModelInfo l. 182-188).
    return {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}


async def continue_show(front, model: str) -> dict:
    """core/llm/llms/Ollama.ts ensureModelInfo (l. 173): POST /api/show {"name"}; from
    `parameters` each line matching /^(\\S+)\\s+((?:".*")|\\S+)$/, num_ctx and stop (JSON-parsed);
    FIM is assumed when the template contains ".Suffix" (l. 242)."""
    async with front.daemon.session.post(
        front.url + "/api/show", headers=continue_headers(), data=json.dumps({"name": model})
    ) as r:
        assert r.status == 200
        body = await r.json()
    info = {"stop": [], "num_ctx": None, "fim": ".Suffix" in (body.get("template") or "")}
    for line in (body.get("parameters") or "").split("\n"):
        parts = re.match(r'^(\S+)\s+((?:".*")|\S+)$', line)
        if parts and parts[1] == "num_ctx":
            info["num_ctx"] = int(parts[2])
        elif parts and parts[1] == "stop":
            info["stop"].append(json.loads(parts[2]))
    return info


async def continue_stream(front, path: str, body: dict, field: str) -> str:
    """Continue's NDJSON reading (Ollama.ts _streamComplete l. 417, _streamChat l. 496,
    _streamFim l. 657): split on "\\n", JSON.parse each non-blank line, an "error" key throws,
    else the field is yielded."""
    async with front.daemon.session.post(front.url + path, headers=continue_headers(), data=json.dumps(body)) as r:
        assert r.status == 200, await r.text()  # streamResponse: 499 returns quietly, others throw
        out = ""
        for line in await lines_of(r):
            if line.strip():
                j = json.loads(line)
                assert "error" not in j, j
                out += (j["message"]["content"] if field == "message" else j[field]) or ""
    return out


async def test_continue_lists_shows_and_chats(front):
    # Ollama.ts listModels (l. 704): GET /api/tags, data.models.map(model => model.name).
    async with front.daemon.session.get(front.url + "/api/tags", headers=continue_headers()) as r:
        names = [m["name"] for m in (await r.json())["models"]]
    assert CHAT_MODEL in names

    info = await continue_show(front, CHAT_MODEL)
    assert info["stop"] and not info["fim"]  # qwen3-coder: a chat model, no FIM template
    # _streamChat (l. 496): model, messages, options (_getModelFileParams l. 306: num_ctx is the
    # context length, 8192 unless the Modelfile says; stop from /api/show), keep_alive 1800;
    # think and stream are undefined, so JSON.stringify leaves them out (NDJSON by default).
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "continue says hi"}],
        "options": {"temperature": 0.5, "num_predict": 4096, "stop": info["stop"], "num_ctx": 8192},
        "keep_alive": 1800,
    }
    text = await continue_stream(front, "/api/chat", body, "message")
    assert text and (await job_detail(front, "continue says hi"))["output"] == text
    sent = [
        b
        for b in front.fakes["node-1"].requests
        if b.get("messages") and b["messages"][-1]["content"] == "continue says hi"
    ][-1]
    assert sent["options"]["num_ctx"] == 8192 and sent["keep_alive"] == 1800  # its 1800 s, within the cap

    # _embed (l. 730): POST api/embed {model, input: chunks}; !resp.ok throws its text, then
    # data.embeddings, an empty list throwing too.
    async with front.daemon.session.post(
        front.url + "/api/embed",
        headers=continue_headers(),
        data=json.dumps({"model": EMBED_MODEL, "input": ["continue chunk a", "continue chunk b"]}),
    ) as r:
        assert r.ok
        assert len((await r.json())["embeddings"]) == 2


async def test_continue_autocomplete_with_and_without_fim(front):
    node = front.fakes["node-3"]
    node.models.add(FIM_MODEL)  # pulled on a node: the front door learns it at the next health check

    async def listed():
        async with front.daemon.session.get(front.url + "/api/tags", headers=continue_headers()) as r:
            return FIM_MODEL in [m["name"] for m in (await r.json())["models"]]

    await eventually(listed, 10, what="the new model to be listed")

    # CompletionStreamer.ts l. 34: supportsFim() (the template has .Suffix) -> streamFim:
    # POST /api/generate {model, prompt: prefix, suffix, options, keep_alive} (Ollama.ts
    # _getGenerateOptions l. 391, _streamFim l. 657), yielding j.response.
    info = await continue_show(front, FIM_MODEL)
    assert info["fim"]
    fim = {
        "model": FIM_MODEL,
        "prompt": "def add(a, b):\n    ",
        "suffix": "\n\nprint(add(1, 2))\n",
        "options": {"temperature": 0.01, "num_predict": 256, "stop": info["stop"], "num_ctx": 8192},
        "keep_alive": 1800,
    }
    completed = await continue_stream(front, "/api/generate", fim, "response")
    assert completed
    sent = [b for b in node.requests if b.get("suffix")][-1]
    assert sent["suffix"] == fim["suffix"] and sent["prompt"] == fim["prompt"]

    # Otherwise streamComplete(prompt, {raw: true}): the prompt already templated by Continue.
    raw = {
        "model": CHAT_MODEL,
        "prompt": "<|fim_prefix|>def sub(a, b):\n    <|fim_suffix|><|fim_middle|>",
        "raw": True,
        "options": {"temperature": 0.01, "num_predict": 256, "num_ctx": 8192},
        "keep_alive": 1800,
    }
    assert await continue_stream(front, "/api/generate", raw, "response")
    assert [b for b in front.fakes["node-1"].requests if b.get("raw")][-1]["raw"] is True


async def test_continue_hears_why_its_waiting_call_was_deleted(front):
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.05, 400
    hold = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hold the node"}], "keep_alive": 1800}
    holding = asyncio.create_task(continue_stream(front, "/api/chat", hold, "message"))
    await eventually(lambda: fake.in_flight == 1, what="a call to hold the node")

    async def waiting_call():
        # packages/fetch/src/stream.ts streamResponse (l. 10): a 499 returns quietly (Continue's
        # own abort: the chat shows nothing), any other non-200 throws its body's text.
        body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "continue waits"}], "keep_alive": 1800}
        async with front.daemon.session.post(
            front.url + "/api/chat", headers=continue_headers(), data=json.dumps(body)
        ) as r:
            return r.status, await r.text()

    call = asyncio.create_task(waiting_call())
    job = await eventually(lambda: first_job(front, "continue waits", "queued"), what="the call to queue")
    status, _ = await router_request(front, "DELETE", f"/api/jobs/{job['id']}")
    assert status == 200
    status, text = await call
    assert status not in (200, 499)  # Continue would show an empty reply and never say why
    assert json.loads(text)["error"] == f"gpuq job {job['id']} was deleted by admin (api 127.0.0.1): request canceled"
    fake.script.token_delay_s = 0
    await holding


async def test_continue_tool_result_round_trip_reaches_the_node(front):
    # The simulator never emits tool calls itself, so this replays Continue's second leg only:
    # _convertToOllamaMessage (Ollama.ts l. 324) sends the assistant's calls as
    # {function: {name, arguments: object}} (no id, no index), the result as role "tool";
    # tools go only when the last message is the user's (l. 514), so none here.
    messages = [
        {"role": "user", "content": "what is the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "sunny, 21C"},
    ]
    body = {"model": CHAT_MODEL, "messages": messages, "keep_alive": 1800, "options": {"num_ctx": 8192}}
    text = await continue_stream(front, "/api/chat", body, "message")
    assert text
    sent = [b for b in front.fakes["node-1"].requests if b.get("messages") and b["messages"][-1].get("role") == "tool"][
        -1
    ]
    assert sent["messages"] == messages


# -- Continue, provider: openai (apiBase http://host:11435/v1) ----------------------------------


async def test_continue_openai_provider_lists_and_streams(front):
    # core/llm/llms/OpenAI.ts _getHeaders (l. 373): Bearer and an "api-key" header (for Azure).
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}", "api-key": TOKEN}
    # listModels (l. 690): data.data ?? data, each m.id.
    async with front.daemon.session.get(front.url + "/v1/models", headers=headers) as r:
        assert CHAT_MODEL in [m["id"] for m in (await r.json())["data"]]
    # toChatBody (core/llm/openaiTypeConverters.ts l. 210): stream defaults to true, no
    # stream_options; streamSse (packages/fetch/src/stream.ts parseSseLine l. 111, streamSse
    # l. 124) stops at "data: [DONE]" and also at a line starting ": ping"; an "error" throws.
    body = {
        "model": CHAT_MODEL,
        "messages": [{"role": "user", "content": "continue via v1"}],
        "max_tokens": 4096,
        "temperature": 0.5,
        "stream": True,
    }
    async with front.daemon.session.post(
        front.url + "/v1/chat/completions", headers=headers, data=json.dumps(body)
    ) as r:
        assert r.status == 200
        lines = await lines_of(r)
    text = ""
    for data in continue_sse(lines):
        delta = (data.get("choices") or [{}])[0].get("delta") or {}
        text += delta.get("content") or ""
    assert text and (await job_detail(front, "continue via v1"))["output"] == text

    # Autocomplete on this provider: supportsFim() is false (core/llm/index.ts l. 108), so
    # CompletionStreamer streams with raw: true, which _streamChat (OpenAI.ts l. 515) sends to
    # the legacy /completions (_legacystreamComplete l. 488): _convertArgs without messages,
    # the prompt, stream: true; each event's choices[0].text is yielded.
    body = {
        "model": CHAT_MODEL,
        "max_tokens": 256,
        "temperature": 0.01,
        "stream": True,
        "stop": ["\n\n", "```"],
        "prompt": "<|fim_prefix|>def mul(a, b):\n    <|fim_suffix|><|fim_middle|>",
    }
    async with front.daemon.session.post(front.url + "/v1/completions", headers=headers, data=json.dumps(body)) as r:
        assert r.status == 200
        lines = await lines_of(r)
    completed = ""
    for value in continue_sse(lines):
        if (value.get("choices") or [{}])[0].get("text") and value.get("finish_reason") != "eos":
            completed += value["choices"][0]["text"]
    assert completed
    sent = [b for b in front.fakes["node-1"].requests if b.get("prompt", "").startswith("<|fim_prefix|>def mul")][-1]
    assert sent["options"]["stop"] == ["\n\n", "```"] and sent["options"]["num_predict"] == 256
