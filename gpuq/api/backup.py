"""`gpuq backup` (POST /api/backup): a consistent, checked copy of the router's SQLite database,
made while it runs (gpuq/store/backup.py says how). Admin only; the path is on the router's
machine."""

from __future__ import annotations

import logging

from aiohttp import web

from ..errors import GpuqError
from .callers import actor_of, admin_only
from .inputs import field_of, json_body
from .render import json_response
from .state import STORE

log = logging.getLogger("gpuq")


async def backup_view(request: web.Request) -> web.Response:
    admin_only(request, "backing up the database")
    body = await json_body(request, {"path", "force"})
    path = field_of(body, "path", str, required=True)
    force = field_of(body, "force", bool) or False
    actor = actor_of(request)
    try:
        made = await request.app[STORE].backup(path, force)
    except GpuqError as exc:
        log.error("database not backed up to %s (asked by %s): %s", path, actor, exc.message)
        raise
    log.info(
        "database backed up to %s by %s: %d bytes in %.2fs, integrity %s",
        made["path"],
        actor,
        made["bytes"],
        made["seconds"],
        made["integrity"],
    )
    return json_response(made)
