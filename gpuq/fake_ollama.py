"""A simulated Ollama server that speaks Ollama's HTTP API (see shared/reference/ollama-api.md):
streaming NDJSON chat, /api/ps with keep_alive semantics, exact error shapes, and scriptable
faults. The demo nodes of `gpuq serve --demo` and every integration test use it."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from .models import normalize_model

BUSY = "server busy, please try again.  maximum pending requests exceeded"
WORDS = ("the queue node model token plan risk retry budget export job result review "
         "change test guard order state commit error memory latency design").split()


def model_size(name: str) -> int:
    """Bytes on disk, from the parameter count in the tag ('qwen3-coder:30b': ~18 GB at Q4)."""
    found = re.search(r":(\d+(?:\.\d+)?)b\b", name)
    return int(float(found.group(1)) * 0.6e9) if found else 2 << 30


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def _keep_alive_s(value: Any) -> float | None:
    """Ollama's Duration: number = seconds, string = Go duration; negative = forever (None)."""
    if value is None:
        return 300.0
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("Unsupported type")
    if isinstance(value, str):
        parts = re.findall(r"(-?\d+(?:\.\d+)?)(ns|us|ms|s|m|h)", value)
        if value != "0" and "".join(n + u for n, u in parts) != value:
            raise ValueError(f'time: missing unit in duration "{value}"')
        unit = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
        seconds = sum(float(n) * unit[u] for n, u in parts)
    else:
        seconds = float(value)
    return None if seconds < 0 else seconds


@dataclass
class Script:
    """How the fake behaves; tests change these fields between jobs."""

    token_delay_s: float = 0.0  # between chunks
    tokens: int | None = None  # reply length in words; None: 8 to 24
    load_delay_s: float = 0.0  # before the headers, like a model load
    hang_headers: bool = False  # never send headers
    load_error: tuple[int, str] | None = None  # e.g. (500, "llama-server reported out-of-memory ...")
    busy: bool = False  # 503 queue full
    error_after: int | None = None  # an {"error"} line after N chunks
    stall_after: int | None = None  # stop sending after N chunks, keep the connection open
    close_after: int | None = None  # drop the connection after N chunks
    unload: str = "immediate"  # immediate | delay | never (stuck in "Stopping...")
    unload_delay_s: float = 0.2
    reply: str | None = None  # exact reply text (else words derived from the prompt)
    invalid_json: bool = False  # a structured-output request gets text that is not JSON
    findings: int | None = None  # how many findings a structured reply holds; None: 1 to 4
    ps_delay_s: float = 0.0  # /api/ps blocks this long (real Ollama's does during a load or unload)
    # Replies of the wrong shape (valid JSON or not), to test the router's client:
    raw_lines: list[str] | None = None  # after raw_after chunks, these lines end the chat stream
    raw_after: int = 0
    raw_bodies: dict[str, str] = field(default_factory=dict)  # e.g. {"/api/ps": "[]"}: a GET's 200 body


@dataclass
class Loaded:
    expires_at: float | None  # None: forever
    refcount: int = 0
    stopping: bool = False


@dataclass
class FakeOllama:
    models: set[str] = field(default_factory=lambda: {"qwen3-coder:30b"})
    script: Script = field(default_factory=Script)
    requests: list[dict] = field(default_factory=list)  # every /api/chat and /api/generate body
    disconnects: int = 0  # generations stopped because the client went away
    ps_calls: int = 0  # GET /api/ps answered (how often someone checked what is loaded)
    in_flight: int = 0  # generations streaming now
    max_in_flight: int = 0  # the most ever at once: a router runs one job per node
    loaded: dict[str, Loaded] = field(default_factory=dict)
    version: str = "0.33.0"
    host: str = "127.0.0.1"
    port: int = 0
    _runner: web.AppRunner | None = None
    _site: web.TCPSite | None = None
    chunk_sent: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.models = {normalize_model(m) for m in self.models}

    # -- lifecycle ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._root)
        app.router.add_get("/api/version", self._version)
        app.router.add_get("/api/tags", self._tags)
        app.router.add_get("/api/ps", self._ps)
        app.router.add_post("/api/chat", self._chat)
        app.router.add_post("/api/generate", self._chat)
        return app

    async def start(self, port: int | None = None) -> str:
        """Serve on loopback; `port` reuses a port after stop() (a node coming back)."""
        # A stopped node drops its connections at once, as a crashed Ollama would.
        self._runner = web.AppRunner(self.app(), handle_signals=False, shutdown_timeout=0.1)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, port if port is not None else self.port)
        await self._site.start()
        self.port = self._runner.addresses[0][1]
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def chat_requests(self) -> list[dict]:
        """Requests that asked for a generation (not unloads)."""
        return [r for r in self.requests if r.get("messages") or r.get("prompt")]


    # -- model state ------------------------------------------------------------------------

    def _expire(self) -> None:
        now = time.monotonic()
        for name, m in list(self.loaded.items()):
            if m.refcount == 0 and m.expires_at is not None and m.expires_at <= now:
                self._begin_unload(name)

    def _begin_unload(self, name: str) -> None:
        m = self.loaded.get(name)
        if m is None or m.stopping:
            return
        m.stopping = True
        if m.refcount == 0:  # like Ollama: an unload waits for in-flight requests (see _release)
            self._free(name, m)

    def _free(self, name: str, m: Loaded) -> None:
        """The runner exits and its VRAM is freed: at once, after a delay, or never."""
        if self.script.unload == "never":
            return  # stuck in "Stopping...": /api/ps keeps listing it
        delay = self.script.unload_delay_s if self.script.unload == "delay" else 0.0
        if delay <= 0:
            self.loaded.pop(name, None)
        else:
            asyncio.get_running_loop().call_later(delay, self._forget, name, m)

    def _forget(self, name: str, m: Loaded) -> None:
        if self.loaded.get(name) is m and m.stopping and m.refcount == 0:
            del self.loaded[name]

    def _release(self, name: str, keep_alive_s: float | None) -> None:
        m = self.loaded.get(name)
        if m is None:
            return
        m.refcount -= 1
        m.expires_at = None if keep_alive_s is None else time.monotonic() + keep_alive_s
        if m.refcount == 0 and m.stopping:
            self._free(name, m)  # an unload asked for while this request ran
        elif m.refcount == 0 and keep_alive_s == 0:
            self._begin_unload(name)

    # -- handlers -----------------------------------------------------------------------------

    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    def _raw_body(self, request: web.Request) -> web.Response | None:
        raw = self.script.raw_bodies.get(request.path)
        return None if raw is None else web.Response(text=raw, content_type="application/json")

    async def _version(self, request: web.Request) -> web.Response:
        return self._raw_body(request) or web.json_response({"version": self.version})

    async def _tags(self, request: web.Request) -> web.Response:
        return self._raw_body(request) or web.json_response({"models": [
            {"name": m, "model": m, "modified_at": _now(), "size": model_size(m), "digest": "0" * 64,
             "details": {"format": "gguf", "family": "llama"}} for m in sorted(self.models)]})

    async def _ps(self, request: web.Request) -> web.Response:
        self.ps_calls += 1
        if self.script.ps_delay_s:
            await asyncio.sleep(self.script.ps_delay_s)
        self._expire()
        return self._raw_body(request) or web.json_response({"models": [
            {"name": m, "model": m, "size": 1 << 30, "digest": "0" * 64,
             "details": {"format": "gguf", "family": "llama"},
             "expires_at": _now(), "size_vram": 1 << 30, "context_length": 4096}
            for m in self.loaded]})

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat")
        raw = await request.read()
        if not raw:
            return self._error(400, "missing request body")
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return self._error(400, str(exc))
        if not isinstance(body, dict) or not body.get("model"):
            return self._error(400, "model is required") if chat else self._error(404, "model '' not found")
        self.requests.append(body)
        try:
            keep_alive = _keep_alive_s(body.get("keep_alive"))
        except ValueError as exc:
            return self._error(400, str(exc))
        model = normalize_model(body["model"])
        if model not in self.models:
            return self._error(404, f"model '{body['model']}' not found")
        empty = not (body.get("messages") if chat else body.get("prompt"))
        if empty and keep_alive == 0:
            self._begin_unload(model)
            return web.json_response(self._final(body["model"], chat, "", "unload", with_stats=False))
        s = self.script
        if s.busy:
            return self._error(503, BUSY)
        if s.hang_headers:  # until the client gives up, as Ollama drops a cancelled request
            await self._wait_for_disconnect(request)
            return self._error(499, "request canceled")
        if s.load_delay_s:
            await asyncio.sleep(s.load_delay_s)
        if s.load_error:
            return self._error(*s.load_error)
        entry = self.loaded.setdefault(model, Loaded(expires_at=None))
        entry.refcount += 1
        entry.stopping = False
        try:
            if empty:
                return web.json_response(self._final(body["model"], chat, "", "load", with_stats=False))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await self._stream(request, body, chat)
            finally:
                self.in_flight -= 1
        finally:
            self._release(model, keep_alive)

    def _reply_words(self, body: dict, chat: bool) -> list[str]:
        s = self.script
        if body.get("format") is not None:
            return [self._structured(body)]
        if s.reply is not None:
            return re.findall(r"\S+\s*", s.reply)
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        rng = random.Random(prompt)
        count = s.tokens if s.tokens is not None else rng.randint(8, 24)
        return [rng.choice(WORDS) + " " for _ in range(count)]

    def _structured(self, body: dict) -> str:
        """A reply to a `format` (JSON schema) request: schema-valid findings, or junk."""
        if self.script.invalid_json:
            return "Sure! Here are my findings: the plan looks fine"
        prompt = body["messages"][-1]["content"] if body.get("messages") else body.get("prompt", "")
        rng = random.Random(prompt + (body.get("model") or ""))
        count = self.script.findings if self.script.findings is not None else rng.randint(1, 4)
        findings = [{"title": f"finding {i + 1}: {rng.choice(WORDS)} {rng.choice(WORDS)}",
                     "detail": " ".join(rng.choice(WORDS) for _ in range(12)),
                     "severity": rng.choice(["low", "medium", "high"]),
                     "where": f"paragraph {rng.randint(1, 9)}"} for i in range(count)]
        return json.dumps({"findings": findings})

    def _final(self, model: str, chat: bool, text: str, reason: str, with_stats: bool = True,
               eval_count: int = 0, started: float = 0.0) -> dict:
        out: dict[str, Any] = {"model": model, "created_at": _now()}
        if chat:
            out["message"] = {"role": "assistant", "content": text}
        else:
            out["response"] = text
        out["done"] = True
        out["done_reason"] = reason
        if with_stats:
            total = int((time.monotonic() - started) * 1e9)
            out.update({"total_duration": total, "load_duration": int(self.script.load_delay_s * 1e9),
                        "prompt_eval_count": 26, "prompt_eval_duration": 1_000_000,
                        "eval_count": eval_count, "eval_duration": max(total - 1_000_000, 1)})
        return out

    async def _stream(self, request: web.Request, body: dict, chat: bool) -> web.StreamResponse:
        s = self.script
        started = time.monotonic()
        model = body["model"]
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        words = self._reply_words(body, chat)
        try:
            for i, word in enumerate(words):
                if s.error_after is not None and i == s.error_after:
                    await resp.write(json.dumps({"error": "an error was encountered while running the model: "
                                                          "unexpected EOF"}).encode() + b"\n")
                    return resp
                if s.close_after is not None and i == s.close_after:
                    request.transport.close()
                    return resp
                if s.stall_after is not None and i == s.stall_after:
                    await self._wait_for_disconnect(request)
                    return resp
                if s.raw_lines is not None and i == s.raw_after:
                    await resp.write("".join(line + "\n" for line in s.raw_lines).encode())
                    await resp.write_eof()
                    return resp
                chunk = {"model": model, "created_at": _now(), "done": False}
                if chat:
                    chunk["message"] = {"role": "assistant", "content": word}
                else:
                    chunk["response"] = word
                await resp.write(json.dumps(chunk).encode() + b"\n")
                self.chunk_sent.set()
                if s.token_delay_s:
                    await asyncio.sleep(s.token_delay_s)
                if request.transport is None or request.transport.is_closing():
                    raise ConnectionResetError
            await resp.write(json.dumps(self._final(model, chat, "", "stop", eval_count=len(words),
                                                    started=started)).encode() + b"\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1  # like Ollama: the client left, generation stops
            raise
        return resp

    async def _wait_for_disconnect(self, request: web.Request) -> None:
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.02)
        self.disconnects += 1
