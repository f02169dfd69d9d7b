"""The front door: a second listener (`[router] ollama_listen`) that answers as an Ollama server
does, its OpenAI-compatible /v1 routes included, so that any Ollama or OpenAI client can use the
lab unchanged, and OpenAI's Responses API and Anthropic's Messages API as Ollama serves them.
This module binds it, orders its middlewares (errors, body deadline, access/doors.py's
front_access) and routes: each route that makes a job is one record of endpoints.py, run as a
Call (call.py); the others are listings.py's. The translations live in ollama_api.py,
openai_api.py, responses.py and anthropic.py, their shared helpers in shapes.py."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence

from aiohttp import web
from aiohttp.typedefs import Handler

from ..access.connections import BACKLOG, ConnectionGuard, bind_sockets, body_deadline
from ..access.doors import front_access
from ..access.sites import cors_headers
from ..bus import Bus
from ..config import Settings
from ..errors import DoorWords, StartupError, http_error
from ..jobs import api_of
from ..node.dispatcher import Dispatcher
from ..store import Store
from .call import call_handler
from .context import FRONT, Front, error_response
from .endpoints import ENDPOINTS
from .listings import NOT_SERVED, not_served, openai_model, openai_models, ps, pull, root, show, status, tags, version
from .relay import Relay

log = logging.getLogger("gpuq")


# -- errors, access --------------------------------------------------------------------------


FRONT_DOOR = DoorWords(
    no_route=lambda method, path: f"404 page not found: gpuq's front door has no route {method} {path}",
    wrong_method=lambda method, path: f"405 method not allowed: {method} {path}",
    too_large=" (front.max_request_bytes)",
    internal="internal error in the gpuq router; see its log",
)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        error = http_error(exc, FRONT_DOOR, request.method, request.path)
        if error is None:
            raise
        if error.unexpected:
            log.exception("unexpected error on the front door: %s %s", request.method, request.path)
        wait = error.retry_after_s  # both SDKs obey Retry-After
        return error_response(
            request, error.status, error.message, error.code, headers={"Retry-After": str(wait)} if wait else None
        )


# -- what the nodes have -----------------------------------------------------------------------


# -- calls that are jobs -----------------------------------------------------------------------


# -- assembly -----------------------------------------------------------------------------------


async def _closing(app: web.Application) -> None:
    """Calls still waiting end first (their jobs cancelled), or the shutdown waits for them."""
    front = app[FRONT]
    front.closing = True
    front.relay.shutdown()


MoreRoutes = Callable[[web.Application], None]


def create_front_app(
    settings: Settings,
    store: Store,
    dispatcher: Dispatcher,
    bus: Bus,
    relay: Relay,
    more_routes: MoreRoutes | None = None,
) -> web.Application:
    """The front door's app; the router's app (gpuq/api/app.py) owns the store and dispatcher,
    and its workers run the calls' jobs through `relay` (the Dispatcher's calls). `more_routes`
    adds the routes of what stands on the front door (the batches' APIs: gpuq.batches)."""
    app = web.Application(
        middlewares=[
            errors_middleware,
            body_deadline(settings.body_timeout_s, error_response),
            front_access(settings, lambda: dispatcher.settings, anthropic=lambda path: api_of(path) == "anthropic"),
        ],
        client_max_size=settings.front_max_request_bytes,
    )  # images: its text is checked apart
    app[FRONT] = Front(settings, store, dispatcher, bus, relay)
    app.on_shutdown.append(_closing)
    app.on_response_prepare.append(cors_headers)
    r = app.router
    r.add_get("/", root)
    r.add_get("/api/version", version)
    r.add_get("/api/tags", tags)
    r.add_get("/api/ps", ps, allow_head=False)
    r.add_get("/api/status", status, allow_head=False)
    r.add_post("/api/show", show)
    r.add_post("/api/pull", pull)
    for ep in ENDPOINTS.values():
        r.add_post(ep.path, call_handler(ep))
    if more_routes is not None:
        more_routes(app)
    r.add_get("/v1/models", openai_models, allow_head=False)
    r.add_get("/v1/models/{model:.+}", openai_model, allow_head=False)
    for path in NOT_SERVED:
        r.add_route("*", path, not_served)
        r.add_route("*", path + "/{rest:.*}", not_served)
    return app


class FrontDoor:
    """The running front door: its runner, its servers and the address clients use."""

    def __init__(self, runner: web.AppRunner, servers: list[asyncio.Server], url: str) -> None:
        self.runner = runner
        self.servers = servers
        self.url = url

    async def stop(self) -> None:
        for server in self.servers:
            server.close()
        await self.runner.cleanup()  # its waiting calls end first (on_shutdown), then connections


FREE_PORT_TRIES = 50  # how far above its port a front door looks for a free one (the demo's)


def bind_front_door(settings: Settings, next_free_if_taken: bool = False) -> list[socket.socket]:
    """The front door's listening sockets, bound with the router's before anything starts (none
    when `ollama_listen` is not set). `next_free_if_taken` (the demo's): when its port is taken,
    the next free one above it, so a restart beside the same programs lands on the same port."""
    if settings.ollama_listen is None:
        return []
    host, port = settings.ollama_listen.rsplit(":", 1)
    host = host.strip("[]")
    try:
        return bind_sockets(settings.ollama_listen, host, int(port))
    except StartupError as exc:
        if not next_free_if_taken:
            raise StartupError(f"{exc.message} (router.ollama_listen)") from None
        first = exc
    for other in range(int(port) + 1, min(int(port) + FREE_PORT_TRIES, 65535) + 1):
        try:
            return bind_sockets(f"{host}:{other}", host, other)
        except StartupError:
            continue
    raise StartupError(f"{first.message}, and so are the {FREE_PORT_TRIES} ports above it (the demo's front door)")


async def start_front_door(
    settings: Settings,
    store: Store,
    dispatcher: Dispatcher,
    bus: Bus,
    relay: Relay,
    sockets: Sequence[socket.socket],
    guard: ConnectionGuard,
    more_routes: MoreRoutes | None = None,
) -> FrontDoor | None:
    """Serve the front door on its sockets, beside the router (the router's app owns the store
    and the dispatcher). A client that disconnects cancels its handler (handler_cancellation),
    so its waiting job is cancelled at once."""
    if not sockets:
        return None
    app = create_front_app(settings, store, dispatcher, bus, relay, more_routes)
    runner = web.AppRunner(
        app,
        handle_signals=False,
        access_log=None,
        handler_cancellation=True,
        keepalive_timeout=settings.keepalive_timeout_s,
    )
    await runner.setup()
    assert runner.server is not None  # setup() made it
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(guard.protocol_factory(runner.server), sock=sock, backlog=BACKLOG) for sock in sockets
    ]
    bound = sockets[0].getsockname()[1]
    url = settings.ollama_url
    assert url is not None  # sockets are bound only when ollama_listen is set (bind_front_door)
    return FrontDoor(runner, servers, url.rsplit(":", 1)[0] + f":{bound}")
