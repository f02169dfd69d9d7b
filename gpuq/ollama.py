"""A small Ollama client: stream a chat, unload a model, ask what is loaded. No retries:
every failure is raised as OllamaError with Ollama's own message. A reply of the wrong shape
(valid JSON, but not what Ollama sends) is an OllamaError too, naming the node and what was
wrong: nothing past this client ever sees a chunk that is not an object of the right types."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from .errors import OllamaError
from .models import normalize_model


def _message(body: str, status: int) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip() or f"HTTP {status}"
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return data["error"]
    return body.strip()


def json_type(value: Any) -> str:
    """What JSON calls the value's type, for messages."""
    if isinstance(value, bool):
        return "boolean"
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _snippet(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and isinstance(value, bool) == (kind is bool)  # a bool is an int to Python


EXPECTED = {str: "a string", bool: "a boolean", int: "a whole number"}
# The final chunk's counters and durations (ns); the store records them as they are.
STATS = ("eval_count", "prompt_eval_count", "total_duration", "load_duration", "eval_duration")


class OllamaClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, *, name: str | None = None,
                 connect_timeout_s: float = 10.0, stall_timeout_s: float = 300.0):
        self.base_url = base_url.rstrip("/")
        self.name = name or self.base_url  # who a wrong-shaped reply is blamed on
        self.session = session
        self.connect_timeout_s = connect_timeout_s
        self.stall_timeout_s = stall_timeout_s

    def _timeout(self, read_s: float) -> aiohttp.ClientTimeout:
        # No total limit here: a job's wall-clock limit belongs to the worker.
        return aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s, sock_read=read_s)

    async def _request(self, method: str, path: str, body: Any = None, read_s: float = 10.0) -> Any:
        url = self.base_url + path
        try:
            async with self.session.request(method, url, json=body, timeout=self._timeout(read_s)) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise OllamaError(_message(text, resp.status), resp.status)
                return json.loads(text)
        except aiohttp.ClientConnectorError as exc:
            raise OllamaError(f"cannot connect to {self.base_url}: {exc.os_error or exc}") from exc
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, RecursionError) as exc:
            raise OllamaError(f"{method} {path} on {self.base_url} failed: {exc!r}") from exc

    def _wrong(self, what: str) -> OllamaError:
        return OllamaError(f"{self.name} sent {what}")

    async def _object(self, path: str) -> dict:
        data = await self._request("GET", path)
        if not isinstance(data, dict):
            raise self._wrong(f"{path} as a JSON {json_type(data)}, not an object")
        return data

    async def version(self) -> str:
        data = await self._object("/api/version")
        if not isinstance(data.get("version"), str):
            raise self._wrong(f"/api/version without a 'version' string: {_snippet(data)}")
        return data["version"]

    async def _model_names(self, path: str) -> set[str]:
        """The names in a {"models": [{"name": ...}]} list (/api/tags, /api/ps)."""
        models = (await self._object(path)).get("models")
        if models is None:  # Go encodes an empty list as null
            return set()
        if not isinstance(models, list):
            raise self._wrong(f"{path} whose 'models' is a JSON {json_type(models)}, not an array")
        for m in models:
            if not isinstance(m, dict) or not isinstance(m.get("name"), str):
                raise self._wrong(f"an {path} entry without a 'name' string: {_snippet(m)}")
        return {normalize_model(m["name"]) for m in models}

    async def installed(self) -> set[str]:
        return await self._model_names("/api/tags")

    async def loaded(self) -> set[str]:
        """Models /api/ps lists (in VRAM, loading, or still stopping)."""
        return await self._model_names("/api/ps")

    async def unload(self, model: str) -> None:
        """An empty chat with keep_alive 0 asks Ollama to unload; it answers done_reason 'unload'."""
        await self._request("POST", "/api/chat", {"model": model, "messages": [], "keep_alive": 0})

    async def chat(self, model: str, prompt: str, fmt: Any = None) -> AsyncIterator[dict]:
        """Stream /api/chat with keep_alive 0 (the model unloads when the request ends).

        Yields each chunk; the last one has done: true. Raises OllamaError on an HTTP error,
        an {"error"} line, a stall longer than stall_timeout_s, or a stream that ends early."""
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "stream": True,
            "keep_alive": 0,
        }
        if fmt is not None:
            body["format"] = fmt
        url = self.base_url + "/api/chat"
        try:
            async with self.session.post(url, json=body, timeout=self._timeout(self.stall_timeout_s)) as resp:
                if resp.status >= 400:
                    raise OllamaError(_message(await resp.text(), resp.status), resp.status)
                while line := await self._read_line(resp):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        chunk = json.loads(line)
                    except (ValueError, RecursionError):
                        raise self._wrong(f"a chat line that is not JSON: {line[:200]!r}") from None
                    self._check_chunk(chunk, line)
                    yield chunk
                    if chunk.get("done"):
                        return
            raise OllamaError("Ollama's stream ended without done: true")
        except aiohttp.ClientConnectorError as exc:
            raise OllamaError(f"cannot connect to {self.base_url}: {exc.os_error or exc}") from exc
        except asyncio.TimeoutError as exc:
            raise OllamaError(f"stalled: no bytes from Ollama for {self.stall_timeout_s:g}s") from exc
        except aiohttp.ClientPayloadError as exc:
            # aiohttp's text here ("TransferEncodingError: 400 ...") reads like an HTTP status.
            raise OllamaError("Ollama's stream broke off: the connection closed before the reply ended") from exc
        except aiohttp.ClientError as exc:
            raise OllamaError(f"request to {self.base_url} failed: {exc}") from exc

    async def _read_line(self, resp: aiohttp.ClientResponse) -> bytes:
        """The next line of the stream (b"" at its end). A line longer than the reader's buffer
        limit fails here, before it fills the router's memory; aiohttp says so with LineTooLong
        (3.13) or a ValueError (some older releases)."""
        try:
            return await resp.content.readline()
        except (LineTooLong, ValueError):
            limit = resp.content.get_read_buffer_limits()[1]
            raise self._wrong(f"a chat line longer than {limit} bytes, the most the router reads") from None

    def _check_chunk(self, chunk: Any, line: bytes) -> None:
        """Raise Ollama's {"error"} line as it is, and a chunk of the wrong shape naming what is wrong."""
        if not isinstance(chunk, dict):
            text = line[:200].decode("utf-8", "replace") + ("..." if len(line) > 200 else "")
            raise self._wrong(f"a chat line that is a JSON {json_type(chunk)}, not an object: {text}")
        if "error" in chunk:
            raise OllamaError(str(chunk["error"]))
        message = chunk.get("message")
        if message is not None and not isinstance(message, dict):
            raise self._wrong(f"a chat line whose 'message' is a JSON {json_type(message)}, not an object")
        fields = [("message.content", (message or {}).get("content"), str),
                  ("response", chunk.get("response"), str), ("done", chunk.get("done"), bool),
                  ("done_reason", chunk.get("done_reason"), str)]
        fields += [(key, chunk.get(key), int) for key in STATS]
        for key, value, kind in fields:
            if value is not None and not _is(value, kind):
                raise self._wrong(f"a chat line whose '{key}' is a JSON {json_type(value)}, not {EXPECTED[kind]}")
