"""A batch's create: in one commit when it is small, in bounded pieces when it is large (issue 43,
item 4: a 100,000-line batch in one transaction held the one writer for 16 s, and /health turned
503). Each piece is its own short write, the writer free between them for /health's callers,
submits, claims and the workers' progress.

The rule: **a batch's lines are hidden until the batch is whole.** `begin` stores the batch
`validating`, with the router creating it (`creator`); each `add_lines` places and queues a piece
of its lines (batch_queue.py: placed by model over the queues as they grow, as in one go); no
worker claims them (the view ready_job leaves out a `validating` batch's lines, migration 026)
and no expiry or finalize looks at the batch. `open_batch`, one short commit of one row, makes it
`in_progress`: its lines run from then on. A create that fails half-way is dropped by its router
(`drop_piece`, a piece at a time); one whose router died (SIGKILL, a power cut) is dropped by the
next router that looks (gpuq/batches/service.py drop_unfinished): it was never answered, so nothing
of it is kept, and none of its lines ever ran."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..errors import Conflict
from ..jobs import NodeInfo
from . import lifecycle
from .batch_queue import queue_lines
from .batches import NewBatch, NewLine, batch_row, with_counts
from .engine import Connection
from .steps import Row, check_quota, iso

# A piece of a large batch's create: at most this many lines, and this many bytes of their
# requests (a line may carry a long prompt): about 25 ms of the writer's time on an idle 2-core
# machine, 150-200 ms at a load of 8. (Pieces that shrank while their writes took over 50 ms made a
# loaded router's 100,000-line create 3.5x slower, 2,000 commits, and its submits wait longer.)
PIECE_LINES = 500
PIECE_BYTES = 4 << 20
# A dropped create's rows go this many lines at a time.
DROP_LINES = 1000


def pieces(
    lines: Sequence[NewLine], max_lines: int = PIECE_LINES, max_bytes: int = PIECE_BYTES
) -> Iterator[list[NewLine]]:
    """`lines` in order, cut into pieces of at most `max_lines` lines and about `max_bytes` bytes
    (a piece always takes one line, however large)."""
    piece: list[NewLine] = []
    size = 0
    for line in lines:
        weight = len(line.job.request or "") + len(line.job.prompt or "") if line.job is not None else 0
        if piece and (len(piece) >= max_lines or size + weight > max_bytes):
            yield piece
            piece, size = [], 0
        piece.append(line)
        size += weight
    if piece:
        yield piece


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _insert(db: Connection, batch: NewBatch, status: str, total: int, at: str, creator: str | None) -> None:
    failed = status == "failed"
    db.execute(
        "INSERT INTO batch (id, api, endpoint, status, completion_window, owner, name, total, input_file_id,"
        " metadata, errors, created_at, in_progress_at, failed_at, expires_at, creator)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            batch.id,
            batch.api,
            batch.endpoint,
            status,
            batch.completion_window,
            batch.owner,
            batch.name,
            total,
            batch.input_file_id,
            _json(batch.metadata),
            _json(batch.errors),
            at,
            at if status == "in_progress" else None,
            at if failed else None,
            iso(batch.expires_at),
            creator,
        ),
    )


def _queue(
    db: Connection, batch_id: str, lines: Sequence[NewLine], nodes: list[NodeInfo], actor: str, now: float, fair: bool
) -> set[str]:
    """Place and queue `lines` as jobs (a line refused before, or whose model no node has, is kept
    refused) and tie each to its batch; returns the nodes they were placed on."""
    queued = queue_lines(db, [line.job for line in lines], nodes, actor, now, fair)
    kept: list[tuple[Any, ...]] = [
        (batch_id, line.line, line.custom_id, job_id, _json(refused or line.refused))
        for line, (job_id, _, refused) in zip(lines, queued, strict=True)
    ]
    db.executemany("INSERT INTO batch_line (batch_id, line, custom_id, job_id, refused) VALUES (?,?,?,?,?)", kept)
    return {node for _, node, _ in queued if node is not None}


def _claim_idle(db: Connection, now: float, max_running: Mapping[str, int], nodes: list[NodeInfo]) -> list[Row]:
    """The heads of the idle nodes, claimed in this commit (to hand to their waiting workers)."""
    idle = sorted({n.name for n in nodes if n.idle and n.up})
    return [head for node in idle if (head := lifecycle.claim(db, now, max_running, node)) is not None]


def _jobs(lines: Sequence[NewLine]) -> int:
    return sum(1 for line in lines if line.job is not None)


def create_batch(
    db: Connection,
    batch: NewBatch,
    lines: Sequence[NewLine],
    nodes: list[NodeInfo],
    actor: str,
    now: float,
    *,
    fair: bool = False,
    max_waiting: int | None = None,
    max_running: Mapping[str, int] = lifecycle.NO_LIMITS,
) -> tuple[Row, list[Row]]:
    """Store a batch and queue every line of it as a job, placed by its model as any job is, in
    this one transaction: all of it, or (a refusal) nothing (a small batch; a large one goes in
    pieces: begin, add_lines, open_batch). A batch with validation `errors` is stored failed, with
    no line. A line whose model no node has is kept refused (404, as the endpoint would answer it)
    and the others run. `max_waiting`: the owner's limit of waiting jobs, which counts every line
    (over it: OverQuota, nothing stored). Returns the batch's row and the jobs claimed for idle
    nodes (to hand to their workers)."""
    at = iso(now)
    if batch.errors is not None:
        _insert(db, batch, "failed", 0, at, None)
        return batch_row(db, batch.id), []
    _insert(db, batch, "in_progress", len(lines), at, None)
    check_quota(db, batch.owner, max_waiting, _jobs(lines))
    placed = _queue(db, batch.id, lines, nodes, actor, now, fair)
    return batch_row(db, batch.id), _claim_idle(db, now, max_running, [n for n in nodes if n.name in placed])


def begin(
    db: Connection, now: float, batch: NewBatch, total: int, jobs: int, creator: str, max_waiting: int | None = None
) -> Row:
    """A large batch's first piece: the batch stored `validating`, its `total` lines to come,
    created by router `creator`. `jobs`: how many of them are jobs (not refused already), which
    the owner's `max_waiting` counts now, for the whole batch (over it: OverQuota, nothing stored)."""
    _insert(db, batch, "validating", total, iso(now), creator)
    check_quota(db, batch.owner, max_waiting, jobs)
    return batch_row(db, batch.id)


def _creating(db: Connection, batch_id: str, creator: str) -> Row:
    """The batch, still being created by `creator` (else Conflict: it was dropped meanwhile, by
    another router that took its creator for dead)."""
    found = db.execute("SELECT id, status, creator, total FROM batch WHERE id = ?", (batch_id,)).fetchone()
    if found is None or found["status"] != "validating" or found["creator"] != creator:
        raise Conflict(f"batch {batch_id} is no longer being created by this router: it was dropped meanwhile")
    return dict(found)


def add_lines(
    db: Connection,
    now: float,
    batch_id: str,
    creator: str,
    lines: Sequence[NewLine],
    nodes: list[NodeInfo],
    actor: str,
    fair: bool = False,
) -> list[str]:
    """A piece of a `validating` batch's lines placed and queued, hidden (not claimable) until
    open_batch. Returns the nodes they were placed on."""
    _creating(db, batch_id, creator)
    return sorted(_queue(db, batch_id, lines, nodes, actor, now, fair))


def open_batch(
    db: Connection, now: float, max_running: Mapping[str, int], batch_id: str, creator: str, nodes: list[NodeInfo]
) -> tuple[Row, list[Row]]:
    """The short commit that makes a whole batch live: `in_progress`, its lines claimable from
    now; the heads of the idle nodes of `nodes` (those its lines went to) are claimed in it
    (returned, to hand to their workers). A batch missing lines (never: each piece committed
    before the next was sent) is refused. Its counts are its lines as they were stored, every
    job queued (none could run; one cancelled meanwhile by a `gpuq clear` is counted queued in
    this answer only): counting them by their jobs' states took half a second at 100,000."""
    found = _creating(db, batch_id, creator)
    stored = db.execute(
        "SELECT COUNT(*) AS n, COUNT(job_id) AS jobs FROM batch_line WHERE batch_id = ?", (batch_id,)
    ).fetchone()
    if stored["n"] != found["total"]:
        raise Conflict(f"batch {batch_id} has {stored['n']} of its {found['total']} lines stored: it is not whole")
    db.execute(
        "UPDATE batch SET status = 'in_progress', creator = NULL, in_progress_at = ? WHERE id = ?", (iso(now), batch_id)
    )
    batch = dict(db.execute("SELECT * FROM batch WHERE id = ?", (batch_id,)).fetchone())
    counted = [
        {"batch_id": batch_id, "state": "queued", "n": stored["jobs"]},
        {"batch_id": batch_id, "state": "refused", "n": stored["n"] - stored["jobs"]},
    ]
    return with_counts(batch, counted), _claim_idle(db, now, max_running, nodes)


def drop_piece(db: Connection, batch_id: str, creator: str, limit: int = DROP_LINES) -> int | None:
    """A piece of a `validating` batch of `creator`'s dropped: up to `limit` of its lines with
    their jobs (never claimed: hidden) and their events; the batch itself once no line is left.
    Returns how many lines went, or None when the batch is gone (or is no longer that creator's
    create: it became whole, or another router's)."""
    found = db.execute("SELECT status, creator FROM batch WHERE id = ?", (batch_id,)).fetchone()
    if found is None or found["status"] != "validating" or found["creator"] != creator:
        return None
    lines = db.execute(
        "SELECT line, job_id FROM batch_line WHERE batch_id = ? ORDER BY line LIMIT ?", (batch_id, limit)
    ).fetchall()
    if not lines:
        db.execute("DELETE FROM batch WHERE id = ?", (batch_id,))
        return None
    db.execute("DELETE FROM batch_line WHERE batch_id = ? AND line <= ?", (batch_id, lines[-1]["line"]))
    jobs = [r["job_id"] for r in lines if r["job_id"] is not None]
    for i in range(0, len(jobs), 500):  # (bound the statement's parameters)
        part = jobs[i : i + 500]
        marks = ",".join("?" * len(part))
        db.execute(f"DELETE FROM event WHERE job_id IN ({marks})", part)
        db.execute(f"DELETE FROM job WHERE id IN ({marks})", part)
    return len(lines)
