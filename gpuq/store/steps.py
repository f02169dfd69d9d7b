"""The steps the queue's verbs share (gpuq/store/lifecycle.py, control.py, records.py), each a
plain function of the writer's connection inside the verb's transaction: the ISO stamp, the event
row every state change writes, a queued job's position (placed, found, renumbered), a cancel and
the held critiques it ends, a user's quota of waiting jobs; and the one read of runs' whole text
and of a queued job's place, which the reads (gpuq/store/reads.py) use too."""

from __future__ import annotations

import json
from typing import Any, TypedDict

from .. import placement as rules
from ..errors import GpuqError, NotFound, OverQuota
from ..jobs import POSITION_GAP, Interrupted, JobState
from ..jobs import iso as _iso
from .engine import Connection

Row = dict[str, Any]

# A verb stamps its rows with its one `now` many times (a finish that claims: seven), each an ISO
# text at ~2.4 us of strftime: the last one made is kept and given again for the same `now`.
# (A tuple swapped whole: whichever thread reads it sees a matching pair.)
_last_iso: tuple[float, str] = (float("nan"), "")


def iso(now: float) -> str:
    global _last_iso
    last = _last_iso
    if last[0] == now:
        return last[1]
    text = _iso(now)
    _last_iso = (now, text)
    return text


# A queued job's place in its node's queue, from 1: the one statement of it (listings, the
# stream's "queued" lines and a move's answer all read it).
QUEUE_POSITION_SQL = (
    "SELECT COUNT(*) + 1 AS n FROM job WHERE node = :node AND state = 'queued'"
    " AND (position < :position OR (position = :position AND id < :id))"
)


# The one read of runs' whole text (the job's page and API, the CLI through it, a critique's
# subject): the pieces in the view run_text, in the order ORDER BY guarantees, joined here.
# Each run is named (run_id IN (...)): SQLite pushes that into both halves of the view's
# UNION ALL and reads each by its primary key.
def run_text_query(run_ids: list[int]) -> tuple[str, tuple[int, ...]]:
    return (
        f"SELECT run_id, output, thinking FROM run_text WHERE run_id IN ({','.join('?' * len(run_ids))})"
        " ORDER BY run_id, seq",
        tuple(run_ids),
    )


class RunText(TypedDict):
    """A run's whole text: its output ("" when it gave none) and its reasoning (None: none)."""

    output: str
    thinking: str | None


def joined_text(run_ids: list[int], pieces: list[Any]) -> dict[int, RunText]:
    """Each run's {"output", "thinking"} from its pieces, read in order; a run without any has
    "" and None (thinking stays None for a run that gave none)."""
    parts: dict[int, tuple[list[str], list[str]]] = {run_id: ([], []) for run_id in run_ids}
    for p in pieces:
        output, thinking = parts[p["run_id"]]
        output.append(p["output"] or "")
        if p["thinking"] is not None:
            thinking.append(p["thinking"])
    return {
        run_id: {"output": "".join(output), "thinking": "".join(thinking) if thinking else None}
        for run_id, (output, thinking) in parts.items()
    }


def run_texts(db: Connection, run_ids: list[int]) -> dict[int, RunText]:
    """Runs' whole text, inside a write (a critique's subject)."""
    return joined_text(run_ids, db.execute(*run_text_query(run_ids)).fetchall())


def rows(cursor_rows: list[Any]) -> list[Row]:
    return [dict(r) for r in cursor_rows]


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def event(
    db: Connection,
    job_id: str,
    from_state: str | None,
    to_state: str,
    actor: str,
    reason: str | None,
    now: float,
    run_id: int | None = None,
) -> None:
    """The event row every state change (and every move) writes, in the same transaction; `run_id`:
    the run it is about (a claim, a run's end, a stale note), which /metrics counts it with."""
    db.execute(
        "INSERT INTO event (job_id, at, from_state, to_state, actor, reason, run_id) VALUES (?,?,?,?,?,?,?)",
        (job_id, iso(now), from_state, to_state, actor, reason, run_id),
    )


# -- a queued job's position ------------------------------------------------------------------


def job_for_update(db: Connection, job_id: str) -> Row:
    row = db.execute("SELECT * FROM job WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no job with id '{job_id}'")
    return dict(row)


def renumber(db: Connection, node: str) -> None:
    """Spread a node's queued positions out again when a gap has run out."""
    rows = db.execute(
        "SELECT id FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id", (node,)
    ).fetchall()
    db.executemany(
        "UPDATE job SET position = ? WHERE id = ?", [((i + 1) * POSITION_GAP, r[0]) for i, r in enumerate(rows)]
    )


def position_at(db: Connection, node: str, job_id: str, index: int) -> int:
    """A position that puts the job at 0-based `index` among the node's other queued jobs."""
    for attempt in range(2):
        positions = [
            r[0]
            for r in db.execute(
                "SELECT position FROM job WHERE node = ? AND state = 'queued' AND id <> ?"
                " ORDER BY position, id LIMIT 2 OFFSET ?",
                (node, job_id, max(index - 1, 0)),
            )
        ]
        if index == 0:
            before, after = None, (positions[0] if positions else None)
        else:
            before = positions[0] if positions else None
            after = positions[1] if len(positions) > 1 else None
            if before is None:  # past the tail: the tail
                before = db.execute(
                    "SELECT MAX(position) FROM job WHERE node = ? AND state = 'queued' AND id <> ?", (node, job_id)
                ).fetchone()[0]
        found = rules.position_between(before, after, POSITION_GAP)
        if found is not None:
            return found
        if attempt == 0:
            renumber(db, node)
    raise GpuqError("no queue position found after renumbering")  # unreachable by construction


def tail_position(db: Connection, node: str) -> int:
    """A position behind every job waiting in the node's queue (its tail)."""
    tail = db.execute("SELECT MAX(position) FROM job WHERE node = ? AND state = 'queued'", (node,)).fetchone()
    position: int = (tail[0] or 0) + POSITION_GAP
    return position


# -- a cancel, and the held critiques a task without a result leaves -----------------------------

# A parent's held critiques (the view held_job): its children by the index job_parent, each checked
# against the view by its id (a `WHERE parent_id = ?` on the view would scan every queued job).
HELD_CHILDREN_SQL = (
    "SELECT * FROM job c WHERE c.parent_id = ? AND EXISTS (SELECT 1 FROM held_job h WHERE h.id = c.id) ORDER BY c.id"
)


def end_held_critiques(db: Connection, parent_id: str, why: str, now: float) -> list[str]:
    """A task that ended without a result leaves its held critiques nothing to review: they end
    cancelled, each with an event naming the parent and why; they never run."""
    held = rows(db.execute(HELD_CHILDREN_SQL, (parent_id,)).fetchall())
    for job in held:
        cancel(db, job, "router", f"parent task {parent_id} {why}; nothing to critique", now)
    return [j["id"] for j in held]


def cancel(db: Connection, job: Row, actor: str, reason: str, now: float) -> Interrupted | None:
    db.execute(
        "UPDATE job SET state = 'cancelled', error = ?, finished_at = ? WHERE id = ?", (reason, iso(now), job["id"])
    )
    event(
        db,
        job["id"],
        job["state"],
        JobState.CANCELLED,
        actor,
        reason,
        now,
        job["run_id"] if job["state"] == JobState.RUNNING else None,
    )
    end_held_critiques(db, job["id"], f"was cancelled ({reason})", now)
    if job["state"] != JobState.RUNNING:
        return None
    db.execute(
        "UPDATE run SET state = 'cancelled', error = ?, finished_at = ? WHERE id = ?", (reason, iso(now), job["run_id"])
    )
    return Interrupted(job["id"], job["node"], job["run_id"])


# -- what a job entering a queue weighs (a submit, a retry) -----------------------------------


def waiting_lanes(db: Connection, node: str) -> list[tuple[str, str | None]]:
    return [
        (r[0], r[1])
        for r in db.execute(
            "SELECT lane, owner FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id", (node,)
        )
    ]


def check_quota(db: Connection, owner: str | None, max_waiting: int | None, adding: int) -> None:
    if owner is None or max_waiting is None:
        return
    waiting = db.execute("SELECT COUNT(*) FROM job WHERE owner = ? AND state = 'queued'", (owner,)).fetchone()[0]
    if waiting + adding > max_waiting:
        jobs = "job" if adding == 1 else f"{adding} jobs"
        ids = [r[0] for r in db.execute("SELECT id FROM job WHERE owner = ? AND state = 'queued'", (owner,))]
        raise OverQuota(
            f"user '{owner}' has {waiting} job{'s' if waiting != 1 else ''} waiting, and max_waiting "
            f"is {max_waiting}: this {jobs} would pass it; submit again when one has started "
            f"(or ask an admin to raise max_waiting)",
            ids,
        )
