"""A small Ollama client: stream a chat, unload a model, ask what is loaded. No retries:
every failure is raised as OllamaError with Ollama's own message (OllamaUnreachable when the
node cannot be connected to at all). A reply of the wrong shape
(valid JSON, but not what Ollama sends) is an OllamaError too, naming the node and what was
wrong: nothing past this client ever sees a chunk that is not an object of the right types."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypedDict

import aiohttp
import orjson

from ..errors import OllamaError, OllamaUnreachable, json_type
from ..jobs import normalize_model


def _message(body: str, status: int) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip() or f"HTTP {status}"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        return error
    return body.strip()


def _progress(chunk: dict[str, Any]) -> bool:
    """Does a stream chunk carry a token: text (answer or reasoning), a tool call?"""
    message = chunk.get("message") or {}
    return bool(
        message.get("content")
        or message.get("thinking")
        or message.get("tool_calls")
        or chunk.get("response")
        or chunk.get("thinking")
    )


def _snippet(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 200 else text[:200] + "..."


EXPECTED = {str: "a string", bool: "a boolean", int: "a whole number"}
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # half of a UTF-16 pair, which JSON's \u escapes allow
# The final chunk's counters and durations (ns); the store records them as they are.
STATS = ("eval_count", "prompt_eval_count", "total_duration", "load_duration", "eval_duration", "prompt_eval_duration")


# Every request to a node asks for its bytes as they are and follows no redirect: a compressed
# reply can unpack a thousandfold (1 MB of gzip was 1 GB of empty lines, unpacked on the event
# loop), and a redirect would send the prompt to another server and take its answer as the node's.
class NodeRequest(TypedDict):
    headers: dict[str, str]
    allow_redirects: bool
    auto_decompress: bool


NODE_REQUEST = NodeRequest(headers={"Accept-Encoding": "identity"}, allow_redirects=False, auto_decompress=False)
MAX_REPLY_BYTES = 16 << 20  # a non-streamed reply read whole (a verbose /api/show is a few MB)
STREAM_HEADERS = {**NODE_REQUEST["headers"], "Content-Type": "application/json"}  # a body of our own JSON


def _body(body: dict[str, Any]) -> bytes:
    """A request's JSON by orjson (a few us, where aiohttp's json= runs json.dumps and wraps it in
    a payload object); what orjson refuses (a lone surrogate, an int past 64 bits) by json."""
    try:
        return orjson.dumps(body)
    except TypeError:  # (orjson.JSONEncodeError is one)
        return json.dumps(body).encode()


def _loads(line: bytes) -> tuple[Any, bool]:
    """A stream line parsed, and whether its strings may hold a lone surrogate. orjson (about 4x
    json's speed on a token's line) refuses what Ollama never sends: a lone surrogate, NaN,
    nesting past 1,024; json then parses it as before, so the same checks name what is wrong."""
    try:
        return orjson.loads(line), False
    except orjson.JSONDecodeError:
        return json.loads(line), True


# A chunk's fields and their JSON types, in the order a wrong one is named.
MESSAGE_FIELDS = (("content", "message.content"), ("thinking", "message.thinking"))
TOP_FIELDS = (("response", str), ("done", bool), ("done_reason", str), *((key, int) for key in STATS))


class _ReadDeadline:
    """A stream's read limit, one timer for the whole stream: each read waits at most until
    `at`, which progress moves on by assignment. asyncio.timeout_at around each read set a
    timer and cancelled it once per token; this timer fires once per limit, and when the limit
    moved on meanwhile, sets itself again for the new one. It cancels the task only while a read
    waits, never while the consumer of a `yield` runs."""

    def __init__(self, at: float):
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None  # (made by a coroutine, which runs in a task)
        self.task = task
        self.at = at
        self.reading = self.expired = False
        self.handle: asyncio.TimerHandle | None = None

    def _fire(self) -> None:
        self.handle = None
        if not self.reading:  # set again by the next read
            return
        if self.loop.time() < self.at:
            self.handle = self.loop.call_at(self.at, self._fire)
            return
        self.expired = True
        self.task.cancel()

    async def read(self, content: aiohttp.StreamReader) -> bytes:
        """`content.readany()`, or TimeoutError at `at` (a read that finds bytes waiting
        returns them, past the limit or not, as asyncio.timeout_at's does)."""
        if self.handle is None or self.handle.when() > self.at:  # (the first token's limit is longer)
            if self.handle is not None:
                self.handle.cancel()
            self.handle = self.loop.call_at(self.at, self._fire)
        cancelling = self.task.cancelling()
        self.reading = True
        try:
            return await content.readany()
        except asyncio.CancelledError:
            if self.expired and self.task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            self.reading = self.expired = False

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


def prompt_was_cut(prompt_eval_count: int, num_ctx: int, num_keep: int = 4) -> bool:
    """Did Ollama cut the prompt to fit the context window? It says so only in its own log, but
    the prompt tokens it evaluated show it: older runners cut to the window (num_ctx), current
    ones (llm/llama_server.go contextShiftPromptLimit) keep num_keep (+1 for the BOS token)
    and half of the rest, exactly num_ctx - (num_ctx - keep) // 2."""
    if num_ctx <= 1:
        return False
    if prompt_eval_count >= num_ctx - 1:
        return True
    return any(
        prompt_eval_count == num_ctx - max((num_ctx - min(keep, num_ctx - 1)) // 2, 1)
        for keep in (num_keep, num_keep + 1)
    )


class OllamaClient:
    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        *,
        name: str | None = None,
        connect_timeout_s: float = 10.0,
        stall_timeout_s: float = 300.0,
        load_timeout_s: float = 600.0,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        self.base_url = base_url.rstrip("/")
        self.name = name or self.base_url  # who a wrong-shaped reply is blamed on
        self.session = session
        self.connect_timeout_s = connect_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.load_timeout_s = load_timeout_s
        self.max_reply_bytes = max_reply_bytes
        self._capabilities: dict[tuple[str, str], list[str] | None] = {}  # (model, digest) -> /api/show's

    async def _request(
        self, method: str, path: str, body: Any = None, timeout_s: float = 10.0, max_bytes: int | None = None
    ) -> Any:
        """One request and its JSON answer, all of it within `timeout_s` (a real /api/ps can
        block for seconds while another client's model loads or unloads) and `max_bytes`
        (default: max_reply_bytes)."""
        url = self.base_url + path
        timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=min(self.connect_timeout_s, timeout_s))
        try:
            async with self.session.request(method, url, json=body, timeout=timeout, **NODE_REQUEST) as resp:
                self._refuse(resp, path)
                data = await self._read(resp, path, max_bytes)
                if resp.status >= 400:
                    raise OllamaError(_message(data.decode("utf-8", "replace"), resp.status), resp.status)
                return json.loads(data)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise self._unreachable(exc, timeout.sock_connect) from exc
        except TimeoutError as exc:
            raise OllamaError(f"{method} {path} on {self.base_url} did not answer within {timeout_s:.1f}s") from exc
        except (aiohttp.ClientError, ValueError, RecursionError) as exc:
            raise OllamaError(f"{method} {path} on {self.base_url} failed: {exc!r}") from exc

    def _refuse(self, resp: aiohttp.ClientResponse, path: str) -> None:
        """A redirect or a compressed body is refused before a byte of it is read."""
        if 300 <= resp.status < 400:
            target = resp.headers.get("Location", "no Location")[:200]
            raise OllamaError(
                f"{self.name} answered {resp.status} redirect to {target}; gpuq does not follow a node's redirects", 502
            )
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding != "identity":
            raise OllamaError(
                f"{self.name} answered {path} with Content-Encoding: {encoding[:50]}, though asked "
                "for identity; gpuq does not unpack a node's compressed replies",
                502,
            )

    async def _read(self, resp: aiohttp.ClientResponse, path: str, max_bytes: int | None = None) -> bytes:
        """A reply's whole body, refused past `max_bytes` (default: max_reply_bytes) before
        more than that is held: an endless /api/tags took the router to 1.1 GB."""
        cap = max_bytes or self.max_reply_bytes
        size, parts = 0, []
        if (resp.content_length or 0) <= cap:
            async for data in resp.content.iter_any():
                size += len(data)
                if size > cap:
                    break
                parts.append(data)
            else:
                return b"".join(parts)
        setting = " (max_reply_bytes)" if max_bytes is None else ""
        raise OllamaError(
            f"{self.name} sent a {path} reply longer than {cap} bytes{setting}, the most the router reads", 502
        )

    @property
    def where(self) -> str:
        """The node as messages name it: its name and URL (the URL alone when it has no name)."""
        return self.base_url if self.name == self.base_url else f"node {self.name} at {self.base_url}"

    def _unreachable(self, exc: aiohttp.ClientError, connect_s: float | None) -> OllamaUnreachable:
        """Refused, no such host, or no answer to the connect in time."""
        if isinstance(exc, aiohttp.ClientConnectorError):
            why = str(exc.os_error or exc)
        else:
            why = f"no connection within {connect_s:g}s (connect_timeout)"
        return OllamaUnreachable(f"cannot connect to {self.where}: {why}")

    def _wrong(self, what: str) -> OllamaError:
        return OllamaError(f"{self.name} sent {what}")

    async def _object(self, path: str, timeout_s: float = 10.0) -> dict[str, Any]:
        data = await self._request("GET", path, timeout_s=timeout_s)
        if not isinstance(data, dict):
            raise self._wrong(f"{path} as a JSON {json_type(data)}, not an object")
        return data

    async def version(self) -> str:
        data = await self._object("/api/version")
        version = data.get("version")
        if not isinstance(version, str):
            raise self._wrong(f"/api/version without a 'version' string: {_snippet(data)}")
        return version

    async def _models(self, path: str, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The entries of a {"models": [{"name": ...}]} list (/api/tags, /api/ps), as sent."""
        models = (await self._object(path, timeout_s)).get("models")
        if models is None:  # Go encodes an empty list as null
            return []
        if not isinstance(models, list):
            raise self._wrong(f"{path} whose 'models' is a JSON {json_type(models)}, not an array")
        for m in models:
            if not isinstance(m, dict) or not isinstance(m.get("name"), str):
                raise self._wrong(f"an {path} entry without a 'name' string: {_snippet(m)}")
        return models

    async def _model_names(self, path: str, timeout_s: float = 10.0) -> set[str]:
        return {normalize_model(m["name"]) for m in await self._models(path, timeout_s)}

    async def tags(self) -> list[dict[str, Any]]:
        """/api/tags' models as the node describes them (names, details, capabilities)."""
        return await self._models("/api/tags")

    async def installed(self) -> set[str]:
        return await self._model_names("/api/tags")

    async def ps(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """/api/ps' models as the node describes them."""
        return await self._models("/api/ps", timeout_s)

    async def post(
        self, path: str, body: dict[str, Any], timeout_s: float | None = None, max_bytes: int | None = None
    ) -> Any:
        """One JSON request and its JSON answer (/api/show, /api/embed), within `timeout_s`
        (default: load_timeout, as a cold load comes first) and `max_bytes` (default:
        max_reply_bytes); an error status raises OllamaError with Ollama's message and status."""
        return await self._request(
            "POST", path, body, timeout_s if timeout_s is not None else self.load_timeout_s, max_bytes
        )

    async def loaded(self, timeout_s: float = 10.0) -> set[str]:
        """Models /api/ps lists (in VRAM, loading, or still stopping)."""
        return await self._model_names("/api/ps", timeout_s)

    async def unload(self, model: str, timeout_s: float = 10.0) -> None:
        """An empty chat with keep_alive 0 asks Ollama to unload; it answers done_reason 'unload'."""
        await self._request("POST", "/api/chat", {"model": model, "messages": [], "keep_alive": 0}, timeout_s)

    async def capabilities(self, model: str, digest: str = "", timeout_s: float = 3.0) -> list[str] | None:
        """The model's capabilities as /api/show lists them, asked once per model and digest (a
        model pulled again is asked again). None when the node does not say (an Ollama older
        than capabilities) or cannot answer now (then not kept: asked again the next time)."""
        key = (normalize_model(model), digest)
        if key in self._capabilities:
            return self._capabilities[key]
        try:
            data = await self._request("POST", "/api/show", {"model": model}, timeout_s)
        except OllamaError:
            return None
        caps = data.get("capabilities") if isinstance(data, dict) else None
        caps = [c for c in caps if isinstance(c, str)] if isinstance(caps, list) else None
        self._capabilities[key] = caps
        return caps

    async def context_length(self, model: str) -> int | None:
        """The model's num_ctx as /api/show's `parameters` set it; None when it sets none (the
        server's default context then applies, which /api/show does not tell)."""
        data = await self._request("POST", "/api/show", {"model": model})
        for line in str(data.get("parameters") or "").splitlines():
            key, _, value = line.strip().partition(" ")
            if key == "num_ctx" and value.strip().isdigit():
                return int(value.strip())
        return None

    async def chat(
        self,
        model: str,
        prompt: str,
        fmt: Any = None,
        think: bool | str | None = None,
        options: dict[str, Any] | None = None,
        keep_alive: int | str = 0,
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream /api/chat, by default with keep_alive 0 (the model unloads when the request ends).

        Yields each chunk; the last one has done: true. Raises OllamaError on an HTTP error,
        an {"error"} line, a stall longer than stall_timeout_s, or a stream that ends early."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "keep_alive": keep_alive,
        }
        if fmt is not None:
            body["format"] = fmt
        if think is not None:
            body["think"] = think
        if options:
            body["options"] = options
        async for lines in self.stream_reads("/api/chat", body):
            for _, chunk in lines:
                yield chunk

    async def stream(
        self, path: str, body: dict[str, Any], max_line: int | None = None
    ) -> AsyncIterator[tuple[bytes, dict[str, Any]]]:
        """Stream /api/chat or /api/generate: each line as Ollama sent it, and parsed. The same
        limits and failures as chat(); an error status keeps Ollama's status. A line may be
        `max_line` bytes long (default: the reader's buffer limit)."""
        async for lines in self.stream_reads(path, body, max_line):
            for item in lines:
                yield item

    async def stream_reads(
        self, path: str, body: dict[str, Any], max_line: int | None = None
    ) -> AsyncIterator[list[tuple[bytes, dict[str, Any]]]]:
        """stream(), the lines of one read of the node's connection at a time (at least one): a
        consumer can do its per-read work (a write to its client) once per read, not per line.
        A line that fails comes after the good lines before it, as in stream()."""
        # A cold load of a large model sends nothing, not even headers, until the model is in
        # VRAM (minutes): the first token gets load_timeout, each token after it stall_timeout.
        # Progress is a token (a line that carries text, a tool call or the end), not a byte: a
        # node that drips a byte every few seconds, or sends blank lines or empty chunks, stalls.
        # The limits are per read, never held across a `yield` (the consumer's own awaits must
        # not be cancelled by this generator's clock).
        loop = asyncio.get_running_loop()
        progress_by = loop.time() + self.load_timeout_s
        first = True
        with self._node_errors():
            resp = await self._post_stream(path, body, progress_by)
            async with resp:
                await self._refuse_stream(resp, path)
                # One read takes whatever has arrived (often many lines): one clock per read,
                # not per line. A line still unfinished past the limit fails here, before it
                # fills the router's memory.
                limit = max_line or resp.content.get_read_buffer_limits()[1]
                pending = buffered = b""
                deadline = _ReadDeadline(progress_by)
                try:
                    while True:
                        # (inline, not a helper: a coroutine call per read costs the relay CPU per token)
                        if buffered:  # bytes that came while the last ones were handled
                            data, buffered = buffered, b""
                        else:
                            deadline.at = progress_by
                            try:
                                data = await deadline.read(resp.content)
                            except TimeoutError:
                                raise self._late(first) from None
                        if data:
                            *lines, pending = (pending + data).split(b"\n")
                        else:
                            lines, pending = [pending], b""
                        good, done, progressed, wrong = self._parse_lines(lines, limit)
                        if good:
                            yield good
                        if wrong is not None:  # raised once the lines before it are handled
                            raise wrong
                        if done:
                            return
                        if progressed:  # the clock starts once the consumer is done with them
                            first, progress_by = False, loop.time() + self.stall_timeout_s
                        if len(pending) > limit:
                            raise self._wrong(f"a chat line longer than {limit} bytes, the most the router reads")
                        if not data:
                            break
                        # Bytes that came meanwhile are taken without waiting; then this task lets
                        # the loop run once, so a node that sends fast does not hold it (every
                        # other node, /health). Nothing came (a paced token): the read waits, and
                        # the loop runs anyway: no second turn of the loop per token.
                        buffered = resp.content.read_nowait()
                        if buffered:
                            await asyncio.sleep(0)
                finally:
                    deadline.close()
            raise OllamaError("Ollama's stream ended without done: true")

    @contextlib.contextmanager
    def _node_errors(self) -> Iterator[None]:
        """aiohttp's errors of a stream, as Ollama's: unreachable, broke off, failed."""
        try:
            yield
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise self._unreachable(exc, self.connect_timeout_s) from exc
        except aiohttp.ClientPayloadError as exc:
            # aiohttp's text here ("TransferEncodingError: 400 ...") reads like an HTTP status.
            raise OllamaError("Ollama's stream broke off: the connection closed before the reply ended") from exc
        except aiohttp.ClientError as exc:
            raise OllamaError(f"request to {self.where} failed: {str(exc) or type(exc).__name__}") from exc

    async def _post_stream(self, path: str, body: dict[str, Any], progress_by: float) -> aiohttp.ClientResponse:
        """The streamed request sent, and its reply's headers by `progress_by` (the first token's
        limit: a cold load sends no headers until the model is loaded)."""
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s, sock_read=None)
        try:
            async with asyncio.timeout_at(progress_by):
                return await self.session.post(
                    self.base_url + path,
                    data=_body(body),
                    timeout=timeout,
                    headers=STREAM_HEADERS,
                    allow_redirects=False,
                    auto_decompress=False,
                )
        except aiohttp.ConnectionTimeoutError:
            raise  # no connection at all (a TimeoutError too): the node is unreachable
        except TimeoutError:
            raise self._late(True) from None

    async def _refuse_stream(self, resp: aiohttp.ClientResponse, path: str) -> None:
        """A stream's reply that is no stream: a redirect, a compressed body, or an error status
        (with Ollama's status and message)."""
        self._refuse(resp, path)
        if resp.status >= 400:
            raise OllamaError(
                _message((await self._read(resp, path)).decode("utf-8", "replace"), resp.status), resp.status
            )

    def _parse_lines(
        self, lines: list[bytes], limit: int
    ) -> tuple[list[tuple[bytes, dict[str, Any]]], bool, bool, OllamaError | None]:
        """One read's lines: the good ones up to the first that fails or ends the stream (each
        as sent, stripped, and parsed), whether the stream is done, whether a line was progress,
        and the error of the line that failed."""
        good: list[tuple[bytes, dict[str, Any]]] = []
        progressed = False
        try:
            for raw in lines:
                if len(raw) > limit:
                    raise self._wrong(f"a chat line longer than {limit} bytes, the most the router reads")
                line = raw.strip()
                if not line:
                    continue
                try:
                    chunk, halves = _loads(line)
                except (ValueError, RecursionError):
                    raise self._wrong(f"a chat line that is not JSON: {line[:200]!r}") from None
                self._check_chunk(chunk, line, halves)
                good.append((line, chunk))
                if chunk.get("done"):
                    return good, True, progressed, None
                progressed = progressed or _progress(chunk)
        except OllamaError as exc:
            return good, False, progressed, exc
        return good, False, progressed, None

    def _late(self, first: bool) -> OllamaError:
        if first:
            return OllamaError(
                f"no reply from Ollama within load_timeout ({self.load_timeout_s:g}s): the model did not load in time"
            )
        return OllamaError(f"stalled: no new token from Ollama for {self.stall_timeout_s:g}s")

    def _check_chunk(self, chunk: Any, line: bytes, halves: bool = True) -> None:
        """Raise Ollama's {"error"} line as it is, and a chunk of the wrong shape naming what is
        wrong. A parsed chunk holds JSON's exact types (a bool is no int); `halves`: its strings
        may hold a lone surrogate (json parsed it, not orjson)."""
        if type(chunk) is not dict:
            text = line[:200].decode("utf-8", "replace") + ("..." if len(line) > 200 else "")
            raise self._wrong(f"a chat line that is a JSON {json_type(chunk)}, not an object: {text}")
        if "error" in chunk:
            raise OllamaError(str(chunk["error"]))
        message = chunk.get("message")
        if message is not None and type(message) is not dict:
            raise self._wrong(f"a chat line whose 'message' is a JSON {json_type(message)}, not an object")
        if message:
            for key, name in MESSAGE_FIELDS:
                value = message.get(key)
                if value is not None and (halves or type(value) is not str):
                    self._check_field(name, value, str, halves)
        # Each type compared here: _check_field only for a wrong one (or text orjson did not parse).
        for key, kind in TOP_FIELDS:
            value = chunk.get(key)
            if value is not None and (halves or type(value) is not kind):
                self._check_field(key, value, kind, halves)

    def _check_field(self, key: str, value: Any, kind: type, halves: bool) -> None:
        if type(value) is not kind:
            raise self._wrong(f"a chat line whose '{key}' is a JSON {json_type(value)}, not {EXPECTED[kind]}")
        # Go's encoder never writes one; text holding one cannot be stored or sent on as UTF-8.
        if halves and isinstance(value, str) and value and (half := LONE_SURROGATE.search(value)):
            raise self._wrong(
                f"a chat line whose '{key}' holds a lone surrogate (\\u{ord(half.group()):04x}), not text"
            )
