"""A batch's lines queued in one go: placed by model over the queues as they grow
(placement.place_batch), each entering its node's queue where placement.entries puts it, the
rows written with executemany. Run inside create_batch's transaction (batches.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import placement as rules
from ..errors import ModelMissing
from ..jobs import POSITION_GAP, JobState, Lane, NewJob, NodeCounts, NodeInfo, new_job_id
from .engine import Connection
from .steps import iso, tail_position

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
