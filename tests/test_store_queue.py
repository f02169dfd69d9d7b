"""Queue control in the store, on a real temp SQLite file: move, preempt, delete, clear and
retry from every state, allowed and refused, each one transaction that writes its events."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

import gpuq.store.control as control_module
import gpuq.store.steps as steps_module
from gpuq.errors import GUARD_MESSAGE, BadRequest, Conflict, GpuqError, GuardMiss, GuardRefused, NotFound
from gpuq.jobs import POSITION_GAP
from gpuq.store import Interrupted, NewJob, NodeInfo, Store

NODES = [
    NodeInfo("node-1", 1, ("task", "critique"), "m1", True),
    NodeInfo("node-2", 2, ("task", "critique"), "m2", True),
    NodeInfo("node-3", 3, ("task",), "m3", True),
    NodeInfo("node-4", 4, ("critique",), "m4", True),
]
UNKNOWN = "1800000000-00000000"


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        self.now += 0.001  # every call a distinct, increasing moment
        return self.now


@pytest.fixture
async def store(database):
    s = Store(database, clock=Clock())
    await s.open()
    yield s
    await s.close()


async def task(store, node="node-3", prompt="p") -> str:
    [job] = await store.submit(NewJob("task", prompt, node=node), NODES, "api")
    return job["id"]


async def tasks(store, n, node="node-3") -> list[str]:
    return [await task(store, node, f"p{i}") for i in range(n)]


async def order(store, node="node-3") -> list[str]:
    _, queued, count = await store.queue(node, 1000)
    assert count == len(queued)
    return [j["id"] for j in queued]


async def positions(store, node="node-3") -> list[int]:
    rows = await store.read(
        "SELECT position FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id", (node,)
    )
    return [r["position"] for r in rows]


async def events(store, job_id) -> list[dict]:
    return (await store.job_detail(job_id))["events"]


async def event_count(store) -> int:
    return (await store.read("SELECT COUNT(*) AS n FROM event"))[0]["n"]


async def in_state(store, state: str, node="node-3") -> str:
    """A job on `node` in the given state, reached through the store's own verbs."""
    job_id = await task(store, node, f"in {state}")
    if state == "queued":
        return job_id
    while (claimed := await store.claim(node)) is None or claimed["id"] != job_id:
        assert claimed is not None, "the job never reached the head"
        await store.finish(claimed["id"], claimed["run_id"], "done", None)
    if state in ("done", "failed"):
        await store.finish(job_id, claimed["run_id"], state, "boom" if state == "failed" else None)
    elif state == "cancelled":
        await store.delete(job_id, "api")
    return job_id


def refused(exc: pytest.ExceptionInfo, status: int, *words: str) -> None:
    assert exc.value.status == status, exc.value.message
    for w in words:
        assert w in exc.value.message, exc.value.message


# -- move -------------------------------------------------------------------------------------


async def test_move_to_a_position(store):
    a, b, c, d, e = await tasks(store, 5)
    moved = await store.move(e, NODES, "cli 127.0.0.1", position=1)
    assert (moved["node"], moved["position"]) == ("node-3", 1)
    assert await order(store) == [e, a, b, c, d]
    moved = await store.move(a, NODES, "cli 127.0.0.1", position=3)
    assert moved["position"] == 3
    assert await order(store) == [e, b, a, c, d]
    moved = await store.move(b, NODES, "api", position=99)  # past the tail: the tail
    assert moved["position"] == 5
    assert await order(store) == [e, a, c, d, b]
    await store.move(b, NODES, "api", position=5)  # where it already is: nothing changes
    assert await order(store) == [e, a, c, d, b]
    [*_, ev] = await events(store, a)
    assert (ev["from_state"], ev["to_state"], ev["actor"], ev["reason"]) == (
        "queued",
        "queued",
        "cli 127.0.0.1",
        "moved at position 3",
    )


async def test_move_before_and_after(store):
    a, b, c, d = await tasks(store, 4)
    assert (await store.move(d, NODES, "page", before=b))["position"] == 2
    assert await order(store) == [a, d, b, c]
    assert (await store.move(a, NODES, "page", after=c))["position"] == 4
    assert await order(store) == [d, b, c, a]
    await store.move(c, NODES, "page", before=d)
    assert await order(store) == [c, d, b, a]
    await store.move(c, NODES, "page", after=a)
    assert await order(store) == [d, b, a, c]
    await store.move(b, NODES, "page", before=a)  # already there
    assert await order(store) == [d, b, a, c]


async def test_move_refuses_nonsense_and_changes_nothing(store):
    a, b, c = await tasks(store, 3)
    [other_node] = await tasks(store, 1, "node-1")
    before = (await order(store), await event_count(store))
    with pytest.raises(BadRequest) as exc:
        await store.move(a, NODES, "api", position=2, before=b)
    refused(exc, 400, "only one of")
    with pytest.raises(BadRequest) as exc:
        await store.move(a, NODES, "api")
    refused(exc, 400, "say where")
    with pytest.raises(BadRequest) as exc:
        await store.move(a, NODES, "api", position=0)
    refused(exc, 400, "position must be 1 or more")
    for where in ({"before": b}, {"after": b}):  # relative to itself
        with pytest.raises(BadRequest) as exc:
            await store.move(b, NODES, "api", **{k: b for k in where})
        refused(exc, 400, "itself")
    with pytest.raises(Conflict) as exc:
        await store.move(a, NODES, "api", before=other_node)
    refused(exc, 409, other_node, "not waiting in node node-3's queue")
    with pytest.raises(GpuqError) as exc:
        await store.move(a, NODES, "api", after=UNKNOWN)
    refused(exc, 422, UNKNOWN)
    with pytest.raises(NotFound) as exc:
        await store.move(UNKNOWN, NODES, "api", position=1)
    refused(exc, 404, UNKNOWN)
    assert (await order(store), await event_count(store)) == before


async def test_move_to_another_node(store):
    a, b = await tasks(store, 2, "node-3")
    x, y = await tasks(store, 2, "node-1")
    moved = await store.move(b, NODES, "cli 127.0.0.1", node="node-1")  # a bare node move: the tail
    assert (moved["node"], moved["position"]) == ("node-1", 3)
    assert await order(store, "node-1") == [x, y, b]
    assert await order(store, "node-3") == [a]
    assert (await store.job(b))["placement"] == "moved"
    [*_, ev] = await events(store, b)
    assert (ev["actor"], ev["reason"]) == ("cli 127.0.0.1", "moved to node-1 at position 3")
    await store.move(a, NODES, "api", node="node-1", before=y)
    assert await order(store, "node-1") == [x, a, y, b]
    await store.move(y, NODES, "api", node="node-3", position=1)
    assert await order(store, "node-3") == [y]
    assert await order(store, "node-1") == [x, a, b]
    await store.move(x, NODES, "api", node="node-1", position=3)  # its own node: a reorder
    assert await order(store, "node-1") == [a, b, x]


async def test_move_to_a_node_without_the_role_or_unknown_is_refused(store):
    a, b = await tasks(store, 2)
    before = (await order(store), await order(store, "node-4"), await event_count(store))
    with pytest.raises(Conflict) as exc:
        await store.move(a, NODES, "api", node="node-4")
    refused(exc, 409, "node 'node-4' does not take task jobs", "critique")
    with pytest.raises(GpuqError) as exc:
        await store.move(a, NODES, "api", node="node-9")
    refused(exc, 422, "unknown node 'node-9' (the nodes: node-1, node-2, node-3, node-4)")
    assert (await order(store), await order(store, "node-4"), await event_count(store)) == before


@pytest.mark.parametrize("state", ["running", "done", "failed", "cancelled"])
async def test_only_queued_jobs_move(store, state):
    job = await in_state(store, state)
    waiting = await tasks(store, 2)
    before = (await store.job(job), await event_count(store))
    for where in ({"position": 1}, {"before": waiting[0]}, {"node": "node-1"}):
        with pytest.raises(Conflict) as exc:
            await store.move(job, NODES, "api", **where)
        refused(exc, 409, job, f"is {state}; only queued jobs move")
    assert (await store.job(job), await event_count(store)) == before
    assert await order(store) == waiting


# -- the guard ----------------------------------------------------------------------------------


async def critique_of(store, parent: str) -> str:
    [crit] = await store.submit(NewJob("critique", "review", parent=parent, node="node-2"), NODES, "api")
    return crit["id"]


async def test_a_critique_never_moves_onto_its_parents_node(store):
    parent = await task(store, "node-1")
    crit = await critique_of(store, parent)
    others = await tasks(store, 2, "node-1")
    before = (await store.job(crit), await order(store, "node-1"), await event_count(store))
    for where in ({}, {"position": 1}, {"before": others[0]}):
        with pytest.raises(GuardRefused) as exc:
            await store.move(crit, NODES, "page", node="node-1", **where)
        refused(exc, 409)
        assert exc.value.message == GUARD_MESSAGE
    assert (await store.job(crit), await order(store, "node-1"), await event_count(store)) == before
    # ...and the parent never moves onto the node where its critique waits.
    with pytest.raises(GuardRefused):
        await store.move(parent, NODES, "page", node="node-2")


async def test_the_database_itself_refuses_a_critique_onto_its_parents_node(store):
    parent = await task(store, "node-1")
    crit = await critique_of(store, parent)
    if store.dsn:  # from a connection of its own, as psql would
        with (
            psycopg.connect(store.dsn, autocommit=True) as db,
            pytest.raises(psycopg.IntegrityError, match=GUARD_MESSAGE),
        ):
            db.execute("UPDATE job SET node = 'node-1' WHERE id = %s", (crit,))
    else:  # as the sqlite3 shell would
        db = sqlite3.connect(store.path)
        try:
            with pytest.raises(sqlite3.IntegrityError, match=GUARD_MESSAGE):
                db.execute("UPDATE job SET node = 'node-1' WHERE id = ?", (crit,))
            db.rollback()
        finally:
            db.close()
    with pytest.raises(GuardRefused):  # the store's own write path translates it to the 409
        await store._write(lambda db: db.execute("UPDATE job SET node = 'node-1' WHERE id = ?", (crit,)))
    assert (await store.job(crit))["node"] == "node-2"


async def test_retrying_a_critique_never_puts_it_on_its_parents_node(store):
    parent = await task(store, "node-1")
    crit = await critique_of(store, parent)
    await store.delete(crit, "cli")
    await store.move(parent, NODES, "cli", node="node-2")  # allowed: the critique is not waiting
    before = await event_count(store)
    with pytest.raises(GuardRefused):
        await store.retry(crit, "cli")
    assert (await store.job(crit))["state"] == "cancelled"
    assert await order(store, "node-2") == [parent]
    assert await event_count(store) == before
    await store.move(parent, NODES, "cli", node="node-1")
    await store.retry(crit, "cli")
    assert await order(store, "node-2") == [crit]


# -- gaps ---------------------------------------------------------------------------------------


async def test_gap_exhaustion_renumbers_inside_the_move_and_order_stays_right(store, monkeypatch):
    renumbered = []
    real = steps_module.renumber

    def spy(db, node):
        renumbered.append(node)
        real(db, node)

    monkeypatch.setattr(steps_module, "renumber", spy)

    head, tail = await tasks(store, 2)
    extra = await tasks(store, 40)
    expected = [head, tail, *extra]
    assert await order(store) == expected
    for job in extra:  # 40 moves into the same spot: right behind the head
        await store.move(job, NODES, "page", position=2)
        expected.remove(job)
        expected.insert(1, job)
        assert await order(store) == expected
        ps = await positions(store)
        assert len(set(ps)) == len(ps)  # never two jobs at one position
    assert expected == [head, *reversed(extra), tail]
    assert renumbered and set(renumbered) == {"node-3"}  # the gap ran out, more than once
    assert len(renumbered) >= 3
    # After a renumber the spacing is whole gaps again.
    await store.move(tail, NODES, "page", position=1)
    assert await order(store) == [tail, head, *reversed(extra)]
    # Forty moves, one event each, and nothing else.
    moves = await store.read("SELECT COUNT(*) AS n FROM event WHERE reason LIKE 'moved %'")
    assert moves[0]["n"] == 41


async def test_a_failed_move_rolls_back_its_renumber(store, monkeypatch):
    a, b, c = await tasks(store, 3)
    await store._write(
        lambda db: db.executemany(  # no gap left anywhere
            "UPDATE job SET position = ? WHERE id = ?", [(i, job) for i, job in enumerate((a, b, c))]
        )
    )
    renumbered = []
    real = steps_module.renumber

    def spy(db, node):
        renumbered.append(node)
        real(db, node)

    def broken_event(*args, **kwargs):  # the engine's own error for a failing disk
        raise (psycopg.errors.DiskFull if store.dsn else sqlite3.OperationalError)("disk I/O error")

    monkeypatch.setattr(steps_module, "renumber", spy)
    monkeypatch.setattr(control_module, "event", broken_event)
    with pytest.raises(GpuqError) as exc:
        await store.move(c, NODES, "api", position=2)
    refused(exc, 503, "nothing was changed")
    assert renumbered == ["node-3"]
    assert (await positions(store), await order(store)) == ([0, 1, 2], [a, b, c])


# -- preempt ------------------------------------------------------------------------------------


async def test_preempt_without_a_running_job_moves_to_the_head(store):
    a, b, c = await tasks(store, 3)
    job, interrupted = await store.preempt(c, "cli 10.0.0.5")
    assert interrupted is None
    assert (job["id"], job["position"]) == (c, 1)
    assert await order(store) == [c, a, b]
    [*_, ev] = await events(store, c)
    assert (ev["from_state"], ev["to_state"], ev["actor"]) == ("queued", "queued", "cli 10.0.0.5")
    assert "preempt" in ev["reason"]


async def test_preempt_interrupts_the_running_job_and_keeps_its_run(store):
    a, b, c, d = await tasks(store, 4)
    claimed = await store.claim("node-3")
    assert claimed["id"] == a
    await store.heartbeat(claimed["run_id"], "partial out")
    job, interrupted = await store.preempt(d, "cli 10.0.0.5")
    assert interrupted == Interrupted(a, "node-3", claimed["run_id"])
    assert await order(store) == [d, a, b, c]  # the victim waits directly behind
    victim = await store.job_detail(a)
    assert victim["state"] == "queued" and victim["finished_at"] is None
    [run] = victim["runs"]
    assert run["state"] == "preempted" and run["error"] == f"preempted by {d}"
    assert run["output"] == "partial out" and run["finished_at"] is not None
    ev = victim["events"][-1]
    assert (ev["from_state"], ev["to_state"], ev["actor"], ev["reason"]) == (
        "running",
        "queued",
        "cli 10.0.0.5",
        f"preempted by {d}",
    )
    # The interrupted worker's late finish is refused: the run is no longer running.
    with pytest.raises(GuardMiss):
        await store.finish(a, claimed["run_id"], "done", None, "full out")
    # The preemptor runs next, then the victim again, as a new run.
    first = await store.claim("node-3")
    assert first["id"] == d
    await store.finish(d, first["run_id"], "done", None)
    again = await store.claim("node-3")
    assert again["id"] == a and again["run_id"] != claimed["run_id"]
    await store.finish(a, again["run_id"], "done", None, "full out")
    detail = await store.job_detail(a)
    assert [(r["state"], r["output"]) for r in detail["runs"]] == [("preempted", "partial out"), ("done", "full out")]
    assert detail["preempted_runs"] == 1 and detail["state"] == "done"
    assert [(e["from_state"], e["to_state"]) for e in detail["events"]] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "queued"),
        ("queued", "running"),
        ("running", "done"),
    ]


async def test_preempt_on_another_node_leaves_this_one_alone(store):
    a = await task(store, "node-3")
    x = await task(store, "node-1")
    await store.claim("node-3")
    _, interrupted = await store.preempt(x, "api")
    assert interrupted is None
    assert (await store.job(a))["state"] == "running"


@pytest.mark.parametrize("state", ["running", "done", "failed", "cancelled"])
async def test_only_a_queued_job_preempts(store, state):
    job = await in_state(store, state)
    before = (await store.job(job), await event_count(store))
    with pytest.raises(Conflict) as exc:
        await store.preempt(job, "api")
    refused(exc, 409, job, f"is {state}; only a queued job can preempt")
    assert (await store.job(job), await event_count(store)) == before


async def test_preempt_unknown_is_404(store):
    with pytest.raises(NotFound) as exc:
        await store.preempt(UNKNOWN, "api")
    refused(exc, 404, UNKNOWN)


# -- delete -------------------------------------------------------------------------------------


async def test_delete_a_queued_job(store):
    a, b, c = await tasks(store, 3)
    job, interrupted = await store.delete(b, "cli 127.0.0.1")
    assert interrupted is None and job["state"] == "cancelled"
    assert await order(store) == [a, c]
    detail = await store.job_detail(b)  # the row stays, for forensics
    assert (detail["state"], detail["error"]) == ("cancelled", "deleted")
    assert detail["finished_at"] is not None
    ev = detail["events"][-1]
    assert (ev["from_state"], ev["to_state"], ev["actor"], ev["reason"]) == (
        "queued",
        "cancelled",
        "cli 127.0.0.1",
        "deleted",
    )


async def test_delete_a_running_job_frees_the_node(store):
    a, b = await tasks(store, 2)
    claimed = await store.claim("node-3")
    await store.heartbeat(claimed["run_id"], "half")
    job, interrupted = await store.delete(a, "page 10.1.1.1")
    assert interrupted == Interrupted(a, "node-3", claimed["run_id"])
    detail = await store.job_detail(a)
    assert (detail["state"], detail["error"]) == ("cancelled", "deleted")
    assert [(r["state"], r["output"]) for r in detail["runs"]] == [("cancelled", "half")]
    assert (detail["events"][-1]["from_state"], detail["events"][-1]["actor"]) == ("running", "page 10.1.1.1")
    running, queued, _ = await store.queue("node-3", 10)
    assert running is None and [j["id"] for j in queued] == [b]
    assert (await store.claim("node-3"))["id"] == b  # the node moves on at once


async def test_a_finish_after_delete_is_a_guard_miss_with_one_outcome(store):
    [a] = await tasks(store, 1)
    claimed = await store.claim("node-3")
    await store.delete(a, "cli")
    for state in ("done", "failed"):
        with pytest.raises(GuardMiss):
            await store.finish(a, claimed["run_id"], state, None, "late output")
    detail = await store.job_detail(a)
    assert (detail["state"], detail["error"]) == ("cancelled", "deleted")
    assert [r["state"] for r in detail["runs"]] == ["cancelled"]
    assert [e["to_state"] for e in detail["events"]] == ["queued", "running", "cancelled"]


@pytest.mark.parametrize("state", ["done", "failed", "cancelled"])
async def test_deleting_a_finished_job_is_refused(store, state):
    job = await in_state(store, state)
    before = (await store.job(job), await event_count(store))
    with pytest.raises(Conflict) as exc:
        await store.delete(job, "api")
    refused(exc, 409, job, f"already {state}")
    assert (await store.job(job), await event_count(store)) == before


async def test_delete_unknown_is_404(store):
    with pytest.raises(NotFound) as exc:
        await store.delete(UNKNOWN, "api")
    refused(exc, 404, UNKNOWN)


# -- clear --------------------------------------------------------------------------------------


async def test_clear_cancels_the_waiting_jobs_and_leaves_the_running_one(store):
    a, b, c = await tasks(store, 3)
    other = await task(store, "node-1")
    await store.claim("node-3")
    ids, interrupted = await store.clear("node-3", "cli 127.0.0.1")
    assert interrupted is None
    assert ids == [b, c]
    assert await order(store) == []
    assert (await store.job(a))["state"] == "running"
    assert await order(store, "node-1") == [other]
    for job in (b, c):
        detail = await store.job_detail(job)
        assert (detail["state"], detail["error"]) == ("cancelled", "cleared")
        ev = detail["events"][-1]
        assert (ev["from_state"], ev["to_state"], ev["actor"]) == ("queued", "cancelled", "cli 127.0.0.1")


async def test_clear_with_running_interrupts_the_head_too(store):
    a, b, c = await tasks(store, 3)
    claimed = await store.claim("node-3")
    ids, interrupted = await store.clear("node-3", "page", running=True)
    assert ids == [a, b, c]
    assert interrupted == Interrupted(a, "node-3", claimed["run_id"])
    running, queued, _ = await store.queue("node-3", 10)
    assert running is None and queued == []
    detail = await store.job_detail(a)
    assert (detail["state"], detail["runs"][0]["state"]) == ("cancelled", "cancelled")
    with pytest.raises(GuardMiss):
        await store.finish(a, claimed["run_id"], "done", None)


async def test_clear_an_empty_node_changes_nothing(store):
    done = await in_state(store, "done")
    before = await event_count(store)
    assert await store.clear("node-3", "api", running=True) == ([], None)
    assert await event_count(store) == before
    assert (await store.job(done))["state"] == "done"


# -- retry --------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["failed", "cancelled"])
async def test_retry_puts_a_finished_job_at_the_tail_as_a_new_run(store, state):
    job = await in_state(store, state)
    before_runs = len((await store.job_detail(job))["runs"])
    a, b = await tasks(store, 2)
    retried = await store.retry(job, "cli 127.0.0.1")
    assert retried["state"] == "queued"
    assert await order(store) == [a, b, job]
    detail = await store.job_detail(job)
    assert (detail["state"], detail["error"], detail["finished_at"]) == ("queued", None, None)
    ev = detail["events"][-1]
    assert (ev["from_state"], ev["to_state"], ev["actor"], ev["reason"]) == (
        state,
        "queued",
        "cli 127.0.0.1",
        "retry requested",
    )
    for expected in (a, b, job):
        claimed = await store.claim("node-3")
        assert claimed["id"] == expected
        await store.finish(expected, claimed["run_id"], "done", None)
    runs = (await store.job_detail(job))["runs"]
    assert len(runs) == before_runs + 1 and runs[-1]["state"] == "done"


async def test_a_deleted_queued_job_retries_into_an_empty_queue(store):
    [a] = await tasks(store, 1)
    await store.delete(a, "cli")
    await store.retry(a, "cli")
    assert await order(store) == [a]
    assert (await store.job(a))["position"] == POSITION_GAP


@pytest.mark.parametrize("state", ["queued", "running", "done"])
async def test_retry_is_refused_unless_failed_or_cancelled(store, state):
    job = await in_state(store, state)
    before = (await store.job(job), await event_count(store))
    with pytest.raises(Conflict) as exc:
        await store.retry(job, "api")
    refused(exc, 409, job, f"is {state}; only failed or cancelled jobs can be retried")
    assert (await store.job(job), await event_count(store)) == before


async def test_retry_unknown_is_404(store):
    with pytest.raises(NotFound) as exc:
        await store.retry(UNKNOWN, "api")
    refused(exc, 404, UNKNOWN)


async def test_nothing_retries_by_itself(store):
    failed = await in_state(store, "failed")
    cancelled = await in_state(store, "cancelled")
    assert await store.claim("node-3") is None
    assert (await store.job(failed))["state"] == "failed"
    assert (await store.job(cancelled))["state"] == "cancelled"
