"""A job's life cycle, each step a verb: a plain function of the writer's connection that runs
inside one transaction its caller opened (the writer's batch, see writer.py; or a test's own
connection), checked against the job's state there. A job is submitted (placed, and claimed at
once by an idle node's worker), claimed, kept (heartbeats, work done), finished; a claim whose
request never reached Ollama is undone; a running head gone stale is noted; at start-up a dead
router's jobs fail and its front-door calls, their clients gone, are cancelled.

A verb's first arguments are the connection and `now` (the caller's clock, in seconds), then a
claim's users' max_running, then its own: core.write makes a Store method of it that gives those
(jobs_api.py). The store's other writes: queue control (move, preempt, delete, clear, retry,
removed nodes) in gpuq/store/control.py, batches in batches.py, the router's own records in
records.py, the steps they share in steps.py."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .. import placement as rules
from ..critique import parent_subject
from ..errors import GuardMiss, IdTaken, NoResultToCritique, Unprocessable
from ..jobs import NO_RESULT, JobState, Lane, NewJob, NodeCounts, NodeInfo, new_job_id
from .engine import Connection, Engine, dialect
from .parts import keep_parts, split_request, whole_request_in
from .steps import (
    Row,
    cancel,
    check_quota,
    dumps,
    end_held_critiques,
    event,
    iso,
    position_at,
    rows,
    run_texts,
    tail_position,
    waiting_lanes,
)

# Users' max_running when none has one (the claim's `max_running`: {user: limit}).
NO_LIMITS: Mapping[str, int] = MappingProxyType({})

# -- submitting --------------------------------------------------------------------------------


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


def submit(
    db: Connection,
    new: NewJob,
    nodes: list[NodeInfo],
    actor: str,
    now: float,
    *,
    fair: bool = False,
    max_waiting: int | None = None,
) -> list[Row]:
    """Place and insert a job (a task, or a critique's whole fan-out). Placement sees the jobs
    submitted before it, in the same batch too (node_load counts them). Where it enters its
    node's queue is placement's `entry`: an interactive job ahead of every waiting batch job, a
    batch job at the tail (with `fair`: where users' batch jobs interleave). `max_waiting`: the
    owner's limit of waiting jobs; beyond it, OverQuota and nothing is stored."""
    models = {n.name: n.model for n in nodes}
    parent = _parent_of(db, new)
    counts = _node_counts(db)
    placements = _placements(db, new, nodes, counts, parent["node"] if parent else None)
    prompt, from_parent = _subject_of(new, parent)
    check_quota(db, new.owner, max_waiting, len(placements))
    waiting_for = new.parent if from_parent and parent["state"] != JobState.DONE else None
    held = f"; waiting for parent {waiting_for}" if waiting_for else ""
    group = None  # a fan-out's children share the first child's id as their group
    at = iso(now)
    created = []
    # a request's large parts (images), stored once per content (gpuq/store/parts.py)
    request, parts = split_request(new.request) if new.request is not None else (None, {})
    for p in placements:
        job_id = _new_id(db, new, now)
        if new.kind == "critique" and group is None:
            group = job_id
        entered, position = _entered(db, new, p.node, job_id, counts.get(p.node, NodeCounts()).queued, fair)
        model = new.model or models[p.node]
        db.execute(
            "INSERT INTO job (id, kind, node, model, model_pinned, prompt, parent_id, group_id,"
            " position, placement, timeout_s, created_at, subject_from_parent, think, options,"
            " endpoint, request, owner, client, lane) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                job_id,
                new.kind,
                p.node,
                model,
                int(new.model is not None),
                prompt,
                new.parent,
                group,
                position,
                p.reason,
                new.timeout_s,
                at,
                int(from_parent),
                None if new.think is None else dumps(new.think),
                None if new.options is None else dumps(new.options),
                new.endpoint,
                request,
                new.owner,
                new.client,
                new.lane,
            ),
        )
        entered_why = f"; {entered.reason}" if entered.reason else ""
        event(db, job_id, None, JobState.QUEUED, actor, f"placed on {p.node} ({p.reason}){entered_why}{held}", now)
        created.append(
            {
                "id": job_id,
                "kind": new.kind,
                "node": p.node,
                "model": model,
                "state": JobState.QUEUED,
                "position": entered.index + 1,
                "reason": p.reason,
                "lane": new.lane,
                "owner": new.owner,
                "entered": entered.reason,
                "parent": new.parent,
                "group": group,
                "waiting_for": waiting_for,
            }
        )
    if parts:
        keep_parts(db, [str(job["id"]) for job in created], parts, at)
    return created


def _parent_of(db: Connection, new: NewJob) -> Any:
    """A critique's parent as read (None: no parent), refused unless it is a task."""
    if new.parent is None:
        return None
    parent = db.execute("SELECT id, kind, node, state, prompt FROM job WHERE id = ?", (new.parent,)).fetchone()
    if parent is None:
        raise Unprocessable(f"unknown parent job '{new.parent}'")
    if parent["kind"] != "task":
        raise Unprocessable(f"parent job '{new.parent}' is a {parent['kind']}, not a task")
    return parent


def _placements(
    db: Connection, new: NewJob, nodes: list[NodeInfo], counts: dict[str, NodeCounts], parent_node: str | None
) -> list[rules.Placement]:
    """Where the job goes: a task's (or an embedding's) node, or a critique's fan-out."""
    interactive = None
    if new.lane == Lane.INTERACTIVE:  # placement weighs each node's interactive backlog
        interactive = {
            r[0]: r[1]
            for r in db.execute(
                "SELECT node, COUNT(*) FROM job WHERE state = 'queued' AND lane = ? GROUP BY node", (Lane.INTERACTIVE,)
            )
        }
    views = rules.node_views(nodes, counts, interactive)
    if new.kind != "critique":
        return [rules.place_task(views, new.node, new.model, new.lane or Lane.BATCH)]
    return rules.place_critique(views, parent_node, new.node, new.model)  # the guard is judged here, first


def _subject_of(new: NewJob, parent: Any) -> tuple[str | None, bool]:
    """The job's prompt, and whether it reviews its parent's prompt and result (held until the
    parent is done; one that can have no result is refused)."""
    if new.prompt is not None:
        return new.prompt, False
    if parent["state"] in NO_RESULT:
        raise NoResultToCritique(parent["id"], parent["state"])
    return parent_subject(parent["prompt"], f"(the result of task {parent['id']}, once it is done)"), True


def _new_id(db: Connection, new: NewJob, now: float) -> str:
    """The id the job asked for (refused when taken), else a fresh one."""
    if not new.job_id:
        return _unused_id(db, now)
    if db.execute("SELECT 1 FROM job WHERE id = ?", (new.job_id,)).fetchone():
        raise IdTaken(f"job id {new.job_id} is taken")
    return new.job_id


def _entered(db: Connection, new: NewJob, node: str, job_id: str, queued: int, fair: bool) -> tuple[rules.Entry, int]:
    """Where the job enters `node`'s queue (of `queued` waiting jobs), as placement's `entry`
    says, and the position that puts it there."""
    lane = new.lane or Lane.BATCH  # (NewJob sets it: None only before its __post_init__)
    entered = rules.Entry(queued)
    if rules.reads_queue(lane, fair):
        entered = rules.entry(waiting_lanes(db, node), lane, new.owner, fair)
    if entered.reason is None:  # the tail
        return entered, tail_position(db, node)
    return entered, position_at(db, node, job_id, entered.index)


def submit_and_claim(
    db: Connection,
    new: NewJob,
    nodes: list[NodeInfo],
    actor: str,
    now: float,
    fair: bool = False,
    max_waiting: int | None = None,
    max_running: Mapping[str, int] = NO_LIMITS,
) -> tuple[list[Row], list[Row]]:
    """Submit, then claim the head of each chosen node whose worker waits idle (NodeInfo.idle),
    in the same transaction: an idle node's job pays one commit before its request, not two.
    The claim is the worker's own (claim: the same guards, run row and event); the created
    rows it took say so (state running). Returns the created rows and the claimed jobs."""
    created = submit(db, new, nodes, actor, now, fair=fair, max_waiting=max_waiting)
    idle = {n.name for n in nodes if n.idle and n.up}
    claimed = [
        job
        for node in dict.fromkeys(j["node"] for j in created if j["node"] in idle)
        if (job := claim(db, now, max_running, node)) is not None
    ]
    running = {job["id"] for job in claimed}
    for row in created:
        if row["id"] in running:
            row.update(state=JobState.RUNNING, position=None)
    return created, claimed


# -- the claim ---------------------------------------------------------------------------------

# The claim: the first ready job of a node's queue becomes running, unless the node has a running
# job already. One statement; tests/test_store.py plans this very text.
CLAIM_SQL = (
    "UPDATE job SET state = 'running' WHERE id = (SELECT id FROM ready_job WHERE node = :node"
    " ORDER BY position, id LIMIT 1)"
    " AND NOT EXISTS (SELECT 1 FROM job WHERE node = :node AND state = 'running') RETURNING *"
)


# Users' max_running, the rule's one statement: `:limits` is a JSON object {user: limit}, read as
# rows `l` in the engine's words; a user whose row holds this runs that many jobs already. The
# claim skips their jobs (claim_limited_sql); the pages say why they wait (at_max_running_sql).
def over_max_running(sql: Engine, user: str) -> str:
    return f"{sql.LIMIT_VALUE} <= {_running_of(user)}"


def _running_of(user: str) -> str:
    return f"(SELECT COUNT(*) FROM job o WHERE o.owner = {user} AND o.state = 'running')"


# The claim when users have max_running: a job whose owner already runs that many waits, even
# on a free node (the next job of another user runs).
def claim_limited_sql(sql: Engine) -> str:
    return (
        "UPDATE job SET state = 'running' WHERE id = (SELECT r.id FROM ready_job r WHERE r.node = :node"
        f" AND NOT EXISTS (SELECT 1 FROM {sql.LIMITS_ROWS} WHERE l.key = r.owner"
        f"  AND {over_max_running(sql, 'r.owner')})"
        " ORDER BY r.position, r.id LIMIT 1)"
        " AND NOT EXISTS (SELECT 1 FROM job WHERE node = :node AND state = 'running') RETURNING *"
    )


def at_max_running_sql(sql: Engine) -> str:
    """The users of `:limits` who run their max_running already, with how many jobs they run."""
    return (
        f"SELECT l.key AS owner, {_running_of('l.key')} AS running FROM {sql.LIMITS_ROWS}"
        f" WHERE {over_max_running(sql, 'l.key')}"
    )


def claim(db: Connection, now: float, max_running: Mapping[str, int], node: str) -> Row | None:
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
    if job.get("request"):  # its worker gets the request whole, its stored parts in place
        job["request"] = whole_request_in(db, job["request"])
    if job["subject_from_parent"]:  # the parent is done (ready_job says so): review its result
        parent = db.execute("SELECT prompt, run_id FROM job WHERE id = ?", (job["parent_id"],)).fetchone()
        text = run_texts(db, [parent["run_id"]])[parent["run_id"]]
        job["prompt"] = parent_subject(parent["prompt"], text["output"])
        db.execute("UPDATE job SET prompt = ? WHERE id = ?", (job["prompt"], job["id"]))
    job["run_id"] = db.execute(
        "INSERT INTO run (job_id, node, model, started_at, progress_at) VALUES (?,?,?,?,?) RETURNING id",
        (job["id"], node, job["model"], iso(now), iso(now)),
    ).fetchone()[0]
    db.execute("UPDATE job SET run_id = ? WHERE id = ?", (job["run_id"], job["id"]))
    event(db, job["id"], JobState.QUEUED, JobState.RUNNING, "router", f"claimed by {node}", now, job["run_id"])
    return job


# -- the worker's verbs ------------------------------------------------------------------------

# Output is written once: each write inserts one run_chunk row (migration 011) with only the text
# its caller has not stored yet, so a long job writes O(n) bytes; nothing rewrites earlier text.
# Text is kept whatever state the run is in (its tokens were produced in it).
APPEND_CHUNK = (
    "INSERT INTO run_chunk (run_id, seq, at, output, thinking)"
    " SELECT :run_id, COALESCE(MAX(seq), 0) + 1, :at, :output, :thinking"
    " FROM run_chunk WHERE run_id = :run_id"
)


def append_output(db: Connection, now: float, run_id: int, output: str | None, thinking: str | None = None) -> None:
    """Keep more of a run's output (and reasoning): a heartbeat's, or an interrupted run's last."""
    if output or thinking:
        db.execute(
            APPEND_CHUNK, {"run_id": run_id, "at": iso(now), "output": output or None, "thinking": thinking or None}
        )


def heartbeat(db: Connection, now: float, run_id: int, output: str, thinking: str | None = None) -> None:
    """Progress: `output` and `thinking` are the text that came since the last write (appended)."""
    append_output(db, now, run_id, output, thinking)
    db.execute("UPDATE run SET progress_at = ? WHERE id = ? AND state = 'running'", (iso(now), run_id))


def work_done(
    db: Connection, now: float, run_id: int, output: str, stats: dict[str, Any], thinking: str | None = None
) -> None:
    """Ollama's stream ended (`output`: its text not stored yet); the job is not finished until
    its model has left VRAM."""
    append_output(db, now, run_id, output, thinking)
    db.execute(
        "UPDATE run SET progress_at = ?, work_done_at = ?, done_reason = ?,"
        " eval_count = ?, prompt_eval_count = ?, total_duration_ns = ?,"
        " load_duration_ns = ?, eval_duration_ns = ?, prompt_eval_duration_ns = ? WHERE id = ? AND state = 'running'",
        (
            iso(now),
            iso(now),
            stats.get("done_reason"),
            stats.get("eval_count"),
            stats.get("prompt_eval_count"),
            stats.get("total_duration"),
            stats.get("load_duration"),
            stats.get("eval_duration"),
            stats.get("prompt_eval_duration"),
            run_id,
        ),
    )


def finish(
    db: Connection,
    now: float,
    max_running: Mapping[str, int],
    job_id: str,
    run_id: int,
    state: str,
    error: str | None,
    output: str | None = None,
    actor: str = "router",
    findings: list[Any] | None = None,
    claim_node: str | None = None,
    thinking: str | None = None,
    streamed: int = 0,
) -> Row | None:
    """Finish a run that is still the job's running run (`state`: done, failed, or cancelled: a
    called job cut as its client left, its output so far in the same commit); anything else is
    a GuardMiss. `output` and `thinking`: text not stored yet, appended.

    `streamed` pieces (one token each) count as a failed run's tokens: Ollama counts them in
    its last line, which a reply that broke off never sent.

    With `claim_node`, the node's next job is claimed in the same transaction and returned:
    a worker going from job to job pays one durable commit between them, not two."""
    assert state in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)
    done = db.execute(
        "UPDATE job SET state = ?, error = ?, finished_at = ?, findings = ? WHERE id = ?"
        " AND state = 'running' AND run_id = ? RETURNING id",
        (state, error, iso(now), None if findings is None else dumps(findings), job_id, run_id),
    ).fetchall()
    if not done:
        raise GuardMiss(f"job {job_id} run {run_id} is no longer running")
    append_output(db, now, run_id, output, thinking)
    tokens = streamed if state == JobState.FAILED and streamed else None  # a reply that broke off: no last line
    db.execute(
        "UPDATE run SET state = ?, error = ?, finished_at = ?, eval_count = COALESCE(eval_count, ?) WHERE id = ?",
        (state, error, iso(now), tokens, run_id),
    )
    event(db, job_id, JobState.RUNNING, state, actor, error, now, run_id)
    if state != JobState.DONE:
        end_held_critiques(db, job_id, f"{'was ' if state == JobState.CANCELLED else ''}{state} ({error})", now)
    return claim(db, now, max_running, claim_node) if claim_node else None


# -- a claim undone: its request never reached Ollama ------------------------------------------


def requeue_unsent(db: Connection, now: float, sent: dict[str, int | None], reason: str) -> list[Row]:
    """When the router stops: the running job of each node in `sent` whose run is not the one its
    worker last sent to Ollama never reached it; its claim is undone (see _put_back)."""
    running = rows(
        db.execute(
            f"SELECT id, node, run_id FROM job WHERE state = 'running' AND node IN ({','.join('?' * len(sent))})",
            tuple(sent),
        ).fetchall()
    )
    unsent = [r for r in running if r["run_id"] != sent[r["node"]]]
    for r in unsent:
        _put_back(db, r, reason, now)
    return unsent


def put_back(db: Connection, now: float, job_id: str, run_id: int, reason: str) -> bool:
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
    db.execute(
        "UPDATE job SET state = 'queued', position = ? WHERE id = ?",
        (position_at(db, job["node"], job["id"], 0), job["id"]),
    )
    db.execute(
        "UPDATE run SET state = 'cancelled', finished_at = ?, error = ? WHERE id = ?", (iso(now), reason, job["run_id"])
    )
    event(db, job["id"], JobState.RUNNING, JobState.QUEUED, "router", reason, now, job["run_id"])


# -- a running head gone stale, a note ---------------------------------------------------------


def note_stale(db: Connection, now: float) -> list[Row]:
    """Write one event per newly stale head (not one per check); returns the new ones."""
    fresh = []
    for head in rows(db.execute(dialect(db).STALE_SQL, {"now": iso(now)}).fetchall()):
        cur = db.execute(
            "UPDATE run SET stale_reason = ? WHERE id = ? AND stale_reason IS DISTINCT FROM ?",
            (head["reason"], head["run_id"], head["reason"]),
        )
        if cur.rowcount:
            event(
                db,
                head["id"],
                JobState.RUNNING,
                JobState.RUNNING,
                "router",
                f"stale: {head['reason']} since {head['since']}",
                now,
                head["run_id"],
            )
            fresh.append(head)
    return fresh


def note(db: Connection, now: float, job_id: str, reason: str, actor: str = "router") -> None:
    """An event that changes no state: an unload that failed, a stale head, a node flag."""
    state = db.execute("SELECT state FROM job WHERE id = ?", (job_id,)).fetchone()
    if state:
        event(db, job_id, state[0], state[0], actor, reason, now)


# -- at start-up: what a dead router left ------------------------------------------------------


def fail_orphans(db: Connection, now: float) -> list[Row]:
    """At start-up: a job still running belonged to a dead router. Fail it, loudly."""
    reason = "router restarted while running"
    failed = rows(
        db.execute(
            "UPDATE job SET state = 'failed', error = ?, finished_at = ? WHERE state = 'running'"
            " RETURNING id, node, model, run_id",
            (reason, iso(now)),
        ).fetchall()
    )
    for r in failed:
        _orphan_failed(db, r, reason, now)
    return failed


def fail_orphan(db: Connection, job_id: str, reason: str, now: float) -> Row | None:
    """One job still running that no live router runs (its router died: gpuq/store/leases.py's
    takeover): failed, loudly, as fail_orphans fails each. None if it is no longer running."""
    job = db.execute(
        "UPDATE job SET state = 'failed', error = ?, finished_at = ? WHERE id = ? AND state = 'running'"
        " RETURNING id, node, model, run_id",
        (reason, iso(now), job_id),
    ).fetchone()
    if job is None:
        return None
    _orphan_failed(db, dict(job), reason, now)
    return dict(job)


def _orphan_failed(db: Connection, job: Row, reason: str, now: float) -> None:
    """The rest of an orphan's failure: its run, its event, its held critiques."""
    db.execute(
        "UPDATE run SET state = 'failed', error = ?, finished_at = ? WHERE id = ? AND state = 'running'",
        (reason, iso(now), job["run_id"]),
    )
    event(db, job["id"], JobState.RUNNING, JobState.FAILED, "router", reason, now, job["run_id"])
    end_held_critiques(db, job["id"], f"failed ({reason})", now)


def cancel_clientless(db: Connection, now: float, nodes: list[str]) -> list[Row]:
    """At start-up: a front-door call still waiting on `nodes` (those this router now drives) lost
    its client with the old router (its connection is gone; a call waits on a node of the router
    its client called). It would run for no one: cancel it, loudly; `gpuq retry` runs it. A
    batch's line has no client to lose: it waits on (gpuq/store/batches.py)."""
    reason = "client gone: the router restarted while it waited (gpuq retry runs it, its output on its page)"
    waiting = (
        rows(
            db.execute(
                "SELECT * FROM job WHERE state = 'queued' AND endpoint IS NOT NULL"
                f" AND node IN ({','.join('?' * len(nodes))})"
                " AND NOT EXISTS (SELECT 1 FROM batch_line l WHERE l.job_id = job.id)",
                nodes,
            ).fetchall()
        )
        if nodes
        else []
    )
    for job in waiting:
        cancel(db, job, "router", reason, now)
    return waiting
