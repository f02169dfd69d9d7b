"""Batches (issue 37): the OpenAI Batch API's files and batches, Anthropic's Message Batches. Each
verb is a plain function of the writer's connection inside one transaction (as lifecycle.py's):
a batch's every line is placed and queued in the one commit of its create (10,000 lines: one
commit, not 10,000), a batch is cancelled, its lines' replies kept as they end, its output
written once every line has ended (finalize), its failed lines retried on request. The reads
of batches and files are here too; gpuq/store/facade.py runs the verbs on the writer.

A line is an ordinary job (its request carries the batch and its custom_id), so placement, the
lanes, fair share, max_waiting and max_running apply to it as to any job."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import placement as rules
from ..errors import Conflict, ModelMissing, NotFound
from ..jobs import ACTIVE, POSITION_GAP, JobState, Lane, NewJob, NodeCounts, NodeInfo, new_job_id
from . import control, lifecycle
from .engine import Connection, Params
from .steps import Row, cancel, check_quota, iso, rows, tail_position

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


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# -- files -----------------------------------------------------------------------------------


def add_file(
    db: Connection, file_id: str, purpose: str, filename: str, content: bytes, owner: str | None, now: float
) -> Row:
    db.execute(
        "INSERT INTO batch_file (id, purpose, filename, bytes, created_at, owner, content) VALUES (?,?,?,?,?,?,?)",
        (file_id, purpose, filename, len(content), iso(now), owner, content),
    )
    return {
        "id": file_id,
        "purpose": purpose,
        "filename": filename,
        "bytes": len(content),
        "created_at": iso(now),
        "owner": owner,
    }


def delete_file(db: Connection, file_id: str, only_owner: str | None) -> None:
    found = db.execute("SELECT owner FROM batch_file WHERE id = ?", (file_id,)).fetchone()
    if found is None or (only_owner is not None and found["owner"] != only_owner):
        raise NotFound(f"no file '{file_id}'")
    db.execute("DELETE FROM batch_file WHERE id = ?", (file_id,))


# -- a batch's create --------------------------------------------------------------------------


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
    max_running: dict[str, int] | None = None,
) -> tuple[Row, list[Row]]:
    """Store a batch and queue every line of it as a job, placed by its model as any job is, in
    this one transaction: all of it, or (a refusal) nothing. A line whose model no node has is
    kept refused (404, as the endpoint would answer it) and the others run. `max_waiting`: the
    owner's limit of waiting jobs, which counts every line (over it: OverQuota, nothing stored).
    Returns the batch's row and the jobs claimed for idle nodes (to hand to their workers)."""
    at = iso(now)
    failed = batch.errors is not None
    db.execute(
        "INSERT INTO batch (id, api, endpoint, status, completion_window, owner, name, total, input_file_id,"
        " metadata, errors, created_at, in_progress_at, failed_at, expires_at)"
        " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (
            batch.id,
            batch.api,
            batch.endpoint,
            "failed" if failed else "in_progress",
            batch.completion_window,
            batch.owner,
            batch.name,
            0 if failed else len(lines),
            batch.input_file_id,
            _dumps(batch.metadata),
            _dumps(batch.errors),
            at,
            None if failed else at,
            at if failed else None,
            iso(batch.expires_at),
        ),
    )
    if failed:
        return batch_row(db, batch.id), []
    check_quota(db, batch.owner, max_waiting, sum(1 for line in lines if line.job is not None))
    queued = queue_lines(db, [line.job for line in lines], nodes, actor, now, fair)
    kept: list[tuple[Any, ...]] = []
    placed: set[str] = set()
    for line, (job_id, node, refused) in zip(lines, queued, strict=True):
        if node is not None:
            placed.add(node)
        kept.append((batch.id, line.line, line.custom_id, job_id, _dumps(refused or line.refused)))
    db.executemany("INSERT INTO batch_line (batch_id, line, custom_id, job_id, refused) VALUES (?,?,?,?,?)", kept)
    idle = {n.name for n in nodes if n.idle and n.up}
    claimed = [
        head for node in sorted(placed & idle) if (head := lifecycle.claim(db, node, now, max_running)) is not None
    ]
    return batch_row(db, batch.id), claimed


# -- queueing many jobs at once ---------------------------------------------------------------------

Queued = tuple[str | None, str | None, dict[str, Any] | None]  # (job id, node, refusal)


def queue_lines(
    db: Connection, jobs: Sequence[NewJob | None], nodes: list[NodeInfo], actor: str, now: float, fair: bool
) -> list[Queued]:
    """Place and insert many batch-lane jobs in this transaction, each exactly where
    lifecycle.submit would put it if they came one by one (placement by model over the queues as
    they grow, the tail of its node's queue or, with `fair`, the gap fair share gives it), but
    with the queues read once and the rows written with executemany: 10,000 lines in about a
    second, where one submit each would take many. A job whose model no node has is refused
    (404) and not stored."""
    counts = {r[0]: NodeCounts(r[1], r[2]) for r in db.execute("SELECT node, running, queued FROM node_load")}
    by_name = {n.name: n for n in nodes}
    wanted = [(i, new) for i, new in enumerate(jobs) if new is not None]
    placements = rules.place_batch(rules.node_views(nodes, counts), [new.model for _, new in wanted])
    out: list[Queued] = [(None, None, None)] * len(jobs)
    chosen: dict[str, list[tuple[int, NewJob, str]]] = {}  # node -> (index in out, job, placement reason)
    for (i, new), placement in zip(wanted, placements, strict=True):
        if isinstance(placement, ModelMissing):
            out[i] = (None, None, {"status": 404, "code": "model_not_found", "message": placement.message})
            continue
        chosen.setdefault(placement.node, []).append((i, new, placement.reason))
        out[i] = (None, placement.node, None)
    ids = _fresh_ids(db, sum(len(v) for v in chosen.values()), now)
    at = iso(now)
    job_rows, event_rows = [], []
    for node, entering in chosen.items():
        owners = {job.owner for _, job, _ in entering}
        assert len(owners) == 1, "a batch's lines are its owner's"
        positions, reasons = _positions(db, node, owners.pop(), fair, len(entering))
        for (i, new, why), position, entered in zip(entering, positions, reasons, strict=True):
            job_id = ids.pop()
            out[i] = (job_id, node, None)
            job_rows.append(
                (
                    job_id,
                    new.kind,
                    node,
                    new.model or by_name[node].model,
                    int(new.model is not None),
                    new.prompt,
                    position,
                    why,
                    new.timeout_s,
                    at,
                    new.endpoint,
                    new.request,
                    new.owner,
                    new.client,
                    new.lane,
                )
            )
            note = f"placed on {node} ({why})" + (f"; {entered}" if entered else "")
            event_rows.append((job_id, at, None, JobState.QUEUED, actor, note, None))
    db.executemany(
        "INSERT INTO job (id, kind, node, model, model_pinned, prompt, position, placement, timeout_s, created_at,"
        " endpoint, request, owner, client, lane) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        job_rows,
    )
    db.executemany(
        "INSERT INTO event (job_id, at, from_state, to_state, actor, reason, run_id) VALUES (?,?,?,?,?,?,?)", event_rows
    )
    return out


def _fresh_ids(db: Connection, n: int, now: float) -> list[str]:
    """`n` job ids unused in the table (ids of one second share their prefix: one range read)."""
    second = str(int(now))
    taken = {r[0] for r in db.execute("SELECT id FROM job WHERE id >= ? AND id < ?", (second + "-", second + "."))}
    fresh: set[str] = set()
    while len(fresh) < n:
        job_id = new_job_id(now)
        if job_id not in taken:
            fresh.add(job_id)
    return sorted(fresh, reverse=True)  # popped from the end: ascending, in line order


def _positions(db: Connection, node: str, owner: str | None, fair: bool, n: int) -> tuple[list[int], list[str | None]]:
    """Positions in `node`'s queue for `n` batch jobs of `owner` entering it in order, each where
    placement.entries puts it (the tail, or with fair share among users' batch jobs). The queue
    is read once; a gap too narrow for the jobs entering it has its queue renumbered."""
    if not rules.reads_queue(Lane.BATCH, fair):
        tail = tail_position(db, node)
        return [tail + i * POSITION_GAP for i in range(n)], [None] * n
    waiting = [
        (r[0], r[1], r[2], r[3])
        for r in db.execute(
            "SELECT id, lane, owner, position FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id",
            (node,),
        )
    ]
    entered = rules.entries([(lane, who) for _, lane, who, _ in waiting], Lane.BATCH, owner, fair, n)
    gaps = [e.index for e in entered]  # each entering job's gap: the index of the waiting job it goes before
    reasons = [e.reason for e in entered]
    by_gap: dict[int, list[int]] = {}
    for j, gap in enumerate(gaps):
        by_gap.setdefault(gap, []).append(j)
    positions = [0] * n
    for gap, members in by_gap.items():
        before = waiting[gap - 1][3] if gap > 0 else None
        after = waiting[gap][3] if gap < len(waiting) else None
        if after is None:
            start = (before or 0) + POSITION_GAP
            for k, j in enumerate(members):
                positions[j] = start + k * POSITION_GAP
            continue
        low = before if before is not None else after - POSITION_GAP * (len(members) + 1)
        if after - low <= len(members):  # no room between them: renumber the whole queue
            return _renumbered(db, waiting, gaps), reasons
        step = (after - low) / (len(members) + 1)
        for k, j in enumerate(members):
            positions[j] = low + int(step * (k + 1))
    return positions, reasons


def _renumbered(db: Connection, waiting: list[tuple[Any, ...]], gaps: list[int]) -> list[int]:
    """The node's waiting jobs and the entering ones merged in order, every position anew."""
    merged: list[tuple[str, Any]] = []
    by_gap: dict[int, list[int]] = {}
    for j, gap in enumerate(gaps):
        by_gap.setdefault(gap, []).append(j)
    for i in range(len(waiting) + 1):
        merged.extend(("new", j) for j in by_gap.get(i, []))
        if i < len(waiting):
            merged.append(("old", waiting[i][0]))
    positions = [0] * len(gaps)
    updates = []
    for n, (kind, what) in enumerate(merged, 1):
        if kind == "new":
            positions[what] = n * POSITION_GAP
        else:
            updates.append((n * POSITION_GAP, what))
    db.executemany("UPDATE job SET position = ? WHERE id = ?", updates)
    return positions


# -- its life --------------------------------------------------------------------------------


def keep_response(db: Connection, job_id: str, response: str) -> bool:
    """A line's reply, in its endpoint's shape, kept as its run ends. False: no batch line."""
    return db.execute("UPDATE batch_line SET response = ? WHERE job_id = ?", (response, job_id)).rowcount > 0


def cancel_batch(db: Connection, batch_id: str, actor: str, now: float, only_owner: str | None) -> tuple[Row, int]:
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
    "SELECT l.line, l.custom_id, l.job_id, l.refused, l.response, j.state, j.error, j.node, j.model"
    " FROM batch_line l LEFT JOIN job j ON j.id = l.job_id WHERE l.batch_id = ? ORDER BY l.line"
)

# (output, errors): each a file's content, or None when it would be empty
Rendered = tuple[bytes | None, bytes | None]


def finalize(db: Connection, batch_id: str, render: Callable[[Row, list[Row]], Rendered], now: float) -> Row | None:
    """Once every line of an open batch has ended: its output and error files are written (the
    render gives their content, in the batch's API's shape) and it is completed (or cancelled,
    when it was cancelling). None when it is not due (a line still waits or runs, or it ended)."""
    found = db.execute("SELECT * FROM batch WHERE id = ?", (batch_id,)).fetchone()
    if found is None or found["status"] not in OPEN:
        return None
    lines = rows(db.execute(LINES_SQL, (batch_id,)).fetchall())
    if any(line["state"] in ACTIVE for line in lines):
        return None
    batch = dict(found)
    output, errors = render(batch, lines)
    ids: list[str | None] = []
    for content, suffix in ((output, "output"), (errors, "errors")):
        if content is None:
            ids.append(None)
            continue
        file_id = new_file_id()
        add_file(db, file_id, "batch_output", f"{batch_id}_{suffix}.jsonl", content, batch["owner"], now)
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
    batch_id: str,
    actor: str,
    now: float,
    only_owner: str | None,
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
        control.retry(db, job_id, actor, now, nodes)
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


def delete_batch(db: Connection, batch_id: str, only_owner: str | None) -> Row:
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


# -- reads -------------------------------------------------------------------------------------

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


BATCH_SQL = "SELECT * FROM batch WHERE id = ?"


def batches_sql(api: str | None, owner: bool, after: bool, status: bool) -> str:
    """Batches, newest first, paged by the last one seen (`after`: its created_at and id)."""
    where = []
    if api is not None:
        where.append("api = :api")
    if owner:
        where.append("owner = :owner")
    if status:
        where.append("status IN ('in_progress', 'cancelling')")
    if after:
        where.append("(created_at < :created_at OR (created_at = :created_at AND id < :id))")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT * FROM batch{clause} ORDER BY created_at DESC, id DESC LIMIT :limit"


LINES_OF_SQL = LINES_SQL
# A batch's lines that are jobs, with the page's and the CLI's view of each.
LINE_JOBS_SQL = (
    "SELECT l.line, l.custom_id, l.job_id, l.refused, j.state, j.error, j.node, j.model, j.created_at, j.finished_at"
    " FROM batch_line l LEFT JOIN job j ON j.id = l.job_id WHERE l.batch_id = ? ORDER BY l.line"
)
# The batch a job is a line of (the page folds them).
OPEN_LINES_SQL = (
    "SELECT l.batch_id, l.job_id FROM batch_line l JOIN batch b ON b.id = l.batch_id"
    " JOIN job j ON j.id = l.job_id WHERE b.status IN ('in_progress', 'cancelling') AND j.state IN ('queued', 'running')"
)
# The open batches' lines per node and state (the queue page folds them: one line per node).
OPEN_BY_NODE_SQL = (
    "SELECT l.batch_id, j.node, j.state, COUNT(*) AS n FROM batch b JOIN batch_line l ON l.batch_id = b.id"
    " JOIN job j ON j.id = l.job_id WHERE b.status IN ('in_progress', 'cancelling')"
    " GROUP BY l.batch_id, j.node, j.state"
)
FILE_SQL = "SELECT id, purpose, filename, bytes, created_at, owner FROM batch_file WHERE id = ?"
FILE_CONTENT_SQL = "SELECT content, owner FROM batch_file WHERE id = ?"
# Batches by state, and the lines of the open ones by their jobs' states (/metrics: a scrape
# reads the lines of the batches in progress only, never the whole history's).
BATCH_STATES_SQL = "SELECT status, COUNT(*) AS n FROM batch GROUP BY status"
LINE_STATES_SQL = (
    "SELECT COALESCE(j.state, 'refused') AS state, COUNT(*) AS n FROM batch b"
    " JOIN batch_line l ON l.batch_id = b.id LEFT JOIN job j ON j.id = l.job_id"
    " WHERE b.status IN ('in_progress', 'cancelling') GROUP BY COALESCE(j.state, 'refused')"
)


def files_sql(owner: bool, purpose: bool, after: bool, ascending: bool) -> str:
    where = []
    if owner:
        where.append("owner = :owner")
    if purpose:
        where.append("purpose = :purpose")
    if after:
        op = ">" if ascending else "<"
        where.append(f"(created_at {op} :created_at OR (created_at = :created_at AND id {op} :id))")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    order = "ASC" if ascending else "DESC"
    return (
        f"SELECT id, purpose, filename, bytes, created_at, owner FROM batch_file{clause}"
        f" ORDER BY created_at {order}, id {order} LIMIT :limit"
    )


class BatchReads:
    """The reads of batches and files (Store's, through its readers' connection). `only_owner`: a
    member's name; another's batch or file is not found (404), as another's job is not theirs."""

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        raise NotImplementedError

    async def batch(self, batch_id: str, only_owner: str | None = None) -> Row:
        found = await self.read(BATCH_SQL, (batch_id,))
        if not found or (only_owner is not None and found[0]["owner"] != only_owner):
            raise NotFound(f"no batch '{batch_id}'")
        return with_counts(found[0], await self.read(counts_sql(1), (batch_id,)))

    async def batches(
        self,
        api: str | None = None,
        owner: str | None = None,
        after: str | None = None,
        limit: int = 20,
        open_only: bool = False,
    ) -> list[Row]:
        """Newest first; `after`: the id of the last one seen (the next page starts past it)."""
        params: dict[str, Any] = {"api": api, "owner": owner, "limit": limit}
        if after is not None:
            seen = await self.read(BATCH_SQL, (after,))
            if not seen:
                raise NotFound(f"no batch '{after}' to list after")
            params.update(created_at=seen[0]["created_at"], id=after)
        found = await self.read(batches_sql(api, owner is not None, after is not None, open_only), params)
        if not found:
            return []
        ids = [b["id"] for b in found]
        counted = await self.read(counts_sql(len(ids)), ids)
        return [with_counts(b, counted) for b in found]

    async def batch_lines(self, batch_id: str) -> list[Row]:
        """A batch's lines in order, each with its job's state, node and error (None: refused)."""
        return await self.read(LINE_JOBS_SQL, (batch_id,))

    async def batch_results(self, batch_id: str) -> list[Row]:
        """A batch's lines in order with their kept replies (its results, its output files)."""
        return await self.read(LINES_SQL, (batch_id,))

    async def open_batch_lines(self) -> dict[str, str]:
        """The waiting and running jobs that are lines of open batches: job id -> batch id."""
        return {r["job_id"]: r["batch_id"] for r in await self.read(OPEN_LINES_SQL)}

    async def batches_of_jobs(self, job_ids: list[str]) -> dict[str, Row]:
        """The batch each of these jobs is a line of ({id, name, custom_id}); others are left out."""
        if not job_ids:
            return {}
        found = await self.read(
            "SELECT l.job_id, b.id, b.name, l.custom_id FROM batch_line l JOIN batch b ON b.id = l.batch_id"
            f" WHERE l.job_id IN ({','.join('?' * len(job_ids))})",
            job_ids,
        )
        return {r["job_id"]: {"id": r["id"], "name": r["name"], "custom_id": r["custom_id"]} for r in found}

    async def open_batches_by_node(self) -> dict[str, dict[str, dict[str, int]]]:
        """The open batches' lines on each node by state: batch id -> node -> state -> count."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for r in await self.read(OPEN_BY_NODE_SQL):
            out.setdefault(r["batch_id"], {}).setdefault(r["node"], {})[r["state"]] = int(r["n"])
        return out

    async def batch_totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """Batches by status, and the open batches' lines by their jobs' states (/metrics)."""
        by_status = {r["status"]: int(r["n"]) for r in await self.read(BATCH_STATES_SQL)}
        by_state = {r["state"]: int(r["n"]) for r in await self.read(LINE_STATES_SQL)}
        return by_status, by_state

    async def file(self, file_id: str, only_owner: str | None = None) -> Row:
        found = await self.read(FILE_SQL, (file_id,))
        if not found or (only_owner is not None and found[0]["owner"] != only_owner):
            raise NotFound(f"no file '{file_id}'")
        return found[0]

    async def files(
        self,
        owner: str | None = None,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10000,
        ascending: bool = False,
    ) -> list[Row]:
        params: dict[str, Any] = {"owner": owner, "purpose": purpose, "limit": limit}
        if after is not None:
            seen = await self.read(FILE_SQL, (after,))
            if not seen:
                raise NotFound(f"no file '{after}' to list after")
            params.update(created_at=seen[0]["created_at"], id=after)
        return await self.read(files_sql(owner is not None, purpose is not None, after is not None, ascending), params)

    async def file_content(self, file_id: str, only_owner: str | None = None) -> bytes:
        found = await self.read(FILE_CONTENT_SQL, (file_id,))
        if not found or (only_owner is not None and found[0]["owner"] != only_owner):
            raise NotFound(f"no file '{file_id}'")
        return bytes(found[0]["content"])
