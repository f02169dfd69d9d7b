"""Group commit (gpuq/store/writer.py): submits that arrive together share one transaction, each
is answered only after its commit, one refused submit never fails the others, and a batch
whose transaction fails fails every one of its submits and stores none of them."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest
from conftest import eventually

from gpuq.errors import SchemaViolated, StoreUnavailable, Unprocessable
from gpuq.placement import FIRST_FREE, SHORTEST
from gpuq.store import NewJob, NodeInfo, Store

NODES = [NodeInfo("a", 1, ("task", "critique"), "ma", True), NodeInfo("b", 2, ("task", "critique"), "mb", True)]
UNKNOWN = "1800000000-00000000"


@pytest.fixture
async def store(tmp_path):
    s = Store(tmp_path / "q.db")
    await s.open()
    yield s
    await s.close()


def rows(path, sql, *params):
    db = sqlite3.connect(path)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


async def together(store: Store, *calls):
    """Start the calls while the writer's thread is busy, so they queue up and form one batch."""
    busy, go = threading.Event(), threading.Event()

    def hold(db):
        busy.set()
        go.wait(10)

    held = asyncio.ensure_future(store._writer.call(hold))
    try:
        await eventually(busy.is_set, what="the writer to be busy")
        tasks = [asyncio.ensure_future(c) for c in calls]
        await eventually(lambda: store._writer.waiting == len(calls), what="every write to queue up")
    finally:
        go.set()
    await held
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_concurrent_submits_share_a_transaction_and_placement_sees_the_earlier_ones(store):
    before = store._writer.batches
    results = await together(store, *(store.submit(NewJob("task", f"p{i}"), NODES, "api") for i in range(10)))
    jobs = [r[0] for r in results]
    assert store._writer.batches - before == 1  # one transaction, one fsync for all ten
    # Placement saw each earlier submit of the batch: first free by rank, then the shorter queue.
    assert [(j["node"], j["reason"]) for j in jobs[:2]] == [("a", FIRST_FREE), ("b", FIRST_FREE)]
    assert all(j["reason"] == SHORTEST for j in jobs[2:])
    for node in ("a", "b"):
        mine = [j for j in jobs if j["node"] == node]
        assert [j["position"] for j in mine] == list(range(1, len(mine) + 1))
    order = rows(store.path, "SELECT id FROM job WHERE node = 'a' AND state = 'queued' ORDER BY position, id")
    assert [r[0] for r in order] == [j["id"] for j in jobs if j["node"] == "a"]
    assert rows(store.path, "SELECT COUNT(*) FROM event WHERE to_state = 'queued'") == [(10,)]


async def test_one_refused_submit_fails_alone(store):
    [task] = await store.submit(NewJob("task", "parent", node="a"), NODES, "api")
    results = await together(
        store,
        store.submit(NewJob("task", "ok 1"), NODES, "api"),
        store.submit(NewJob("critique", "c", parent=UNKNOWN), NODES, "api"),  # refused in Python
        store.submit(NewJob("critique", "c", parent=task["id"], node="a"), NODES, "api"),  # the guard
        store.submit(NewJob("task", "ok 2"), NODES, "api"),
        store.submit(NewJob("critique", "fan-out", parent=task["id"]), NODES, "api"),
    )
    assert isinstance(results[1], Unprocessable) and "unknown parent" in results[1].message
    assert results[2].status == 409 and "parent task's node" in results[2].message
    ok = [r for i, r in enumerate(results) if i in (0, 3, 4)]
    assert all(isinstance(r, list) for r in ok), results
    assert [j["node"] for j in ok[2]] == ["b"]  # the fan-out skips the parent's node
    ids = {j["id"] for r in ok for j in r}
    stored = {r[0] for r in rows(store.path, "SELECT id FROM job")}
    assert stored == ids | {task["id"]}


async def test_a_claim_inside_a_batch_is_seen_by_the_submits_after_it(store):
    [first] = await store.submit(NewJob("task", "waits on b", node="b"), NODES, "api")
    before = store._writer.batches
    x, claimed, y, refused = await together(
        store,
        store.submit(NewJob("task", "x"), NODES, "api"),
        store.claim("b"),
        store.submit(NewJob("task", "y"), NODES, "api"),
        store.finish(first["id"], 10**6, "done", None),  # not its run: refused alone
    )
    assert store._writer.batches - before == 1
    assert (x[0]["node"], x[0]["reason"]) == ("a", FIRST_FREE)
    assert claimed["id"] == first["id"]
    # b's only queued job became its running head inside the batch: y sees b's empty queue.
    assert (y[0]["node"], y[0]["reason"], y[0]["position"]) == ("b", SHORTEST, 1)
    assert (
        refused.status == 409
        and refused.message.endswith("is no longer running")
        and "finish refused" not in refused.message
    )
    assert rows(store.path, "SELECT state FROM job WHERE id = ?", first["id"]) == [("running",)]


async def test_a_submit_failing_halfway_rolls_back_only_its_own_rows(store):
    # The database refuses one submit's event row after its job row went in: its savepoint
    # takes the job row back out, and the submits around it in the batch still commit.
    await store._writer.call(
        lambda db: db.execute(
            "CREATE TEMP TRIGGER refuse_evil BEFORE INSERT ON event WHEN NEW.actor = 'evil'"
            " BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        )
    )
    results = await together(
        store,
        store.submit(NewJob("task", "before"), NODES, "api"),
        store.submit(NewJob("task", "evil"), NODES, "evil"),
        store.submit(NewJob("task", "after"), NODES, "api"),
    )
    assert isinstance(results[1], SchemaViolated) and "refused by the test" in results[1].message
    assert rows(store.path, "SELECT prompt FROM job ORDER BY prompt") == [("after",), ("before",)]
    assert rows(store.path, "SELECT COUNT(*) FROM event") == [(2,)]
    # Placement inside the batch did not count the rolled-back job.
    assert [r[0]["position"] for r in (results[0], results[2])] == [1, 1]


async def test_a_batch_whose_commit_fails_fails_every_submit_and_stores_nothing(store):
    def dangling(db):
        db.execute("PRAGMA defer_foreign_keys = ON")  # checked at COMMIT, which then refuses
        db.execute("INSERT INTO event (job_id, at, to_state, actor) VALUES (?, 'x', 'queued', 'test')", (UNKNOWN,))

    results = await together(
        store, *(store.submit(NewJob("task", f"p{i}"), NODES, "api") for i in range(4)), store._writer.run(dangling)
    )
    assert all(isinstance(r, SchemaViolated) for r in results), results
    assert all("FOREIGN KEY" in r.message for r in results)
    assert rows(store.path, "SELECT COUNT(*) FROM job") == [(0,)]
    assert rows(store.path, "SELECT COUNT(*) FROM event") == [(0,)]
    [job] = await store.submit(NewJob("task", "after"), NODES, "api")  # the store goes on
    assert job["position"] == 1


async def test_a_full_disk_leaves_each_submit_either_stored_whole_or_refused(store):
    pages = await store._writer.call(lambda db: db.execute("PRAGMA page_count").fetchone()[0])
    await store._writer.call(lambda db: db.execute(f"PRAGMA max_page_count = {pages + 12}").fetchall())
    prompt = "x" * 6000
    results = await together(store, *(store.submit(NewJob("task", f"{i} {prompt}"), NODES, "api") for i in range(20)))
    refused = [r for r in results if isinstance(r, Exception)]
    assert refused and all(isinstance(r, StoreUnavailable) and "full" in r.message for r in refused)
    acknowledged = {r[0]["id"] for r in results if isinstance(r, list)}
    assert {r[0] for r in rows(store.path, "SELECT id FROM job")} == acknowledged
    assert {r[0] for r in rows(store.path, "SELECT job_id FROM event")} == acknowledged


async def test_a_locked_database_refuses_the_whole_batch_loudly(tmp_path):
    s = Store(tmp_path / "q.db", busy_timeout_s=0.2)
    await s.open()
    try:
        shell = sqlite3.connect(s.path, isolation_level=None)  # a person in the sqlite3 shell
        shell.execute("BEGIN IMMEDIATE")
        try:
            results = await asyncio.gather(
                *(s.submit(NewJob("task", f"p{i}"), NODES, "api") for i in range(5)), return_exceptions=True
            )
        finally:
            shell.execute("ROLLBACK")
            shell.close()
        assert all(isinstance(r, StoreUnavailable) and "locked" in r.message for r in results), results
        assert rows(s.path, "SELECT COUNT(*) FROM job") == [(0,)]
        assert len(await s.submit(NewJob("task", "later"), NODES, "api")) == 1
    finally:
        await s.close()


async def test_closing_the_store_lets_the_batch_in_flight_commit(tmp_path):
    s = Store(tmp_path / "q.db")
    await s.open()
    pending = [asyncio.ensure_future(s.submit(NewJob("task", f"p{i}"), NODES, "api")) for i in range(5)]
    await asyncio.sleep(0)
    await s.close()
    results = await asyncio.gather(*pending, return_exceptions=True)
    stored = {r[0] for r in rows(tmp_path / "q.db", "SELECT id FROM job")}
    assert stored, "close() must let the batch in flight commit, but nothing was stored"
    assert {r[0]["id"] for r in results if isinstance(r, list)} == stored
    assert all(isinstance(r, (list, StoreUnavailable)) for r in results), results
    with pytest.raises(StoreUnavailable):
        await s.submit(NewJob("task", "after close"), NODES, "api")


# -- through the API, against the real daemon ------------------------------------------------


async def test_fifty_concurrent_submits_through_the_api(lab, tmp_path):
    async def one(i):
        return await lab.request("POST", "/api/jobs", {"kind": "task", "prompt": f"burst {i}"})

    results = await asyncio.gather(*(one(i) for i in range(50)))
    assert [status for status, _ in results] == [201] * 50
    ids = [body["jobs"][0]["id"] for _, body in results]
    assert len(set(ids)) == 50
    db = sqlite3.connect(tmp_path / "gpuq.db")
    try:
        stored = {r[0] for r in db.execute("SELECT id FROM job")}
        created = db.execute("SELECT job_id, COUNT(*) FROM event WHERE from_state IS NULL GROUP BY job_id").fetchall()
    finally:
        db.close()
    assert set(ids) <= stored
    assert {job_id for job_id, n in created if n == 1} >= set(ids)


async def test_an_invalid_submit_among_concurrent_ones_gets_its_own_error(lab):
    async def task(i):
        return await lab.request("POST", "/api/jobs", {"kind": "task", "prompt": f"fine {i}"})

    bad = lab.request("POST", "/api/jobs", {"kind": "critique", "prompt": "x", "parent": UNKNOWN})
    results = await asyncio.gather(*(task(i) for i in range(10)), bad, *(task(i) for i in range(10, 20)))
    statuses = [s for s, _ in results]
    assert statuses[10] == 422 and "unknown parent" in results[10][1]["error"]["message"]
    assert statuses[:10] + statuses[11:] == [201] * 20


async def test_a_job_claimed_in_its_submit_reaches_its_worker_even_when_the_submitter_went_away(store, tmp_path):
    """The hand-over runs after the commit whatever became of the caller: a request cancelled
    while its submit was committing still leaves its claimed job with the worker, not orphaned
    as running with nobody to run it."""
    idle = [NodeInfo("a", 1, ("task",), "ma", True, idle=True)]
    handed = []
    busy, go = threading.Event(), threading.Event()

    def hold(db):
        busy.set()
        go.wait(10)

    held = asyncio.ensure_future(store._writer.call(hold))
    await eventually(busy.is_set, what="the writer to be busy")
    submitting = asyncio.ensure_future(store.submit(NewJob("task", "p"), idle, "api", handed.append))
    await eventually(lambda: store._writer.waiting == 1, what="the submit to queue up")
    submitting.cancel()  # its client went away while the write waited
    go.set()
    await held
    await eventually(lambda: handed, what="the claimed job to be handed over")
    [job] = handed
    assert (job["node"], job["state"], job["prompt"]) == ("a", "running", "p")
    assert rows(tmp_path / "q.db", "SELECT state, run_id FROM job") == [("running", job["run_id"])]
    with pytest.raises(asyncio.CancelledError):
        await submitting


async def test_a_refused_submit_hands_nothing_over(store):
    idle = [NodeInfo("a", 1, ("task",), "ma", True, idle=True)]
    handed = []
    with pytest.raises(Unprocessable):
        await store.submit(NewJob("critique", None, parent=UNKNOWN), idle, "api", handed.append)
    [job] = await store.submit(NewJob("task", "p"), idle, "api", handed.append)
    assert [j["id"] for j in handed] == [job["id"]]
