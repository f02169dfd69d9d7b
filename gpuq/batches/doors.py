"""What the front door's batch routes share (OpenAI's, batches/openai_routes.py; Anthropic's,
batches/anthropic_routes.py): the one batch service, who calls, and the replies' small shapes."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ..access.identity import ANYONE, Caller
from ..access.tokens import CALLER
from ..errors import FrontError
from ..front.shapes import dumps
from .service import BatchService

BATCHES = web.AppKey("batches", BatchService)  # the front door's batch service (set by gpuq.batches)


def batches_of(request: web.Request) -> BatchService:
    return request.app[BATCHES]


def caller_of(request: web.Request) -> Caller:
    caller: Caller = request.get(CALLER, ANYONE)
    return caller


def limit_of(request: web.Request, default: int, most: int) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return default
    try:
        limit = int(raw)
    except ValueError:
        raise FrontError(400, f"limit: an integer from 1 to {most} is required, got {raw[:20]!r}") from None
    if not 1 <= limit <= most:
        raise FrontError(400, f"limit: an integer from 1 to {most} is required, got {limit}")
    return limit


def json_reply(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=dumps)
