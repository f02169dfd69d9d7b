"""A small Ollama client: stream a chat, unload a model, ask what is loaded. No retries:
every failure is raised as OllamaError with Ollama's own message."""

from __future__ import annotations

import asyncio
import json
from typing import Any, AsyncIterator

import aiohttp

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


class OllamaClient:
    def __init__(self, base_url: str, session: aiohttp.ClientSession, *,
                 connect_timeout_s: float = 10.0, stall_timeout_s: float = 300.0):
        self.base_url = base_url.rstrip("/")
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
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise OllamaError(f"{method} {path} on {self.base_url} failed: {exc!r}") from exc

    async def version(self) -> str:
        return (await self._request("GET", "/api/version"))["version"]

    async def tags(self) -> list[dict]:
        """/api/tags' models as the node lists them (names, details, capabilities)."""
        data = await self._request("GET", "/api/tags")
        models = data.get("models") if isinstance(data, dict) else None
        return [m for m in models or [] if isinstance(m, dict) and isinstance(m.get("name"), str)]

    async def installed(self) -> set[str]:
        return {normalize_model(m["name"]) for m in await self.tags()}

    async def ps(self, read_s: float = 10.0) -> list[dict]:
        data = await self._request("GET", "/api/ps", read_s=read_s)
        return [m for m in (data.get("models") if isinstance(data, dict) else None) or [] if isinstance(m, dict)]

    async def post(self, path: str, body: dict, read_s: float | None = None) -> Any:
        """One JSON request and its JSON answer (/api/show, /api/embed); an error status raises
        OllamaError with Ollama's message and status."""
        return await self._request("POST", path, body, read_s=read_s if read_s is not None else self.stall_timeout_s)

    async def loaded(self) -> set[str]:
        """Models /api/ps lists (in VRAM, loading, or still stopping)."""
        data = await self._request("GET", "/api/ps")
        return {normalize_model(m["name"]) for m in data.get("models", [])}

    async def unload(self, model: str) -> None:
        """An empty chat with keep_alive 0 asks Ollama to unload; it answers done_reason 'unload'."""
        await self._request("POST", "/api/chat", {"model": model, "messages": [], "keep_alive": 0})

    async def context_length(self, model: str) -> int | None:
        """The model's num_ctx as /api/show's `parameters` set it; None when it sets none (the
        server's default context then applies, which /api/show does not tell)."""
        data = await self._request("POST", "/api/show", {"model": model})
        for line in str(data.get("parameters") or "").splitlines():
            key, _, value = line.strip().partition(" ")
            if key == "num_ctx" and value.strip().isdigit():
                return int(value.strip())
        return None

    async def chat(self, model: str, prompt: str, fmt: Any = None, think: bool | str | None = None,
                   options: dict | None = None) -> AsyncIterator[dict]:
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
        if think is not None:
            body["think"] = think
        if options:
            body["options"] = options
        async for _, chunk in self.stream("/api/chat", body):
            yield chunk

    async def stream(self, path: str, body: dict) -> AsyncIterator[tuple[bytes, dict]]:
        """Stream /api/chat or /api/generate: each line as Ollama sent it, and parsed. The same
        failures as chat(); an error status keeps Ollama's status."""
        url = self.base_url + path
        try:
            async with self.session.post(url, json=body, timeout=self._timeout(self.stall_timeout_s)) as resp:
                if resp.status >= 400:
                    raise OllamaError(_message(await resp.text(), resp.status), resp.status)
                async for raw in resp.content:
                    line = raw.strip()
                    if not line:
                        continue
                    try:
                        chunk = json.loads(line)
                    except ValueError:
                        raise OllamaError(f"Ollama sent a line that is not JSON: {line[:200]!r}") from None
                    if not isinstance(chunk, dict):
                        raise OllamaError(f"Ollama sent a line that is not a JSON object: {line[:200]!r}")
                    if "error" in chunk:
                        raise OllamaError(str(chunk["error"]))
                    yield line, chunk
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
