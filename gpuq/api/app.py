"""The router's HTTP API assembled: the app factory (its state, middlewares and routes) and its
lifecycle. The views live beside it, one module per concern, thin: parse, call one verb of the
store or the dispatcher, render. Errors are raised as GpuqError anywhere and rendered once,
here, as {"error": {"status", "message"}} (errors.http_error is the ladder)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from aiohttp.typedefs import Handler

from ..access.connections import body_deadline
from ..access.doors import api_access, host_middleware
from ..batches.runs import BatchRelay
from ..batches.service import BatchService
from ..bus import Bus
from ..config import Settings
from ..errors import DoorWords, http_error
from ..node.dispatcher import Dispatcher
from ..shipped import shipped_files
from ..store import Store
from ..upkeep import Upkeep
from . import batches
from .backup import backup_view
from .callers import whoami
from .health import activity_view, alerts, health, metrics
from .inputs import bounded
from .jobs import get_job, history, list_jobs, submit
from .metrics import Metrics
from .models import models
from .pages import WEB_DIR, headers_middleware, history_page, page, preview_page, usage_page
from .queue import clear, delete, move, nodes, preempt, queue, retry, stale
from .reload import reload_view
from .render import error_response
from .retention import prune_view
from .state import BATCHES, BUS, DISPATCHER, METRICS, RELOADING, SETTINGS, STORE, UPKEEP
from .storage import COUNTING, storage_view
from .streams import events, stream_job
from .usage import usage_view

log = logging.getLogger("gpuq")


API_DOOR = DoorWords(
    no_route=lambda method, path: f"no route for {path}",
    wrong_method=None,
    too_large="",
    internal="internal error in the router; see its log",
)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:
        error = http_error(exc, API_DOOR, request.method, request.path)
        if error is None:
            raise
        if error.unexpected and isinstance(exc, ConnectionResetError) and client_left(request):
            # A closed tab ends its event stream or job stream this way: normal, and nobody to answer.
            log.debug("client left during %s %s", request.method, request.path)
        elif error.unexpected:
            log.exception("unexpected error on %s %s", request.method, request.path)
        response = error_response(error.status, error.message)
        if error.retry_after_s is not None:
            response.headers["Retry-After"] = str(error.retry_after_s)
        return response


def client_left(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


async def _end_streams(app: web.Application) -> None:
    """Open streams (a page's events, a job's output) end first, or shutdown waits for them."""
    app[BUS].publish("shutdown", {})


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    store = app[STORE]
    await store.open()
    dispatcher = app[DISPATCHER]
    try:
        await store.configure(
            {
                "stale_after_s": settings.stale_after_s,
                "stale_grace_s": settings.stale_grace_s,
                "max_runtime_s": settings.max_runtime_s,
            },
            list(settings.nodes),
        )
        # A model a previous router saw stuck in VRAM keeps its node flagged until it is gone.
        await dispatcher.start(stuck=[a for a in await store.open_alerts() if a["alert"] == "vram_stuck"])
        await app[UPKEEP].start()
    except BaseException:  # the store's threads would keep a router that failed to start alive
        await app[UPKEEP].stop()
        await dispatcher.stop()
        await store.close()
        raise
    # Sum the history for /metrics now, so the first scrape after a start is not the slow one.
    warm = asyncio.create_task(app[METRICS].catch_up(store))
    yield
    warm.cancel()
    await asyncio.gather(warm, return_exceptions=True)
    await app[UPKEEP].stop()
    await dispatcher.stop()
    await store.close()


def create_app(settings: Settings, clock: Callable[[], float] = time.time) -> web.Application:
    app = web.Application(
        middlewares=[
            headers_middleware,
            errors_middleware,
            body_deadline(settings.body_timeout_s, lambda _, *error: error_response(*error)),
            host_middleware(settings),
            api_access(lambda: app[DISPATCHER].settings),
        ],
        client_max_size=settings.max_prompt_bytes * 2 + 65536,
    )
    bus = Bus()
    store = Store(
        settings.database,
        settings.busy_timeout_s,
        clock,
        max_bytes=settings.max_database_bytes,
        submit_timeout_s=settings.submit_timeout_s,
    )
    app[SETTINGS] = settings
    app[STORE] = store
    app[BUS] = bus
    app[METRICS] = Metrics()
    # Jobs that clients called for (the front door's, a batch's lines) run as the front door
    # prepares them, and their waiting clients hear their runs through its relay; a batch line's
    # reply is kept for its batch (gpuq/batches/runs.py).
    app[DISPATCHER] = Dispatcher(settings, store, bus, calls=BatchRelay(store))
    dispatcher = app[DISPATCHER]
    app[BATCHES] = BatchService(store, dispatcher)
    app[UPKEEP] = Upkeep(settings, store, dispatcher, bus, app[BATCHES], clock)
    app[RELOADING] = asyncio.Lock()
    app[COUNTING] = asyncio.Lock()
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_end_streams)
    r = app.router
    r.add_get("/health", health)
    r.add_get("/metrics", metrics)
    r.add_get("/api/queue", bounded(queue))
    r.add_get("/api/nodes", bounded(nodes))
    r.add_get("/api/models", bounded(models))
    r.add_get("/api/stale", bounded(stale))
    r.add_get("/api/history", bounded(history))
    r.add_get("/api/activity", bounded(activity_view))
    r.add_get("/api/alerts", bounded(alerts))
    r.add_get("/api/events", events)
    r.add_post("/api/jobs", submit)
    r.add_get("/api/jobs", bounded(list_jobs))
    r.add_get("/api/jobs/{id}", bounded(get_job))
    r.add_delete("/api/jobs/{id}", delete)
    r.add_get("/api/jobs/{id}/stream", stream_job)
    r.add_post("/api/jobs/{id}/move", move)
    r.add_post("/api/jobs/{id}/preempt", preempt)
    r.add_post("/api/jobs/{id}/retry", retry)
    r.add_post("/api/nodes/{name}/clear", clear)
    r.add_post("/api/reload", reload_view)
    r.add_post("/api/backup", backup_view)
    r.add_post("/api/prune", prune_view)
    r.add_get("/api/storage", storage_view)
    r.add_get("/api/usage", bounded(usage_view))
    batches.add_routes(r, bounded)  # gpuq batch, the pages
    r.add_get("/api/whoami", whoami)
    r.add_get("/", page)
    r.add_get("/jobs/{id}", preview_page)
    r.add_get("/history", history_page)
    r.add_get("/usage", usage_page)
    shipped_files(WEB_DIR, "index.html", "pages")
    r.add_static("/static/", WEB_DIR, name="static")
    return app
