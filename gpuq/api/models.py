"""GET /api/models: every node's models (gpuq/node_models.py), for `gpuq models`: /api/tags as
the node's monitor last read it, /api/ps asked now (each node at once, briefly: a node that
does not answer says why, its models' `loaded` unknown), the runs' use and measured speed."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from .. import speed
from ..errors import OllamaError
from ..node.runtime import NodeRuntime
from ..node_models import USE_DAYS, node_models, use_by_model
from .render import json_response
from .state import DISPATCHER, STORE

PS_TIMEOUT_S = 3.0  # a node that takes longer to list what it has loaded is shown as not answering


async def models(request: web.Request) -> web.Response:
    runtimes = list(request.app[DISPATCHER].nodes.values())
    store = request.app[STORE]
    answers = await asyncio.gather(*(_ps(rt) for rt in runtimes))
    asked = {
        (rt.name, name)
        for rt, (ps, _) in zip(runtimes, answers)
        for m in [*rt.tags, *(ps or []), {"name": rt.config.model}]
        for name in speed.asked_names(m["name"])
    }
    speeds = speed.from_rows(await store.speeds(asked, speed.LAST_RUNS))
    use = use_by_model(await store.model_use(time.time() - USE_DAYS * 86400))
    return json_response(
        {
            "nodes": [
                {
                    "name": rt.name,
                    "up": rt.up,
                    "ps_error": error,
                    "models": node_models(rt.name, rt.config.model, rt.tags, ps, speeds, use),
                }
                for rt, (ps, error) in zip(runtimes, answers)
            ]
        }
    )


async def _ps(rt: NodeRuntime) -> tuple[list[dict[str, Any]] | None, str | None]:
    """/api/ps' models, or None and why the node did not say."""
    try:
        return await rt.client.ps(PS_TIMEOUT_S), None
    except OllamaError as exc:
        return None, exc.message
