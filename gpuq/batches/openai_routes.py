"""OpenAI's Files and Batch API on the front door: /v1/files (upload as the SDK sends it,
multipart; list, retrieve, delete, content) and /v1/batches (create, list, retrieve, cancel), in
OpenAI's shapes. Each handler reads its request and answers in OpenAI's shape; the work is the
batch service's (gpuq/batches/service.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader, web

from ..access.connections import late_body, streams_body
from ..errors import FrontError
from ..front.call import actor_of
from ..front.context import error_response, json_of
from ..store import Row
from .doors import batches_of, caller_of, json_reply, limit_of, send_stream
from .files import FileUpload
from .service import BatchService
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

READ_BYTES = 64 * 1024  # an upload is read from its socket this much at a time
MAX_FIELD_BYTES = 1024  # a form field that is not the file ('purpose')
NOT_MULTIPART = "a file is uploaded as multipart/form-data with the fields 'purpose' and 'file'"
INCOMPLETE = "the upload ended before its closing multipart boundary: incomplete upload"


class Form:
    """One upload's multipart form, read as it arrives: its fields but the file kept (small),
    the file sent to the store chunk by chunk, the body's bytes counted against
    front.max_request_bytes."""

    def __init__(self, request: web.Request, limit: int) -> None:
        self.request = request
        self.limit = limit
        self.read = 0
        self.fields: dict[str, str] = {}
        self.upload: FileUpload | None = None

    async def parts(self) -> None:
        """Every part, to the closing boundary; a body that ends before it is refused."""
        try:
            reader = await self.request.multipart()
            while (part := await reader.next()) is not None:
                if not isinstance(part, BodyPartReader):
                    raise FrontError(400, NOT_MULTIPART)  # (a nested multipart)
                await self.part(part)
        except ValueError as exc:  # aiohttp's words for a body cut short, or no form at all
            raise FrontError(400, INCOMPLETE if self.read else f"{NOT_MULTIPART}: {exc}") from None

    async def part(self, part: BodyPartReader) -> None:
        if part.name == "file" and self.upload is None:
            if "purpose" in self.fields:
                BatchService.check_purpose(self.fields["purpose"])
            base64 = encoded(part)
            self.upload = await batches_of(self.request).begin_upload(
                caller_of(self.request), part.filename or "upload.jsonl"
            )
            upload = self.upload
            await self.pieces(part, (lambda data: upload.write(part.decode(data))) if base64 else upload.write)
            return
        kept = bytearray()

        async def keep(data: bytes) -> None:
            if len(kept) + len(data) > MAX_FIELD_BYTES:
                raise FrontError(400, f"form field {str(part.name)[:40]!r}: over {MAX_FIELD_BYTES} bytes")
            kept.extend(data)

        await self.pieces(part, keep)
        if part.name and part.name not in self.fields:
            self.fields[part.name] = kept.decode("utf-8", "replace").strip()

    async def pieces(self, part: BodyPartReader, take: Callable[[bytes], Awaitable[None]]) -> None:
        while data := await part.read_chunk(READ_BYTES):
            self.read += len(data)
            if self.read > self.limit:
                raise web.HTTPRequestEntityTooLarge(max_size=self.limit, actual_size=self.read)
            await take(data)
        if not part.at_eof():
            raise FrontError(400, INCOMPLETE)


def encoded(part: BodyPartReader) -> bool:
    """Whether the file comes in base64 (decoded piece by piece: aiohttp reads it in whole
    quanta); another transfer or content encoding is refused, naming it."""
    transfer = part.headers.get("Content-Transfer-Encoding", "binary").lower()
    content = part.headers.get("Content-Encoding", "identity").lower()
    if transfer not in ("binary", "7bit", "8bit", "base64") or content != "identity":
        raise FrontError(
            400, f"the file's encoding ({transfer}, {content}) is not one gpuq reads: send it as is, or in base64"
        )
    return transfer == "base64"


@streams_body
async def upload_file(request: web.Request) -> web.StreamResponse:
    """POST /v1/files: multipart/form-data with `purpose` and `file`, as the SDK sends it, read
    as it arrives and stored chunk by chunk (never whole in memory). front.max_request_bytes
    bounds it (413 past it, naming that key), router.body_timeout its arrival (408); a body cut
    before its closing boundary is refused (400), and nothing of a refused upload is kept."""
    if not request.content_type.startswith("multipart/form-data"):
        raise FrontError(400, NOT_MULTIPART)
    service = batches_of(request)
    limit = service.settings.front_max_request_bytes
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length)
    form = Form(request, limit)
    timeout_s = service.settings.body_timeout_s
    try:
        try:
            async with asyncio.timeout(timeout_s):
                await form.parts()
        except TimeoutError:
            if form.upload is not None:
                await form.upload.abort()
            return await too_late(request, timeout_s)
        row = await finish_upload(form)
    except BaseException:
        if form.upload is not None:
            await asyncio.shield(form.upload.abort())
        raise
    return json_reply(file_object(row))


async def too_late(request: web.Request, timeout_s: float) -> web.StreamResponse:
    """408, as the body deadline answers any late body: the connection closed at once after it,
    without aiohttp's lingering read of the rest."""
    resp = error_response(request, 408, late_body(timeout_s))
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    request.protocol.force_close()
    return resp


async def finish_upload(form: Form) -> Row:
    """The upload kept, once its form is whole and says what it is."""
    if "purpose" not in form.fields:
        raise FrontError(400, "Missing required parameter: 'purpose'.", "missing_required_parameter")
    if form.upload is None:
        raise FrontError(400, "Missing required parameter: 'file'.", "missing_required_parameter")
    BatchService.check_purpose(form.fields["purpose"])
    return await form.upload.finish()


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


async def file_content(request: web.Request) -> web.StreamResponse:
    """A file's content streamed from the store chunk by chunk, at the pace its client reads."""
    service = batches_of(request)
    row, chunks = await service.file_content(request.match_info["id"], caller_of(request))
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.content_length = row["bytes"]
    return await send_stream(
        request, resp, chunks, service.settings.front_stalled_client_s, f"download of file {row['id']}"
    )


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
