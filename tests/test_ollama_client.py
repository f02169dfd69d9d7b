"""The Ollama client against aioresponses: streaming, errors mid-stream, 404/500, unload, ps."""

import errno
import json
import socket

import aiohttp
import pytest
from aioresponses import aioresponses

from gpuq.errors import OllamaError, OllamaUnreachable
from gpuq.node.ollama import OllamaClient

URL = "http://node-1:11434"


def ndjson(*objs) -> str:
    return "".join(json.dumps(o) + "\n" for o in objs)


def chunk(text):
    return {
        "model": "m",
        "created_at": "2026-11-29T08:00:00Z",
        "message": {"role": "assistant", "content": text},
        "done": False,
    }


FINAL = {
    "model": "m",
    "created_at": "2026-11-29T08:00:01Z",
    "message": {"role": "assistant", "content": ""},
    "done": True,
    "done_reason": "stop",
    "eval_count": 2,
    "eval_duration": 1000,
    "total_duration": 5000,
}


@pytest.fixture
async def client():
    async with aiohttp.ClientSession() as session:
        yield OllamaClient(URL, session, stall_timeout_s=5)


async def collect(client, **kw):
    return [c async for c in client.chat("m", "hi", **kw)]


async def test_streams_chunks_and_sends_keep_alive_zero(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body=ndjson(chunk("Hel"), chunk("lo"), FINAL), content_type="application/x-ndjson")
        chunks = await collect(client)
        sent = json.loads(m.requests[("POST", aiohttp.client.URL(f"{URL}/api/chat"))][0].kwargs["data"])
    assert "".join(c["message"]["content"] for c in chunks) == "Hello"
    assert chunks[-1]["done"] is True and chunks[-1]["eval_count"] == 2
    assert sent["keep_alive"] == 0 and sent["stream"] is True
    assert sent["messages"] == [{"role": "user", "content": "hi"}]


async def test_format_is_sent_for_structured_output(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body=ndjson(FINAL))
        await collect(client, fmt={"type": "object"})
        sent = json.loads(m.requests[("POST", aiohttp.client.URL(f"{URL}/api/chat"))][0].kwargs["data"])
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


@pytest.mark.parametrize(
    "status,message",
    [
        (404, "model 'x' not found"),
        (500, "llama-server reported out-of-memory during startup: ..."),
        (503, "server busy, please try again.  maximum pending requests exceeded"),
    ],
)
async def test_http_errors_keep_status_and_message(client, status, message):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", status=status, payload={"error": message})
        with pytest.raises(OllamaError) as exc:
            await collect(client)
    assert (exc.value.status, exc.value.message) == (status, message)


async def test_a_connection_that_breaks_names_the_node_its_url_and_the_failure(named):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", exception=aiohttp.ServerDisconnectedError("Server disconnected"))
        with pytest.raises(OllamaError) as exc:
            await collect(named)
    assert exc.value.message == f"request to node node-1 at {URL} failed: Server disconnected"
    assert not isinstance(exc.value, OllamaUnreachable)  # it answered the connect: not down


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): a connect is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "call",
    [
        lambda c: collect(c),  # the chat stream
        lambda c: c.version(),  # a health check
        lambda c: c.loaded(),  # an unload check
    ],
)
async def test_a_node_that_refuses_the_connection_is_unreachable_naming_node_and_url(call):
    url = f"http://127.0.0.1:{closed_port()}"
    async with aiohttp.ClientSession() as session:
        client = OllamaClient(url, session, name="node-7", connect_timeout_s=2)
        with pytest.raises(OllamaUnreachable) as exc:
            await call(client)
    assert exc.value.message.startswith(f"cannot connect to node node-7 at {url}: ")
    assert f"[Errno {errno.ECONNREFUSED}]" in exc.value.message
    assert exc.value.status is None


async def test_unload_sends_empty_messages_with_keep_alive_zero(client):
    with aioresponses() as m:
        m.post(
            f"{URL}/api/chat",
            payload={
                "model": "m",
                "done": True,
                "done_reason": "unload",
                "message": {"role": "assistant", "content": ""},
            },
        )
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


# -- replies of the wrong shape: an OllamaError naming the node and what was wrong ------------


@pytest.fixture
async def named():
    async with aiohttp.ClientSession() as session:
        yield OllamaClient(URL, session, name="node-1", stall_timeout_s=5)


@pytest.mark.parametrize(
    "line,message",
    [
        ("[1,2]", "node-1 sent a chat line that is a JSON array, not an object: [1,2]"),
        ("42", "node-1 sent a chat line that is a JSON number, not an object: 42"),
        ('"done"', 'node-1 sent a chat line that is a JSON string, not an object: "done"'),
        (
            '{"message": "str", "done": false}',
            "node-1 sent a chat line whose 'message' is a JSON string, not an object",
        ),
        (
            '{"message": {"content": 5}, "done": false}',
            "node-1 sent a chat line whose 'message.content' is a JSON number, not a string",
        ),
        (
            '{"response": ["a"], "done": false}',
            "node-1 sent a chat line whose 'response' is a JSON array, not a string",
        ),
        (
            '{"message": {"content": "a"}, "done": "yes"}',
            "node-1 sent a chat line whose 'done' is a JSON string, not a boolean",
        ),
        (
            '{"message": {"content": ""}, "done": true, "eval_count": "259"}',
            "node-1 sent a chat line whose 'eval_count' is a JSON string, not a whole number",
        ),
        (
            '{"message": {"content": ""}, "done": true, "total_duration": true}',
            "node-1 sent a chat line whose 'total_duration' is a JSON boolean, not a whole number",
        ),
        ("{not json", "node-1 sent a chat line that is not JSON: b'{not json'"),
        (
            '{"message": {"content": "a\\ud800b"}, "done": false}',
            "node-1 sent a chat line whose 'message.content' holds a lone surrogate (\\ud800), not text",
        ),
        (
            '{"message": {"content": "", "thinking": "\\udc00"}, "done": false}',
            "node-1 sent a chat line whose 'message.thinking' holds a lone surrogate (\\udc00), not text",
        ),
    ],
)
async def test_a_chat_line_of_the_wrong_shape_names_the_node_and_the_fault(named, line, message):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body=ndjson(chunk("a")) + line + "\n")
        chunks = []
        with pytest.raises(OllamaError) as exc:
            async for c in named.chat("m", "hi"):
                chunks.append(c)
    assert [c["message"]["content"] for c in chunks] == ["a"]  # the good chunk before it got through
    assert exc.value.message == message


async def test_a_line_nested_too_deeply_for_python_is_not_json_to_the_router(named):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body="[" * 50_000 + "]" * 50_000 + "\n")
        with pytest.raises(OllamaError, match="^node-1 sent a chat line that is not JSON: b'\\[\\[\\["):
            await collect(named)


async def test_a_line_over_the_limit_fails_cleanly_naming_the_limit(named):
    huge = json.dumps(chunk("x" * 300_000))
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body=ndjson(chunk("a")) + huge + "\n" + ndjson(FINAL))
        with pytest.raises(OllamaError) as exc:
            await collect(named)
    assert exc.value.message == "node-1 sent a chat line longer than 131072 bytes, the most the router reads"


async def test_a_wrong_shape_names_the_url_when_the_client_has_no_name(client):
    with aioresponses() as m:
        m.post(f"{URL}/api/chat", body="[]\n")
        with pytest.raises(OllamaError) as exc:
            await collect(client)
    assert exc.value.message == f"{URL} sent a chat line that is a JSON array, not an object: []"


@pytest.mark.parametrize(
    "path,call,body,message",
    [
        ("/api/version", "version", '{"v": "1"}', 'node-1 sent /api/version without a \'version\' string: {"v": "1"}'),
        (
            "/api/version",
            "version",
            '{"version": 33}',
            "node-1 sent /api/version without a 'version' string: {\"version\": 33}",
        ),
        ("/api/version", "version", '"0.33.0"', "node-1 sent /api/version as a JSON string, not an object"),
        (
            "/api/tags",
            "installed",
            '{"models": [{"model": "m"}]}',
            'node-1 sent an /api/tags entry without a \'name\' string: {"model": "m"}',
        ),
        (
            "/api/tags",
            "installed",
            '{"models": ["m"]}',
            "node-1 sent an /api/tags entry without a 'name' string: \"m\"",
        ),
        (
            "/api/tags",
            "installed",
            '{"models": {"name": "m"}}',
            "node-1 sent /api/tags whose 'models' is a JSON object, not an array",
        ),
        ("/api/ps", "loaded", "[]", "node-1 sent /api/ps as a JSON array, not an object"),
        ("/api/ps", "loaded", "null", "node-1 sent /api/ps as a JSON null, not an object"),
        (
            "/api/ps",
            "loaded",
            '{"models": [{"name": null}]}',
            "node-1 sent an /api/ps entry without a 'name' string: {\"name\": null}",
        ),
    ],
)
async def test_a_health_answer_of_the_wrong_shape_names_the_node_and_the_fault(named, path, call, body, message):
    with aioresponses() as m:
        m.get(f"{URL}{path}", body=body, content_type="application/json")
        with pytest.raises(OllamaError) as exc:
            await getattr(named, call)()
    assert exc.value.message == message


async def test_an_empty_model_list_may_be_null_as_go_encodes_it(named):
    with aioresponses() as m:
        m.get(f"{URL}/api/ps", payload={"models": None})
        m.get(f"{URL}/api/tags", payload={})
        assert await named.loaded() == set()
        assert await named.installed() == set()


# Every call the router makes to a node: (method, path, the call)
NODE_CALLS = [
    ("POST", "/api/chat", lambda c: collect(c)),
    ("POST", "/api/generate", lambda c: c.stream("/api/generate", {"model": "m", "prompt": "hi"}).__anext__()),
    ("POST", "/api/embed", lambda c: c.post("/api/embed", {"model": "m", "input": "hi"})),
    ("GET", "/api/ps", lambda c: c.loaded()),
    ("GET", "/api/tags", lambda c: c.tags()),
    ("GET", "/api/version", lambda c: c.version()),
    ("POST", "/api/show", lambda c: c.context_length("m")),
    ("POST", "/api/chat", lambda c: c.unload("m")),
]


@pytest.mark.parametrize("method,path,call", NODE_CALLS, ids=[f"{c[1]}-{i}" for i, c in enumerate(NODE_CALLS)])
@pytest.mark.parametrize("status", [301, 302, 307, 308])
async def test_no_call_follows_a_redirect_and_the_error_names_its_target(named, method, path, call, status):
    elsewhere = "http://elsewhere:11434" + path
    with aioresponses() as m:
        m.add(URL + path, method, status=status, headers={"Location": elsewhere})
        m.add(elsewhere, method, payload={"version": "0.1", "models": [], "done": True})  # never asked
        with pytest.raises(OllamaError) as exc:
            await call(named)
        asked = [url for (_, url) in m.requests]
        sent = next(iter(m.requests.values()))[0].kwargs
    assert (
        exc.value.message
        == f"node-1 answered {status} redirect to {elsewhere}; gpuq does not follow a node's redirects"
    )
    assert [str(u) for u in asked] == [URL + path]
    assert sent["allow_redirects"] is False and sent["headers"]["Accept-Encoding"] == "identity"
    assert sent["auto_decompress"] is False


@pytest.mark.parametrize("method,path,call", NODE_CALLS, ids=[f"{c[1]}-{i}" for i, c in enumerate(NODE_CALLS)])
async def test_a_compressed_reply_is_refused_before_it_is_read(named, method, path, call):
    with aioresponses() as m:
        m.add(URL + path, method, body=b"\x1f\x8b not read", headers={"Content-Encoding": "gzip"})
        with pytest.raises(OllamaError) as exc:
            await call(named)
    assert exc.value.message == (
        f"node-1 answered {path} with Content-Encoding: gzip, though asked for identity; "
        "gpuq does not unpack a node's compressed replies"
    )


@pytest.mark.parametrize(
    "method,path,call", NODE_CALLS[3:], ids=[c[1] + "-" + str(i) for i, c in enumerate(NODE_CALLS[3:])]
)
async def test_a_reply_past_max_reply_bytes_is_refused_naming_the_cap(method, path, call):
    async with aiohttp.ClientSession() as session:
        client = OllamaClient(URL, session, name="node-1", max_reply_bytes=1000)
        with aioresponses() as m:
            m.add(URL + path, method, body=json.dumps({"models": [], "version": "x" * 1000}))
            with pytest.raises(OllamaError) as exc:
                await call(client)
    assert exc.value.message == (
        f"node-1 sent a {path} reply longer than 1000 bytes (max_reply_bytes), the most the router reads"
    )


async def test_an_error_status_with_an_endless_body_is_bounded_too():
    async with aiohttp.ClientSession() as session:
        client = OllamaClient(URL, session, name="node-1", max_reply_bytes=1000)
        with aioresponses() as m:
            m.post(f"{URL}/api/chat", status=500, body="x" * 5000)
            with pytest.raises(OllamaError) as exc:
                await collect(client)
    assert (
        exc.value.message
        == "node-1 sent a /api/chat reply longer than 1000 bytes (max_reply_bytes), the most the router reads"
    )
