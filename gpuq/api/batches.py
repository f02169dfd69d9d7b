"""Batches on the router's API, for `gpuq batch` and the pages: list, show (counts, ETA, the
failed lines), cancel, retry the failed lines, results as JSON Lines, and a submit of a JSON Lines
input. The work is the batch service's (gpuq/batches/service.py); these routes reach it with the
API's token and the API's error shape. Who sees and changes which batch: gpuq/access/privacy.py."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web
from aiohttp.typedefs import Handler

from .. import eta
from ..batches.doors import send_stream
from ..batches.parse import OPENAI_ENDPOINTS
from ..batches.service import BatchService
from ..batches.shapes import anthropic_result, openai_line, openai_status, request_counts
from ..errors import BadRequest, OverQuota
from ..front.shapes import dumps
from ..jobs import ACTIVE
from ..store import Row
from .callers import actor_of, caller_of
from .inputs import field_of, int_param, json_body
from .render import json_response
from .state import BATCHES, DISPATCHER

log = logging.getLogger("gpuq")

FAILED_SHOWN = 100  # `show`'s failed lines: this many, then how many more


def batches_of(request: web.Request) -> BatchService:
    return request.app[BATCHES]


def batch_json(batch: Row) -> Row:
    """A batch in the API's shape: its counts by line state, OpenAI's three, and its times."""
    counts = batch["counts"]
    return {
        "id": batch["id"],
        "api": batch["api"],
        "name": batch["name"],
        "endpoint": batch["endpoint"],
        "status": openai_status(batch),
        "owner": batch["owner"],
        "total": sum(counts.values()),
        "counts": counts,
        "request_counts": request_counts(counts),
        "input_file_id": batch["input_file_id"],
        "output_file_id": batch["output_file_id"],
        "error_file_id": batch["error_file_id"],
        "errors": batch["errors"],
        "metadata": batch["metadata"],
        "created_at": batch["created_at"],
        "completed_at": batch["completed_at"],
        "cancelling_at": batch["cancelling_at"],
        "cancelled_at": batch["cancelled_at"],
        "failed_at": batch["failed_at"],
        "expires_at": batch["expires_at"],
        "expired_at": batch["finalizing_at"] if batch["status"] == "expired" else None,
        "pruned_at": batch.get("pruned_at"),  # retention took its files and replies (docs/operations.md)
    }


# What a batch of another user's shows a member of a private router (gpuq/access/privacy.py): its
# progress and whose it is, never what it says (its name, metadata, errors and files).
BATCH_PLACEHOLDER_NULLS = ("name", "input_file_id", "output_file_id", "error_file_id", "errors", "metadata")


def batch_placeholder(shown: Row) -> Row:
    return shown | {key: None for key in BATCH_PLACEHOLDER_NULLS} | {"private": True}


async def with_eta(request: web.Request, batch: Row, lines: list[Row]) -> Row:
    """The batch's expected end, from the nodes' recent runs (gpuq/eta.py), as `finish_at`."""
    active = [line["job_id"] for line in lines if line["state"] in ACTIVE]
    try:
        found = await request.app[DISPATCHER].batch_estimates() if active else {}
    except Exception:  # an estimate is a hint: the batch is shown without it
        found = {}
    finish, reason = eta.batch_finish(found, active)
    batch["eta"] = {"finish_s": finish, "reason": reason}
    return batch


async def list_batches(request: web.Request) -> web.Response:
    limit = int_param(request.query, "limit", 50, 1, 1000)
    if request.query.get("open") == "1":
        return json_response({"batches": await open_batches(request, limit)})
    found = await batches_of(request).listed(caller_of(request), None, request.query.get("after"), limit)
    return json_response({"batches": [batch_json(b) for b in found]})


async def open_batches(request: web.Request, limit: int) -> list[Row]:
    """The batches in progress (everyone's: the queue page shows the whole lab; another user's as
    its placeholder on a private router), each with its lines per node and state and its expected
    end: what the page folds into one line per node."""
    service = batches_of(request)
    store = service.store
    found = await service.open_batches(limit)
    if not found:
        return []
    by_node = await store.open_batches_by_node()
    active: dict[str, list[str]] = {}
    for job_id, batch_id in (await store.open_batch_lines()).items():
        active.setdefault(batch_id, []).append(job_id)
    try:
        estimates = await request.app[DISPATCHER].batch_estimates() if active else {}
    except Exception:  # an estimate is a hint: the batches are shown without it
        estimates = {}
    out = []
    for b in found:
        shown = batch_json(b)
        shown["nodes"] = by_node.get(b["id"], {})
        finish, reason = eta.batch_finish(estimates, active.get(b["id"], []))
        shown["eta"] = {"finish_s": finish, "reason": reason}
        out.append(shown if service.visible(caller_of(request), b) else batch_placeholder(shown))
    return out


async def get_batch(request: web.Request) -> web.Response:
    service = batches_of(request)
    batch = await service.get(request.match_info["id"], caller_of(request))
    lines = await service.lines(batch)
    out = await with_eta(request, batch_json(batch), lines)
    failed = [
        {k: line[k] for k in ("line", "custom_id", "job_id", "state", "node", "error")}
        | ({"error": _refusal(line)} if line["job_id"] is None else {})
        for line in lines
        if line["state"] in ("failed", "cancelled") or line["job_id"] is None
    ]
    out["failed_lines"] = failed[:FAILED_SHOWN]
    out["failed_more"] = max(len(failed) - FAILED_SHOWN, 0)
    out["jobs"] = [
        {k: line[k] for k in ("line", "custom_id", "job_id", "state", "node")} for line in lines if line["job_id"]
    ][:1000]
    return json_response({"batch": out})


def _refusal(line: Row) -> str:
    refused = json.loads(line["refused"] or "{}")
    return f"{refused.get('status')} {refused.get('message')}"


async def cancel_batch(request: web.Request) -> web.Response:
    batch = await batches_of(request).cancel(request.match_info["id"], caller_of(request), actor_of(request))
    return json_response({"batch": batch_json(batch)})


async def retry_batch(request: web.Request) -> web.Response:
    body = await json_body(request, {"failed"})
    if field_of(body, "failed", bool) is not True:
        raise BadRequest('retry takes {"failed": true}: the batch\'s failed and cancelled lines run again')
    try:
        batch, retried = await batches_of(request).retry_failed(
            request.match_info["id"], caller_of(request), actor_of(request)
        )
    except OverQuota as exc:
        await request.app[DISPATCHER].when_one_starts(exc)
        raise
    return json_response({"batch": batch_json(batch), "retried": retried})


async def results(request: web.Request) -> web.StreamResponse:
    """Every line's result in input order, in its API's shape (OpenAI's output and error lines
    together; Anthropic's results), as JSON Lines: `gpuq batch results ID > out.jsonl`."""
    service = batches_of(request)
    batch = await service.results(request.match_info["id"], caller_of(request))

    async def pages() -> AsyncIterator[bytes]:
        async for lines in service.results_pages(batch):
            out = []
            for line in lines:
                rendered = openai_line(batch["id"], line)[0] if batch["api"] == "openai" else anthropic_result(line)
                out.append(dumps(rendered).encode() + b"\n")
            yield b"".join(out)

    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    return await send_stream(
        request, resp, pages(), service.settings.front_stalled_client_s, f"results of batch {batch['id']}"
    )


async def submit_batch(request: web.Request) -> web.Response:
    """`gpuq batch submit`: {input (JSON Lines text), endpoint, name, completion_window}. The
    input is kept as a file (purpose batch) and the batch made from it as POST /v1/batches does."""
    body = await json_body(request, {"input", "endpoint", "name", "completion_window"})
    field_of(body, "input", str, required=True)
    endpoint = field_of(body, "endpoint", str) or "/v1/chat/completions"
    if endpoint not in OPENAI_ENDPOINTS:
        raise BadRequest(f"field 'endpoint' must be one of {', '.join(OPENAI_ENDPOINTS)}, got {str(endpoint)[:80]!r}")
    batch = await batches_of(request).submit_text(
        caller_of(request),
        request.headers.get("User-Agent"),
        actor_of(request),
        body["input"],
        endpoint,
        body.get("name"),
        body.get("completion_window", "24h"),
    )
    return json_response({"batch": batch_json(batch)}, status=201 if batch["status"] != "failed" else 200)


def add_routes(router: web.UrlDispatcher, bounded: Callable[[Handler], Handler]) -> None:
    router.add_get("/api/batches", bounded(list_batches))
    router.add_post("/api/batches", submit_batch)
    router.add_get("/api/batches/{id}", bounded(get_batch))
    router.add_post("/api/batches/{id}/cancel", cancel_batch)
    router.add_post("/api/batches/{id}/retry", retry_batch)
    router.add_get("/api/batches/{id}/results", results)
