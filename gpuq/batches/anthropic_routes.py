"""Anthropic's Message Batches on the front door: /v1/messages/batches (create, list,
retrieve, cancel, delete) and its results as JSON Lines, in Anthropic's shapes, as its SDK reads them
(`results` follows the batch's `results_url`, here this door's own). The work is the batch
service's (gpuq/batches/service.py); each request is a /v1/messages job in the batch lane."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from ..errors import FrontError
from ..front.call import actor_of
from ..front.context import body_of
from ..front.shapes import dumps
from .doors import batches_of, caller_of, json_reply, limit_of, send_stream
from .shapes import anthropic_result, message_batch


def base_url(request: web.Request) -> str:
    """This door as its caller reached it: the results_url the SDK follows."""
    return f"{request.scheme}://{request.host}"


async def create(request: web.Request) -> web.Response:
    """A batch's every request arrives in one JSON body, bounded by front.max_request_bytes (413
    past it) and its requests by front.max_batch_lines; parsed and checked off the event loop."""
    body = await asyncio.to_thread(body_of, await request.read())
    batch = await batches_of(request).create_anthropic(
        caller_of(request), request.headers.get("User-Agent"), actor_of(request, "anthropic"), body
    )
    return json_reply(message_batch(batch, base_url(request)))


async def list_batches(request: web.Request) -> web.Response:
    limit = limit_of(request, 20, 1000)
    found = await batches_of(request).listed(caller_of(request), "anthropic", request.query.get("after_id"), limit + 1)
    shown = [message_batch(b, base_url(request)) for b in found[:limit]]
    return json_reply(
        {
            "data": shown,
            "has_more": len(found) > limit,
            "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None,
        }
    )


async def retrieve(request: web.Request) -> web.Response:
    batch = await batches_of(request).get(request.match_info["id"], caller_of(request), "anthropic")
    return json_reply(message_batch(batch, base_url(request)))


async def cancel(request: web.Request) -> web.Response:
    batch = await batches_of(request).cancel(
        request.match_info["id"], caller_of(request), actor_of(request, "anthropic"), "anthropic"
    )
    return json_reply(message_batch(batch, base_url(request)))


async def delete(request: web.Request) -> web.Response:
    """DELETE: an ended batch gone, as the SDK's `messages.batches.delete` reads it."""
    batch = await batches_of(request).delete(
        request.match_info["id"], caller_of(request), actor_of(request, "anthropic"), "anthropic"
    )
    return json_reply({"id": batch["id"], "type": "message_batch_deleted"})


async def results(request: web.Request) -> web.StreamResponse:
    """The batch's results, one JSON line per request in its order; only once it has ended (as
    Anthropic's: before, no results_url)."""
    service, batch_id = batches_of(request), request.match_info["id"]
    batch = await service.get(batch_id, caller_of(request), "anthropic")
    if message_batch(batch, "")["processing_status"] != "ended":
        raise_not_ended(batch["id"])
    batch = await service.results(batch_id, caller_of(request), "anthropic")

    async def pages() -> AsyncIterator[bytes]:
        async for lines in service.results_pages(batch):
            yield b"".join(dumps(anthropic_result(line)).encode() + b"\n" for line in lines)

    resp = web.StreamResponse(headers={"Content-Type": "application/binary"})
    return await send_stream(
        request, resp, pages(), service.settings.front_stalled_client_s, f"results of batch {batch['id']}"
    )


def raise_not_ended(batch_id: str) -> None:
    raise FrontError(400, f"batch {batch_id} is still processing: its results are ready once it has ended")


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v1/messages/batches", create)
    router.add_get("/v1/messages/batches", list_batches, allow_head=False)
    router.add_get("/v1/messages/batches/{id}", retrieve, allow_head=False)
    router.add_delete("/v1/messages/batches/{id}", delete)
    router.add_post("/v1/messages/batches/{id}/cancel", cancel)
    router.add_get("/v1/messages/batches/{id}/results", results, allow_head=False)
