"""`gpuq prune` (POST /api/prune): the retention sweep now, or with `dry_run` what it would drop
and how many bytes (gpuq/upkeep/retention.py). Admin only."""

from __future__ import annotations

import logging

from aiohttp import web

from .callers import actor_of, admin_only
from .inputs import field_of, json_body
from .render import json_response
from .state import UPKEEP

log = logging.getLogger("gpuq")


async def prune_view(request: web.Request) -> web.Response:
    admin_only(request, "pruning the database")
    body = await json_body(request, {"dry_run"})
    dry = field_of(body, "dry_run", bool) or False
    sweeper = request.app[UPKEEP].sweeper
    if dry:
        return json_response({"dry_run": True} | await sweeper.plan())
    swept = await sweeper.run_once(force=True)
    log.info("retention sweep asked by %s: %s", actor_of(request), swept.json())
    return json_response({"dry_run": False} | swept.json())
