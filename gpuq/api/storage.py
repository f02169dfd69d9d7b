"""GET /api/storage (`gpuq storage`): the storage budget as /health shows it (size, WAL, growth per
day, free space, warnings, the last backup, the last retention sweep) and which tables and indexes hold the bytes. Counting
them reads every page of a SQLite file (dbstat), on a connection of its own in a thread: the
writer goes on meanwhile, and one count runs at a time."""

from __future__ import annotations

import asyncio

from aiohttp import web

from .render import json_response
from .state import STORE, UPKEEP

COUNTING = web.AppKey("counting storage", asyncio.Lock)


async def storage_view(request: web.Request) -> web.Response:
    app = request.app
    watch = app[UPKEEP].storage
    if watch.now is None or watch.store.dsn is None:  # measured now, not up to REFRESH_S ago
        await watch.run_once()
    async with app[COUNTING]:
        relations = await app[STORE].relations()
    total = sum(r["bytes"] for r in relations["relations"]) or 1
    for r in relations["relations"]:
        r["share"] = round(r["bytes"] / total, 4)
    body = {
        **(watch.json() or {}),
        "backup": app[UPKEEP].backups.json(),
        "retention": app[UPKEEP].sweeper.report.json(),
    }
    return json_response(body | relations)
