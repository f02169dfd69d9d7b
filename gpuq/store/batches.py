"""Batches: the OpenAI Batch API's files and batches, Anthropic's Message Batches. Each verb is a
plain function of the writer's connection inside one transaction (as lifecycle.py's): a batch is
created (batch_create.py: in one commit, a large one in bounded pieces), cancelled, its lines'
replies kept as they end, its output written once every line has ended (finalize), its failed
lines retried on request. Their reads are batch_reads.py's; batches_api.py runs the verbs on the
writer.

A line is an ordinary job (its request carries the batch and its custom_id), so placement, the
lanes, fair share, max_waiting and max_running apply to it as to any job."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import Conflict, NotFound
from ..jobs import ACTIVE, NewJob
from . import control
from .engine import Connection
from .steps import Row, cancel, check_quota, iso, rows

# A batch's status as stored; `finalizing` is answered while its lines have all ended and its
# output is not written yet (a read that sees it writes it: finalize).
OPEN = ("in_progress", "cancelling")
ENDED = ("completed", "cancelled", "failed", "expired")


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


@dataclass(frozen=True)
class NewBatch:
    """A batch as its create asks for it; its lines come apart (NewLine)."""

    id: str
    api: str  #: "openai" or "anthropic"
    endpoint: str
    completion_window: str
    expires_at: float
    owner: str | None = None
    name: str | None = None
    input_file_id: str | None = None
    metadata: dict[str, Any] | None = None
    #: validation errors ({code, line, message, param}): the batch is stored failed, no line runs
    errors: list[dict[str, Any]] | None = None


@dataclass(frozen=True)
class NewLine:
    """One line: its job, or why it was refused before it became one ({status, code, message})."""

    line: int
    custom_id: str
    job: NewJob | None = None
    refused: dict[str, Any] | None = None


# -- files -----------------------------------------------------------------------------------

# A file's content is kept as rows of at most this many bytes (batch_file_chunk, migration 025):
# an upload is stored, and a download read, one chunk at a time, never the file whole.
FILE_CHUNK_BYTES = 1 << 20
UPLOADING = -1  # a file's `bytes` while its upload is under way: no read shows it
# An upload whose router stopped half-way leaves its row behind: the next upload removes it once
# it is older than this, or twice router.body_timeout if longer (an upload lasts at most that).
ABANDONED_S = 2 * 3600.0


def add_file(
    db: Connection, now: float, file_id: str, purpose: str, filename: str, content: bytes, owner: str | None
) -> Row:
    """A file kept whole in one write (the output finalize writes; `gpuq batch submit`'s input,
    within the API's body limit), as chunks."""
    begin_file(db, now, file_id, purpose, filename, owner)
    for seq, at in enumerate(range(0, len(content), FILE_CHUNK_BYTES)):
        add_file_chunk(db, file_id, seq, content[at : at + FILE_CHUNK_BYTES])
    return end_file(db, file_id, len(content))


def begin_file(
    db: Connection,
    now: float,
    file_id: str,
    purpose: str,
    filename: str,
    owner: str | None,
    abandoned_s: float = ABANDONED_S,
) -> None:
    """An upload begins: its row, shown by no read until end_file (and any upload begun more
    than `abandoned_s` ago, by a router stopped half-way through it, removed with its chunks)."""
    db.execute("DELETE FROM batch_file WHERE bytes = ? AND created_at < ?", (UPLOADING, iso(now - abandoned_s)))
    db.execute(
        "INSERT INTO batch_file (id, purpose, filename, bytes, created_at, owner) VALUES (?,?,?,?,?,?)",
        (file_id, purpose, filename, UPLOADING, iso(now), owner),
    )


def add_file_chunk(db: Connection, file_id: str, seq: int, data: bytes) -> None:
    """One piece of a file under upload, in its order (`seq` from 0)."""
    db.execute("INSERT INTO batch_file_chunk (file_id, seq, bytes) VALUES (?,?,?)", (file_id, seq, data))


def end_file(db: Connection, file_id: str, size: int) -> Row:
    """The upload is whole: its size set, the file shown from now on."""
    db.execute("UPDATE batch_file SET bytes = ? WHERE id = ? AND bytes = ?", (size, file_id, UPLOADING))
    found = db.execute(
        "SELECT id, purpose, filename, bytes, created_at, owner FROM batch_file WHERE id = ?", (file_id,)
    ).fetchone()
    if found is None or found["bytes"] != size:
        raise NotFound(f"no upload '{file_id}' under way")
    return dict(found)


def drop_upload(db: Connection, file_id: str) -> None:
    """An upload refused or cut: its row and every chunk it stored so far, gone."""
    db.execute("DELETE FROM batch_file WHERE id = ? AND bytes = ?", (file_id, UPLOADING))


def delete_file(db: Connection, file_id: str, only_owner: str | None = None) -> None:
    """A file gone. `only_owner`: a member's name; another's file is not found (404)."""
    found = db.execute("SELECT owner FROM batch_file WHERE id = ? AND bytes >= 0", (file_id,)).fetchone()
    if found is None or (only_owner is not None and found["owner"] != only_owner):
        raise NotFound(f"no file '{file_id}'")
    db.execute("DELETE FROM batch_file WHERE id = ?", (file_id,))


# -- its life --------------------------------------------------------------------------------


def keep_response(db: Connection, job_id: str, response: str) -> bool:
    """A line's reply, in its endpoint's shape, kept as its run ends. False: no batch line."""
    return db.execute("UPDATE batch_line SET response = ? WHERE job_id = ?", (response, job_id)).rowcount > 0


def cancel_batch(
    db: Connection, now: float, batch_id: str, actor: str, only_owner: str | None = None
) -> tuple[Row, int]:
    """Cancelling: every waiting line is cancelled now; a running one ends as it would (as
    OpenAI's in-flight requests do), and the batch is cancelled once none runs (finalize).
    Returns the batch and how many lines were cancelled."""
    batch = _batch_for_update(db, batch_id, only_owner)
    if batch["status"] not in OPEN:
        raise Conflict(f"batch {batch_id} is {batch['status']}: only a batch in progress can be cancelled")
    reason = f"its batch {batch_id} was cancelled"
    waiting = rows(
        db.execute(
            "SELECT j.* FROM job j JOIN batch_line l ON l.job_id = j.id WHERE l.batch_id = ? AND j.state = 'queued'",
            (batch_id,),
        ).fetchall()
    )
    for job in waiting:
        cancel(db, job, actor, reason, now)
    if batch["status"] == "in_progress":
        db.execute("UPDATE batch SET status = 'cancelling', cancelling_at = ? WHERE id = ?", (iso(now), batch_id))
    return batch_row(db, batch_id), len(waiting)


# A line its batch's completion_window ended before it ran: cancelled with this reason, counted
# (and answered: OpenAI's `batch_expired`, Anthropic's `expired`) as expired.
EXPIRED = "expired: "


def expire_due(db: Connection, now: float, actor: str) -> list[tuple[str, int]]:
    """Every batch in progress past its expires_at (its completion_window): its waiting lines
    cancelled as expired, as OpenAI's unfinished requests are; a running one ends as it would,
    and finalize then ends the batch `expired` with the files of what finished. Returns each
    expired batch and how many lines it cancelled (a batch with none waiting is left alone)."""
    out = []
    due = db.execute(
        "SELECT b.id, b.completion_window, COUNT(*) AS n FROM batch b JOIN batch_line l ON l.batch_id = b.id"
        " JOIN job j ON j.id = l.job_id WHERE b.status = 'in_progress' AND b.expires_at <= ? AND j.state = 'queued'"
        " GROUP BY b.id, b.completion_window",
        (iso(now),),
    ).fetchall()
    for batch in due:
        reason = (
            f"{EXPIRED}its batch {batch['id']} did not end within its completion_window ({batch['completion_window']})"
        )
        waiting = rows(
            db.execute(
                "SELECT j.* FROM job j JOIN batch_line l ON l.job_id = j.id WHERE l.batch_id = ? AND j.state = 'queued'",
                (batch["id"],),
            ).fetchall()
        )
        for job in waiting:
            cancel(db, job, actor, reason, now)
        out.append((batch["id"], len(waiting)))
    return out


# What finalize hands its renderer: a batch's lines, in order, each with its job's end.
LINES_SQL = (
    "SELECT l.line, l.custom_id, l.job_id, l.refused, l.response, j.state, j.error, j.node, j.model, j.finished_at"
    " FROM batch_line l LEFT JOIN job j ON j.id = l.job_id WHERE l.batch_id = ? ORDER BY l.line"
)
# What finalize checks again in its transaction: each line's state and end, not its reply.
LINE_ENDS_SQL = (
    "SELECT l.line, j.state, j.error, j.finished_at"
    " FROM batch_line l LEFT JOIN job j ON j.id = l.job_id WHERE l.batch_id = ? ORDER BY l.line"
)

# A batch's lines as its output was rendered from them: each line's state and when it ended
# (a line retried and ended again between the read and the write ends at another time).
Seen = list[tuple[Any, Any, Any]]


def lines_seen(lines: Sequence[Row]) -> Seen:
    return [(line["line"], line["state"], line["finished_at"]) for line in lines]


def finalize(
    db: Connection, now: float, batch_id: str, output: bytes | None, errors: bytes | None, seen: Seen
) -> Row | None:
    """The batch ends: its output and error files (rendered off the writer, in the batch's API's
    shape, from the lines as `seen`) are written and it is completed (cancelled, when it was
    cancelling; expired, when its window ended some). None when it is not due: it ended already
    (another router's finalize came first), a line still waits or runs, or a line changed since
    it was read (retried); then nothing is written, and the next look renders it again."""
    found = db.execute("SELECT * FROM batch WHERE id = ?", (batch_id,)).fetchone()
    if found is None or found["status"] not in OPEN:
        return None
    lines = rows(db.execute(LINE_ENDS_SQL, (batch_id,)).fetchall())
    if any(line["state"] in ACTIVE for line in lines) or lines_seen(lines) != seen:
        return None
    batch = dict(found)
    ids: list[str | None] = []
    for content, suffix in ((output, "output"), (errors, "errors")):
        if content is None:
            ids.append(None)
            continue
        file_id = new_file_id()
        add_file(db, now, file_id, "batch_output", f"{batch_id}_{suffix}.jsonl", content, batch["owner"])
        ids.append(file_id)
    at = iso(now)
    if batch["status"] == "cancelling":
        status = "cancelled"
    elif any(is_expired(line) for line in lines):
        status = "expired"  # (its time is finalizing_at: the schema has no expired_at)
    else:
        status = "completed"
    ended_at = "" if status == "expired" else f", {status}_at = ?"
    db.execute(
        f"UPDATE batch SET status = ?, output_file_id = ?, error_file_id = ?, finalizing_at = ?{ended_at} WHERE id = ?",
        (status, ids[0], ids[1], at, *(() if status == "expired" else (at,)), batch_id),
    )
    return batch_row(db, batch_id)


def is_expired(line: Row) -> bool:
    """A line cancelled because its batch's completion_window ended (expire_due)."""
    return line.get("state") == "cancelled" and str(line.get("error") or "").startswith(EXPIRED)


def retry_failed(
    db: Connection,
    now: float,
    batch_id: str,
    actor: str,
    only_owner: str | None = None,
    nodes: frozenset[str] | None = None,
    max_waiting: dict[str, int] | None = None,
    window_s: float | None = None,
) -> tuple[Row, list[str]]:
    """Only by explicit request (`gpuq batch retry ID --failed`): the batch's failed, cancelled
    and expired lines go back to the tail of their queues and the batch is in progress again;
    its old output and error files go (the new ones are written when it ends again). A batch
    past its expiry gets a new one, `window_s` from now (else it would expire again at once)."""
    batch = _batch_for_update(db, batch_id, only_owner)
    if batch["status"] == "failed":
        raise Conflict(f"batch {batch_id} failed its validation: nothing of it ran; fix its input and submit it again")
    if batch["status"] == "validating":
        raise Conflict(f"batch {batch_id} is still being created: none of its lines has run yet")
    retried = [
        r["job_id"]
        for r in db.execute(
            "SELECT l.job_id FROM batch_line l JOIN job j ON j.id = l.job_id"
            " WHERE l.batch_id = ? AND j.state IN ('failed', 'cancelled') ORDER BY l.line",
            (batch_id,),
        )
    ]
    if not retried:
        raise Conflict(f"batch {batch_id} has no failed or cancelled lines to retry")
    check_quota(db, batch["owner"], (max_waiting or {}).get(batch["owner"] or ""), len(retried))
    for job_id in retried:
        control.retry(db, now, job_id, actor, nodes)
    db.execute(
        "UPDATE batch_line SET response = NULL WHERE batch_id = ? AND job_id IN (SELECT id FROM job WHERE state = 'queued')",
        (batch_id,),
    )
    for file_id in (batch["output_file_id"], batch["error_file_id"]):
        if file_id is not None:
            db.execute("DELETE FROM batch_file WHERE id = ?", (file_id,))
    db.execute(
        "UPDATE batch SET status = 'in_progress', output_file_id = NULL, error_file_id = NULL, finalizing_at = NULL,"
        " completed_at = NULL, cancelling_at = NULL, cancelled_at = NULL WHERE id = ?",
        (batch_id,),
    )
    if window_s is not None and batch["expires_at"] <= iso(now):
        db.execute("UPDATE batch SET expires_at = ? WHERE id = ?", (iso(now + window_s), batch_id))
    return batch_row(db, batch_id), retried


def delete_batch(db: Connection, batch_id: str, only_owner: str | None = None) -> Row:
    """An ended batch gone (Anthropic's DELETE): its row, its lines' ties and the output and error
    files it wrote; its lines' jobs stay, ordinary jobs of the history (retention ends them).
    Its input file stays (the caller uploaded it; they delete it themselves). Returns it."""
    batch = _batch_for_update(db, batch_id, only_owner)
    if batch["status"] not in ENDED:
        raise Conflict(f"batch {batch_id} is {batch['status']}: only an ended batch can be deleted; cancel it first")
    for file_id in (batch["output_file_id"], batch["error_file_id"]):
        if file_id is not None:
            db.execute("DELETE FROM batch_file WHERE id = ?", (file_id,))
    db.execute("DELETE FROM batch_line WHERE batch_id = ?", (batch_id,))
    db.execute("DELETE FROM batch WHERE id = ?", (batch_id,))
    return batch


def _batch_for_update(db: Connection, batch_id: str, only_owner: str | None) -> Row:
    batch = db.execute("SELECT * FROM batch WHERE id = ?", (batch_id,)).fetchone()
    if batch is None or (only_owner is not None and batch["owner"] != only_owner):
        raise NotFound(f"no batch '{batch_id}'")
    return dict(batch)


def batch_row(db: Connection, batch_id: str) -> Row:
    """A batch with its lines' counts, inside a write."""
    batch = dict(db.execute("SELECT * FROM batch WHERE id = ?", (batch_id,)).fetchone())
    counted = rows(db.execute(COUNTS_SQL.format(ids="?"), (batch_id,)).fetchall())
    return with_counts(batch, counted)


# -- a batch's counts (its rows, in writes and reads) ---------------------------------------------

# Each batch's lines by their jobs' states ('refused': a line that never became a job).
# 'expired': a line cancelled by its batch's expiry (expire_due), not counted as cancelled.
LINE_STATE_SQL = (
    f"CASE WHEN j.id IS NULL THEN 'refused' WHEN j.state = 'cancelled' AND j.error LIKE '{EXPIRED}%' THEN 'expired'"
    " ELSE j.state END"
)
COUNTS_SQL = (
    f"SELECT l.batch_id, {LINE_STATE_SQL} AS state, COUNT(*) AS n"
    " FROM batch_line l LEFT JOIN job j ON j.id = l.job_id WHERE l.batch_id IN ({ids})"
    f" GROUP BY l.batch_id, {LINE_STATE_SQL}"
)

LINE_STATES = ("queued", "running", "done", "failed", "cancelled", "expired", "refused")


def with_counts(batch: Row, counted: list[Row]) -> Row:
    counts = dict.fromkeys(LINE_STATES, 0)
    for c in counted:
        if c["batch_id"] == batch["id"]:
            counts[c["state"]] = int(c["n"])
    out = dict(batch)
    out["counts"] = counts
    out["metadata"] = json.loads(batch["metadata"]) if batch.get("metadata") else None
    out["errors"] = json.loads(batch["errors"]) if batch.get("errors") else None
    return out


def counts_sql(n: int) -> str:
    return COUNTS_SQL.format(ids=",".join("?" * n))
