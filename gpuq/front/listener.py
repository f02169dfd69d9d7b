"""The front door: a second listener (`[router] ollama_listen`) that answers as an Ollama server
does, its OpenAI-compatible /v1 routes included, so that any Ollama or OpenAI client can use the
lab unchanged, and OpenAI's Responses API and Anthropic's Messages API as Ollama serves them.
Every call that makes a model work is a durable job: stored before any work, placed by its
model, queued, visible, movable; its client's connection is held while it waits and its chunks
are relayed as the node sends them (gpuq/front/relay.py). Each route that makes a job is one
record of gpuq/front/endpoints.py; the translations live in ollama_api.py, openai_api.py,
responses.py and anthropic.py, their shared helpers in shapes.py."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import Any, Callable

from aiohttp import web

from ..access import identity
from ..bus import Bus
from ..config import Settings
from ..access.connections import BACKLOG, body_deadline, bind_sockets
from ..node.dispatcher import Dispatcher
from ..errors import (
    BadRequest, Conflict, DoorWords, FrontError, IdTaken, ModelMissing, NotFound, OllamaError, StartupError,
    StoreUnavailable, check_text, http_error, json_object, json_type,
)
from ..jobs import ACTIVE, new_job_id, normalize_model, preview_url
from ..access.identity import ANYONE, Caller
from ..access.lanes import Door, lane_for
from ..access.hosts import CALLER, check_host, served_hosts, token_of
from ..store import NewJob, Store
from .anthropic import anthropic_error
from .endpoints import ENDPOINTS, Endpoint, api_of, early_refusal, entries_of, front_nodes
from .ollama_api import (
    collected, is_load_or_unload, load_or_unload_reply, merged_ps, merged_tags, ollama_error, pull_model_of,
    pull_progress,
)
from .openai_api import model_card, model_list, openai_error
from .relay import Relay
from .shapes import dumps, should_retry

log = logging.getLogger("gpuq")

FRONT = web.AppKey("front", "Front")
STATE_CHECK_S = 1.0  # a waiting call rereads its job this often when nothing arrives (a safety net)
KEEPALIVE_S = 10.0  # an OpenAI stream that waits gets an SSE comment this often
LISTING_TIMEOUT_S = 3.0  # /api/ps and /api/show ask the nodes; a slow node is left out of /api/ps
# A call whose job someone else ended (deleted, preempted) before anything was sent gets this
# status, not Ollama's 499: 499 means "the client closed the request", and clients treat it as
# their own abort and show nothing (Continue's streamResponse returns quietly on 499).
ENDED_STATUS = 410
# Browsers and Electron apps call the front door as they call Ollama: by CORS, with Ollama's
# configuration (server/routes.go GenerateRoutes: cors.DefaultConfig, AllowWildcard, its
# AllowHeaders; envconfig/config.go AllowedOrigins), answered as gin-contrib/cors v1.7.2 does.
DEFAULT_ORIGINS = (
    *(f"{scheme}://{host}{port}" for host in ("localhost", "127.0.0.1", "0.0.0.0")
      for port in ("", ":*") for scheme in ("http", "https")),
    "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*",
)
CORS_ALLOW_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"  # cors.DefaultConfig
CORS_ALLOW_HEADERS = ",".join((  # canonical forms, as gin-contrib/cors writes them (utils.go)
    "Authorization", "Content-Type", "User-Agent", "Accept", "X-Requested-With", "Openai-Beta",
    "X-Stainless-Arch", "X-Stainless-Async", "X-Stainless-Custom-Poll-Interval", "X-Stainless-Helper-Method",
    "X-Stainless-Lang", "X-Stainless-Os", "X-Stainless-Package-Version", "X-Stainless-Poll-Helper",
    "X-Stainless-Retry-Count", "X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Timeout",
))
CORS_MAX_AGE = "43200"  # cors.DefaultConfig's MaxAge, 12 h
CORS_ORIGIN = "gpuq.cors_origin"  # the request's allowed origin, for its answer's headers
NOT_SERVED = ("/api/push", "/api/create", "/api/delete", "/api/copy", "/api/blobs")


class Front:
    """What the front door's handlers share: the router's store, dispatcher and bus, and the
    relay its waiting calls hear their runs through."""

    def __init__(self, settings: Settings, store: Store, dispatcher: Dispatcher, bus: Bus, relay: Relay):
        self.settings = settings
        self.store = store
        self.dispatcher = dispatcher
        self.bus = bus
        self.relay = relay
        self.closing = False

    def nodes_by_rank(self):
        return sorted(self.dispatcher.nodes.values(), key=lambda rt: rt.config.rank)

    def preview_url(self, job_id: str) -> str:
        return preview_url(self.settings.public_url, job_id)

    async def cancel(self, job_id: str, reason: str, actor: str) -> None:
        """End a call's job because its client is gone: as a delete, with the reason."""
        try:
            job, interrupted = await self.store.delete(job_id, actor, reason=reason)
        except (Conflict, NotFound):
            return  # it ended on its own meanwhile
        except StoreUnavailable as exc:
            log.error("job=%s could not be cancelled (%s): %s", job_id, reason, exc.message)
            return
        self.dispatcher.abort(interrupted, reason)
        self.bus.publish("queue", {"deleted": job_id})
        log.info("job=%s node=%s state=cancelled reason=%r actor=%r", job_id, job["node"], reason, actor)


# -- errors, access --------------------------------------------------------------------------

def error_response(request: web.Request, status: int, message: str, code: str | None = None,
                   headers: dict | None = None) -> web.Response:
    """An error in the shape of the caller's API; an OpenAI or Anthropic client is told whether
    to retry it (x-should-retry, which both SDKs obey): only a refusal that stored nothing and
    may pass later (503, 429) is retried, never one that would be refused again or a job."""
    api = api_of(request.path)
    if api == "ollama":
        return web.json_response(ollama_error(message), status=status, headers=headers, dumps=dumps)
    headers = {**(headers or {}), "x-should-retry": should_retry(status)}
    if api == "anthropic":
        body = anthropic_error(status, message)
    else:
        body = openai_error(status, message, code)
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


FRONT_DOOR = DoorWords(no_route=lambda method, path: f"404 page not found: gpuq's front door has no route {method} {path}",
                       wrong_method=lambda method, path: f"405 method not allowed: {method} {path}",
                       too_large=" (front.max_request_bytes)", internal="internal error in the gpuq router; see its log")


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except Exception as exc:
        error = http_error(exc, FRONT_DOOR, request.method, request.path)
        if error is None:
            raise
        if error.unexpected:
            log.exception("unexpected error on the front door: %s %s", request.method, request.path)
        wait = error.retry_after_s  # both SDKs obey Retry-After
        return error_response(request, error.status, error.message, error.code,
                              headers={"Retry-After": str(wait)} if wait else None)


def tokens_given(request: web.Request) -> list[str]:
    """The tokens a call offers: Bearer, and on /v1/messages also x-api-key (the Anthropic SDK's
    api_key and Claude Code's ANTHROPIC_API_KEY send it; ANTHROPIC_AUTH_TOKEN sends Bearer)."""
    given = [token_of(request)]
    if api_of(request.path) == "anthropic":
        given.append(request.headers.get("x-api-key"))
    return [t for t in given if t is not None]


class Origins:
    """Which browser origins may call the front door: Ollama's defaults and [front] origins (as
    OLLAMA_ORIGINS), matched as gin-contrib/cors matches them (config.go validateOrigin: exact, or
    one '*' as a prefix/suffix wildcard; a lone '*' allows every origin)."""

    def __init__(self, configured: tuple[str, ...]):
        listed = [*configured, *DEFAULT_ORIGINS]
        self.everyone = "*" in listed
        self.exact = frozenset(o for o in listed if "*" not in o)
        self.wildcards = [tuple(o.split("*", 1)) for o in listed if "*" in o and o != "*"]

    def allows(self, origin: str) -> bool:
        if self.everyone or origin in self.exact:
            return True
        return any(origin.startswith(head) and origin.endswith(tail) and len(origin) >= len(head) + len(tail)
                   for head, tail in self.wildcards)


def cors(request: web.Request, origins: Origins) -> web.Response | None:
    """gin-contrib/cors's applyCors for one request: no Origin, or the front door's own origin,
    is not a CORS request; an origin not allowed is 403; a preflight (OPTIONS) from an allowed
    one is answered here, 204, and any other call goes on, its answer marked for that origin."""
    origin = request.headers.get("Origin")
    if not origin or origin in (f"http://{request.host}", f"https://{request.host}"):
        return None
    if not origins.allows(origin):
        raise FrontError(403, f"origin '{origin[:200]}' is not allowed to call this gpuq front door (as in Ollama, "
                              "allowed are localhost, 127.0.0.1 and 0.0.0.0 on any port, app://, file://, tauri://, "
                              "vscode-webview:// and vscode-file://); add it to [front] origins in gpuq.toml, "
                              "as OLLAMA_ORIGINS")
    request[CORS_ORIGIN] = "*" if origins.everyone else origin
    if request.method != "OPTIONS":
        return None
    headers = {"Access-Control-Allow-Origin": request[CORS_ORIGIN], "Access-Control-Allow-Methods": CORS_ALLOW_METHODS,
               "Access-Control-Allow-Headers": CORS_ALLOW_HEADERS, "Access-Control-Max-Age": CORS_MAX_AGE}
    resp = web.Response(status=204, headers=headers)
    if not origins.everyone:
        for vary in ("Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers"):
            resp.headers.add("Vary", vary)
    return resp


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer to an allowed cross-origin call, errors and streams too, names its origin
    (on_response_prepare: a stream's headers go out before its handler returns)."""
    origin = request.get(CORS_ORIGIN)
    if origin is not None and request.method != "OPTIONS":
        response.headers["Access-Control-Allow-Origin"] = origin
        if origin != "*":
            response.headers.add("Vary", "Origin")


def access_middleware(settings: Settings, live: Callable[[], Settings] | None = None):
    """The router's own rules: its host names only (no DNS rebinding; Ollama's rule, gpuq/access/hosts.py),
    browsers by CORS as Ollama allows them (a preflight needs no token: browsers send none), and
    its token when one is set (Bearer, as the OpenAI SDK's api_key sends it), on every route but
    `/` ("Ollama is running", which clients probe). Who calls is gpuq/access/identity.py's who, over the
    live settings (`live`: a reload's [[user]] changes apply at once), kept as request[CALLER]."""
    allowed = served_hosts(settings)
    origins = Origins(settings.front_origins)

    @web.middleware
    async def middleware(request: web.Request, handler):
        check_host(request, allowed)
        preflight = cors(request, origins)
        if preflight is not None:
            return preflight
        if request.method == "OPTIONS":  # no CORS, a known host: 204 (allowedHostsMiddleware)
            return web.Response(status=204)
        caller = await identity.who(live() if live else settings, tokens_given(request), request, any_key=True)
        request[CALLER] = caller or ANYONE
        if caller is None and request.path != "/":
            if api_of(request.path) == "anthropic":
                raise FrontError(401, "missing or wrong token: this gpuq front door needs the token as 'x-api-key: "
                                      "<token>' or 'Authorization: Bearer <token>' (ANTHROPIC_API_KEY or "
                                      "ANTHROPIC_AUTH_TOKEN=<token>)")
            raise FrontError(401, "missing or wrong token: this gpuq front door needs 'Authorization: Bearer "
                                  "<token>' (OpenAI SDK: api_key=<token>; ollama: "
                                  "headers={'Authorization': 'Bearer <token>'})", "invalid_api_key")
        return await handler(request)
    return middleware


def text_bytes(value: Any) -> int:
    """The UTF-8 bytes of a request's text, in Ollama's terms: every string in it but its images."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        return sum(text_bytes(v) for k, v in value.items() if k != "images")
    if isinstance(value, list):
        return sum(text_bytes(v) for v in value)
    return 0


def check_text_size(ollama: dict, limit: int) -> None:
    """The front door takes images up to front.max_request_bytes; its text is held to the
    router's prompt limit, as every job's prompt is (413, as the router's API says it)."""
    size = text_bytes(ollama)
    if size > limit:
        raise FrontError(413, f"request text is {size} bytes (images not counted), over the limit of {limit} "
                              "(router.max_prompt_bytes)")


async def json_of(request: web.Request) -> dict:
    """A front-door call's body, whatever its API; text that cannot be stored is a 400 here, once."""
    body = json_object(await request.read(), "missing request body", "invalid character in JSON", json_type,
                       strict=True)
    check_text(body)
    return body


# -- what the nodes have -----------------------------------------------------------------------

def _version_key(text: str) -> tuple:
    parts = []
    for piece in text.split("-")[0].split("."):
        parts.append(int(piece) if piece.isdigit() else 0)
    return tuple(parts)


async def root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def version(request: web.Request) -> web.Response:
    """The oldest Ollama among the nodes: what every node can do (clients gate features on it)."""
    known = [rt.version for rt in request.app[FRONT].nodes_by_rank() if rt.version]
    return web.json_response({"version": min(known, key=_version_key) if known else "0.0.0"}, dumps=dumps)


def all_tags(front: Front) -> list[dict]:
    return merged_tags((rt.tags for rt in front_nodes(front.nodes_by_rank())), normalize_model)


async def tags(request: web.Request) -> web.Response:
    """Every model the front door can run (installed on a task node), each once, as the nodes'
    last health checks saw them: a critique-only node's models are not listed."""
    return web.json_response({"models": all_tags(request.app[FRONT])}, dumps=dumps)


async def ps(request: web.Request) -> web.Response:
    """What the nodes have loaded now (a node that does not answer in time is left out)."""
    nodes = [rt for rt in request.app[FRONT].nodes_by_rank() if rt.up]
    answers = await asyncio.gather(*(rt.client.ps(timeout_s=LISTING_TIMEOUT_S) for rt in nodes), return_exceptions=True)
    return web.json_response({"models": merged_ps(a for a in answers if isinstance(a, list))}, dumps=dumps)


def node_with(front: Front, model: str):
    """The first node by rank, up, whose Ollama lists the model (for /api/show)."""
    wanted = normalize_model(model)
    return next((rt for rt in front.nodes_by_rank() if rt.up and rt.installed and wanted in rt.installed), None)


async def _show(front: Front, body: dict) -> dict:
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("model is required")
    rt = node_with(front, model)
    if rt is None:
        raise NotFound(f"model '{model}' not found")
    try:
        return await rt.client.post("/api/show", {**body, "model": model}, timeout_s=30.0)
    except OllamaError as exc:
        raise FrontError(exc.status or 502, exc.message) from None


def model_not_found(front: Front, model: str) -> str:
    """Ollama's 404 text, and why when /api/tags lists the model: only nodes that take no task
    jobs have it, and every front-door call is a task (or embed) job."""
    wanted = normalize_model(model)
    elsewhere = [rt.name for rt in front.nodes_by_rank()
                 if "task" not in rt.config.roles and rt.installed and wanted in rt.installed]
    if not elsewhere:
        return f"model '{model}' not found"
    return (f"model '{model}' not found on a node that takes task jobs: only {', '.join(elsewhere)} has it "
            "(front-door calls run on task nodes; pull it on one, or give that node the task role)")


async def show(request: web.Request) -> web.Response:
    """Answered by a node that has the model: no GPU work, so not a job."""
    return web.json_response(await _show(request.app[FRONT], await json_of(request)), dumps=dumps)


async def openai_models(request: web.Request) -> web.Response:
    return web.json_response(model_list(all_tags(request.app[FRONT])), dumps=dumps)


async def openai_model(request: web.Request) -> web.Response:
    """A model /v1/models lists (a task node has it), described by a node's /api/show."""
    name = request.match_info["model"]
    if not entries_of(request.app[FRONT].nodes_by_rank(), name):
        raise NotFound(f"model '{name}' not found")
    return web.json_response(model_card(name, await _show(request.app[FRONT], {"model": name})), dumps=dumps)


async def pull(request: web.Request) -> web.StreamResponse:
    """Ollama's success for a model a task node has (server/routes.go PullHandler: a stream of
    progress objects, or with stream:false the last one); a 404 saying where to pull one that
    none has."""
    front = request.app[FRONT]
    body = await json_of(request)
    model = pull_model_of(body)
    nodes = front_nodes(front.nodes_by_rank())
    having = [rt.name for rt in nodes if entries_of([rt], model)]
    progress = pull_progress(model, having, {rt.name: sorted(rt.installed or ()) for rt in nodes})
    if body.get("stream") is False:
        return web.json_response(progress[-1], dumps=dumps)
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    await resp.write(b"".join(dumps(p).encode() + b"\n" for p in progress))
    await resp.write_eof()
    return resp


async def not_served(request: web.Request) -> web.Response:
    raise FrontError(501, f"gpuq's front door does not manage models ({request.path}): run it on a node's own "
                          "Ollama (e.g. `ollama pull <model>` there); /api/tags lists what the nodes have")


# -- calls that are jobs -----------------------------------------------------------------------

class Call:
    """One front-door call from submit to its last byte."""

    def __init__(self, request: web.Request, ep: Endpoint, body: dict):
        self.request = request
        self.front: Front = request.app[FRONT]
        self.ep = ep
        self.endpoint = ep.path
        self.body = body  # as the client sent it
        self.ollama = ep.to_ollama(body)  # in Ollama's terms (raises BadRequest)
        check_text_size(self.ollama, self.front.settings.max_prompt_bytes)
        self.api = ep.api
        self.openai = self.api != "ollama"  # /v1: streams only when asked, as SSE
        self.stream = ep.streams(body)
        self.job_id = ""
        self.node = ""
        self.inbox: asyncio.Queue = asyncio.Queue()  # what its run sends (gpuq/front/relay.py)
        self.resp: web.StreamResponse | None = None
        self.chunks: list[dict] = []
        self.delivered = False  # the client has its whole answer: a disconnect now cancels nothing
        self.started = False  # its run began on a node
        self.sse: Any = None  # a /v1 stream's translator (feed, error), once the job has its id
        self.parked = False  # its handler waits on the inbox: a chunk may be written by the relay
        self.fed = False  # the relay wrote a chunk since the handler last looked (write_now)
        self.unsent: list[bytes] = []  # chunks write_now took, written together once the read is done

    @property
    def caller(self) -> Caller:
        return self.request.get(CALLER, ANYONE)

    @property
    def actor(self) -> str:
        """'alice (ollama 127.0.0.1)', as the router's API names its callers (server.actor_of)."""
        door = f"{self.api} {self.request.remote or '?'}"
        return door if self.caller.name is None else f"{self.caller.name} ({door})"

    def headers(self) -> dict:
        out = {"X-Gpuq-Job": self.job_id, "X-Gpuq-Preview": self.front.preview_url(self.job_id)}
        if self.node:
            out["X-Gpuq-Node"] = self.node
        return out

    # -- submit ---------------------------------------------------------------------------

    def new_job(self, job_id: str) -> NewJob:
        request = {"path": self.endpoint, "user_agent": self.request.headers.get("User-Agent"), "body": self.body}
        # (a Responses or Messages call is shown from its translation, made once, in __init__)
        return NewJob(kind=self.ep.kind, prompt=self.ep.shown_prompt(self.body, self.ollama),
                      model=self.ollama["model"].strip(), endpoint=self.endpoint, request=dumps(request),
                      job_id=job_id, owner=self.caller.name, client=self.request.headers.get("User-Agent"),
                      lane=lane_for(self.caller.user, None, Door.FRONT))

    async def submit(self) -> None:
        """Store the job (placed by its model) before any work; the relay is in place first, so
        the node's first chunk cannot come before its client listens."""
        front = self.front
        for _ in range(8):  # a chosen id taken by another job of the same second: choose again
            self.job_id = new_job_id()
            self.inbox = front.relay.open(self.job_id, self.write_now, self.send_unsent)
            submitting = asyncio.ensure_future(front.dispatcher.submit(self.new_job(self.job_id), self.actor))
            try:
                jobs = await asyncio.shield(submitting)
                break
            except IdTaken:
                front.relay.close(self.job_id)
            except ModelMissing:
                front.relay.close(self.job_id)
                raise FrontError(404, model_not_found(front, self.ollama["model"]), "model_not_found") from None
            except asyncio.CancelledError:  # the client left while its job was being stored
                await self._cancel_when_stored(submitting)
                raise
            except BaseException:
                front.relay.close(self.job_id)
                raise
        else:
            raise FrontError(503, "could not choose a free job id; try again")
        job = jobs[0]
        self.node = job["node"]
        log.info("job=%s node=%s state=%s model=%s kind=%s placement=%r via=%s actor=%r", self.job_id, self.node,
                 job["state"], job["model"], job["kind"], job["reason"], self.endpoint, self.actor)
        if self.openai and self.stream:
            self.sse = self.stream_translator()

    def stream_translator(self):
        """Chat or generate chunks -> the /v1 route's server-sent events."""
        return self.ep.stream(self.ep.reply_id(self.job_id), self.job_id, self.body)

    async def _cancel_when_stored(self, submitting: asyncio.Future) -> None:
        try:
            await submitting
        except BaseException:
            self.front.relay.close(self.job_id)
            return
        await self.front.cancel(self.job_id, "client disconnected", self.actor)
        self.front.relay.close(self.job_id)

    # -- follow -----------------------------------------------------------------------------

    async def follow(self) -> web.StreamResponse:
        """Relay the job's run to the client until its last byte, or its end. Chunks that
        arrived together go out in one write: a slow reader costs the relay no extra CPU."""
        if self.sse is not None:  # headers now, so that comments keep a long wait alive
            await self.prepare("text/event-stream")
        waited = time.monotonic()
        while True:
            self.parked = True
            try:
                async with asyncio.timeout(STATE_CHECK_S):
                    items = [await self.inbox.get()]
            except TimeoutError:
                self.parked = False
                if self.fed:  # the relay wrote chunks meanwhile: the job runs, the stream is alive
                    self.fed = False
                    waited = time.monotonic()
                    continue
                ended = await self.ended_meanwhile()
                if ended is not None:
                    return await self.fail(*ended)
                if self.sse is not None and time.monotonic() - waited >= KEEPALIVE_S:
                    waited = time.monotonic()
                    await self.resp.write(f": waiting for node {self.node} (gpuq job {self.job_id})\n\n".encode())
                continue
            finally:
                self.parked = False
            while not self.inbox.empty():
                items.append(self.inbox.get_nowait())
            out, self.unsent = self.unsent, []  # chunks write_now took before these (not yet sent)
            for item in items:
                kind = item[0]
                if kind == "data":  # a chunk write_now had translated, but could not write
                    out.append(item[1])
                    continue
                if kind == "chunk":
                    data, done = self.on_chunk(item[1], item[2])
                    out.append(data)
                    if done:
                        await self.flush(out, last=True)
                        return self.resp
                    continue
                await self.flush(out)
                out = []
                if kind == "start":
                    self.node, self.started = item[1], True
                elif kind == "reply":
                    return await self.on_reply(item[1])
                elif kind == "error":
                    return await self.fail(item[1] or 500, item[2])
                elif kind == "ended":
                    return await self.on_ended(item[1])
                elif kind == "shutdown":  # a running job is failed at the next start, as any running then
                    if not self.started:
                        await self.front.cancel(self.job_id, "router shut down while its client waited", "router")
                    return await self.fail(503, "the gpuq router is shutting down; this request was cancelled",
                                           "router_shutdown")
            await self.flush(out)

    def write_now(self, raw: bytes, chunk: dict) -> bool:
        """A chunk from the node's reading task (Relay.chunk), taken at once when nothing stands
        before it: the handler waits with its inbox empty, the chunk is not the last, and the
        client reads (its response has begun and its connection's writing is not paused, so the
        write completes without waiting). Else it goes through the inbox as before, and the
        handler writes it (waiting for a slow client: back pressure as ever)."""
        if not self.parked or chunk.get("done") or not self.inbox.empty():
            return False
        if self.sse is None and not self.stream:  # stream:false: kept for the one reply
            self.chunks.append(chunk)
            self.fed = True
            return True
        if not self.writable():
            return False
        try:
            data, _ = self.on_chunk(raw, chunk)
        except Exception:  # the client's translation fails in its handler, as before, not in the node's run
            return False
        if data:  # the chunks of one read go out in one write, after it (Relay.flush)
            self.unsent.append(data)
        self.fed = True
        return True

    def writable(self) -> bool:
        resp, transport, protocol = self.resp, self.request.transport, self.request.protocol
        return not (resp is None or not resp.prepared or transport is None or transport.is_closing()
                    or protocol is None or protocol.writing_paused)

    def send_unsent(self) -> None:
        """The chunks write_now took, in one write (unless the handler took them meanwhile):
        called by the node's reading task once a read's chunks are handled (Relay.flush)."""
        if not self.unsent:
            return
        data, self.unsent = b"".join(self.unsent), []
        if not self.parked or not self.writable():  # the handler writes them, as it would have
            self.inbox.put_nowait(("data", data))
            return
        writing = self.resp.write(data)
        try:
            writing.send(None)  # not paused: it returns without waiting
        except StopIteration:
            pass
        except Exception:  # nothing was written: the handler writes it, and hears the error
            self.inbox.put_nowait(("data", data))
        else:  # it waited for the client after writing: the next chunks queue behind
            writing.close()

    async def flush(self, out: list[bytes], last: bool = False) -> None:
        data = b"".join(out)
        if data:
            await self.prepare("text/event-stream" if self.sse is not None else "application/x-ndjson")
            await self.resp.write(data)
        if last:
            self.delivered = True
            if self.resp is not None and self.resp.prepared:
                await self.resp.write_eof()

    async def ended_meanwhile(self) -> tuple | None:
        """The job ended with nothing for this client (a path that did not tell it)."""
        if not self.inbox.empty():
            return None
        try:
            job = await self.front.store.job(self.job_id)
        except (NotFound, StoreUnavailable):
            return None
        if job["state"] in ACTIVE or not self.inbox.empty():
            return None
        message = f"gpuq job {self.job_id} is {job['state']}: {job['error'] or 'ended'}"
        return ENDED_STATUS, message, "job_" + job["state"]

    async def prepare(self, content_type: str) -> None:
        if self.resp is None:
            self.resp = web.StreamResponse(headers={"Content-Type": content_type, **self.headers()})
            if content_type == "text/event-stream":
                self.resp.headers["Cache-Control"] = "no-cache"
            await self.resp.prepare(self.request)

    def on_chunk(self, raw: bytes, chunk: dict) -> tuple[bytes, bool]:
        """One chunk from the node: the bytes for the client now, and whether it was the last.
        stream:false keeps them, and the last makes the one reply."""
        done = bool(chunk.get("done"))
        if self.sse is not None:
            return self.sse.feed(chunk), done
        if self.stream:  # Ollama's own stream: the node's line as it sent it
            return raw + b"\n", done
        self.chunks.append(chunk)
        if done:
            reply = self.whole_reply(collected(self.ep.node_route, self.chunks, self.ollama))
            self.resp = web.json_response(reply, headers=self.headers(), dumps=dumps)
            if not self.openai:
                self.resp.content_type, self.resp.charset = "application/json", "utf-8"
        return b"", done

    def whole_reply(self, reply: Any) -> Any:
        """stream:false (or an embedding): the node's reply in the route's shape (an Ollama
        route's as the node gave it)."""
        if self.ep.whole is None:
            return reply
        return self.ep.whole(self.ep.reply_id(self.job_id), self.job_id, self.body, reply)

    async def on_reply(self, reply: Any) -> web.StreamResponse:
        reply = self.whole_reply(reply)
        self.delivered = True
        return web.json_response(reply, headers=self.headers(), dumps=dumps)

    async def on_ended(self, reason: str) -> web.StreamResponse:
        """A person (or the router) ended the running job: the client hears why."""
        if reason.startswith("preempted by"):
            # Its run went back in the queue, but its client's request ends here: with no one to
            # answer, it would run for no one. It is cancelled; `gpuq retry` runs it again.
            await self.front.cancel(self.job_id, f"{reason}; its client's request ended with the run", "router")
            return await self.fail(ENDED_STATUS, f"gpuq job {self.job_id} was {reason}; its request ended (gpuq retry "
                                        f"{self.job_id} runs it again)", "job_preempted")
        if reason == "client disconnected":
            return await self.fail(499, "request canceled", "job_cancelled")
        return await self.fail(ENDED_STATUS, f"gpuq job {self.job_id} was {reason}: request canceled",
                               "job_cancelled")

    async def fail(self, status: int, message: str, code: str | None = None) -> web.StreamResponse:
        """The call ends with an error: its status and body when nothing was sent yet, else one
        error line in its API's stream shape."""
        self.delivered = True  # the client has its answer: the error
        if self.resp is not None and self.resp.prepared:
            if self.sse is not None:
                await self.resp.write(self.sse.error(status, message, code))
            else:
                await self.resp.write(dumps(ollama_error(message)).encode() + b"\n")
            await self.resp.write_eof()
            return self.resp
        return error_response(self.request, status, message, code, headers=self.headers())


async def run_call(request: web.Request, ep: Endpoint) -> web.StreamResponse:
    """A call that makes a model work: a job, followed to its end by its client."""
    body = await json_of(request)
    if ep.check is not None:
        ep.check(body)
    front = request.app[FRONT]
    if front.closing:
        raise FrontError(503, "the gpuq router is shutting down", "router_shutdown")
    if is_load_or_unload(ep.path, body):
        # gpuq loads a model for each job and unloads it after: nothing to do, answered as Ollama
        # does, for a model some node has (Open WebUI unloads this way).
        wanted = normalize_model(body["model"])
        if not any(wanted in (rt.installed or ()) for rt in front_nodes(front.nodes_by_rank())):
            raise NotFound(f"model '{body['model']}' not found")
        return web.json_response(load_or_unload_reply(ep.path, body), dumps=dumps)
    call = Call(request, ep, body)
    await early_refusal(ep, call.ollama, front.nodes_by_rank())  # what its node would refuse, before it waits
    try:
        await call.submit()
        return await call.follow()
    except asyncio.CancelledError:  # aiohttp cancels the handler when its client disconnects
        if call.job_id and not call.delivered and not front.closing:
            await asyncio.shield(front.cancel(call.job_id, "client disconnected", call.actor))
        raise
    except ConnectionError:  # the client left while a chunk was written
        if call.job_id and not call.delivered:
            await front.cancel(call.job_id, "client disconnected", call.actor)
        raise
    finally:
        if call.job_id:
            front.relay.close(call.job_id)


def call_handler(ep: Endpoint):
    """The handler of an endpoint's route (one per record of gpuq/front/endpoints.py)."""
    async def handler(request: web.Request) -> web.StreamResponse:
        return await run_call(request, ep)
    return handler


# -- assembly -----------------------------------------------------------------------------------

async def _closing(app: web.Application) -> None:
    """Calls still waiting end first (their jobs cancelled), or the shutdown waits for them."""
    front = app[FRONT]
    front.closing = True
    front.relay.shutdown()


def create_front_app(settings: Settings, store: Store, dispatcher: Dispatcher, bus: Bus,
                     relay: Relay) -> web.Application:
    """The front door's app; the router's app (gpuq/api/app.py) owns the store and dispatcher,
    and its workers run the calls' jobs through `relay` (the Dispatcher's calls)."""
    app = web.Application(middlewares=[errors_middleware, body_deadline(settings.body_timeout_s, error_response),
                                       access_middleware(settings, lambda: dispatcher.settings)],
                          client_max_size=settings.front_max_request_bytes)  # images: its text is checked apart
    app[FRONT] = Front(settings, store, dispatcher, bus, relay)
    app.on_shutdown.append(_closing)
    app.on_response_prepare.append(cors_headers)
    r = app.router
    r.add_get("/", root)
    r.add_get("/api/version", version)
    r.add_get("/api/tags", tags)
    r.add_get("/api/ps", ps, allow_head=False)
    r.add_post("/api/show", show)
    r.add_post("/api/pull", pull)
    for ep in ENDPOINTS.values():
        r.add_post(ep.path, call_handler(ep))
    r.add_get("/v1/models", openai_models, allow_head=False)
    r.add_get("/v1/models/{model:.+}", openai_model, allow_head=False)
    for path in NOT_SERVED:
        r.add_route("*", path, not_served)
        r.add_route("*", path + "/{rest:.*}", not_served)
    return app


class FrontDoor:
    """The running front door: its runner, its servers and the address clients use."""

    def __init__(self, runner: web.AppRunner, servers: list, url: str):
        self.runner = runner
        self.servers = servers
        self.url = url

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        await self.runner.cleanup()  # its waiting calls end first (on_shutdown), then connections


def bind_front_door(settings: Settings, any_port_if_taken: bool = False) -> list[socket.socket]:
    """The front door's listening sockets, bound with the router's before anything starts (none
    when `ollama_listen` is not set). The demo takes any free port when its usual one is taken."""
    if settings.ollama_listen is None:
        return []
    host, port = settings.ollama_listen.rsplit(":", 1)
    host = host.strip("[]")
    try:
        sockets = bind_sockets(settings.ollama_listen, host, int(port))
    except StartupError as exc:
        if not any_port_if_taken:
            raise StartupError(f"{exc.message} (router.ollama_listen)") from None
        sockets = bind_sockets(f"{host}:0", host, 0)
    return sockets


async def start_front_door(settings: Settings, store: Store, dispatcher: Dispatcher, bus: Bus, relay: Relay,
                           sockets: list[socket.socket], guard) -> FrontDoor | None:
    """Serve the front door on its sockets, beside the router (the router's app owns the store
    and the dispatcher). A client that disconnects cancels its handler (handler_cancellation),
    so its waiting job is cancelled at once."""
    if not sockets:
        return None
    app = create_front_app(settings, store, dispatcher, bus, relay)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True,
                           keepalive_timeout=settings.keepalive_timeout_s)
    await runner.setup()
    loop = asyncio.get_running_loop()
    servers = [await loop.create_server(guard.protocol_factory(runner.server), sock=sock, backlog=BACKLOG)
               for sock in sockets]
    bound = sockets[0].getsockname()[1]
    return FrontDoor(runner, servers, settings.ollama_url.rsplit(":", 1)[0] + f":{bound}")
