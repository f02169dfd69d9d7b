"""What the front door's batch routes share (OpenAI's, batches/openai_routes.py; Anthropic's,
batches/anthropic_routes.py): the one batch service, who calls, and the replies' small shapes."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from ..access.identity import ANYONE, Caller
from ..access.tokens import CALLER
from ..errors import FrontError
from ..front.shapes import dumps
from .service import BatchService

log = logging.getLogger("gpuq")

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


async def send_stream(
    request: web.Request, resp: web.StreamResponse, pieces: AsyncIterator[bytes], stalled_s: float, what: str
) -> web.StreamResponse:
    """A download sent piece by piece: each write waits for the client to take what the
    transport holds past its high-water mark (backpressure), so the router holds one piece and the
    socket's buffers, never the whole. A client that takes nothing of a write for `stalled_s`
    ([front] stalled_client_timeout) has its connection closed, and the download ends there."""
    await resp.prepare(request)
    try:
        async for piece in pieces:
            async with asyncio.timeout(stalled_s):
                await resp.write(piece)
        await resp.write_eof()
    except TimeoutError:
        log.warning(
            "%s: its client took nothing for %ss ([front] stalled_client_timeout): connection closed",
            what,
            f"{stalled_s:g}",
        )
        if request.transport is not None:
            request.transport.abort()
    return resp
