"""A batch as its API shows it: OpenAI's batch and file objects, its output and error
files' lines; Anthropic's message_batch and its results' lines. Pure: the store's rows in, the
API's JSON out (a line's reply was rendered in its endpoint's shape when its run ended)."""

from __future__ import annotations

import json
from typing import Any

from ..front.anthropic import ERROR_TYPES
from ..front.openai_api import openai_error
from ..front.shapes import dumps
from ..jobs import ACTIVE, parse_iso
from ..store.batches import is_expired


def unix(text: str | None) -> int | None:
    return None if text is None else int(parse_iso(text))


def rfc3339(text: str | None) -> str | None:
    """Anthropic's times: RFC 3339 in UTC, as the stored ISO text already is."""
    return text


# -- OpenAI -------------------------------------------------------------------------------------


def file_object(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "object": "file",
        "bytes": int(row["bytes"]),
        "created_at": unix(row["created_at"]),
        "filename": row["filename"],
        "purpose": row["purpose"],
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def active(counts: dict[str, int]) -> int:
    return counts["queued"] + counts["running"]


def openai_status(batch: dict[str, Any]) -> str:
    """The stored status, but `finalizing` for an open batch whose every line has ended and whose
    output is not written yet."""
    status = batch["status"]
    if status in ("in_progress", "cancelling") and not active(batch["counts"]) and batch["api"] == "openai":
        return "finalizing"
    return str(status)


def request_counts(counts: dict[str, int]) -> dict[str, int]:
    """OpenAI's three: completed (done), failed (failed, refused, cancelled, expired), and their total."""
    failed = counts["failed"] + counts["refused"] + counts["cancelled"] + counts["expired"]
    return {"total": sum(counts.values()), "completed": counts["done"], "failed": failed}


def batch_object(batch: dict[str, Any]) -> dict[str, Any]:
    errors = batch.get("errors")
    return {
        "id": batch["id"],
        "object": "batch",
        "endpoint": batch["endpoint"],
        "model": None,
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": batch["input_file_id"],
        "completion_window": batch["completion_window"],
        "status": openai_status(batch),
        "output_file_id": batch["output_file_id"],
        "error_file_id": batch["error_file_id"],
        "created_at": unix(batch["created_at"]),
        "in_progress_at": unix(batch["in_progress_at"]),
        "expires_at": unix(batch["expires_at"]),
        "finalizing_at": unix(batch["finalizing_at"]),
        "completed_at": unix(batch["completed_at"]),
        "failed_at": unix(batch["failed_at"]),
        "expired_at": unix(batch["finalizing_at"]) if batch["status"] == "expired" else None,
        "cancelling_at": unix(batch["cancelling_at"]),
        "cancelled_at": unix(batch["cancelled_at"]),
        "request_counts": request_counts(batch["counts"]),
        "metadata": batch.get("metadata"),
    }


def _jsonl(lines: list[dict[str, Any]]) -> bytes | None:
    if not lines:
        return None
    return b"".join(dumps(line).encode() + b"\n" for line in lines)


def openai_line(batch_id: str, line: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """One request's line in OpenAI's shape, and whether it goes to the output file (else the
    error file): done, its reply (status 200); refused, the endpoint's error as its response;
    failed, gpuq's error as a 500 response; cancelled, no response and the cancel as `error`."""
    job_id, custom_id = line["job_id"], line["custom_id"]
    out: dict[str, Any] = {
        "id": f"batch_req_{job_id}" if job_id else f"batch_req_{batch_id}_{line['line']}",
        "custom_id": custom_id,
        "response": None,
        "error": None,
    }
    if job_id is None:
        refused = json.loads(line["refused"])
        status = int(refused.get("status") or 400)
        body = openai_error(status, refused["message"], refused.get("code"))
        out["response"] = {"status_code": status, "request_id": None, "body": body}
        return out, False
    state = line["state"]
    if state == "done" and line.get("response") is not None:
        out["response"] = {"status_code": 200, "request_id": job_id, "body": json.loads(line["response"])}
        return out, True
    if is_expired(line):  # (OpenAI's words for a request its batch's window ended before)
        out["error"] = {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        }
        return out, False
    if state == "cancelled":
        out["error"] = {"code": "batch_cancelled", "message": f"gpuq job {job_id} was cancelled: {line['error']}"}
        return out, False
    if state == "done":  # (its reply was not kept: a router older than batches ran it)
        message = f"gpuq job {job_id} is done but its reply was not kept; `gpuq batch retry {batch_id} --failed`"
    else:
        message = f"gpuq job {job_id} failed on node {line['node']}: {line['error']}"
    out["response"] = {"status_code": 500, "request_id": job_id, "body": openai_error(500, message, "job_failed")}
    return out, False


def render_openai(batch: dict[str, Any], lines: list[dict[str, Any]]) -> tuple[bytes | None, bytes | None]:
    """A finished batch's output file and error file (None: it would be empty), in input order."""
    output: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for line in lines:
        rendered, ok = openai_line(batch["id"], line)
        (output if ok else errors).append(rendered)
    return _jsonl(output), _jsonl(errors)


# -- Anthropic ----------------------------------------------------------------------------------


def processing_status(batch: dict[str, Any]) -> str:
    status = batch["status"]
    if status == "validating":  # still being created (Anthropic's has no such status)
        return "in_progress"
    if status == "in_progress" and active(batch["counts"]):
        return "in_progress"
    if status == "cancelling" and active(batch["counts"]):
        return "canceling"
    return "ended" if status not in ("in_progress", "cancelling") else "in_progress"


def ended_at(batch: dict[str, Any]) -> str | None:
    """When it ended: an expired one at its finalizing (the schema keeps no expired_at)."""
    ended: str | None = batch["finalizing_at"] if batch["status"] == "expired" else None
    return ended or batch["completed_at"] or batch["cancelled_at"] or batch["failed_at"]


def message_batch(batch: dict[str, Any], base_url: str) -> dict[str, Any]:
    """Anthropic's message_batch. Its counts move as lines end (Anthropic's stay 0 until the
    batch ends: gpuq shows its progress); their sum is always its total."""
    counts = batch["counts"]
    ended = batch["status"] in ("completed", "cancelled", "failed", "expired")
    return {
        "id": batch["id"],
        "type": "message_batch",
        "processing_status": processing_status(batch) if not ended else "ended",
        "request_counts": {
            "processing": active(counts),
            "succeeded": counts["done"],
            "errored": counts["failed"] + counts["refused"],
            "canceled": counts["cancelled"],
            "expired": counts["expired"],
        },
        "created_at": rfc3339(batch["created_at"]),
        "ended_at": rfc3339(ended_at(batch)),
        "expires_at": rfc3339(batch["expires_at"]),
        "cancel_initiated_at": rfc3339(batch["cancelling_at"]),
        "archived_at": None,
        "results_url": f"{base_url}/v1/messages/batches/{batch['id']}/results" if ended else None,
    }


def _anthropic_error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def anthropic_result(line: dict[str, Any]) -> dict[str, Any]:
    job_id = line["job_id"]
    result: dict[str, Any]
    if job_id is None:
        refused = json.loads(line["refused"])
        result = {"type": "errored", "error": _anthropic_error(int(refused.get("status") or 400), refused["message"])}
    elif line["state"] == "done" and line.get("response") is not None:
        result = {"type": "succeeded", "message": json.loads(line["response"])}
    elif is_expired(line):
        result = {"type": "expired"}
    elif line["state"] == "cancelled":
        result = {"type": "canceled"}
    elif line["state"] in ACTIVE:  # (results are read once the batch ended: none is)
        result = {"type": "errored", "error": _anthropic_error(500, f"gpuq job {job_id} has not ended")}
    else:
        message = f"gpuq job {job_id} failed on node {line['node']}: {line['error']}"
        result = {"type": "errored", "error": _anthropic_error(500, message)}
    return {"custom_id": line["custom_id"], "result": result}


def render_anthropic(batch: dict[str, Any], lines: list[dict[str, Any]]) -> tuple[bytes | None, bytes | None]:
    """Anthropic's results are read from the lines themselves (GET .../results): no files."""
    return None, None
