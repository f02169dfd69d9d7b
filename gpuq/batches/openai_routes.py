"""OpenAI's Files and Batch API on the front door: /v1/files (upload as the SDK sends it,
multipart; list, retrieve, delete, content) and /v1/batches (create, list, retrieve, cancel), in
OpenAI's shapes. Each handler reads its request and answers in OpenAI's shape; the work is the
batch service's (gpuq/batches/service.py)."""

from __future__ import annotations

import email.policy
from email.parser import BytesParser
from typing import Any

from aiohttp import web

from ..errors import FrontError
from ..front.call import actor_of
from ..front.context import json_of
from .doors import batches_of, caller_of, json_reply, limit_of
from .shapes import batch_object, file_object


def page(data: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """OpenAI's cursor page: `after` the last id for the next one."""
    shown = data[:limit]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
        "has_more": len(data) > limit,
    }


# -- /v1/files ---------------------------------------------------------------------------------


def form_parts(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data's fields: name -> (filename, bytes). The body is whole already (read
    within router.body_timeout, bounded by front.max_request_bytes: access/connections.py)."""
    message = BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode("latin-1") + body
    )
    if not message.is_multipart():
        raise FrontError(400, "a file is uploaded as multipart/form-data with the fields 'purpose' and 'file'")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if isinstance(name, str) and name not in fields:
            payload = part.get_payload(decode=True)
            fields[name] = (part.get_filename(), payload if isinstance(payload, bytes) else b"")
    return fields


async def upload_file(request: web.Request) -> web.Response:
    """POST /v1/files: multipart/form-data with `purpose` and `file`, as the SDK sends it. The
    file is one request: front.max_request_bytes bounds it (413 past it, naming that key)."""
    if not request.content_type.startswith("multipart/form-data"):
        raise FrontError(400, "a file is uploaded as multipart/form-data with the fields 'purpose' and 'file'")
    fields = form_parts(request.headers["Content-Type"], await request.read())
    if "purpose" not in fields:
        raise FrontError(400, "Missing required parameter: 'purpose'.", "missing_required_parameter")
    if "file" not in fields:
        raise FrontError(400, "Missing required parameter: 'file'.", "missing_required_parameter")
    purpose = fields["purpose"][1].decode("utf-8", "replace").strip()
    filename, content = fields["file"]
    row = await batches_of(request).upload(caller_of(request), purpose, filename or "upload.jsonl", content)
    return json_reply(file_object(row))


async def list_files(request: web.Request) -> web.Response:
    limit = limit_of(request, 10000, 10000)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise FrontError(400, f"order: 'asc' or 'desc', got {order[:20]!r}")
    found = await batches_of(request).files(
        caller_of(request), request.query.get("purpose"), request.query.get("after"), limit + 1, order == "asc"
    )
    return json_reply(page([file_object(f) for f in found], limit))


async def get_file(request: web.Request) -> web.Response:
    row = await batches_of(request).file(request.match_info["id"], caller_of(request))
    return json_reply(file_object(row))


async def delete_file(request: web.Request) -> web.Response:
    file_id = request.match_info["id"]
    await batches_of(request).delete_file(file_id, caller_of(request))
    return json_reply({"id": file_id, "object": "file", "deleted": True})


async def file_content(request: web.Request) -> web.Response:
    content = await batches_of(request).file_content(request.match_info["id"], caller_of(request))
    return web.Response(body=content, content_type="application/octet-stream")


# -- /v1/batches -------------------------------------------------------------------------------


async def create_batch(request: web.Request) -> web.Response:
    body = await json_of(request)
    batch = await batches_of(request).create_openai(
        caller_of(request),
        request.headers.get("User-Agent"),
        actor_of(request, "openai"),
        body.get("input_file_id"),
        body.get("endpoint"),
        body.get("completion_window"),
        body.get("metadata"),
    )
    return json_reply(batch_object(batch))


async def list_batches(request: web.Request) -> web.Response:
    limit = limit_of(request, 20, 100)
    found = await batches_of(request).listed(caller_of(request), "openai", request.query.get("after"), limit + 1)
    return json_reply(page([batch_object(b) for b in found], limit))


async def get_batch(request: web.Request) -> web.Response:
    batch = await batches_of(request).get(request.match_info["id"], caller_of(request), "openai")
    return json_reply(batch_object(batch))


async def cancel_batch(request: web.Request) -> web.Response:
    batch = await batches_of(request).cancel(
        request.match_info["id"], caller_of(request), actor_of(request, "openai"), "openai"
    )
    return json_reply(batch_object(batch))


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_post("/v1/files", upload_file)
    router.add_get("/v1/files", list_files, allow_head=False)
    router.add_get("/v1/files/{id}", get_file, allow_head=False)
    router.add_delete("/v1/files/{id}", delete_file)
    router.add_get("/v1/files/{id}/content", file_content, allow_head=False)
    router.add_post("/v1/batches", create_batch)
    router.add_get("/v1/batches", list_batches, allow_head=False)
    router.add_get("/v1/batches/{id}", get_batch, allow_head=False)
    router.add_post("/v1/batches/{id}/cancel", cancel_batch)
