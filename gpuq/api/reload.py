"""gpuq.toml read again while the router runs: `gpuq reload` (POST /api/reload) and SIGHUP."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from ..config import ConfigError, load_config
from ..errors import Conflict, GpuqError, Unprocessable
from ..reload import REMOVED_REASON, plan, refusal
from .callers import actor_of, admin_only
from .inputs import field_of, json_body
from .render import json_response
from .state import BUS, DISPATCHER, RELOADING, STORE, UPKEEP

log = logging.getLogger("gpuq")


async def reload_config(app: web.Application, actor: str, force: bool = False) -> dict[str, Any]:
    """Read gpuq.toml again and follow it (gpuq/reload.py says what changed). A file that cannot
    be read or is invalid changes nothing; removing a node where jobs wait or run is refused,
    naming them, unless `force` (its waiting jobs fail, its running one finishes). Every reload,
    refused or not, is a row of config_reload and a log line."""
    dispatcher, store = app[DISPATCHER], app[STORE]
    async with app[RELOADING]:
        old = dispatcher.settings
        if old.source is None:
            message = (
                "this router has no gpuq.toml to reload: it runs the demo's simulated nodes; "
                "serve a config file (gpuq serve --config gpuq.toml) to change settings live"
            )
            log.error("config not reloaded (asked by %s): %s", actor, message)
            raise Conflict(message)
        path = str(old.source)

        async def refused(message: str) -> None:
            log.error("config not reloaded from %s by %s: %s", path, actor, message)
            try:
                await store.record_reload(actor, path, None, message)
            except GpuqError as exc:
                log.error("config reload not recorded: %s", exc.message)

        try:
            new = await asyncio.to_thread(load_config, old.source)
        except ConfigError as exc:
            message = f"not reloaded, nothing changed: {exc.message}"
            await refused(message)
            raise Unprocessable(message) from None
        change = plan(old, new)
        dispatcher.leaving(change.removed)
        try:
            failed = await store.remove_nodes(list(change.removed), force, REMOVED_REASON, refusal)
            settings = change.settings
            await store.configure(
                {
                    "stale_after_s": settings.stale_after_s,
                    "stale_grace_s": settings.stale_grace_s,
                    "max_runtime_s": settings.max_runtime_s,
                },
                list(settings.nodes),
            )
        except GpuqError as exc:
            dispatcher.restore(change.removed)
            await refused(exc.message)
            raise
        dispatcher.reconfigure(change)
        await app[UPKEEP].alerter.reconfigure(change.settings)
        app[UPKEEP].backups.wake.set()  # a new schedule is looked at now
        for job in failed:
            log.warning("job=%s node=%s state=failed reason=%r", job["id"], job["node"], REMOVED_REASON)
        dispatcher.ended([j["id"] for j in failed], REMOVED_REASON)
        answer = {"path": path, **change.json(), "failed": [{"id": j["id"], "node": j["node"]} for j in failed]}
        log.info("config reloaded from %s by %s: %s", path, actor, change.summary())
        try:
            await store.record_reload(actor, path, answer, None)
        except GpuqError as exc:  # in force all the same: the log line says what changed
            log.error("config reload not recorded: %s", exc.message)
        app[BUS].publish("queue", {"reloaded": True})
        return answer


async def reload_view(request: web.Request) -> web.Response:
    admin_only(request, "reloading gpuq.toml")
    body = await json_body(request, {"force"}) if request.body_exists else {}  # body_deadline read it
    force = field_of(body, "force", bool) or False
    return json_response(await reload_config(request.app, actor_of(request), force))


def reload_on_signal(app: web.Application) -> None:
    """SIGHUP: reload gpuq.toml as `gpuq reload` does; the outcome goes to the log."""

    async def reload() -> None:
        try:
            await reload_config(app, "signal SIGHUP")
        except GpuqError:
            pass  # logged by reload_config
        except Exception:
            log.exception("config reload on SIGHUP failed")

    task = asyncio.ensure_future(reload())
    app[DISPATCHER].retiring.add(task)  # kept until done, cancelled at the stop
    task.add_done_callback(app[DISPATCHER].retiring.discard)
