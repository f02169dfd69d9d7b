"""The Ollama client against aioresponses: streaming, errors mid-stream, 404/500, unload, ps."""

import json

import aiohttp
import pytest
from aioresponses import aioresponses

from gpuq.errors import OllamaError
from gpuq.ollama import OllamaClient

URL = "http://node-1:11434"


def ndjson(*objs) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def chunk(text):
    return {"model": "m", "created_at": "2026-11-29T08:00:00Z", "message": {"role": "assistant", "content": text}, "done": False}


FINAL = {"model": "m", "created_at": "2026-11-29T08:00:01Z", "message": {"role": "assistant", "content": ""},
         "done": True, "done_reason": "stop", "eval_count": 2, "eval_duration": 1000, "total_duration": 5000}


@pytest.fixture
async def client():
    async with aiohttp.ClientSession() as session:
        yield OllamaClient(URL, session, stall_timeout_s=5)


async def collect(client, **kw):
    return [c async for c in client.chat("m", "hi", **kw)]


async def test_streams_chunks_and_sends_keep_alive_zero(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body=ndjson(chunk("Hel"), chunk("lo"), FINAL),
               content_type="application/x-ndjson")
        chunks = await collect(client)
        sent = m.requests[("POST", aiohttp.client.URL(f"{URL}/api/chat"))][0].kwargs["json"]
    assert "".join(c["message"]["content"] for c in chunks) == "Hello"
    assert chunks[-1]["done"] is True and chunks[-1]["eval_count"] == 2
    assert sent["keep_alive"] == 0 and sent["stream"] is True
    assert sent["messages"] == [{"role": "user", "content": "hi"}]


async def test_format_is_sent_for_structured_output(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body=ndjson(FINAL))
        await collect(client, fmt={"type": "object"})
        sent = m.requests[("POST", aiohttp.client.URL(f"{URL}/api/chat"))][0].kwargs["json"]
    assert sent["format"] == {"type": "object"}


async def test_error_line_mid_stream_raises_ollamas_message(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body=ndjson(chunk("a"), {"error": "model runner has unexpectedly stopped"}))
        with pytest.raises(OllamaError) as exc:
            await collect(client)
    assert exc.value.message == "model runner has unexpectedly stopped"


async def test_stream_without_done_is_an_error(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body=ndjson(chunk("a"), chunk("b")))
        with pytest.raises(OllamaError, match="without done: true"):
            await collect(client)


@pytest.mark.parametrize("status,message", [
    (404, "model 'x' not found"),
    (500, "llama-server reported out-of-memory during startup: ..."),
    (503, "server busy, please try again.  maximum pending requests exceeded"),
])
async def test_http_errors_keep_status_and_message(client, status, message):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", status=status, payload={"error": message})
        with pytest.raises(OllamaError) as exc:
            await collect(client)
    assert (exc.value.status, exc.value.message) == (status, message)


async def test_connection_refused_names_the_node(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", exception=aiohttp.ClientConnectionError("refused"))
        with pytest.raises(OllamaError, match="failed"):
            await collect(client)


async def test_unload_sends_empty_messages_with_keep_alive_zero(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", payload={"model": "m", "done": True, "done_reason": "unload",
                                           "message": {"role": "assistant", "content": ""}})
        await client.unload("m")
        sent = m.requests[("POST", aiohttp.client.URL(f"{URL}/api/chat"))][0].kwargs["json"]
    assert sent == {"model": "m", "messages": [], "keep_alive": 0}


async def test_unload_of_missing_model_is_404(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", status=404, payload={"error": "model 'm' not found"})
        with pytest.raises(OllamaError) as exc:
            await client.unload("m")
    assert exc.value.status == 404


async def test_ps_and_tags_normalise_names(client):
    with aioresponses() as m:
        m.get(f"{URL}/api/ps", payload={"models": [{"name": "llama3.2:latest", "model": "llama3.2:latest"}]})
        m.get(f"{URL}/api/tags", payload={"models": [{"name": "mistral", "model": "mistral"}]})
        m.get(f"{URL}/api/version", payload={"version": "0.33.0"})
        assert await client.loaded() == {"llama3.2:latest"}
        assert await client.installed() == {"mistral:latest"}
        assert await client.version() == "0.33.0"


async def test_ps_500_is_an_error(client):
    with aioresponses() as m:
        m.get(f"{URL}/api/ps", status=500, body="boom")
        with pytest.raises(OllamaError) as exc:
            await client.loaded()
    assert exc.value.status == 500
