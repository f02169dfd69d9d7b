"""A simulated Ollama server that real clients accept (Ollama's HTTP API as its own source
answers it): /api/chat and /api/generate streamed or as one object, thinking, structured
output, options, load and unload with keep_alive, /api/ps, /api/show, /api/tags, /api/embed,
Ollama's exact error texts, and scriptable faults. `gpuq serve --demo`, every integration test
and the benchmarks use it.

Where a choice is not obvious, a comment names the Ollama file it follows: server/routes.go,
server/sched.go, server/images.go, api/types.go, types/model/name.go, llm/llama_server.go.

The one module of gpuq over ~650 lines, on purpose: its handlers follow Ollama's routes.go
handler by handler, so one file reads beside that one file; its model table (catalogue.py) and
request parsing (parse.py) already live apart."""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from .catalogue import ModelName, chat_template, count_tokens, details, digest, model_size, profile_for, size_bytes
from .parse import (
    CHAT_FIELDS,
    DEFAULT_KEEP_ALIVE_S,
    EMBED_FIELDS,
    EMBEDDINGS_FIELDS,
    GENERATE_FIELDS,
    SHOW_FIELDS,
    THINK_LEVELS,
    Reply,
    go_quote,
    parse_body,
    parse_keep_alive,
    parse_options,
    request_fields,
)

BUSY = "server busy, please try again.  maximum pending requests exceeded"
WORDS = (
    "the queue node model token plan risk retry budget export job result review "
    "change test guard order state commit error memory latency design"
).split()
THOUGHTS = (
    "okay so the user wants this let me think about the plan first wait the queue "
    "matters here maybe check the order again then answer"
).split()
FOREVER_S = (2**63 - 1) / 1e9  # a negative keep_alive is time.Duration(math.MaxInt64) [api/types.go]
# llama-server started without --embeddings answers this; Ollama passes it on [llm/llama_server.go]
NO_EMBEDDINGS = "This server does not support embeddings. Start it with `--embeddings`"
TOO_LONG_FOR_EMBED = "the input length exceeds the context length"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def _iso(ts: float) -> str:
    """A wall-clock time as Go writes a time.Time (RFC 3339, UTC)."""
    moment = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=ts)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _tool_call_id() -> str:
    """Ollama's id of a parsed tool call [server/routes.go toolCallId]."""
    return "call_" + "".join(random.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))


# -- the simulator -----------------------------------------------------------------------------


@dataclass
class Script:
    """How the fake behaves; tests change these fields between jobs."""

    token_delay_s: float = 0.0  # between chunks
    tokens: int | None = None  # reply length in words; None: 8 to 24
    load_delay_s: float = 0.0  # load time, paid before the headers by a request whose model is not loaded
    hang_headers: bool = False  # never send headers
    load_error: tuple[int, str] | None = None  # e.g. (500, "llama-server reported out-of-memory ...")
    busy: bool = False  # 503 queue full (for a model that is not loaded, as Ollama)
    error_after: int | None = None  # an {"error"} line after N chunks
    stall_after: int | None = None  # stop sending after N chunks, keep the connection open
    hold_after: int | None = None  # after N chunks, wait until `released` is set, then go on
    released: asyncio.Event = field(default_factory=asyncio.Event)
    close_after: int | None = None  # drop the connection after N chunks
    unload: str = "immediate"  # immediate | delay | never (stuck in "Stopping...")
    unload_delay_s: float = 0.2
    reply: str | None = None  # exact reply text (else words derived from the prompt)
    # A chat that offers tools, its last message not a tool's result, calls this tool (name,
    # arguments) instead of answering, after any reasoning; given the result, it answers.
    tool_call: tuple[str, dict[str, Any]] | None = None
    invalid_json: bool = False  # a structured-output request gets text that is not JSON
    findings: int | None = None  # how many findings a structured reply holds; None: 1 to 4
    thinking_tokens: int | None = None  # a thinking model's reasoning in words; None: 6 to 16 (by level); 0: none
    ps_delay_s: float = 0.0  # /api/ps blocks this long (real Ollama's does during a load or unload)
    # Replies of the wrong shape (valid JSON or not), to test the router's client:
    raw_lines: list[str] | None = None  # after raw_after chunks, these lines end the chat stream
    raw_after: int = 0
    raw_bodies: dict[str, str] = field(default_factory=dict)  # e.g. {"/api/ps": "[]"}: a GET's 200 body


@dataclass
class Loaded:
    expires_at: float | None  # monotonic deadline once idle; None: forever, or not set yet
    refcount: int = 0
    stopping: bool = False
    keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S  # the session: the last request's keep_alive
    context_length: int = 4096  # num_ctx it was loaded with
    ready: asyncio.Future[None] | None = None  # done once loaded (None: loaded)


@dataclass
class Generation:
    """One request's reply: reasoning, then the answer, and what ended it."""

    thinking: list[str]
    content: list[str]
    done_reason: str
    prompt_tokens: int
    started: float  # monotonic, when the request arrived
    loaded: float  # when its model was ready
    first: float | None = None  # when its first token came out
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # Ollama's, with their ids


@dataclass
class FakeOllama:
    models: set[str] = field(default_factory=lambda: {"qwen3-coder:30b"})
    script: Script = field(default_factory=Script)
    requests: list[dict[str, Any]] = field(default_factory=list)  # every /api/chat and /api/generate body
    disconnects: int = 0  # generations stopped because the client went away
    ps_calls: int = 0  # GET /api/ps answered (how often someone checked what is loaded)
    in_flight: int = 0  # generations streaming now
    loads: int = 0  # models loaded (each a cold load a request paid, Script.load_delay_s)
    max_in_flight: int = 0  # the most ever at once: a router runs one job per node
    loaded: dict[str, Loaded] = field(default_factory=dict)
    version: str = "0.33.0"
    host: str = "127.0.0.1"
    port: int = 0
    _runner: web.AppRunner | None = None
    _site: web.TCPSite | None = None
    chunk_sent: asyncio.Event = field(default_factory=asyncio.Event)
    capabilities: dict[str, tuple[str, ...]] = field(default_factory=dict)  # by model: overrides PROFILES
    context_length: int = 4096  # the server's default num_ctx (OLLAMA_CONTEXT_LENGTH)
    installed_at: float = field(default_factory=lambda: time.time() - 86400)  # modified_at of every model

    def __post_init__(self) -> None:
        self.models = {ModelName.parse(m).short for m in self.models}

    # -- lifecycle ----------------------------------------------------------------------------

    def app(self) -> web.Application:
        # Ollama reads a body of any size (images too): no aiohttp 1 MiB default here
        app = web.Application(middlewares=[self._gin_errors], client_max_size=1 << 30)
        app.router.add_get("/", self._root)  # GET and HEAD, as every route below that has them
        app.router.add_get("/api/version", self._version)
        app.router.add_get("/api/tags", self._tags)
        app.router.add_get("/api/ps", self._ps, allow_head=False)
        app.router.add_post("/api/show", self._show)
        app.router.add_post("/api/chat", self._chat)
        app.router.add_post("/api/generate", self._chat)
        app.router.add_post("/api/embed", self._embed)
        app.router.add_post("/api/embeddings", self._embeddings)
        return app

    async def start(self, port: int | None = None) -> str:
        """Serve on loopback; `port` reuses a port after stop() (a node coming back)."""
        # A stopped node drops its connections at once, as a crashed Ollama would.
        # A client that leaves cancels its handler at once, as its request context does in Ollama
        # (the generation stops and its runner is released: an unload then waits for nothing).
        self._runner = web.AppRunner(self.app(), handle_signals=False, shutdown_timeout=0.1, handler_cancellation=True)
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
    def chat_requests(self) -> list[dict[str, Any]]:
        """Requests that asked for a generation (not unloads)."""
        return [r for r in self.requests if r.get("messages") or r.get("prompt")]

    # -- the catalogue ------------------------------------------------------------------------

    def installed(self, name: str) -> str | None:
        """The installed model a name means: case-insensitive, ':latest' and the default
        registry implied [server/routes.go getExistingName]."""
        wanted = ModelName.parse(name)
        return next((m for m in sorted(self.models) if ModelName.parse(m).same(wanted)), None)

    def capabilities_of(self, model: str) -> tuple[str, ...]:
        wanted = ModelName.parse(model)
        for name, caps in self.capabilities.items():
            if ModelName.parse(name).same(wanted):
                return tuple(caps)
        return profile_for(model).capabilities

    def _context_for(self, model: str, options: dict[str, Any]) -> int:
        """The num_ctx a runner is loaded with [server/sched.go getRunner, effectiveContext]."""
        num_ctx: int = max(options.get("num_ctx", self.context_length), 4)
        if "vision" in self.capabilities_of(model):
            num_ctx = max(num_ctx, 2048)
        return min(num_ctx, profile_for(model).context_length)

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
        m.expires_at = time.monotonic()  # /api/ps shows a stopping model expiring now [sched.go expireRunner]
        m.keep_alive_s = 0.0
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

    def _release(self, name: str, m: Loaded) -> None:
        """A request is done with its runner [sched.go: finishedReqCh]."""
        m.refcount -= 1
        if m.refcount > 0 or self.loaded.get(name) is not m:
            return
        if m.stopping:
            self._free(name, m)  # an unload asked for while this request ran
        elif m.keep_alive_s is not None and m.keep_alive_s <= 0:
            self._begin_unload(name)  # a zero session expires as soon as it goes idle
        else:
            m.expires_at = None if m.keep_alive_s is None else time.monotonic() + m.keep_alive_s

    async def _acquire(self, name: str, body: dict[str, Any], num_ctx: int) -> Loaded:
        """Get a runner for the model [sched.go getRunner]: a loaded one at once; one that is
        not loaded (or stopping, or loaded with another num_ctx) is loaded first, paying
        Script.load_delay_s before any header goes out."""
        s = self.script
        self._expire()
        keep_alive = parse_keep_alive(body["keep_alive"]) if body.get("keep_alive") is not None else None
        m = self.loaded.get(name)
        if m is not None and m.refcount == 0 and (m.stopping or m.context_length != num_ctx):
            self.loaded.pop(name)  # it must unload (or reload) first
            m = None
        if m is not None:
            m.refcount += 1
            m.stopping = False
            if body.get("keep_alive") is not None:
                m.keep_alive_s = keep_alive
            if m.ready is not None:
                try:
                    await asyncio.shield(m.ready)  # loading for another request: wait for it
                except BaseException:
                    m.refcount -= 1
                    raise
            return m
        if s.busy:
            raise Reply(503, BUSY)
        ready = asyncio.get_running_loop().create_future()
        m = Loaded(expires_at=None, refcount=1, context_length=num_ctx, ready=ready)
        self.loads += 1
        if body.get("keep_alive") is not None:
            m.keep_alive_s = keep_alive
        self.loaded[name] = m
        try:
            if s.load_delay_s:
                await asyncio.sleep(s.load_delay_s)
            if s.load_error:
                raise Reply(*s.load_error)
        except BaseException as exc:
            m.refcount -= 1
            if self.loaded.get(name) is m:
                del self.loaded[name]
            ready.set_exception(exc if isinstance(exc, Reply) else Reply(499, "request canceled"))
            ready.exception()  # a load nobody else waited for is not an unretrieved error
            raise
        ready.set_result(None)
        m.ready = None
        return m

    # -- handlers -----------------------------------------------------------------------------

    @web.middleware
    async def _gin_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """gin's own answers for an unknown path and a wrong method [routes.go HandleMethodNotAllowed]."""
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed:
            return web.Response(status=405, text="405 method not allowed")
        except web.HTTPNotFound:
            return web.Response(status=404, text="404 page not found")

    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    def _raw_body(self, request: web.Request) -> web.Response | None:
        raw = self.script.raw_bodies.get(request.path)
        return None if raw is None else web.Response(text=raw, content_type="application/json")

    async def _version(self, request: web.Request) -> web.Response:
        return self._raw_body(request) or web.json_response({"version": self.version})

    async def _tags(self, request: web.Request) -> web.Response:
        # Most recently modified first; every fake model was installed at the same moment.
        return self._raw_body(request) or web.json_response(
            {
                "models": [
                    {
                        "name": m,
                        "model": m,
                        "modified_at": _iso(self.installed_at),
                        "size": model_size(m),
                        "digest": digest(m),
                        "details": details(m, with_lengths=True),
                        "capabilities": list(self.capabilities_of(m)),
                    }
                    for m in sorted(self.models)
                ]
            }
        )

    async def _ps(self, request: web.Request) -> web.Response:
        self.ps_calls += 1
        if self.script.ps_delay_s:
            await asyncio.sleep(self.script.ps_delay_s)
        raw = self._raw_body(request)
        if raw is not None:
            return raw
        self._expire()
        models = []
        for name, m in self.loaded.items():
            models.append(
                (
                    self._expires_wall(m),
                    {
                        "name": name,
                        "model": name,
                        "size": model_size(name),
                        "digest": digest(name),
                        "details": details(name),
                        "expires_at": None,
                        "size_vram": model_size(name),
                        "context_length": m.context_length,
                    },
                )
            )
        models.sort(key=lambda pair: -pair[0])  # the longest time left first [routes.go PsHandler]
        for expires, entry in models:
            entry["expires_at"] = _iso(expires)
        return web.json_response({"models": [entry for _, entry in models]})

    @staticmethod
    def _expires_wall(m: Loaded) -> float:
        """expires_at as wall-clock time; a model in use or loading shows now + its session."""
        now = time.monotonic()
        if m.expires_at is not None:
            return time.time() + (m.expires_at - now)
        return time.time() + (FOREVER_S if m.keep_alive_s is None else m.keep_alive_s)

    async def _show(self, request: web.Request) -> web.Response:
        try:
            body = request_fields(parse_body(await request.read(), "ShowRequest"), "ShowRequest", SHOW_FIELDS)
            wanted = body.get("model") or body.get("name") or ""
            if not wanted:
                raise Reply(400, "model is required")
            name = self._parse_ref(wanted, missing=(400, "model is required"))
            model = self.installed(wanted)
            if model is None:
                raise Reply(404, f"model '{name.short}' not found")
        except Reply as r:
            return self._error(r.status, r.message)
        return web.json_response(self._card(model, body))

    def _card(self, model: str, body: dict[str, Any]) -> dict[str, Any]:
        """/api/show's answer [routes.go GetModelInfo, api/types.go ShowResponse]."""
        profile, name = profile_for(model), ModelName.parse(model)
        capabilities = self.capabilities_of(model)
        template = chat_template(capabilities) if "completion" in capabilities else "{{ .Prompt }}"
        parameters = "\n".join(f"{k:<30} {json.dumps(v, ensure_ascii=False)}" for k, v in profile.parameters)
        modelfile = (
            f'# Modelfile generated by "ollama show"\n# To build a new Modelfile based on this, '
            f"replace FROM with:\n# FROM {name.short}\n\nFROM /root/.ollama/models/blobs/sha256-"
            f'{digest(model)}\nTEMPLATE """{template}"""\n'
            + "".join(f"PARAMETER {k} {json.dumps(v, ensure_ascii=False)}\n" for k, v in profile.parameters)
        )
        family = profile.family
        described = details(model)
        info = {
            "general.architecture": family,
            "general.basename": name.model,
            "general.parameter_count": int(size_bytes(described["parameter_size"], "F16") / 2),
            "general.quantization_version": 2,
            f"{family}.context_length": profile.context_length,
            f"{family}.embedding_length": profile.embedding_length,
            f"{family}.block_count": 28 if profile.embedding_length > 1024 else 12,
        }
        out: dict[str, Any] = {"license": "Apache License 2.0", "modelfile": modelfile}
        if parameters:
            out["parameters"] = parameters
        out["template"] = template
        if body.get("system"):
            out["system"] = body["system"]
        out.update(
            {
                "details": described,
                "model_info": info,
                "capabilities": list(self.capabilities_of(model)),
                "modified_at": _iso(self.installed_at),
            }
        )
        return out

    @staticmethod
    def _error(status: int, message: str) -> web.Response:
        return web.json_response({"error": message}, status=status)

    def _parse_ref(self, raw: str, missing: tuple[int, str]) -> ModelName:
        """Ollama's parseAndValidateModelRef: a blank name gets `missing`, a bad one 400."""
        if not raw.strip():
            raise Reply(*missing)
        name = ModelName.parse(raw.strip())
        if not name.valid:
            raise Reply(400, "invalid model name")
        return name

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        """POST /api/chat and /api/generate, in Ollama's order of checks [routes.go ChatHandler,
        GenerateHandler]."""
        started = time.monotonic()
        chat = request.path.endswith("/chat")
        struct = "ChatRequest" if chat else "GenerateRequest"
        try:
            body = parse_body(await request.read(), struct)
            self.requests.append(body)
            body = request_fields(body, struct, CHAT_FIELDS if chat else GENERATE_FIELDS)
            return await self._answer(request, body, chat, started)
        except Reply as r:
            return self._error(r.status, r.message)

    async def _answer(
        self, request: web.Request, body: dict[str, Any], chat: bool, started: float
    ) -> web.StreamResponse:
        wanted = body.get("model") or ""
        if not 0 <= (body.get("top_logprobs") or 0) <= 20:
            raise Reply(400, "top_logprobs must be between 0 and 20")
        self._parse_ref(wanted, (400, "model is required") if chat else (404, f"model '{wanted}' not found"))
        model = self.installed(wanted)
        if model is None:
            raise Reply(404, f"model '{wanted}' not found")
        empty = not (body.get("messages") if chat else body.get("prompt"))
        if empty and body.get("keep_alive") is not None and parse_keep_alive(body["keep_alive"]) == 0:
            self._begin_unload(model)  # before any other check; the stream flag is ignored
            return web.json_response(self._final(wanted, chat, "", "unload", with_stats=False))
        if not chat and body.get("raw") and (body.get("template") or body.get("system") or body.get("context")):
            raise Reply(400, "raw mode does not support template, system, or context")
        caps = self.capabilities_of(model)
        think = body.get("think")
        if "thinking" in caps:
            think = True if think is None else think  # thinking is on unless asked off (since 0.12.4)
            if think is False and profile_for(model).family == "gptoss":
                think = True  # gpt-oss's trace cannot be turned off [docs/capabilities/thinking.mdx]
        elif think is True or think in THINK_LEVELS:
            raise Reply(400, f"{go_quote(wanted)} does not support thinking")
        needed = (
            ["completion"]
            + (["tools"] if chat and body.get("tools") else [])
            + (["insert"] if not chat and body.get("suffix") else [])
        )
        missing = [c for c in needed if c not in caps]
        if "completion" in missing:
            raise Reply(400, f"{go_quote(wanted)} does not support {'chat' if chat else 'generate'}")
        if missing:  # [images.go CheckCapabilities, routes.go scheduleRunner]
            raise Reply(400, f"{ModelName.parse(model).full} does not support " + "\n".join(missing))
        options = parse_options(body.get("options"))
        s = self.script
        if s.hang_headers:  # until the client gives up, as Ollama drops a cancelled request
            await self._wait_for_disconnect(request)
            return self._error(499, "request canceled")
        num_ctx = self._context_for(model, options)
        entry = await self._acquire(model, body, num_ctx)
        try:
            if empty:
                return web.json_response(self._final(wanted, chat, "", "load", with_stats=False))
            self._check_format(body.get("format"))
            gen = self._plan(body, chat, think, options, num_ctx, started)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                if body.get("stream") is False:
                    return await self._whole(request, body, chat, gen)
                return await self._stream(request, body, chat, gen)
            finally:
                self.in_flight -= 1
        finally:
            self._release(model, entry)

    @staticmethod
    def _check_format(fmt: Any) -> None:
        """ "json", a JSON schema object, or nothing ("" and null) [llm/llama_server.go]."""
        if fmt is None or fmt == "" or fmt == "json" or isinstance(fmt, dict):
            return
        raw = json.dumps(fmt, separators=(",", ":"), ensure_ascii=False)
        raise Reply(500, f'invalid format: {go_quote(raw)}; expected "json" or a valid JSON Schema object')

    # -- the reply ----------------------------------------------------------------------------

    @staticmethod
    def _prompt_text(body: dict[str, Any], chat: bool) -> str:
        if chat:
            return "\n".join((m or {}).get("content") or "" for m in body.get("messages") or [])
        return "\n".join(body.get(k) or "" for k in ("system", "prompt", "suffix"))

    def _plan(
        self, body: dict[str, Any], chat: bool, think: Any, options: dict[str, Any], num_ctx: int, started: float
    ) -> Generation:
        thinking = self._thinking_words(body, chat, think) if think else []
        content = self._reply_words(body, chat)
        reason = "stop"
        stops = [s for s in options.get("stop") or [] if s]
        if stops:  # the reply ends before the first stop sequence it would have written
            text, cut = "", len(content)
            for i, word in enumerate(content):
                text += word
                if any(stop in text for stop in stops):
                    cut = i
                    break
            content = content[:cut]
        limit = options.get("num_predict", -1)
        if 0 <= limit <= len(thinking) + len(content):  # llama-server stops with "limit" [llama_server.go]
            thinking, content = thinking[:limit], content[: max(0, limit - len(thinking))]
            reason = "length"
        gen = Generation(
            thinking, content, reason, self._prompt_tokens(body, chat, options, num_ctx), started, time.monotonic()
        )
        messages = body.get("messages") or []
        if chat and self.script.tool_call and body.get("tools") and (messages[-1] or {}).get("role") != "tool":
            name, arguments = self.script.tool_call
            gen.content = []  # a parsed tool call's text is not content [routes.go ChatHandler]
            gen.tool_calls = [{"id": _tool_call_id(), "function": {"index": 0, "name": name, "arguments": arguments}}]
        return gen

    def _prompt_tokens(self, body: dict[str, Any], chat: bool, options: dict[str, Any], num_ctx: int) -> int:
        """Prompt tokens evaluated. A prompt longer than the context is cut to about half of it,
        keeping its first num_keep tokens [llm/llama_server.go completionPromptForRequest]."""
        text = self._prompt_text(body, chat)
        template = 4 * len(body.get("messages") or []) + 3 if chat else (0 if body.get("raw") else 8)
        count = template + count_tokens(text)
        if count <= num_ctx - 1:
            return count
        num_keep = options.get("num_keep", 4)
        keep = min(count if num_keep < 0 else num_keep + 1, num_ctx - 1)  # + the BOS token
        return num_ctx - max((num_ctx - keep) // 2, 1)

    def _thinking_words(self, body: dict[str, Any], chat: bool, level: Any) -> list[str]:
        rng = random.Random("think:" + self._prompt_text(body, chat) + str(body.get("options", {}).get("seed", "")))
        count = self.script.thinking_tokens
        if count is None:
            scale = {"low": 0.5, "high": 2.0, "max": 3.0}.get(level, 1.0) if isinstance(level, str) else 1.0
            count = int(rng.randint(6, 16) * scale)
        return [rng.choice(THOUGHTS) + " " for _ in range(count)]

    def _reply_words(self, body: dict[str, Any], chat: bool) -> list[str]:
        s = self.script
        if body.get("format") not in (None, ""):
            return re.findall(r"\S+\s*|\s+", self._structured(body))
        if s.reply is not None:
            return re.findall(r"\S+\s*", s.reply)
        prompt = ((body["messages"][-1] or {}).get("content") or "") if chat else body["prompt"]
        rng = random.Random(prompt)
        count = s.tokens if s.tokens is not None else rng.randint(8, 24)
        return [rng.choice(WORDS) + " " for _ in range(count)]

    def _structured(self, body: dict[str, Any]) -> str:
        """A reply to a `format` request: JSON that fits the schema (findings for gpuq's), or junk."""
        if self.script.invalid_json:
            return "Sure! Here are my findings: the plan looks fine"
        prompt = (body["messages"][-1] or {}).get("content") or "" if body.get("messages") else body.get("prompt", "")
        rng = random.Random(prompt + (body.get("model") or ""))
        fmt = body["format"]
        if not (isinstance(fmt, dict) and "findings" in (fmt.get("properties") or {})):
            return json.dumps(
                _instance(
                    fmt if isinstance(fmt, dict) else {"type": "object", "properties": {"answer": {"type": "string"}}},
                    rng,
                    fmt if isinstance(fmt, dict) else {},
                )
            )
        count = self.script.findings if self.script.findings is not None else rng.randint(1, 4)
        findings = [
            {
                "title": f"finding {i + 1}: {rng.choice(WORDS)} {rng.choice(WORDS)}",
                "detail": " ".join(rng.choice(WORDS) for _ in range(12)),
                "severity": rng.choice(["low", "medium", "high"]),
                "where": f"paragraph {rng.randint(1, 9)}",
            }
            for i in range(count)
        ]
        return json.dumps({"findings": findings})

    def _chunk(self, model: str, chat: bool, content: str = "", thinking: str = "") -> dict[str, Any]:
        """A streamed piece; `thinking` is omitted when empty [api/types.go omitempty]."""
        out: dict[str, Any] = {"model": model, "created_at": _now()}
        if chat:
            out["message"] = {"role": "assistant", "content": content, **({"thinking": thinking} if thinking else {})}
        else:
            out["response"] = content
            if thinking:
                out["thinking"] = thinking
        out["done"] = False
        return out

    def _final(
        self,
        model: str,
        chat: bool,
        text: str,
        reason: str,
        with_stats: bool = True,
        eval_count: int = 0,
        started: float = 0.0,
        gen: Generation | None = None,
        thinking: str = "",
        raw: bool = False,
    ) -> dict[str, Any]:
        out = self._chunk(model, chat, text, thinking)
        out["done"] = True
        out["done_reason"] = reason
        if not with_stats:
            return out
        now = time.monotonic()
        started = gen.started if gen else started
        loaded = gen.loaded if gen else started
        if not chat and not raw:  # the conversation so far as tokens [routes.go GenerateHandler]
            rng = random.Random(model)
            out["context"] = [rng.randrange(1, 151000) for _ in range((gen.prompt_tokens if gen else 0) + eval_count)]
        first = gen.first if gen and gen.first is not None else now
        stats = {
            "total_duration": int((now - started) * 1e9),
            "load_duration": max(int((loaded - started) * 1e9), 1),
            "prompt_eval_count": gen.prompt_tokens if gen else 26,
            "prompt_eval_duration": max(int((first - loaded) * 1e9), 1),
            "eval_count": eval_count,
            "eval_duration": max(int((now - first) * 1e9), 1),
        }
        out.update({k: v for k, v in stats.items() if v})  # Metrics are omitempty
        return out

    def _pieces(self, gen: Generation) -> list[tuple[str, str]]:
        return [("thinking", w) for w in gen.thinking] + [("content", w) for w in gen.content]

    async def _stream(
        self, request: web.Request, body: dict[str, Any], chat: bool, gen: Generation
    ) -> web.StreamResponse:
        s = self.script
        model = body["model"]
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        pieces = self._pieces(gen)
        try:
            for i, (kind, word) in enumerate(pieces):
                if s.error_after is not None and i == s.error_after:
                    await resp.write(
                        json.dumps(
                            {"error": "an error was encountered while running the model: unexpected EOF"}
                        ).encode()
                        + b"\n"
                    )
                    return resp
                if s.close_after is not None and i == s.close_after:
                    assert request.transport is not None  # the client's connection, open while it reads
                    request.transport.close()
                    return resp
                if s.stall_after is not None and i == s.stall_after:
                    await self._wait_for_disconnect(request)
                    return resp
                if s.hold_after is not None and i == s.hold_after:
                    await s.released.wait()
                if s.raw_lines is not None and i == s.raw_after:
                    await resp.write("".join(line + "\n" for line in s.raw_lines).encode())
                    await resp.write_eof()
                    return resp
                gen.first = gen.first or time.monotonic()
                chunk = self._chunk(model, chat, **{kind: word})
                await resp.write(json.dumps(chunk, ensure_ascii=False).encode() + b"\n")
                self.chunk_sent.set()
                if s.token_delay_s:
                    await asyncio.sleep(s.token_delay_s)
                if request.transport is None or request.transport.is_closing():
                    raise ConnectionResetError
            if gen.tool_calls:  # one chunk, its content empty [routes.go ChatHandler]
                chunk = self._chunk(model, chat)
                chunk["message"]["tool_calls"] = gen.tool_calls
                await resp.write(json.dumps(chunk, ensure_ascii=False).encode() + b"\n")
            final = self._final(
                model, chat, "", gen.done_reason, eval_count=len(pieces), gen=gen, raw=bool(body.get("raw"))
            )
            await resp.write(json.dumps(final).encode() + b"\n")
            await resp.write_eof()
        except ConnectionResetError:  # like Ollama: the client left, generation stops (no traceback:
            self.disconnects += 1  # a router aborting a preempted or deleted job is routine)
            return resp
        except asyncio.CancelledError:
            self.disconnects += 1
            raise
        return resp

    async def _whole(
        self, request: web.Request, body: dict[str, Any], chat: bool, gen: Generation
    ) -> web.StreamResponse:
        """stream: false: the same generation, answered as one JSON object [routes.go writeChatResponse]."""
        s = self.script
        pieces = self._pieces(gen)
        try:
            for i, _ in enumerate(pieces):
                if s.error_after is not None and i == s.error_after:
                    raise Reply(500, "an error was encountered while running the model: unexpected EOF")
                if s.close_after is not None and i == s.close_after:
                    assert request.transport is not None  # the client's connection, open while it reads
                    request.transport.close()
                    return web.Response()
                if s.stall_after is not None and i == s.stall_after:
                    await self._wait_for_disconnect(request)
                    return web.Response()
                gen.first = gen.first or time.monotonic()
                if s.token_delay_s:
                    await asyncio.sleep(s.token_delay_s)
                if request.transport is None or request.transport.is_closing():
                    raise ConnectionResetError
        except (ConnectionResetError, asyncio.CancelledError):
            self.disconnects += 1
            raise
        final = self._final(
            body["model"],
            chat,
            "".join(gen.content),
            gen.done_reason,
            eval_count=len(pieces),
            gen=gen,
            thinking="".join(gen.thinking),
            raw=bool(body.get("raw")),
        )
        if gen.tool_calls:
            final["message"]["tool_calls"] = gen.tool_calls
        self.chunk_sent.set()
        return web.json_response(final, dumps=lambda d: json.dumps(d, ensure_ascii=False))

    async def _wait_for_disconnect(self, request: web.Request) -> None:
        while request.transport is not None and not request.transport.is_closing():
            await asyncio.sleep(0.02)
        self.disconnects += 1

    # -- embeddings ---------------------------------------------------------------------------

    async def _embed(self, request: web.Request) -> web.Response:
        """POST /api/embed [routes.go EmbedHandler]: any model loads; one without embeddings
        then fails in its runner."""
        started = time.monotonic()
        try:
            body = request_fields(parse_body(await request.read(), "EmbedRequest"), "EmbedRequest", EMBED_FIELDS)
            wanted = body.get("model") or ""
            self._parse_ref(wanted, (404, f"model '{wanted}' not found"))
            texts = body.get("input")
            if isinstance(texts, str):
                texts = [texts] if texts else []
            elif texts is None:
                texts = []
            elif not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
                raise Reply(400, "invalid input type")
            model, entry, num_ctx = await self._embedding_runner(wanted, body)
            loaded = time.monotonic()
            try:
                if not texts:
                    return web.json_response({"model": wanted, "embeddings": []})
                if "embedding" not in self.capabilities_of(model):
                    raise Reply(501, NO_EMBEDDINGS)
                limit = num_ctx  # already within the model's trained context
                counts = [count_tokens(t) for t in texts]
                if body.get("truncate") is False and max(counts) > limit:
                    raise Reply(400, TOO_LONG_FOR_EMBED)
                size = profile_for(model).embedding_length
                dims = body.get("dimensions") or 0
                vectors = [_embedding(t, size, dims if 0 < dims < size else size) for t in texts]
                return web.json_response(
                    {
                        "model": wanted,
                        "embeddings": vectors,
                        "total_duration": max(int((time.monotonic() - started) * 1e9), 1),
                        "load_duration": max(int((loaded - started) * 1e9), 1),
                        "prompt_eval_count": sum(min(c, limit) for c in counts),
                    }
                )
            finally:
                self._release(model, entry)
        except Reply as r:
            return self._error(r.status, r.message)

    async def _embeddings(self, request: web.Request) -> web.Response:
        """POST /api/embeddings, the older single-prompt form [routes.go EmbeddingsHandler]."""
        try:
            body = request_fields(
                parse_body(await request.read(), "EmbeddingRequest"), "EmbeddingRequest", EMBEDDINGS_FIELDS
            )
            wanted = body.get("model") or ""
            self._parse_ref(wanted, (400, "model is required"))
            model, entry, _ = await self._embedding_runner(wanted, body)
            try:
                if not body.get("prompt"):
                    return web.json_response({"embedding": []})
                if "embedding" not in self.capabilities_of(model):
                    raise Reply(500, NO_EMBEDDINGS)
                size = profile_for(model).embedding_length
                return web.json_response({"embedding": _embedding(body["prompt"], size, size)})
            finally:
                self._release(model, entry)
        except Reply as r:
            return self._error(r.status, r.message)

    async def _embedding_runner(self, wanted: str, body: dict[str, Any]) -> tuple[str, Loaded, int]:
        model = self.installed(wanted)
        if model is None:  # this route's message differs from chat's [routes.go handleScheduleError]
            raise Reply(404, f"model {go_quote(wanted)} not found, try pulling it first")
        options = parse_options(body.get("options"))
        num_ctx = self._context_for(model, options)
        return model, await self._acquire(model, body, num_ctx), num_ctx


def _embedding(text: str, size: int, dims: int) -> list[float]:
    """A unit vector derived from the text (cut to `dims` and normalised again, as Ollama does)."""
    rng = random.Random("embed:" + text)
    vector = [rng.gauss(0.0, 1.0) for _ in range(size)][:dims]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [float(f"{x / norm:.7g}") for x in vector]


def _instance(schema: Any, rng: random.Random, root: dict[str, Any], depth: int = 0) -> Any:
    """A value that fits a JSON schema (the subset structured outputs use)."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "$ref" in schema:
        return _instance(_resolve_ref(schema["$ref"], root), rng, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return rng.choice(schema["enum"])
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return _instance(schema[key][0], rng, root, depth + 1)
    kind = _schema_type(schema)
    if kind == "object":
        return {k: _instance(v, rng, root, depth + 1) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        low = schema.get("minItems", 1)
        count = max(low, min(schema.get("maxItems", low + 2), rng.randint(low, low + 2)))
        return [_instance(schema.get("items", {}), rng, root, depth + 1) for _ in range(count)]
    return _scalar(kind, schema, rng)


def _resolve_ref(ref: str, root: dict[str, Any]) -> Any:
    """What a "$ref" ("#/$defs/Finding") points at in the root schema; {} where nothing is."""
    target: Any = root
    for part in ref.lstrip("#/").split("/"):
        target = target.get(part, {}) if isinstance(target, dict) else {}
    return target


def _schema_type(schema: dict[str, Any]) -> Any:
    """A schema's type: the first one not null of a list; unsaid, an object if it has
    properties, else a string."""
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    return kind


def _scalar(kind: Any, schema: dict[str, Any], rng: random.Random) -> Any:
    """A value of a type that holds no other values: a number, a boolean, null or a string."""
    if kind == "integer":
        return rng.randint(schema.get("minimum", 0), schema.get("maximum", 100))
    if kind == "number":
        return round(rng.uniform(schema.get("minimum", 0), schema.get("maximum", 100)), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6)))
