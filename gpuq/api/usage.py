"""GET /api/usage (`gpuq usage`, the /usage page): usage over time, summed by user, node, model,
client or lane per step of a window (store/usage.py). On a router with users a member reads
their own runs only, an admin everyone's (access/privacy.py usage_scope)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from aiohttp import web

from ..access.privacy import usage_scope
from ..config.checks import parse_duration
from ..errors import BadRequest, ConfigError
from ..jobs import iso
from ..store.usage import KEYS
from .callers import caller_of
from .render import json_response
from .state import STORE

MAX_STEPS = 2000  # points per series: a year by the hour is 8,784; ask for steps of 5h or more
MIN_STEP_S = 60


def duration_param(query: Mapping[str, str], key: str, default: str) -> int:
    """A window's length or its step: '7d', '1h', '90m', '1h30m'; whole seconds, at least 1,
    at most a year."""
    text = query.get(key, default)
    try:
        seconds = parse_duration(text, f"query parameter '{key}'")
    except ConfigError as exc:
        raise BadRequest(exc.message) from None
    if seconds < 1:
        raise BadRequest(f"query parameter '{key}' must be at least 1s, got '{text[:40]}'")
    return math.ceil(seconds)


def window(query: Mapping[str, str], now: float) -> tuple[float, int, int]:
    """The window's start (a whole number of steps since the epoch, so hours are clock hours),
    its step in seconds and its number of steps, or a 400 naming what is wrong."""
    since = duration_param(query, "since", "7d")
    step = duration_param(query, "step", "1h")
    if step < MIN_STEP_S:
        raise BadRequest(f"query parameter 'step' must be at least {MIN_STEP_S}s, got '{query['step'][:40]}'")
    start = math.floor((now - since) / step) * step
    steps = math.ceil((now - start) / step)
    if steps > MAX_STEPS:
        raise BadRequest(
            f"since={query.get('since', '7d')[:40]} in steps of step={query.get('step', '1h')[:40]} is {steps} steps;"
            f" at most {MAX_STEPS}: ask for a longer step or a shorter window"
        )
    return float(start), step, steps


async def usage_view(request: web.Request) -> web.Response:
    q = request.query
    by = q.get("by", "user")
    if by not in KEYS:
        raise BadRequest(f"query parameter 'by' must be one of {', '.join(KEYS)}, got '{by[:40]}'")
    store = request.app[STORE]
    now = store.clock()
    start, step, steps = window(q, now)
    owner = usage_scope(caller_of(request))
    rows = await store.usage(by, start, now, step, owner)
    body = {
        "by": by,
        "since": iso(start),
        "until": iso(now),
        "step_s": step,
        "steps": steps,
        "scope": "everyone" if owner is None else "own",
        "rows": rows,
    }
    return json_response(body)
