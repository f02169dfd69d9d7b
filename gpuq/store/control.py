"""Queue control: the verbs that act on jobs from outside their life cycle, each a plain function
of the writer's connection inside the transaction its caller opened (see writer.py), checked
against the job's state there: a move within or between nodes' queues, a preempt, a delete, a
clear of a node's queue, a retry, and the nodes a reload removes. The life cycle itself (submit,
claim, heartbeat, finish...) is gpuq/store/lifecycle.py; the steps both share, steps.py."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .. import placement as rules
from ..errors import BadRequest, Conflict, Forbidden, NoResultToCritique, Unprocessable
from ..jobs import ACTIVE, NO_RESULT, Interrupted, JobState, Lane, NodeInfo, pruned_words
from .engine import Connection
from .steps import (
    QUEUE_POSITION_SQL,
    Row,
    cancel,
    check_quota,
    end_held_critiques,
    event,
    iso,
    job_for_update,
    position_at,
    rows,
    tail_position,
    waiting_lanes,
)

# -- a move, a preempt: a queued job's place ----------------------------------------------------


def _check_move_request(
    job_id: str, position: int | None, before: str | None, after: str | None, node: str | None
) -> None:
    if sum(x is not None for x in (position, before, after)) > 1:
        raise BadRequest("give only one of 'position', 'before' and 'after'")
    if job_id in (before, after):
        raise BadRequest(f"job {job_id} cannot be moved before or after itself")
    if position is None and before is None and after is None and node is None:
        raise BadRequest("say where to move the job: 'position', 'before', 'after' or 'node'")
    if position is not None and position < 1:
        raise BadRequest(f"position must be 1 or more, got {position}")


def _index_of(db: Connection, node: str, other_id: str, job_id: str) -> int:
    other = db.execute("SELECT node, state, position FROM job WHERE id = ?", (other_id,)).fetchone()
    if other is None:
        raise Unprocessable(f"unknown job '{other_id}'")
    if other["state"] != JobState.QUEUED or other["node"] != node:
        raise Conflict(f"job {other_id} is not waiting in node {node}'s queue")
    ahead: int = db.execute(
        "SELECT COUNT(*) FROM job WHERE node = ? AND state = 'queued' AND id <> ?"
        " AND (position < ? OR (position = ? AND id < ?))",
        (node, job_id, other["position"], other["position"], other_id),
    ).fetchone()[0]
    return ahead


def move(
    db: Connection,
    now: float,
    job_id: str,
    nodes: Sequence[NodeInfo],
    actor: str,
    *,
    position: int | None = None,
    before: str | None = None,
    after: str | None = None,
    node: str | None = None,
) -> Row:
    """Reorder a queued job within its node's queue or move it to another node's queue."""
    _check_move_request(job_id, position, before, after, node)
    job = job_for_update(db, job_id)
    if job["state"] != JobState.QUEUED:
        raise Conflict(f"job {job_id} is {job['state']}; only queued jobs move")
    target = node or job["node"]
    if target != job["node"]:
        rules.check_move(
            job["kind"], rules.node_views(list(nodes), {}), target, job["model"] if job["model_pinned"] else None
        )
        if job["endpoint"] is not None and not _batch_line(db, job_id):
            _check_call_stays(db, job, target)
    index: int | None
    if before is not None:
        index = _index_of(db, target, before, job_id)
    elif after is not None:
        index = _index_of(db, target, after, job_id) + 1
    elif position is not None:
        index = position - 1
    else:  # a bare node move goes to the tail (of the queue it is already in: stays)
        index = 1 << 62 if target != job["node"] else None
    if index is not None:
        # A job that did not ask for a model runs the model of the node it moves to.
        target_model = next((n.model for n in nodes if n.name == target), job["model"])
        db.execute(
            "UPDATE job SET node = ?, position = ?, placement = CASE WHEN node <> ?"
            " THEN 'moved' ELSE placement END, model = CASE WHEN model_pinned = 1"
            " THEN model ELSE ? END WHERE id = ?",
            (target, position_at(db, target, job_id, index), target, target_model, job_id),
        )
    moved = dict(job, node=target)
    now_at = db.execute("SELECT node, position, id FROM job WHERE id = ?", (job_id,)).fetchone()
    moved["position"] = db.execute(QUEUE_POSITION_SQL, dict(now_at)).fetchone()[0]
    where = f"to {target} " if target != job["node"] else ""
    event(db, job_id, JobState.QUEUED, JobState.QUEUED, actor, f"moved {where}at position {moved['position']}", now)
    return moved


def _batch_line(db: Connection, job_id: str) -> bool:
    """Is the job a batch's line? No client waits on one: it may move to any router's node."""
    return db.execute("SELECT 1 FROM batch_line WHERE job_id = ?", (job_id,)).fetchone() is not None


def _check_call_stays(db: Connection, job: Row, target: str) -> None:
    """A front-door call's client waits on the router that drives its node (several routers on
    PostgreSQL): it moves only among that router's nodes, else nobody would read its answer."""
    holder = {
        r["node"]: r["router"]
        for r in db.execute(
            "SELECT node, router FROM node_lease WHERE node IN (?, ?)", (job["node"], target)
        ).fetchall()
    }
    if holder.get(job["node"]) != holder.get(target):
        raise Conflict(
            f"job {job['id']} is a front-door call whose client waits on the router that drives"
            f" {job['node']} ({holder.get(job['node']) or 'none now'}), and {target} is driven by"
            f" {holder.get(target) or 'no router now'}: a call moves only among its router's nodes"
        )


def preempt(
    db: Connection,
    now: float,
    job_id: str,
    actor: str,
    only_owner: str | None = None,
    rule: Callable[[str, int, bool], bool] | None = None,
    reason: str | None = None,
    to: str | None = None,
    nodes: Sequence[NodeInfo] = (),
) -> tuple[Row, Interrupted | None]:
    """The queued job runs next: to the head, and the node's running job goes back behind it.
    `only_owner` (a member preempting): interrupting someone else's running job is acting on it,
    refused (403) naming its owner, before anything changes. `rule` (the router preempting on
    its own, [router] interactive_preempts): given the running job's lane, how many times it
    was preempted before and whether its answer is whole, whether to; when no
    job runs, the job is no longer waiting or the rule says no, nothing changes. `to` (with
    `rule` and `nodes`): on that node instead, the job moved there in the same transaction,
    only when the rule holds there and no other interactive job waits there (else nothing
    changes: the job is never left at the tail of another node's queue). `reason`: what the
    interrupted job's event and run say (else "preempted by <id>")."""
    job = job_for_update(db, job_id)
    if rule is not None:
        where = to or job["node"]
        running = db.execute(
            "SELECT j.lane, r.work_done_at,"
            " (SELECT COUNT(*) FROM run p WHERE p.job_id = j.id AND p.state = 'preempted') AS preempted"
            " FROM job j LEFT JOIN run r ON r.id = j.run_id WHERE j.node = ? AND j.state = 'running'",
            (where,),
        ).fetchone()
        if (
            job["state"] != JobState.QUEUED
            or running is None
            or not rule(running["lane"], running["preempted"], running["work_done_at"] is not None)
            or not db.execute("SELECT 1 FROM ready_job WHERE id = ?", (job_id,)).fetchone()
        ):
            return dict(job), None
        if where != job["node"]:
            if db.execute(
                "SELECT 1 FROM job WHERE node = ? AND state = 'queued' AND lane = ? AND id != ?",
                (where, Lane.INTERACTIVE, job_id),
            ).fetchone():
                return dict(job), None
            move(db, now, job_id, nodes, actor, position=1, node=where)
            job = job_for_update(db, job_id)
    if job["state"] != JobState.QUEUED:
        raise Conflict(f"job {job_id} is {job['state']}; only a queued job can preempt")
    if not db.execute("SELECT 1 FROM ready_job WHERE id = ?", (job_id,)).fetchone():
        if job["parent_id"] is None:  # (a line of a batch still being created: hidden until it is whole)
            raise Conflict(f"job {job_id} is a line of a batch still being created; it cannot run before")
        raise Conflict(f"job {job_id} is waiting for parent {job['parent_id']} to finish; it cannot run before")
    node = job["node"]
    if only_owner is not None:
        other = db.execute("SELECT id, owner FROM job WHERE node = ? AND state = 'running'", (node,)).fetchone()
        if other is not None and other["owner"] != only_owner:
            raise Forbidden(
                f"preempting {job_id} would interrupt job {other['id']} on {node}, which belongs to "
                f"{other['owner'] or 'no user'}; a member acts only on their own jobs (move yours to "
                "position 1 instead: it runs next)"
            )
    db.execute("UPDATE job SET position = ? WHERE id = ?", (position_at(db, node, job_id, 0), job_id))
    running = db.execute("SELECT id, run_id FROM job WHERE node = ? AND state = 'running'", (node,)).fetchone()
    moved = "preempt: moved to the head"
    if running and reason is not None:
        moved += f", ahead of running job {running['id']}, which goes back behind it"
    event(db, job_id, JobState.QUEUED, JobState.QUEUED, actor, moved, now)
    if not running:
        return dict(job, position=1), None
    victim, run_id = running["id"], running["run_id"]
    why = reason or f"preempted by {job_id}"
    behind = position_at(db, node, victim, 1)
    db.execute("UPDATE job SET state = 'queued', position = ? WHERE id = ?", (behind, victim))
    db.execute("UPDATE run SET state = 'preempted', finished_at = ?, error = ? WHERE id = ?", (iso(now), why, run_id))
    event(db, victim, JobState.RUNNING, JobState.QUEUED, actor, why, now, run_id)
    return dict(job, position=1), Interrupted(victim, node, run_id)


# -- a delete, a clear, a retry: a job's end by request, and its second chance ------------------


def delete(
    db: Connection, now: float, job_id: str, actor: str, reason: str = "deleted"
) -> tuple[Row, Interrupted | None]:
    """A queued or running job is cancelled with the reason ('deleted'); its rows stay."""
    job = job_for_update(db, job_id)
    if job["state"] not in ACTIVE:
        raise Conflict(f"job {job_id} is already {job['state']}; only queued or running jobs can be deleted")
    return dict(job, state=JobState.CANCELLED), cancel(db, job, actor, reason, now)


def clear(
    db: Connection,
    now: float,
    node: str,
    actor: str,
    running: bool = False,
    reason: str = "cleared",
    only_owner: str | None = None,
) -> tuple[list[str], Interrupted | None]:
    """Cancel the node's queued jobs (and its running one, with `running`), each with `reason`.
    `only_owner` (a member clearing): when any of them is someone else's, nothing is cancelled and
    the refusal names whose they are (clearing them would be acting on them)."""
    states = ACTIVE if running else (JobState.QUEUED,)
    jobs = rows(
        db.execute(
            f"SELECT * FROM job WHERE node = ? AND state IN ({','.join('?' * len(states))})"
            " ORDER BY state = 'queued', position, id",
            (node, *states),
        ).fetchall()
    )
    if only_owner is not None:
        others = sorted({j["owner"] or "no user" for j in jobs if j["owner"] != only_owner})
        if others:
            mine = sum(j["owner"] == only_owner for j in jobs)
            raise Forbidden(
                f"node {node} also has jobs of {', '.join(others)}; a member acts only on their own "
                f"jobs, and clearing cancels them too: nothing cleared (delete your {mine} one by one)"
            )
    interrupted = None
    for job in jobs:
        interrupted = cancel(db, job, actor, reason, now) or interrupted
    return [j["id"] for j in jobs], interrupted


def retry(
    db: Connection,
    now: float,
    job_id: str,
    actor: str,
    nodes: frozenset[str] | None = None,
    max_waiting: dict[str, int] | None = None,
) -> Row:
    """Only by explicit request: a failed or cancelled job goes to the tail of its node's queue
    (an interactive job: to the tail of the interactive jobs, ahead of every waiting batch job).
    `nodes`: the nodes there are (a reload may have removed the job's); `max_waiting`: each
    user's limit, which a retry counts against as a submit does."""
    job = job_for_update(db, job_id)
    if job["state"] not in NO_RESULT:
        raise Conflict(f"job {job_id} is {job['state']}; only failed or cancelled jobs can be retried")
    if nodes is not None and job["node"] not in nodes:
        raise Conflict(
            f"job {job_id}'s node {job['node']} is no longer in gpuq.toml (a reload removed it): "
            "submit the job again to place it on the nodes there are"
        )
    if job["pruned_at"] is not None:  # its request (a front-door call's) and its output are gone
        raise Conflict(f"job {job_id} cannot be retried: {pruned_words(job['pruned_at'])}; submit it again")
    check_quota(db, job["owner"], (max_waiting or {}).get(job["owner"]), 1)
    if job["subject_from_parent"]:  # (a parent now on this node: the schema refuses the requeue)
        parent = job_for_update(db, job["parent_id"])
        if parent["state"] in NO_RESULT:
            raise NoResultToCritique(parent["id"], parent["state"])
        if parent["pruned_at"] is not None:
            raise Conflict(
                f"job {job_id} cannot be retried: the output of its parent {parent['id']} it reviews was"
                f" {pruned_words(parent['pruned_at']).removeprefix('output ')}"
            )
    if rules.reads_queue(job["lane"], False):  # interactive: in its lane again, ahead of every waiting batch job
        entered = rules.entry(waiting_lanes(db, job["node"]), job["lane"], job["owner"], False)
        position = position_at(db, job["node"], job_id, entered.index)
    else:
        position = tail_position(db, job["node"])
    db.execute(
        "UPDATE job SET state = 'queued', error = NULL, finished_at = NULL, position = ? WHERE id = ?",
        (position, job_id),
    )
    event(db, job_id, job["state"], JobState.QUEUED, actor, "retry requested", now)
    return dict(job, state=JobState.QUEUED)


# -- nodes leaving the config (a reload) ---------------------------------------------------------


def remove_nodes(
    db: Connection,
    now: float,
    names: list[str],
    force: bool,
    reason: str,
    refused: Callable[[dict[str, list[str]], dict[str, str]], str | None],
) -> list[Row]:
    """Nodes leaving the config (a reload): refused (Conflict, with `refused`'s message) while jobs
    wait or run there, unless `force`: then each waiting job fails with `reason`, loudly (a running
    one is left to finish). Returns the failed jobs."""
    if not names:
        return []
    marks = ",".join("?" * len(names))
    active = rows(
        db.execute(
            f"SELECT * FROM job WHERE node IN ({marks}) AND state IN ('queued', 'running')"
            " ORDER BY node, state = 'queued', position, id",
            tuple(names),
        ).fetchall()
    )
    waiting = [j for j in active if j["state"] == JobState.QUEUED]
    if not force:
        message = refused(
            {n: [j["id"] for j in waiting if j["node"] == n] for n in names if any(j["node"] == n for j in waiting)},
            {j["node"]: j["id"] for j in active if j["state"] == JobState.RUNNING},
        )
        if message:
            raise Conflict(message)
    for job in waiting:
        db.execute(
            "UPDATE job SET state = 'failed', error = ?, finished_at = ? WHERE id = ?", (reason, iso(now), job["id"])
        )
        event(db, job["id"], JobState.QUEUED, JobState.FAILED, "router", reason, now)
        end_held_critiques(db, job["id"], f"failed ({reason})", now)
    return waiting
