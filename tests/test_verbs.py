"""The queue's verbs (gpuq/store/lifecycle.py, control.py) alone: plain functions of a connection, run here on each
engine (a real SQLite file; a throwaway PostgreSQL database through gpuq/store/postgres.py's
connection) with no event loop, no thread and no Store around them."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from gpuq.errors import GUARD_MESSAGE, GuardMiss
from gpuq.jobs import NewJob, NodeInfo, iso
from gpuq.shipped import shipped_files
from gpuq.store import MIGRATIONS_DIR, control, lifecycle, postgres, steps
from gpuq.store import sqlite as engine
from gpuq.store.engine import dialect

NODES = [NodeInfo("a", 1, ("task",), "ma", True), NodeInfo("b", 2, ("critique",), "mb", True)]
NOW = 1_800_000_000.0


# A write the database itself refuses, on either engine.
IntegrityError = (sqlite3.IntegrityError, psycopg.IntegrityError)


@pytest.fixture
def db(database):
    if isinstance(database, str):  # PostgreSQL
        conn = postgres.connect_writer(database, 5.0)
        postgres.migrate(conn.raw, shipped_files(postgres.MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "pg"), NOW, "test")
    else:
        conn = sqlite3.connect(database, isolation_level=None)
        conn.row_factory = sqlite3.Row
        engine.migrate(conn, shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations"), NOW, database)
    yield conn
    conn.close()


def in_transaction(db, verb, **kwargs):
    """What the writer does for one write: its engine's BEGIN, the verb, COMMIT (ROLLBACK if it raises)."""
    db.execute(dialect(db).BEGIN_WRITE)
    try:
        result = verb(db, **kwargs)
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
    return result


def test_submit_claim_and_finish_by_hand(db):
    [job] = in_transaction(db, lifecycle.submit, new=NewJob("task", "hello"), nodes=NODES, actor="test", now=NOW)
    assert (job["node"], job["state"], job["position"]) == ("a", "queued", 1)
    claimed = in_transaction(db, lifecycle.claim, max_running={}, node="a", now=NOW + 1)
    assert claimed["id"] == job["id"] and claimed["prompt"] == "hello"
    in_transaction(
        db,
        lifecycle.finish,
        max_running={},
        job_id=job["id"],
        run_id=claimed["run_id"],
        state="done",
        error=None,
        now=NOW + 2,
        output="world",
    )
    assert db.execute("SELECT state FROM job").fetchone()[0] == "done"
    assert steps.run_texts(db, [claimed["run_id"]]) == {claimed["run_id"]: {"output": "world", "thinking": None}}
    assert [r[0] for r in db.execute("SELECT to_state FROM event ORDER BY id")] == ["queued", "running", "done"]


def test_a_refused_verb_leaves_nothing_behind(db):
    [job] = in_transaction(db, lifecycle.submit, new=NewJob("task", "x"), nodes=NODES, actor="test", now=NOW)
    claimed = in_transaction(db, lifecycle.claim, max_running={}, node="a", now=NOW)
    with pytest.raises(GuardMiss):  # not the job's running run
        in_transaction(
            db,
            lifecycle.finish,
            max_running={},
            job_id=job["id"],
            run_id=claimed["run_id"] + 1,
            state="done",
            error=None,
            now=NOW,
        )
    assert db.execute("SELECT state FROM job").fetchone()[0] == "running"
    assert db.execute("SELECT COUNT(*) FROM event").fetchone()[0] == 2


def test_the_schema_refuses_every_write_that_puts_a_critique_on_its_parents_node(db):
    """The guard lives in the schema alone (migration 010): an insert, a move of the critique, a
    move of its parent, and a retry's requeue each fail with the one message the router maps to
    409; a write that leaves an active critique where it is (its claim) is not judged again."""
    nodes = [NodeInfo("a", 1, ("task", "critique"), "ma", True), NodeInfo("b", 2, ("task", "critique"), "mb", True)]
    [task] = in_transaction(db, lifecycle.submit, new=NewJob("task", "t", node="a"), nodes=nodes, actor="t", now=NOW)
    with pytest.raises(IntegrityError, match=GUARD_MESSAGE):  # asked for the parent's node
        in_transaction(
            db,
            lifecycle.submit,
            new=NewJob("critique", "c", parent=task["id"], node="a"),
            nodes=nodes,
            actor="t",
            now=NOW,
        )
    [critique] = in_transaction(
        db, lifecycle.submit, new=NewJob("critique", "c", parent=task["id"]), nodes=nodes, actor="t", now=NOW
    )
    assert critique["node"] == "b"  # the fan-out never chooses the parent's node
    for sql, job in (
        ("UPDATE job SET node = 'a' WHERE id = ?", critique["id"]),
        ("UPDATE job SET node = 'b' WHERE id = ?", task["id"]),
    ):
        with pytest.raises(IntegrityError, match=GUARD_MESSAGE):
            in_transaction(db, lambda d, sql=sql, job=job: d.execute(sql, (job,)))
    in_transaction(db, control.delete, job_id=critique["id"], actor="t", reason="deleted", now=NOW)
    in_transaction(db, lambda d: d.execute("UPDATE job SET node = 'b' WHERE id = ?", (task["id"],)))
    with pytest.raises(IntegrityError, match=GUARD_MESSAGE):  # retry would requeue it beside its parent
        in_transaction(db, control.retry, job_id=critique["id"], actor="t", now=NOW)
    assert db.execute("SELECT state FROM job WHERE id = ?", (critique["id"],)).fetchone()[0] == "cancelled"
    in_transaction(db, lambda d: d.execute("UPDATE job SET node = 'a' WHERE id = ?", (task["id"],)))
    in_transaction(db, control.retry, job_id=critique["id"], actor="t", now=NOW)
    assert in_transaction(db, lifecycle.claim, max_running={}, node="b", now=NOW)["id"] == critique["id"]


def test_many_appends_keep_the_whole_text_in_order_and_never_rewrite_earlier_text(db):
    """Output is written once (issue 12): each heartbeat, the end of the stream and the finish
    insert one chunk with only the new text; the run row's own text columns are not touched and
    no earlier chunk changes. Read back, the pieces join into the whole text, reasoning and
    answer apart, in the order written; and a critique held for the run's job reviews all of it."""
    nodes = [NodeInfo("a", 1, ("task",), "ma", True), NodeInfo("b", 2, ("critique",), "mb", True)]
    [job] = in_transaction(db, lifecycle.submit, new=NewJob("task", "write at length"), nodes=nodes, actor="t", now=NOW)
    [held] = in_transaction(
        db, lifecycle.submit, new=NewJob("critique", None, parent=job["id"]), nodes=nodes, actor="t", now=NOW
    )
    run_id = in_transaction(db, lifecycle.claim, max_running={}, node="a", now=NOW)["run_id"]
    pieces = [(f"answer {i:03d} ünïcode\n", f"thought {i:03d} " if i < 40 else None) for i in range(200)]

    def chunks() -> list[tuple]:
        return [tuple(r) for r in db.execute("SELECT * FROM run_chunk WHERE run_id = ? ORDER BY seq", (run_id,))]

    for i, (output, thinking) in enumerate(pieces[:-2]):
        before = chunks()
        in_transaction(db, lifecycle.heartbeat, run_id=run_id, output=output, thinking=thinking, now=NOW + i)
        after = chunks()
        assert after[:-1] == before and len(after) == i + 1  # one new row; the earlier ones as they were
        assert after[-1][1:] == (i + 1, iso(NOW + i), output, thinking)
    in_transaction(db, lifecycle.heartbeat, run_id=run_id, output="", thinking=None, now=NOW + 500)  # nothing new
    in_transaction(
        db,
        lifecycle.work_done,
        run_id=run_id,
        output=pieces[-2][0],
        stats={"eval_count": 240},
        thinking=None,
        now=NOW + 501,
    )
    in_transaction(
        db,
        lifecycle.finish,
        max_running={},
        job_id=job["id"],
        run_id=run_id,
        state="done",
        error=None,
        now=NOW + 502,
        output=pieces[-1][0],
    )
    assert len(chunks()) == len(pieces)
    assert db.execute("SELECT output, thinking FROM run WHERE id = ?", (run_id,)).fetchone()[:] == ("", None)
    whole = {"output": "".join(o for o, _ in pieces), "thinking": "".join(t for _, t in pieces if t)}
    assert steps.run_texts(db, [run_id]) == {run_id: whole}
    claimed = in_transaction(db, lifecycle.claim, max_running={}, node="b", now=NOW + 503)
    assert claimed["id"] == held["id"] and claimed["prompt"].endswith("## Result\n" + whole["output"])


def test_a_run_that_gave_no_reasoning_reads_none_and_a_run_with_no_text_reads_empty(db):
    in_transaction(db, lifecycle.submit, new=NewJob("task", "p"), nodes=NODES, actor="t", now=NOW)
    answered = in_transaction(db, lifecycle.claim, max_running={}, node="a", now=NOW)["run_id"]
    in_transaction(db, lifecycle.heartbeat, run_id=answered, output="partial", thinking=None, now=NOW)
    [other] = in_transaction(db, lifecycle.submit, new=NewJob("task", "q"), nodes=NODES, actor="t", now=NOW)
    in_transaction(db, control.preempt, job_id=other["id"], actor="t", now=NOW)  # ends the first run
    silent = in_transaction(db, lifecycle.claim, max_running={}, node="a", now=NOW)["run_id"]
    assert steps.run_texts(db, [answered, silent]) == {
        answered: {"output": "partial", "thinking": None},
        silent: {"output": "", "thinking": None},
    }


@pytest.mark.parametrize("foreign_keys", ["ON", "OFF"])  # the router's connections / the sqlite3 shell's default
def test_a_run_deleted_by_hand_takes_its_chunks_with_it(db, foreign_keys):
    """Nothing in the router deletes a run; a person in the sqlite3 shell may, and leaves no
    orphaned text (or events naming it) behind."""
    in_transaction(db, lifecycle.submit, new=NewJob("task", "p"), nodes=NODES, actor="t", now=NOW)
    run_id = in_transaction(db, lifecycle.claim, max_running={}, node="a", now=NOW)["run_id"]
    for i in range(3):
        in_transaction(db, lifecycle.heartbeat, run_id=run_id, output=f"piece {i}", thinking=None, now=NOW + i)
    lite = isinstance(db, sqlite3.Connection)  # (PostgreSQL checks every reference, always)
    if lite:
        db.execute(f"PRAGMA foreign_keys = {foreign_keys}")
    db.execute("DELETE FROM run WHERE id = ?", (run_id,))
    assert db.execute("SELECT COUNT(*) FROM run_chunk").fetchone()[0] == 0
    if lite:
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []


def events_of(db: sqlite3.Connection, job_id: str) -> list[tuple]:
    return [
        tuple(r)
        for r in db.execute(
            "SELECT at, from_state, to_state, actor, reason FROM event WHERE job_id = ? ORDER BY id", (job_id,)
        )
    ]


def test_a_submit_to_an_idle_node_claims_it_in_the_same_transaction_as_a_claim_would(db):
    idle = [NodeInfo("a", 1, ("task",), "ma", True, idle=True), NODES[1]]
    [job], [claimed] = in_transaction(
        db, lifecycle.submit_and_claim, new=NewJob("task", "now"), nodes=idle, actor="test", now=NOW
    )
    assert (job["id"], job["state"], job["position"]) == (claimed["id"], "running", None)
    assert claimed["prompt"] == "now" and claimed["state"] == "running"
    assert db.execute("SELECT state, run_id FROM job").fetchone()[:] == ("running", claimed["run_id"])
    assert [tuple(r) for r in db.execute("SELECT job_id, node, state FROM run")] == [(job["id"], "a", "running")]
    at = "2027-01-15T08:00:00.000000Z"
    assert events_of(db, job["id"]) == [
        (at, None, "queued", "test", "placed on a (first free node by rank)"),
        (at, "queued", "running", "router", "claimed by a"),
    ]
    # The same job submitted, then claimed by its worker: the same rows, the same events.
    [other] = in_transaction(
        db,
        lifecycle.submit,
        new=NewJob("task", "later", node="b"),
        nodes=[NODES[0], NodeInfo("b", 2, ("task",), "mb", True)],
        actor="test",
        now=NOW,
    )
    in_transaction(db, lifecycle.claim, max_running={}, node="b", now=NOW)
    assert [e[1:] for e in events_of(db, other["id"])] == [
        (None, "queued", "test", "placed on b (asked)"),
        ("queued", "running", "router", "claimed by b"),
    ]


def test_a_submit_claims_nothing_on_a_busy_node_a_node_not_idle_or_down_or_for_a_held_critique(db):
    busy = [
        NodeInfo("a", 1, ("task", "critique"), "ma", True, idle=True),
        NodeInfo("b", 2, ("task", "critique"), "mb", True, idle=True),
    ]
    [first], _ = in_transaction(
        db, lifecycle.submit_and_claim, new=NewJob("task", "1", node="a"), nodes=busy, actor="t", now=NOW
    )
    # (the worker's idle flag is stale: it runs `first` already; the claim's own guard says no)
    [second], claimed = in_transaction(
        db, lifecycle.submit_and_claim, new=NewJob("task", "2", node="a"), nodes=busy, actor="t", now=NOW
    )
    assert claimed == [] and (second["state"], second["position"]) == ("queued", 1)
    not_idle = [NodeInfo("b", 2, ("task",), "mb", True)]
    down = [NodeInfo("b", 2, ("task",), "mb", False, idle=True)]
    for nodes in (not_idle, down):
        [job], claimed = in_transaction(
            db, lifecycle.submit_and_claim, new=NewJob("task", "3", node="b"), nodes=nodes, actor="t", now=NOW
        )
        assert claimed == [] and job["state"] == "queued"
        in_transaction(db, control.delete, job_id=job["id"], actor="t", reason="deleted", now=NOW)
    [held], claimed = in_transaction(
        db, lifecycle.submit_and_claim, new=NewJob("critique", None, parent=first["id"]), nodes=busy, actor="t", now=NOW
    )  # waits for `first` to be done
    assert claimed == [] and (held["node"], held["state"], held["waiting_for"]) == ("b", "queued", first["id"])
    assert db.execute("SELECT COUNT(*) FROM job WHERE state = 'running'").fetchone()[0] == 1


def test_a_critique_fanned_out_to_idle_nodes_is_claimed_on_each(db):
    nodes = [
        NodeInfo("a", 1, ("task",), "ma", True),
        NodeInfo("b", 2, ("critique",), "mb", True, idle=True),
        NodeInfo("c", 3, ("critique",), "mc", True, idle=True),
    ]
    created, claimed = in_transaction(
        db, lifecycle.submit_and_claim, new=NewJob("critique", "review"), nodes=nodes, actor="t", now=NOW
    )
    assert [(j["node"], j["state"]) for j in created] == [("b", "running"), ("c", "running")]
    assert sorted(j["node"] for j in claimed) == ["b", "c"]
    assert [tuple(r) for r in db.execute("SELECT node, running, queued FROM node_load ORDER BY node")] == [
        ("b", 1, 0),
        ("c", 1, 0),
    ]
