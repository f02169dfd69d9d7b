"""The queue's verbs: each a plain function of a sqlite3 connection that runs inside one
transaction its caller opened (the writer's batch, see writer.py; or a test's own
connection). All the write SQL lives here; gpuq/store/facade.py is the async facade that runs each verb
on the writer and holds the reads. `now` is the caller's clock, in seconds."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Callable, TypedDict

from .. import placement as rules
from .engine import Connection, Engine, dialect
from ..config import NodeConfig
from ..critique import parent_subject
from ..errors import (BadRequest, Conflict, Forbidden, GpuqError, GuardMiss, IdTaken, NoResultToCritique, NotFound,
                      OverQuota, Unprocessable)
from ..jobs import (
    ACTIVE, NO_RESULT, POSITION_GAP, Interrupted, JobState, NewJob, NodeCounts, NodeInfo, new_job_id,
)
from ..jobs import iso as _iso

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
QUEUE_POSITION_SQL = ("SELECT COUNT(*) + 1 AS n FROM job WHERE node = :node AND state = 'queued'"
                      " AND (position < :position OR (position = :position AND id < :id))")


# The one read of runs' whole text (the job's page and API, the CLI through it, a critique's
# subject): the pieces in the view run_text, in the order ORDER BY guarantees, joined here.
# Each run is named (run_id IN (...)): SQLite pushes that into both halves of the view's
# UNION ALL and reads each by its primary key.
def run_text_query(run_ids: list[int]) -> tuple[str, tuple[int, ...]]:
    return (f"SELECT run_id, output, thinking FROM run_text WHERE run_id IN ({','.join('?' * len(run_ids))})"
            " ORDER BY run_id, seq", tuple(run_ids))


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
    return {run_id: {"output": "".join(output), "thinking": "".join(thinking) if thinking else None}
            for run_id, (output, thinking) in parts.items()}


def run_texts(db: Connection, run_ids: list[int]) -> dict[int, RunText]:
    """Runs' whole text, inside a write (a critique's subject)."""
    return joined_text(run_ids, db.execute(*run_text_query(run_ids)).fetchall())


def rows(cursor_rows: list[Any]) -> list[Row]:
    return [dict(r) for r in cursor_rows]


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def _event(db: Connection, job_id: str, from_state: str | None, to_state: str, actor: str,
           reason: str | None, now: float, run_id: int | None = None) -> None:
    """The event row every state change (and every move) writes, in the same transaction; `run_id`:
    the run it is about (a claim, a run's end, a stale note), which /metrics counts it with."""
    db.execute("INSERT INTO event (job_id, at, from_state, to_state, actor, reason, run_id) VALUES (?,?,?,?,?,?,?)",
               (job_id, iso(now), from_state, to_state, actor, reason, run_id))


def _node_counts(db: Connection) -> dict[str, NodeCounts]:
    """Running and queued jobs per node: one row per node, kept by triggers (migration 009)."""
    return {r[0]: NodeCounts(r[1], r[2]) for r in db.execute("SELECT node, running, queued FROM node_load")}


def _unused_id(db: Connection, now: float) -> str:
    """A fresh job id. 32 random bits a second collide now and then in a burst of thousands
    (the birthday bound), so look before using one."""
    while True:
        job_id = new_job_id(now)
        if db.execute("SELECT 1 FROM job WHERE id = ?", (job_id,)).fetchone() is None:
            return job_id


# The claim: the first ready job of a node's queue becomes running, unless the node has a running
# job already. One statement; tests/test_store.py plans this very text.
CLAIM_SQL = ("UPDATE job SET state = 'running' WHERE id = (SELECT id FROM ready_job WHERE node = :node"
             " ORDER BY position, id LIMIT 1)"
             " AND NOT EXISTS (SELECT 1 FROM job WHERE node = :node AND state = 'running') RETURNING *")


# The claim when users have max_running: a job whose owner already runs that many waits, even
# on a free node (the next job of another user runs). `:limits` is a JSON object {user: limit},
# read as rows in the engine's words.
def claim_limited_sql(sql: Engine) -> str:
    return (
        "UPDATE job SET state = 'running' WHERE id = (SELECT r.id FROM ready_job r WHERE r.node = :node"
        f" AND NOT EXISTS (SELECT 1 FROM {sql.LIMITS_ROWS} WHERE l.key = r.owner"
        f"  AND {sql.LIMIT_VALUE} <= (SELECT COUNT(*) FROM job o WHERE o.owner = r.owner AND o.state = 'running'))"
        " ORDER BY r.position, r.id LIMIT 1)"
        " AND NOT EXISTS (SELECT 1 FROM job WHERE node = :node AND state = 'running') RETURNING *")


def claim(db: Connection, node: str, now: float, max_running: dict[str, int] | None = None) -> Row | None:
    """The first ready job of the node's queue becomes running, with a new run row (never a
    second head). Ready (the view ready_job, migration 003): not a critique held for its
    parent's result, so a held critique never blocks the jobs behind it. With `max_running`
    ({user: limit}), a job whose owner runs that many jobs already is skipped too."""
    if max_running:
        row = db.execute(claim_limited_sql(dialect(db)), {"node": node, "limits": dumps(max_running)}).fetchone()
    else:
        row = db.execute(CLAIM_SQL, {"node": node}).fetchone()
    if row is None:
        return None
    job = dict(row)
    if job["subject_from_parent"]:  # the parent is done (ready_job says so): review its result
        parent = db.execute("SELECT prompt, run_id FROM job WHERE id = ?", (job["parent_id"],)).fetchone()
        text = run_texts(db, [parent["run_id"]])[parent["run_id"]]
        job["prompt"] = parent_subject(parent["prompt"], text["output"])
        db.execute("UPDATE job SET prompt = ? WHERE id = ?", (job["prompt"], job["id"]))
    job["run_id"] = db.execute("INSERT INTO run (job_id, node, model, started_at, progress_at) VALUES (?,?,?,?,?)"
                               " RETURNING id", (job["id"], node, job["model"], iso(now), iso(now))).fetchone()[0]
    db.execute("UPDATE job SET run_id = ? WHERE id = ?", (job["run_id"], job["id"]))
    _event(db, job["id"], JobState.QUEUED, JobState.RUNNING, "router", f"claimed by {node}", now, job["run_id"])
    return job


def _job_for_update(db: Connection, job_id: str) -> Row:
    row = db.execute("SELECT * FROM job WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no job with id '{job_id}'")
    return dict(row)


def _renumber(db: Connection, node: str) -> None:
    """Spread a node's queued positions out again when a gap has run out."""
    rows = db.execute("SELECT id FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id",
                      (node,)).fetchall()
    db.executemany("UPDATE job SET position = ? WHERE id = ?",
                   [((i + 1) * POSITION_GAP, r[0]) for i, r in enumerate(rows)])


def _position_at(db: Connection, node: str, job_id: str, index: int) -> int:
    """A position that puts the job at 0-based `index` among the node's other queued jobs."""
    for attempt in range(2):
        positions = [r[0] for r in db.execute(
            "SELECT position FROM job WHERE node = ? AND state = 'queued' AND id <> ?"
            " ORDER BY position, id LIMIT 2 OFFSET ?", (node, job_id, max(index - 1, 0)))]
        if index == 0:
            before, after = None, (positions[0] if positions else None)
        else:
            before = positions[0] if positions else None
            after = positions[1] if len(positions) > 1 else None
            if before is None:  # past the tail: the tail
                before = db.execute("SELECT MAX(position) FROM job WHERE node = ? AND state = 'queued'"
                                    " AND id <> ?", (node, job_id)).fetchone()[0]
        found = rules.position_between(before, after, POSITION_GAP)
        if found is not None:
            return found
        if attempt == 0:
            _renumber(db, node)
    raise GpuqError("no queue position found after renumbering")  # unreachable by construction


def _index_of(db: Connection, node: str, other_id: str, job_id: str) -> int:
    other = db.execute("SELECT node, state, position FROM job WHERE id = ?", (other_id,)).fetchone()
    if other is None:
        raise Unprocessable(f"unknown job '{other_id}'")
    if other["state"] != JobState.QUEUED or other["node"] != node:
        raise Conflict(f"job {other_id} is not waiting in node {node}'s queue")
    ahead: int = db.execute(
        "SELECT COUNT(*) FROM job WHERE node = ? AND state = 'queued' AND id <> ?"
        " AND (position < ? OR (position = ? AND id < ?))",
        (node, job_id, other["position"], other["position"], other_id)).fetchone()[0]
    return ahead


# A parent's held critiques (the view held_job): its children by the index job_parent, each checked
# against the view by its id (a `WHERE parent_id = ?` on the view would scan every queued job).
HELD_CHILDREN_SQL = ("SELECT * FROM job c WHERE c.parent_id = ?"
                     " AND EXISTS (SELECT 1 FROM held_job h WHERE h.id = c.id) ORDER BY c.id")


def _end_held_critiques(db: Connection, parent_id: str, why: str, now: float) -> list[str]:
    """A task that ended without a result leaves its held critiques nothing to review: they end
    cancelled, each with an event naming the parent and why; they never run."""
    held = rows(db.execute(HELD_CHILDREN_SQL, (parent_id,)).fetchall())
    for job in held:
        _cancel(db, job, "router", f"parent task {parent_id} {why}; nothing to critique", now)
    return [j["id"] for j in held]


def _cancel(db: Connection, job: Row, actor: str, reason: str, now: float) -> Interrupted | None:
    db.execute("UPDATE job SET state = 'cancelled', error = ?, finished_at = ? WHERE id = ?",
               (reason, iso(now), job["id"]))
    _event(db, job["id"], job["state"], JobState.CANCELLED, actor, reason, now,
           job["run_id"] if job["state"] == JobState.RUNNING else None)
    _end_held_critiques(db, job["id"], f"was cancelled ({reason})", now)
    if job["state"] != JobState.RUNNING:
        return None
    db.execute("UPDATE run SET state = 'cancelled', error = ?, finished_at = ? WHERE id = ?",
               (reason, iso(now), job["run_id"]))
    return Interrupted(job["id"], job["node"], job["run_id"])


# -- the router's own writes ------------------------------------------------------------------

def configure(db: Connection, settings_s: dict[str, float], nodes: Sequence[NodeConfig]) -> None:
    """Record the thresholds (read by the view stale_heads, migration 012) and nodes in force."""
    db.executemany("INSERT INTO router_setting (key, value) VALUES (?, ?)"
                   " ON CONFLICT (key) DO UPDATE SET value = excluded.value", list(settings_s.items()))
    for n in nodes:
        db.execute(
            "INSERT INTO node (name, url, rank, roles, model, max_runtime_s) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT (name) DO UPDATE SET url = excluded.url, rank = excluded.rank,"
            " roles = excluded.roles, model = excluded.model, max_runtime_s = excluded.max_runtime_s",
            (n.name, n.url, n.rank, ",".join(n.roles), n.model, n.max_runtime_s))


def remove_nodes(db: Connection, names: list[str], force: bool, reason: str, now: float,
                 refused: Callable[[dict[str, list[str]], dict[str, str]], str | None]) -> list[Row]:
    """Nodes leaving the config (a reload): refused (Conflict, with `refused`'s message) while jobs
    wait or run there, unless `force`: then each waiting job fails with `reason`, loudly (a running
    one is left to finish). Returns the failed jobs."""
    if not names:
        return []
    marks = ",".join("?" * len(names))
    active = rows(db.execute(f"SELECT * FROM job WHERE node IN ({marks}) AND state IN ('queued', 'running')"
                             " ORDER BY node, state = 'queued', position, id", tuple(names)).fetchall())
    waiting = [j for j in active if j["state"] == JobState.QUEUED]
    if not force:
        message = refused({n: [j["id"] for j in waiting if j["node"] == n] for n in names
                           if any(j["node"] == n for j in waiting)},
                          {j["node"]: j["id"] for j in active if j["state"] == JobState.RUNNING})
        if message:
            raise Conflict(message)
    for job in waiting:
        db.execute("UPDATE job SET state = 'failed', error = ?, finished_at = ? WHERE id = ?",
                   (reason, iso(now), job["id"]))
        _event(db, job["id"], JobState.QUEUED, JobState.FAILED, "router", reason, now)
        _end_held_critiques(db, job["id"], f"failed ({reason})", now)
    return waiting


def record_reload(db: Connection, actor: str, path: str, changes: dict[str, Any] | None, error: str | None,
                  now: float) -> None:
    """One row per reload of gpuq.toml (migration 013): what changed, or why nothing did."""
    db.execute("INSERT INTO config_reload (at, actor, path, ok, changes, error) VALUES (?,?,?,?,?,?)",
               (iso(now), actor, path, int(error is None), None if changes is None else dumps(changes), error))


def set_node_health(db: Connection, name: str, up: bool, error: str | None, now: float) -> None:
    db.execute("UPDATE node SET up = ?, last_error = ?, since = ? WHERE name = ?", (int(up), error, iso(now), name))


def note_stale(db: Connection, now: float) -> list[Row]:
    """Write one event per newly stale head (not one per check); returns the new ones."""
    fresh = []
    for head in rows(db.execute(dialect(db).STALE_SQL, {"now": iso(now)}).fetchall()):
        cur = db.execute("UPDATE run SET stale_reason = ? WHERE id = ? AND stale_reason IS DISTINCT FROM ?",
                         (head["reason"], head["run_id"], head["reason"]))
        if cur.rowcount:
            _event(db, head["id"], JobState.RUNNING, JobState.RUNNING, "router",
                   f"stale: {head['reason']} since {head['since']}", now, head["run_id"])
            fresh.append(head)
    return fresh


def note(db: Connection, job_id: str, reason: str, actor: str, now: float) -> None:
    """An event that changes no state: an unload that failed, a stale head, a node flag."""
    state = db.execute("SELECT state FROM job WHERE id = ?", (job_id,)).fetchone()
    if state:
        _event(db, job_id, state[0], state[0], actor, reason, now)


def fail_orphans(db: Connection, now: float) -> list[Row]:
    """At start-up: a job still running belonged to a dead router. Fail it, loudly."""
    reason = "router restarted while running"
    failed = rows(db.execute(
        "UPDATE job SET state = 'failed', error = ?, finished_at = ? WHERE state = 'running'"
        " RETURNING id, node, model, run_id", (reason, iso(now))).fetchall())
    for r in failed:
        _orphan_failed(db, r, reason, now)
    return failed


def fail_orphan(db: Connection, job_id: str, reason: str, now: float) -> Row | None:
    """One job still running that no live router runs (its router died: gpuq/store/leases.py's
    takeover): failed, loudly, as fail_orphans fails each. None if it is no longer running."""
    job = db.execute("UPDATE job SET state = 'failed', error = ?, finished_at = ? WHERE id = ? AND state = 'running'"
                     " RETURNING id, node, model, run_id", (reason, iso(now), job_id)).fetchone()
    if job is None:
        return None
    _orphan_failed(db, dict(job), reason, now)
    return dict(job)


def _orphan_failed(db: Connection, job: Row, reason: str, now: float) -> None:
    """The rest of an orphan's failure: its run, its event, its held critiques."""
    db.execute("UPDATE run SET state = 'failed', error = ?, finished_at = ? WHERE id = ?"
               " AND state = 'running'", (reason, iso(now), job["run_id"]))
    _event(db, job["id"], JobState.RUNNING, JobState.FAILED, "router", reason, now, job["run_id"])
    _end_held_critiques(db, job["id"], f"failed ({reason})", now)


def cancel_clientless(db: Connection, now: float, nodes: list[str]) -> list[Row]:
    """At start-up: a front-door call still waiting on `nodes` (those this router now drives) lost
    its client with the old router (its connection is gone; a call waits on a node of the router
    its client called). It would run for no one: cancel it, loudly; `gpuq retry` runs it."""
    reason = "client gone: the router restarted while it waited (gpuq retry runs it, its output on its page)"
    waiting = rows(db.execute("SELECT * FROM job WHERE state = 'queued' AND endpoint IS NOT NULL"
                              f" AND node IN ({','.join('?' * len(nodes))})", nodes).fetchall()) if nodes else []
    for job in waiting:
        _cancel(db, job, "router", reason, now)
    return waiting


# -- alerts (gpuq/node/alerts.py) -------------------------------------------------------------------

def fire_alert(db: Connection, alert: dict[str, Any], deliver: bool, now: float) -> Row:
    return dict(db.execute(
        "INSERT INTO alert (alert, node, job_id, model, since, message, fix, fired_at, deliver)"
        " VALUES (?,?,?,?,?,?,?,?,?) RETURNING *",
        (alert["alert"], alert["node"], alert["job"], alert.get("model"), alert["since"], alert["message"],
         alert["fix"], iso(now), int(deliver))).fetchone())


def resolve_alert(db: Connection, alert_id: int, resolution: str, now: float) -> None:
    db.execute("UPDATE alert SET resolved_at = ?, resolution = ? WHERE id = ? AND resolved_at IS NULL",
               (iso(now), resolution, alert_id))


def owe_open_alerts(db: Connection) -> int:
    """At start-up with alert_url set: firings still open are owed their notices, even those
    seen while no alert_url was configured (they still fire)."""
    return db.execute("UPDATE alert SET deliver = 1 WHERE resolved_at IS NULL AND deliver = 0").rowcount


def record_delivery(db: Connection, alert_id: int, status: str, attempt: int, ok: bool,
                    http_status: int | None, error: str | None, now: float) -> None:
    """One try to deliver a notice; a delivered one is marked sent in the same transaction."""
    sent_column = {"firing": "fired_sent_at", "resolved": "resolved_sent_at"}[status]
    db.execute("INSERT INTO alert_delivery (alert_id, status, at, attempt, ok, http_status, error)"
               " VALUES (?,?,?,?,?,?,?)", (alert_id, status, iso(now), attempt, int(ok), http_status, error))
    if ok:
        db.execute(f"UPDATE alert SET {sent_column} = ? WHERE id = ?", (iso(now), alert_id))


# -- submitting --------------------------------------------------------------------------------

def _waiting_lanes(db: Connection, node: str) -> list[tuple[str, str | None]]:
    return [(r[0], r[1]) for r in db.execute(
        "SELECT lane, owner FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id", (node,))]


def _check_quota(db: Connection, owner: str | None, max_waiting: int | None, adding: int) -> None:
    if owner is None or max_waiting is None:
        return
    waiting = db.execute("SELECT COUNT(*) FROM job WHERE owner = ? AND state = 'queued'", (owner,)).fetchone()[0]
    if waiting + adding > max_waiting:
        jobs = "job" if adding == 1 else f"{adding} jobs"
        ids = [r[0] for r in db.execute("SELECT id FROM job WHERE owner = ? AND state = 'queued'", (owner,))]
        raise OverQuota(f"user '{owner}' has {waiting} job{'s' if waiting != 1 else ''} waiting, and max_waiting "
                        f"is {max_waiting}: this {jobs} would pass it; submit again when one has started "
                        f"(or ask an admin to raise max_waiting)", ids)


def submit(db: Connection, new: NewJob, nodes: list[NodeInfo], actor: str, now: float, *,
           fair: bool = False, max_waiting: int | None = None) -> list[Row]:
    """Place and insert a job (a task, or a critique's whole fan-out). Placement sees the jobs
    submitted before it, in the same batch too (node_load counts them). Where it enters its
    node's queue is placement's `entry`: an interactive job ahead of every waiting batch job, a
    batch job at the tail (with `fair`: where users' batch jobs interleave). `max_waiting`: the
    owner's limit of waiting jobs; beyond it, OverQuota and nothing is stored."""
    by_name = {n.name: n for n in nodes}
    lane = new.lane or rules.BATCH  # (NewJob sets it: None only before its __post_init__)
    parent: Any = None  # the parent's row (a critique's), as read
    if new.parent is not None:
        parent = db.execute("SELECT id, kind, node, state, prompt FROM job WHERE id = ?", (new.parent,)).fetchone()
        if parent is None:
            raise Unprocessable(f"unknown parent job '{new.parent}'")
        if parent["kind"] != "task":
            raise Unprocessable(f"parent job '{new.parent}' is a {parent['kind']}, not a task")
    parent_node = parent["node"] if parent else None
    counts = _node_counts(db)
    interactive = None
    if new.lane == rules.INTERACTIVE:
        interactive = {r[0]: r[1] for r in db.execute(
            "SELECT node, COUNT(*) FROM job WHERE state = 'queued' AND lane = ? GROUP BY node", (rules.INTERACTIVE,))}
    views = rules.node_views(nodes, counts, interactive)
    if new.kind != "critique":  # a task, or an embedding (placed as a task)
        placements = [rules.place_task(views, new.node, new.model, lane)]
    else:  # the guard is judged here, first, whatever state the parent is in
        placements = rules.place_critique(views, parent_node, new.node, new.model)
    prompt, from_parent = new.prompt, new.prompt is None
    if from_parent:  # reviews the parent's prompt and result; held until the parent is done
        if parent["state"] in NO_RESULT:
            raise NoResultToCritique(parent["id"], parent["state"])
        prompt = parent_subject(parent["prompt"], f"(the result of task {parent['id']}, once it is done)")
    _check_quota(db, new.owner, max_waiting, len(placements))
    group = None  # a fan-out's children share the first child's id as their group
    at = iso(now)
    created = []
    for p in placements:
        job_id = new.job_id or _unused_id(db, now)
        if new.job_id and db.execute("SELECT 1 FROM job WHERE id = ?", (job_id,)).fetchone():
            raise IdTaken(f"job id {job_id} is taken")
        if new.kind == "critique" and group is None:
            group = job_id
        entered = rules.Entry(counts.get(p.node, NodeCounts()).queued)
        if new.lane == rules.INTERACTIVE or fair:
            waiting = _waiting_lanes(db, p.node)
            entered = rules.entry(waiting, lane, new.owner, fair)
        if entered.reason is None:  # the tail
            tail = db.execute("SELECT MAX(position) FROM job WHERE node = ? AND state = 'queued'",
                              (p.node,)).fetchone()
            position = (tail[0] or 0) + POSITION_GAP
        else:
            position = _position_at(db, p.node, job_id, entered.index)
        model = new.model or by_name[p.node].model
        db.execute(
            "INSERT INTO job (id, kind, node, model, model_pinned, prompt, parent_id, group_id,"
            " position, placement, timeout_s, created_at, subject_from_parent, think, options,"
            " endpoint, request, owner, client, lane) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (job_id, new.kind, p.node, model, int(new.model is not None), prompt, new.parent,
             group, position, p.reason, new.timeout_s, at, int(from_parent),
             None if new.think is None else dumps(new.think), None if new.options is None else dumps(new.options),
             new.endpoint, new.request, new.owner, new.client, new.lane),
        )
        waiting_for = new.parent if from_parent and parent["state"] != JobState.DONE else None
        held = f"; waiting for parent {waiting_for}" if waiting_for else ""
        entered_why = f"; {entered.reason}" if entered.reason else ""
        _event(db, job_id, None, JobState.QUEUED, actor, f"placed on {p.node} ({p.reason}){entered_why}{held}", now)
        created.append({"id": job_id, "kind": new.kind, "node": p.node, "model": model,
                        "state": JobState.QUEUED, "position": entered.index + 1, "reason": p.reason,
                        "lane": new.lane, "owner": new.owner, "entered": entered.reason,
                        "parent": new.parent, "group": group, "waiting_for": waiting_for})
    return created


def submit_and_claim(db: Connection, new: NewJob, nodes: list[NodeInfo], actor: str,
                     now: float, fair: bool = False, max_waiting: int | None = None,
                     max_running: dict[str, int] | None = None) -> tuple[list[Row], list[Row]]:
    """Submit, then claim the head of each chosen node whose worker waits idle (NodeInfo.idle),
    in the same transaction: an idle node's job pays one commit before its request, not two.
    The claim is the worker's own (claim: the same guards, run row and event); the created
    rows it took say so (state running). Returns the created rows and the claimed jobs."""
    created = submit(db, new, nodes, actor, now, fair=fair, max_waiting=max_waiting)
    idle = {n.name for n in nodes if n.idle and n.up}
    claimed = [job for node in dict.fromkeys(j["node"] for j in created if j["node"] in idle)
               if (job := claim(db, node, now, max_running)) is not None]
    running = {job["id"] for job in claimed}
    for row in created:
        if row["id"] in running:
            row.update(state=JobState.RUNNING, position=None)
    return created, claimed


# -- the worker's verbs ------------------------------------------------------------------------

# Output is written once: each write inserts one run_chunk row (migration 011) with only the text
# its caller has not stored yet, so a long job writes O(n) bytes; nothing rewrites earlier text.
# Text is kept whatever state the run is in (its tokens were produced in it).
APPEND_CHUNK = ("INSERT INTO run_chunk (run_id, seq, at, output, thinking)"
                " SELECT :run_id, COALESCE(MAX(seq), 0) + 1, :at, :output, :thinking"
                " FROM run_chunk WHERE run_id = :run_id")


def append_output(db: Connection, run_id: int, output: str | None, thinking: str | None,
                  now: float) -> None:
    """Keep more of a run's output (and reasoning): a heartbeat's, or an interrupted run's last."""
    if output or thinking:
        db.execute(APPEND_CHUNK, {"run_id": run_id, "at": iso(now), "output": output or None,
                                  "thinking": thinking or None})


def heartbeat(db: Connection, run_id: int, output: str, thinking: str | None, now: float) -> None:
    append_output(db, run_id, output, thinking, now)
    db.execute("UPDATE run SET progress_at = ? WHERE id = ? AND state = 'running'", (iso(now), run_id))


def work_done(db: Connection, run_id: int, output: str, stats: dict[str, Any], thinking: str | None,
              now: float) -> None:
    """Ollama's stream ended (`output`: its text not stored yet); the job is not finished until
    its model has left VRAM."""
    append_output(db, run_id, output, thinking, now)
    db.execute(
        "UPDATE run SET progress_at = ?, work_done_at = ?, done_reason = ?,"
        " eval_count = ?, prompt_eval_count = ?, total_duration_ns = ?,"
        " load_duration_ns = ?, eval_duration_ns = ? WHERE id = ? AND state = 'running'",
        (iso(now), iso(now), stats.get("done_reason"), stats.get("eval_count"),
         stats.get("prompt_eval_count"), stats.get("total_duration"),
         stats.get("load_duration"), stats.get("eval_duration"), run_id))


def finish(db: Connection, job_id: str, run_id: int, state: str, error: str | None, now: float, *,
           output: str | None = None, actor: str = "router", findings: list[Any] | None = None,
           claim_node: str | None = None, thinking: str | None = None, streamed: int = 0,
           max_running: dict[str, int] | None = None) -> Row | None:
    """Finish a run that is still the job's running run; anything else is a GuardMiss. `output`
    and `thinking`: text not stored yet, appended. With `claim_node`, the node's next job is
    claimed in the same transaction and returned."""
    done = db.execute(
        "UPDATE job SET state = ?, error = ?, finished_at = ?, findings = ? WHERE id = ?"
        " AND state = 'running' AND run_id = ? RETURNING id",
        (state, error, iso(now), None if findings is None else dumps(findings), job_id, run_id)).fetchall()
    if not done:
        raise GuardMiss(f"job {job_id} run {run_id} is no longer running")
    append_output(db, run_id, output, thinking, now)
    tokens = streamed if state == JobState.FAILED and streamed else None  # a reply that broke off: no last line
    db.execute("UPDATE run SET state = ?, error = ?, finished_at = ?, eval_count = COALESCE(eval_count, ?)"
               " WHERE id = ?", (state, error, iso(now), tokens, run_id))
    _event(db, job_id, JobState.RUNNING, state, actor, error, now, run_id)
    if state == JobState.FAILED:
        _end_held_critiques(db, job_id, f"failed ({error})", now)
    return claim(db, claim_node, now, max_running) if claim_node else None


# -- the user's verbs: each checked against the job's state inside its transaction --------------

def _check_move_request(job_id: str, position: int | None, before: str | None, after: str | None,
                        node: str | None) -> None:
    if sum(x is not None for x in (position, before, after)) > 1:
        raise BadRequest("give only one of 'position', 'before' and 'after'")
    if job_id in (before, after):
        raise BadRequest(f"job {job_id} cannot be moved before or after itself")
    if position is None and before is None and after is None and node is None:
        raise BadRequest("say where to move the job: 'position', 'before', 'after' or 'node'")
    if position is not None and position < 1:
        raise BadRequest(f"position must be 1 or more, got {position}")


def move(db: Connection, job_id: str, nodes: Sequence[NodeInfo], actor: str, now: float, *,
         position: int | None = None, before: str | None = None, after: str | None = None,
         node: str | None = None) -> Row:
    """Reorder a queued job within its node's queue or move it to another node's queue."""
    _check_move_request(job_id, position, before, after, node)
    job = _job_for_update(db, job_id)
    if job["state"] != JobState.QUEUED:
        raise Conflict(f"job {job_id} is {job['state']}; only queued jobs move")
    target = node or job["node"]
    if target != job["node"]:
        rules.check_move(job["kind"], rules.node_views(list(nodes), {}), target, job["model"] if job["model_pinned"] else None)
        if job["endpoint"] is not None:
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
        db.execute("UPDATE job SET node = ?, position = ?, placement = CASE WHEN node <> ?"
                   " THEN 'moved' ELSE placement END, model = CASE WHEN model_pinned = 1"
                   " THEN model ELSE ? END WHERE id = ?",
                   (target, _position_at(db, target, job_id, index), target, target_model, job_id))
    moved = dict(job, node=target)
    now_at = db.execute("SELECT node, position, id FROM job WHERE id = ?", (job_id,)).fetchone()
    moved["position"] = db.execute(QUEUE_POSITION_SQL, dict(now_at)).fetchone()[0]
    where = f"to {target} " if target != job["node"] else ""
    _event(db, job_id, JobState.QUEUED, JobState.QUEUED, actor, f"moved {where}at position {moved['position']}", now)
    return moved


def _check_call_stays(db: Connection, job: Row, target: str) -> None:
    """A front-door call's client waits on the router that drives its node (several routers on
    PostgreSQL): it moves only among that router's nodes, else nobody would read its answer."""
    holder = {r["node"]: r["router"] for r in db.execute(
        "SELECT node, router FROM node_lease WHERE node IN (?, ?)", (job["node"], target)).fetchall()}
    if holder.get(job["node"]) != holder.get(target):
        raise Conflict(f"job {job['id']} is a front-door call whose client waits on the router that drives"
                       f" {job['node']} ({holder.get(job['node']) or 'none now'}), and {target} is driven by"
                       f" {holder.get(target) or 'no router now'}: a call moves only among its router's nodes")


def preempt(db: Connection, job_id: str, actor: str, now: float,
            only_owner: str | None = None, rule: Callable[[str], bool] | None = None,
            reason: str | None = None, to: str | None = None, nodes: Sequence[NodeInfo] = ()) -> tuple[Row, Interrupted | None]:
    """The queued job runs next: to the head, and the node's running job goes back behind it.
    `only_owner` (a member preempting): interrupting someone else's running job is acting on it,
    refused (403) naming its owner, before anything changes. `rule` (the router preempting on
    its own, [router] interactive_preempts): given the running job's lane, whether to; when no
    job runs, the job is no longer waiting or the rule says no, nothing changes. `to` (with
    `rule` and `nodes`): on that node instead, the job moved there in the same transaction,
    only when the rule holds there and no other interactive job waits there (else nothing
    changes: the job is never left at the tail of another node's queue). `reason`: what the
    interrupted job's event and run say (else "preempted by <id>")."""
    job = _job_for_update(db, job_id)
    if rule is not None:
        where = to or job["node"]
        running = db.execute("SELECT lane FROM job WHERE node = ? AND state = 'running'", (where,)).fetchone()
        if (job["state"] != JobState.QUEUED or running is None or not rule(running["lane"])
                or not db.execute("SELECT 1 FROM ready_job WHERE id = ?", (job_id,)).fetchone()):
            return dict(job), None
        if where != job["node"]:
            if db.execute("SELECT 1 FROM job WHERE node = ? AND state = 'queued' AND lane = ? AND id != ?",
                          (where, rules.INTERACTIVE, job_id)).fetchone():
                return dict(job), None
            move(db, job_id, nodes, actor, now, position=1, node=where)
            job = _job_for_update(db, job_id)
    if job["state"] != JobState.QUEUED:
        raise Conflict(f"job {job_id} is {job['state']}; only a queued job can preempt")
    if not db.execute("SELECT 1 FROM ready_job WHERE id = ?", (job_id,)).fetchone():
        raise Conflict(f"job {job_id} is waiting for parent {job['parent_id']} to finish; it cannot run before")
    node = job["node"]
    if only_owner is not None:
        other = db.execute("SELECT id, owner FROM job WHERE node = ? AND state = 'running'", (node,)).fetchone()
        if other is not None and other["owner"] != only_owner:
            raise Forbidden(f"preempting {job_id} would interrupt job {other['id']} on {node}, which belongs to "
                            f"{other['owner'] or 'no user'}; a member acts only on their own jobs (move yours to "
                            "position 1 instead: it runs next)")
    db.execute("UPDATE job SET position = ? WHERE id = ?", (_position_at(db, node, job_id, 0), job_id))
    running = db.execute("SELECT id, run_id FROM job WHERE node = ? AND state = 'running'", (node,)).fetchone()
    moved = "preempt: moved to the head"
    if running and reason is not None:
        moved += f", ahead of running job {running['id']}, which goes back behind it"
    _event(db, job_id, JobState.QUEUED, JobState.QUEUED, actor, moved, now)
    if not running:
        return dict(job, position=1), None
    victim, run_id = running["id"], running["run_id"]
    why = reason or f"preempted by {job_id}"
    behind = _position_at(db, node, victim, 1)
    db.execute("UPDATE job SET state = 'queued', position = ? WHERE id = ?", (behind, victim))
    db.execute("UPDATE run SET state = 'preempted', finished_at = ?, error = ? WHERE id = ?",
               (iso(now), why, run_id))
    _event(db, victim, JobState.RUNNING, JobState.QUEUED, actor, why, now, run_id)
    return dict(job, position=1), Interrupted(victim, node, run_id)


def delete(db: Connection, job_id: str, actor: str, reason: str, now: float) -> tuple[Row, Interrupted | None]:
    """A queued or running job is cancelled with the reason ('deleted'); its rows stay."""
    job = _job_for_update(db, job_id)
    if job["state"] not in ACTIVE:
        raise Conflict(f"job {job_id} is already {job['state']}; only queued or running jobs can be deleted")
    return dict(job, state=JobState.CANCELLED), _cancel(db, job, actor, reason, now)


def clear(db: Connection, node: str, actor: str, running: bool, now: float,
          reason: str = "cleared", only_owner: str | None = None) -> tuple[list[str], Interrupted | None]:
    """Cancel the node's queued jobs (and its running one, with `running`), each with `reason`.
    `only_owner` (a member clearing): when any of them is someone else's, nothing is cancelled and
    the refusal names whose they are (clearing them would be acting on them)."""
    states = ACTIVE if running else (JobState.QUEUED,)
    jobs = rows(db.execute(
        f"SELECT * FROM job WHERE node = ? AND state IN ({','.join('?' * len(states))})"
        " ORDER BY state = 'queued', position, id", (node, *states)).fetchall())
    if only_owner is not None:
        others = sorted({j["owner"] or "no user" for j in jobs if j["owner"] != only_owner})
        if others:
            mine = sum(j["owner"] == only_owner for j in jobs)
            raise Forbidden(f"node {node} also has jobs of {', '.join(others)}; a member acts only on their own "
                            f"jobs, and clearing cancels them too: nothing cleared (delete your {mine} one by one)")
    interrupted = None
    for job in jobs:
        interrupted = _cancel(db, job, actor, reason, now) or interrupted
    return [j["id"] for j in jobs], interrupted


def retry(db: Connection, job_id: str, actor: str, now: float, nodes: frozenset[str] | None = None,
          max_waiting: dict[str, int] | None = None) -> Row:
    """Only by explicit request: a failed or cancelled job goes to the tail of its node's queue
    (an interactive job: to the tail of the interactive jobs, ahead of every waiting batch job).
    `nodes`: the nodes there are (a reload may have removed the job's); `max_waiting`: each
    user's limit, which a retry counts against as a submit does."""
    job = _job_for_update(db, job_id)
    if job["state"] not in NO_RESULT:
        raise Conflict(f"job {job_id} is {job['state']}; only failed or cancelled jobs can be retried")
    if nodes is not None and job["node"] not in nodes:
        raise Conflict(f"job {job_id}'s node {job['node']} is no longer in gpuq.toml (a reload removed it): "
                       "submit the job again to place it on the nodes there are")
    _check_quota(db, job["owner"], (max_waiting or {}).get(job["owner"]), 1)
    if job["subject_from_parent"]:  # (a parent now on this node: the schema refuses the requeue)
        parent = _job_for_update(db, job["parent_id"])
        if parent["state"] in NO_RESULT:
            raise NoResultToCritique(parent["id"], parent["state"])
    if job["lane"] == rules.INTERACTIVE:  # in its lane again: ahead of every waiting batch job
        entered = rules.entry(_waiting_lanes(db, job["node"]), job["lane"], job["owner"], False)
        position = _position_at(db, job["node"], job_id, entered.index)
    else:
        tail = db.execute("SELECT MAX(position) FROM job WHERE node = ? AND state = 'queued'",
                          (job["node"],)).fetchone()[0]
        position = (tail or 0) + POSITION_GAP
    db.execute("UPDATE job SET state = 'queued', error = NULL, finished_at = NULL, position = ?"
               " WHERE id = ?", (position, job_id))
    _event(db, job_id, job["state"], JobState.QUEUED, actor, "retry requested", now)
    return dict(job, state=JobState.QUEUED)


def requeue_unsent(db: Connection, sent: dict[str, int | None], reason: str, now: float) -> list[Row]:
    """When the router stops: the running job of each node in `sent` whose run is not the one its
    worker last sent to Ollama never reached it; its claim is undone (see _put_back)."""
    running = rows(db.execute(
        f"SELECT id, node, run_id FROM job WHERE state = 'running' AND node IN ({','.join('?' * len(sent))})",
        tuple(sent)).fetchall())
    unsent = [r for r in running if r["run_id"] != sent[r["node"]]]
    for r in unsent:
        _put_back(db, r, reason, now)
    return unsent


def put_back(db: Connection, job_id: str, run_id: int, reason: str, now: float) -> bool:
    """The run's request never reached Ollama: undo its claim. False when the run had already
    ended (deleted or preempted meanwhile: that already ended it)."""
    job = db.execute("SELECT id, node, run_id, state FROM job WHERE id = ?", (job_id,)).fetchone()
    if job is None or job["state"] != JobState.RUNNING or job["run_id"] != run_id:
        return False
    _put_back(db, dict(job), reason, now)
    return True


def _put_back(db: Connection, job: Row, reason: str, now: float) -> None:
    """Undo a claim whose request never reached Ollama: the job is queued at the head again,
    its run ends cancelled with `reason` (kept for forensics), an event says why."""
    db.execute("UPDATE job SET state = 'queued', position = ? WHERE id = ?",
               (_position_at(db, job["node"], job["id"], 0), job["id"]))
    db.execute("UPDATE run SET state = 'cancelled', finished_at = ?, error = ? WHERE id = ?",
               (iso(now), reason, job["run_id"]))
    _event(db, job["id"], JobState.RUNNING, JobState.QUEUED, "router", reason, now, job["run_id"])
