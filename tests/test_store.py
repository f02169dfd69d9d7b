"""The store on each engine (a real temp SQLite file, then a throwaway PostgreSQL database): state
machine, guarded finish, one running per node, claim and staleness use their indexes (SQLite's
plans), migrations, stale boundaries with a controlled clock."""

from __future__ import annotations

import asyncio
import sqlite3

import psycopg
import pytest

from gpuq.errors import GpuqError, GuardMiss, GuardRefused, StoreUnavailable
from gpuq.jobs import iso
from gpuq.store import MIGRATIONS_DIR, STALE_SQL, NewJob, NodeInfo, Store
from gpuq.store import postgres as pg

NODES = [NodeInfo("a", 1, ("task", "critique"), "ma", True), NodeInfo("b", 2, ("critique",), "mb", True)]


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def store(database):
    clock = Clock()
    s = Store(database, clock=clock)
    await s.open()
    await s.configure({"stale_after_s": 600, "stale_grace_s": 30, "max_runtime_s": 3600}, [])
    s.test_clock = clock
    yield s
    await s.close()


@pytest.fixture
async def lite_store(tmp_path):
    """The store on SQLite alone: for what is SQLite's own (its query plans, its pragmas)."""
    s = Store(tmp_path / "q.db", clock=Clock())
    await s.open()
    yield s
    await s.close()


# A write the database itself refuses, on either engine.
IntegrityError = (sqlite3.IntegrityError, psycopg.IntegrityError)


async def raw(where, sql, *params):
    """A statement from a connection of its own, as a person at the shell would send it
    (sqlite3 or psql); `where` a Store, or a SQLite file's path."""
    if isinstance(where, Store) and where.dsn:
        with psycopg.connect(where.dsn, autocommit=True) as db:
            cur = db.execute(pg.translate(sql), params or None)
            return [tuple(r) for r in cur.fetchall()] if cur.description else []
    db = sqlite3.connect(where.path if isinstance(where, Store) else where)
    try:
        rows = db.execute(sql, params).fetchall()
        db.commit()
        return rows
    finally:
        db.close()


async def test_submit_claim_finish_writes_state_runs_and_events(store):
    [job] = await store.submit(NewJob("task", "p"), NODES, "cli 127.0.0.1")
    assert job["node"] == "a" and job["model"] == "ma" and job["position"] == 1
    claimed = await store.claim("a")
    assert claimed["id"] == job["id"]
    await store.work_done(claimed["run_id"], "out", {"eval_count": 3, "done_reason": "stop"})
    await store.finish(job["id"], claimed["run_id"], "done", None)  # the output is stored already
    detail = await store.job_detail(job["id"])
    assert detail["state"] == "done" and detail["output"] == "out" and detail["eval_count"] == 3
    assert [(e["from_state"], e["to_state"]) for e in detail["events"]] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "done"),
    ]
    assert detail["events"][0]["actor"] == "cli 127.0.0.1"
    assert [r["state"] for r in detail["runs"]] == ["done"]


async def test_finish_is_guarded(store):
    [job] = await store.submit(NewJob("task", "p"), NODES, "api")
    claimed = await store.claim("a")
    await store.finish(job["id"], claimed["run_id"], "failed", "boom")
    with pytest.raises(GuardMiss):
        await store.finish(job["id"], claimed["run_id"], "done", None)
    assert (await store.job(job["id"]))["state"] == "failed"


async def test_a_finish_from_an_old_run_is_refused(store):
    [job] = await store.submit(NewJob("task", "p"), NODES, "api")
    first = await store.claim("a")
    await store.finish(job["id"], first["run_id"], "failed", "boom")
    await store.retry(job["id"], "cli")
    second = await store.claim("a")
    with pytest.raises(GuardMiss):
        await store.finish(job["id"], first["run_id"], "done", None)
    await store.finish(job["id"], second["run_id"], "done", None)


async def test_one_running_job_per_node_is_enforced_by_the_database(store):
    for _ in range(2):
        await store.submit(NewJob("task", "p", node="a"), NODES, "api")
    await store.claim("a")
    assert await store.claim("a") is None  # the claim never takes a second head...
    with pytest.raises(IntegrityError):  # ...and the index refuses any other path
        await raw(store, "UPDATE job SET state = 'running' WHERE state = 'queued'")


async def test_states_are_checked_by_the_database(store):
    [job] = await store.submit(NewJob("task", "p"), NODES, "api")
    with pytest.raises(IntegrityError):
        await raw(store, "UPDATE job SET state = 'finished' WHERE id = ?", job["id"])
    with pytest.raises(IntegrityError):  # a finished job must say when
        await raw(store, "UPDATE job SET state = 'done' WHERE id = ?", job["id"])


async def test_guard_holds_in_the_database_itself(store):
    [task] = await store.submit(NewJob("task", "p", node="a"), NODES, "api")
    [crit] = await store.submit(NewJob("critique", "c", parent=task["id"]), NODES, "api")
    assert crit["node"] == "b"
    with pytest.raises(IntegrityError, match="a critique never runs on its parent task's node"):
        await raw(store, "UPDATE job SET node = 'a' WHERE id = ?", crit["id"])
    with pytest.raises(GuardRefused):
        await store.submit(NewJob("critique", "c", parent=task["id"], node="a"), NODES, "api")


async def test_queued_order_survives_reopen(tmp_path):
    s = Store(tmp_path / "q.db")
    await s.open()
    ids = [(await s.submit(NewJob("task", f"p{i}", node="a"), NODES, "api"))[0]["id"] for i in range(5)]
    await s.close()
    s2 = Store(tmp_path / "q.db")
    await s2.open()
    _, queued, count = await s2.queue("a", 100)
    assert [j["id"] for j in queued] == ids and count == 5
    await s2.close()


async def test_orphans_fail_and_never_requeue(store):
    [job] = await store.submit(NewJob("task", "p"), NODES, "api")
    await store.claim("a")
    orphans = await store.fail_orphans()
    assert [o["id"] for o in orphans] == [job["id"]]
    detail = await store.job_detail(job["id"])
    assert detail["state"] == "failed" and detail["error"] == "router restarted while running"
    assert detail["runs"][0]["state"] == "failed"


def plan(path, sql: str, params=()) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [r[3] for r in db.execute("EXPLAIN QUERY PLAN " + sql, params)]
    finally:
        db.close()


async def test_the_claims_own_sql_takes_the_head_by_the_queue_index(lite_store):
    """The claim's statement itself (lifecycle.CLAIM_SQL), not a copy: the head of one node's queue is
    found by walking job_queue in order, with no sort of the whole queue and no scan of history."""
    from gpuq.store import lifecycle

    steps = plan(lite_store.path, lifecycle.CLAIM_SQL, {"node": "a"})
    reads = [s for s in steps if s.startswith(("SCAN", "SEARCH")) and " j " in f" {s} "]
    assert reads and all(
        "USING INDEX job_queue" in s or "USING COVERING INDEX job_queue" in s
        for s in reads
        if "(node=? AND state=?)" in s
    ), steps
    assert any("job_queue (node=? AND state=?)" in s for s in reads), steps
    assert not any(s.startswith("SCAN") and s.split()[1] in ("j", "job") for s in steps), steps
    assert not any("TEMP B-TREE" in s for s in steps), steps


async def test_a_parents_held_critiques_are_found_by_its_children_not_the_queue(lite_store):
    """Ending a parent without a result (a cancel, a clear of thousands) reads its own children
    through job_parent, not every queued job through the view held_job."""
    from gpuq.store import steps as shared

    steps = plan(lite_store.path, shared.HELD_CHILDREN_SQL, ("1-aaaaaaaa",))
    assert steps[0].startswith("SEARCH c USING INDEX job_parent (parent_id=?)"), steps
    assert not any(s.startswith("SCAN") or "(state=?)" in s for s in steps), steps


async def test_staleness_query_reads_only_running_rows(lite_store):
    """STALE_SQL names no index: the planner must reach job by its state on its own (the partial
    index of running heads or job_state_node), never scan the job table's history."""
    assert "INDEXED BY" not in STALE_SQL.upper()
    steps = plan(lite_store.path, STALE_SQL, {"now": iso(0)})
    reads = [s for s in steps if s.split()[1:2] == ["j"]]
    assert reads, steps
    for s in reads:
        assert s.startswith("SEARCH j USING") and ("job_one_running_per_node" in s or "(state=?)" in s), steps


async def test_migrations_new_existing_and_newer(tmp_path):
    path = tmp_path / "q.db"
    s = Store(path)
    await s.open()
    await s.submit(NewJob("task", "keep me"), NODES, "api")
    await s.close()
    s = Store(path)
    await s.open()  # an existing database starts cleanly, nothing re-applied
    assert len(await s.jobs()) == 1
    await s.close()
    versions = await raw(path, "SELECT version FROM schema_migration")
    assert versions == [(int(f.name[:3]),) for f in sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql"))]
    db = sqlite3.connect(path)
    db.execute("INSERT INTO schema_migration VALUES (999, '999_future', 'x')")
    db.commit()
    db.close()
    s = Store(path)
    with pytest.raises(GpuqError, match="newer gpuq"):
        await s.open()
    await s.close()


async def test_database_file_is_owner_only(tmp_path):
    s = Store(tmp_path / "q.db")
    await s.open()
    await s.close()
    assert (tmp_path / "q.db").stat().st_mode & 0o077 == 0


# -- staleness boundaries, with the store's clock under the test's control ---------------------


async def running_job(store):
    [job] = await store.submit(NewJob("task", "p", node="a"), NODES, "api")
    claimed = await store.claim("a")
    return job["id"], claimed["run_id"]


async def test_no_progress_boundary(store):
    job_id, run_id = await running_job(store)
    t0 = store.test_clock.now
    assert await store.stale_heads(t0 + 599.9) == []
    [head] = await store.stale_heads(t0 + 600.1)
    assert (head["id"], head["reason"]) == (job_id, "no progress")
    store.test_clock.now = t0 + 500
    await store.heartbeat(run_id, "more")  # progress resets the clock
    assert await store.stale_heads(t0 + 1000) == []
    assert (await store.stale_heads(t0 + 1100.1))[0]["reason"] == "no progress"


async def test_finished_stream_not_closed_boundary_the_49_minute_case(store):
    job_id, run_id = await running_job(store)
    t0 = store.test_clock.now
    await store.work_done(run_id, "all", {})
    assert await store.stale_heads(t0 + 29.9) == []
    [head] = await store.stale_heads(t0 + 30.1)
    assert head["reason"] == "ollama finished but the job was not closed"
    [head] = await store.stale_heads(t0 + 49 * 60)
    assert head["id"] == job_id and head["since"] == iso(t0)


async def test_max_runtime_boundary_and_per_node_override(store):
    await store.configure(
        {"stale_after_s": 10**9},
        [type("N", (), dict(name="a", url="http://a:1", rank=1, roles=("task",), model="ma", max_runtime_s=100.0))()],
    )
    job_id, run_id = await running_job(store)
    t0 = store.test_clock.now
    assert await store.stale_heads(t0 + 99.9) == []
    assert (await store.stale_heads(t0 + 100.1))[0]["reason"] == "ran past max_runtime"


async def test_finished_jobs_are_never_stale(store):
    job_id, run_id = await running_job(store)
    await store.finish(job_id, run_id, "done", None)
    assert await store.stale_heads(store.test_clock.now + 10**6) == []


async def test_stale_event_is_written_once(store):
    job_id, _ = await running_job(store)
    t = store.test_clock.now + 700
    assert len(await store.note_stale(t)) == 1
    assert await store.note_stale(t + 1) == []
    assert await store.note_stale(t + 2) == []
    events = (await store.job_detail(job_id))["events"]
    assert sum(1 for e in events if (e["reason"] or "").startswith("stale:")) == 1


async def test_stale_heads_view_works_in_the_shell(store):
    job_id, _ = await running_job(store)
    # The view uses the real clock, and the test clock's job starts in 2027: not stale yet.
    rows = await raw(store, "SELECT id, reason FROM stale_heads")
    assert rows == []
    store_now = store.test_clock.now
    await raw(store, "UPDATE run SET progress_at = ?, started_at = ?", iso(store_now - 10**8), iso(store_now - 10**8))
    rows = await raw(store, "SELECT id, reason FROM stale_heads")
    assert rows == [(job_id, "ran past max_runtime")]


async def test_a_move_naming_the_jobs_own_node_and_no_position_keeps_its_place(store):
    ids = [(await store.submit(NewJob("task", f"p{i}", node="a"), NODES, "api"))[0]["id"] for i in range(3)]
    moved = await store.move(ids[0], NODES, "page", node="a")
    assert moved["position"] == 1
    _, queued, _ = await store.queue("a", 10)
    assert [j["id"] for j in queued] == ids


async def test_finish_can_claim_the_next_job_in_the_same_transaction(store):
    first, second = [(await store.submit(NewJob("task", f"p{i}", node="a"), NODES, "api"))[0]["id"] for i in range(2)]
    claimed = await store.claim("a")
    nxt = await store.finish(first, claimed["run_id"], "done", None, "out", claim_node="a")
    assert nxt["id"] == second and nxt["state"] == "running" and nxt["run_id"] != claimed["run_id"]
    assert (await store.job(first))["state"] == "done"
    assert await store.finish(second, nxt["run_id"], "done", None, claim_node="a") is None  # queue empty
    with pytest.raises(GuardMiss):  # a refused finish claims nothing either
        await store.finish(second, nxt["run_id"], "done", None, claim_node="a")


async def test_a_read_only_database_refuses_writes_loudly_and_keeps_serving_reads(tmp_path):
    s = Store(tmp_path / "q.db")
    await s.open()
    [job] = await s.submit(NewJob("task", "kept"), NODES, "api")
    # SQLite answers SQLITE_READONLY here exactly as for a read-only file (as root, chmod
    # would not bite, so the test asks SQLite itself to refuse writes).
    await s._writer.call(lambda db: db.execute("PRAGMA query_only = ON"))
    with pytest.raises(StoreUnavailable) as exc:
        await s.submit(NewJob("task", "refused"), NODES, "api")
    assert exc.value.status == 503 and "read-only" in exc.value.message
    assert "nothing was changed" in exc.value.message
    assert [j["id"] for j in await s.jobs()] == [job["id"]]
    await s.close()


async def test_a_colliding_job_id_is_replaced_not_refused(store, monkeypatch):
    [first] = await store.submit(NewJob("task", "p"), NODES, "api")
    ids = iter([first["id"], first["id"], "1800000000-0000abcd"])  # the id generator repeats itself
    monkeypatch.setattr("gpuq.store.lifecycle.new_job_id", lambda now: next(ids))
    [second] = await store.submit(NewJob("task", "q"), NODES, "api")
    assert second["id"] == "1800000000-0000abcd"
    assert len(await store.jobs()) == 2


async def test_every_write_is_durable_wal_and_synchronous_full(lite_store):
    """A 201 means the job is on disk: the writer connection runs WAL at synchronous=FULL with
    foreign keys on. (A SIGKILL cannot catch synchronous=OFF: the page cache survives it.)"""

    def pragmas(db: sqlite3.Connection) -> tuple:
        return tuple(db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("journal_mode", "synchronous", "foreign_keys"))

    assert await lite_store._writer.call(pragmas) == ("wal", 2, 1)  # 2 = FULL


async def test_node_load_counts_every_way_a_job_comes_and_goes(store):
    """The per-node counts placement reads (table node_load, kept by triggers) equal a count of
    the job table after submits, a claim, a move, a preempt, a finish, a delete and a retry."""

    async def truth() -> dict:
        return {
            n: (r, q)
            for n, r, q in await raw(
                store,
                "SELECT node, SUM(CASE WHEN state = 'running' THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN state = 'queued' THEN 1 ELSE 0 END) FROM job"
                " WHERE state IN ('queued', 'running') GROUP BY node",
            )
        }

    async def check():
        kept = {n: tuple(c) for n, c in (await store.active_by_node()).items() if c != (0, 0)}
        assert kept == await truth()

    nodes = [NodeInfo("a", 1, ("task",), "ma", True), NodeInfo("c", 2, ("task",), "mc", True)]
    jobs = [j for i in range(6) for j in await store.submit(NewJob("task", f"p{i}"), nodes, "api")]
    await check()
    head = await store.claim(jobs[0]["node"])
    await check()
    waiting = [j for j in jobs if j["node"] == head["node"] and j["id"] != head["id"]]
    other = "c" if head["node"] == "a" else "a"
    await store.move(waiting[0]["id"], nodes, "api", node=other)
    await check()
    await store.preempt(waiting[1]["id"], "api")
    await check()
    nxt = await store.claim(head["node"])
    await store.finish(nxt["id"], nxt["run_id"], "done", None, "out")
    await check()
    await store.delete(jobs[-1]["id"], "api")
    await check()
    await store.retry(jobs[-1]["id"], "api")
    await check()


# How the router before migration 011 stored text: appended to the run row's own columns.
OLD_APPEND = (
    "UPDATE run SET output = output || COALESCE(:output, ''),"
    " thinking = COALESCE(thinking || :thinking, thinking, :thinking) WHERE id = :run_id"
)


def old_event(db, job_id, from_state, to_state, actor, reason, now, run_id=None) -> None:
    """How the router before migration 012 wrote an event: with no run."""
    db.execute(
        "INSERT INTO event (job_id, at, from_state, to_state, actor, reason) VALUES (?,?,?,?,?,?)",
        (job_id, iso(now), from_state, to_state, actor, reason),
    )


async def test_an_upgrade_from_migration_010_keeps_every_runs_text(tmp_path, monkeypatch):
    """A database at migration 010, its runs' text in run.output/run.thinking as the old router
    wrote it: after the upgrade every run reads exactly as before (the API's job, a held
    critique's subject, the view run_output), a run that gave no reasoning still reads None, and
    new text goes to run_chunk after the run's old text, which stays where it was. Its events,
    written with no run, get the run they were about (migration 012's backfill)."""
    from gpuq.shipped import shipped_files
    from gpuq.store import lifecycle, steps
    from gpuq.store import sqlite as engine

    monkeypatch.setattr(lifecycle, "event", old_event)
    monkeypatch.setattr(steps, "event", old_event)

    path, now = tmp_path / "q.db", 1_800_000_000.0
    nodes = [
        NodeInfo("a", 1, ("task",), "ma", True),
        NodeInfo("b", 2, ("task",), "mb", True),
        NodeInfo("c", 3, ("critique",), "mc", True),
    ]
    db = sqlite3.connect(path, isolation_level=None)
    db.row_factory = sqlite3.Row
    files = shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations")
    engine.migrate(db, [f for f in files if int(f.name[:3]) <= 10], now, path)
    # Today's submit writes the columns of migration 014 too: there for the writing, gone after.
    LATER_COLUMNS = ("owner", "client", "lane")
    for column in LATER_COLUMNS:
        db.execute(f"ALTER TABLE job ADD COLUMN {column} TEXT")

    def old_run(prompt: str, node: str, texts: list[tuple[str | None, str | None]], done: bool = True) -> str:
        [job] = lifecycle.submit(db, NewJob("task", prompt, node=node), nodes, "api", now)
        run_id = lifecycle.claim(db, now, {}, node)["run_id"]
        for output, thinking in texts:
            db.execute(OLD_APPEND, {"output": output, "thinking": thinking, "run_id": run_id})
        if done:
            lifecycle.finish(db, now, {}, job["id"], run_id, "done", None)
        return job["id"]

    thought = old_run("think first", "a", [("The answer, ", "mulling "), ("in two parts.", "it over")])
    [held] = lifecycle.submit(db, NewJob("critique", None, parent=thought), nodes, "api", now)
    plain = old_run("just answer", "a", [("plain", None)])
    running = old_run("still going", "b", [("before ", None)], done=False)
    for column in LATER_COLUMNS:
        db.execute(f"ALTER TABLE job DROP COLUMN {column}")
    db.close()
    monkeypatch.undo()

    store = Store(path, clock=lambda: now + 60)
    await store.open()
    try:
        for job_id, output, thinking in (
            (thought, "The answer, in two parts.", "mulling it over"),
            (plain, "plain", None),
        ):
            job = await store.job_detail(job_id)
            assert (job["output"], job["thinking"]) == (output, thinking)
            assert [(r["output"], r["thinking"]) for r in job["runs"]] == [(output, thinking)]
        critique = await store.claim("c")
        assert (critique["id"], critique["prompt"]) == (
            held["id"],
            "## Task\nthink first\n\n## Result\nThe answer, in two parts.",
        )
        run_id = (await store.job(running))["run_id"]
        await store.heartbeat(run_id, "and after")
        assert (await store.job_detail(running))["output"] == "before and after"
    finally:
        await store.close()
    assert await raw(path, "SELECT output, thinking FROM run ORDER BY id") == [
        ("The answer, in two parts.", "mulling it over"),
        ("plain", None),
        ("before ", None),
        ("", None),
    ]
    assert await raw(path, "SELECT run_id, seq, output, thinking FROM run_chunk") == [(run_id, 1, "and after", None)]
    assert await raw(path, "PRAGMA foreign_key_check") == []
    assert await raw(path, "SELECT output, thinking FROM run_output ORDER BY run_id") == [
        ("The answer, in two parts.", "mulling it over"),
        ("plain", None),
        ("before and after", None),
        ("", None),
    ]
    # Each claim and each end is about the run it started or ended; a submit is about none.
    assert await raw(
        path,
        "SELECT e.job_id, e.to_state, r.job_id FROM event e LEFT JOIN run r ON r.id = e.run_id"
        " WHERE e.job_id IN (?, ?) ORDER BY e.id",
        thought,
        plain,
    ) == [
        (thought, "queued", None),
        (thought, "running", thought),
        (thought, "done", thought),
        (plain, "queued", None),
        (plain, "running", plain),
        (plain, "done", plain),
    ]
    assert await raw(
        path, "SELECT COUNT(*) FROM event WHERE run_id IS NULL AND (from_state = 'running' OR to_state = 'running')"
    ) == [(0,)]
    assert await raw(path, "SELECT MAX(version) FROM schema_migration") == [(max(int(f.name[:3]) for f in files),)]


async def test_an_empty_hand_over_taken_alone_does_not_stop_the_writer(store):
    """close() hands the writer the loop's turn even when it is empty; a thread that took that
    empty hand-over before anything else came died on it (IndexError) and left every later write
    unanswered (seen once in make test as an unhandled exception in gpuq-writer)."""
    writer = store._writer
    writer._hand_over()  # what close() does first, with nothing made in this turn
    await eventually_taken(writer)
    assert await asyncio.wait_for(writer.run(lambda db: db.execute("SELECT 1").fetchone()[0]), 5) == 1


async def eventually_taken(writer) -> None:
    """Until the writer's thread has taken everything handed to it (a deadline, not a sleep)."""
    deadline = asyncio.get_running_loop().time() + 5
    while not writer._queue.empty():
        assert asyncio.get_running_loop().time() < deadline, "the writer never took the hand-over"
        await asyncio.sleep(0.01)
