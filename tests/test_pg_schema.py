"""PostgreSQL's schema (migrations/postgres/) keeps SQLite's rules: the same tables, named rules,
indexes, views and triggers; the same refusals, the guard's message included; the same answers
from the views for the same rows (written to both engines and compared); applied once however
many routers start together; and a job's change wakes a listener (NOTIFY gpuq_job).

Against a real throwaway cluster: initdb in a temp dir, a Unix socket only, stopped at the end."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg  # noqa: E402 (the test extras carry it: never skipped)
import pytest

from gpuq.errors import GUARD_MESSAGE, GpuqError
from gpuq.shipped import shipped_files
from gpuq.store import MIGRATIONS_DIR
from gpuq.store import postgres as pg
from gpuq.store import sqlite as sqlite_engine

pytestmark = pytest.mark.postgres


# The database: conftest's pg_dsn (tests/pg.py), a new empty one for each test.


def pg_files() -> list[Path]:
    return shipped_files(pg.MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "PostgreSQL migrations")


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True)


@pytest.fixture
def pgdb(pg_dsn: str) -> Iterator[psycopg.Connection]:
    """A migrated PostgreSQL database."""
    with connect(pg_dsn) as conn:
        pg.migrate(conn, pg_files(), 0.0, "test")
        yield conn


@pytest.fixture
def litedb(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    """A migrated SQLite database, as the router opens one (foreign keys on)."""
    path = tmp_path / "q.db"
    db = sqlite3.connect(path, isolation_level=None)
    sqlite_engine.migrate(db, shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations"), 0.0, path)
    db.execute("PRAGMA foreign_keys = ON")
    yield db
    db.close()


def both(litedb: sqlite3.Connection, pgdb: psycopg.Connection, *statements: str) -> None:
    """Run literal SQL (no parameters, so the one text serves both engines) in each."""
    for sql in statements:
        litedb.execute(sql)
        pgdb.execute(sql)


# -- the migrations ----------------------------------------------------------------------------


def test_the_schema_applies_to_an_empty_database_and_holds_every_object_sqlites_has(pg_dsn, litedb):
    """Every table, index, view, trigger and named rule of SQLite's schema after all its migrations
    (tests/schema.sql) exists in PostgreSQL's under the same name."""
    with connect(pg_dsn) as conn:
        pg.migrate(conn, pg_files(), 0.0, "test")
        assert conn.execute("SELECT version, name FROM schema_migration ORDER BY version").fetchall() == [
            (int(f.name[:3]), f.stem) for f in pg_files()
        ]
        ours = {
            (kind, name)
            for kind, name in conn.execute("""
            SELECT 'table', tablename FROM pg_tables WHERE schemaname = 'public'
            UNION ALL SELECT 'view', viewname FROM pg_views WHERE schemaname = 'public'
            UNION ALL SELECT 'index', indexname FROM pg_indexes WHERE schemaname = 'public'
            UNION ALL SELECT 'trigger', tgname FROM pg_trigger WHERE NOT tgisinternal
            UNION ALL SELECT 'constraint', conname FROM pg_constraint WHERE connamespace = 'public'::regnamespace""")
        }
    theirs = {
        (kind, name)
        for kind, name in litedb.execute(
            "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite_autoindex_%'"
        )
    }
    for [sql] in litedb.execute("SELECT sql FROM sqlite_master WHERE type = 'table'"):
        theirs |= {("constraint", name) for name in _constraint_names(sql)}
    assert len(theirs) > 44
    assert theirs - ours == set()
    # ...and nothing of SQLite's is missing the other way but what PostgreSQL names itself
    # (primary keys, unnamed CHECKs and foreign keys) and the wake-up (job_notify).
    extra = {(k, n) for k, n in ours - theirs if not (n.endswith(("_pkey", "_check", "_fkey")) or n == "job_notify")}
    assert extra == set()


def _constraint_names(sql: str) -> list[str]:
    words = sql.replace("(", " ").split()
    return [words[i + 1] for i, w in enumerate(words[:-1]) if w.upper() == "CONSTRAINT"]


def test_migrating_twice_in_a_row_applies_each_migration_once(pg_dsn):
    with connect(pg_dsn) as conn:
        pg.migrate(conn, pg_files(), 0.0, "test")
        pg.migrate(conn, pg_files(), 60.0, "test")
        assert conn.execute("SELECT version, applied_at FROM schema_migration ORDER BY version").fetchall() == [
            (int(f.name[:3]), "1970-01-01T00:00:00.000000Z") for f in pg_files()
        ]


def test_two_routers_starting_together_migrate_once(pg_dsn):
    """Both wait on the advisory lock (held here until both are seen waiting), then one applies
    each migration and the other finds it applied: no error, one record per version."""
    errors: list[BaseException] = []

    def router() -> None:
        try:
            with connect(pg_dsn) as conn:
                pg.migrate(conn, pg_files(), 0.0, "test")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    with connect(pg_dsn) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (pg.MIGRATE_LOCK,))
        threads = [threading.Thread(target=router) for _ in range(2)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while (
            holder.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0]
            < 2
        ):
            assert time.monotonic() < deadline and not errors, errors or "the routers never waited on the lock"
            time.sleep(0.01)  # polling with a deadline, not synchronising by sleep
        holder.execute("SELECT pg_advisory_unlock(%s)", (pg.MIGRATE_LOCK,))
        for t in threads:
            t.join(60)
        assert errors == []
        assert holder.execute("SELECT version FROM schema_migration ORDER BY version").fetchall() == [
            (int(f.name[:3]),) for f in pg_files()
        ]
        assert (
            holder.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'critique_guard_insert'").fetchone()[0] == 1
        )


def test_a_migration_another_router_applied_while_this_one_waited_is_skipped(pgdb):
    """The second router read the applied versions before the first committed its migration: under
    the lock it reads again, and applies nothing twice."""
    first = pg_files()[0]
    pg._apply_migration(pgdb, 1, first, 60.0)
    assert pgdb.execute("SELECT version, applied_at FROM schema_migration WHERE version = 1").fetchall() == [
        (1, "1970-01-01T00:00:00.000000Z")
    ]


def test_a_database_from_a_newer_gpuq_is_refused(pgdb):
    pgdb.execute("INSERT INTO schema_migration VALUES (999, '999_future', 'x')")
    with pytest.raises(GpuqError, match="was written by a newer gpuq") as exc:
        pg.migrate(pgdb, pg_files(), 0.0, "postgresql:///gpuq")
    assert exc.value.exit_code == 2


def test_a_migration_that_fails_leaves_nothing_behind(pg_dsn, tmp_path):
    broken = tmp_path / f"{max(int(f.name[:3]) for f in pg_files()) + 1:03d}_broken.sql"  # the next version
    broken.write_text("CREATE TABLE half_made (id INTEGER);\nSELECT no_such_function();\n")
    with connect(pg_dsn) as conn:
        with pytest.raises(psycopg.errors.UndefinedFunction):
            pg.migrate(conn, [*pg_files(), broken], 0.0, "test")
        assert [v for (v,) in conn.execute("SELECT version FROM schema_migration ORDER BY version")] == [
            int(f.name[:3]) for f in pg_files()
        ]
        assert conn.execute("SELECT to_regclass('half_made')").fetchone()[0] is None
        # the lock went with the failure: another router migrates at once
        with connect(pg_dsn) as other:
            pg.migrate(other, pg_files(), 0.0, "test")


# -- the rules ---------------------------------------------------------------------------------

NODES = (
    "INSERT INTO node (name, url, rank, roles, model) VALUES ('a', 'http://a', 1, 'task,critique', 'ma')",
    "INSERT INTO node (name, url, rank, roles, model) VALUES ('b', 'http://b', 2, 'task,critique', 'mb')",
)


def job(id: str, node: str = "a", kind: str = "task", state: str = "queued", **more: object) -> str:
    cols = {
        "id": id,
        "kind": kind,
        "state": state,
        "node": node,
        "model": "m",
        "prompt": "p",
        "position": 1024,
        "placement": "asked",
        "created_at": "2026-01-01T00:00:00.000000Z",
        **more,
    }
    if state not in ("queued", "running"):
        cols.setdefault("finished_at", "2026-01-01T00:01:00.000000Z")

    def lit(v: object) -> str:
        return "NULL" if v is None else str(v) if isinstance(v, (int, float)) else "'" + str(v).replace("'", "''") + "'"

    return f"INSERT INTO job ({', '.join(cols)}) VALUES ({', '.join(lit(v) for v in cols.values())})"


def test_the_guard_refuses_a_critique_on_its_parents_node_with_the_one_message(litedb, pgdb):
    """Each write the SQLite schema refuses (tests/test_verbs.py): an insert, a move of the
    critique, a move of its parent, a requeue; a write that leaves it where it is passes."""
    both(litedb, pgdb, *NODES, job("t1", "a"))
    refused = (job("c1", "a", "critique", parent_id="t1"),)
    for sql in refused:
        _refused_by_both(litedb, pgdb, sql, GUARD_MESSAGE)
    both(litedb, pgdb, job("c1", "b", "critique", parent_id="t1"))
    for sql in ("UPDATE job SET node = 'a' WHERE id = 'c1'", "UPDATE job SET node = 'b' WHERE id = 't1'"):
        _refused_by_both(litedb, pgdb, sql, GUARD_MESSAGE)
    both(
        litedb,
        pgdb,
        "UPDATE job SET state = 'cancelled', finished_at = 'x' WHERE id = 'c1'",
        "UPDATE job SET node = 'b' WHERE id = 't1'",
    )
    _refused_by_both(
        litedb, pgdb, "UPDATE job SET state = 'queued', finished_at = NULL WHERE id = 'c1'", GUARD_MESSAGE
    )  # a retry would requeue it beside its parent
    both(
        litedb,
        pgdb,
        "UPDATE job SET node = 'a' WHERE id = 't1'",
        "UPDATE job SET state = 'queued', finished_at = NULL WHERE id = 'c1'",
        "UPDATE job SET state = 'running' WHERE id = 'c1'",
    )  # the claim is not judged again
    with pytest.raises(psycopg.errors.IntegrityError) as exc:
        pgdb.execute("UPDATE job SET node = 'b' WHERE id = 't1'")
    assert exc.value.diag.message_primary == GUARD_MESSAGE
    assert exc.value.diag.constraint_name == "critique_guard"
    assert exc.value.sqlstate == "23000"


# SQLite names a unique index's columns, not the index; PostgreSQL names the index.
SQLITE_SAYS = {"job_one_running_per_node": "UNIQUE constraint failed: job.node"}


def _refused_by_both(litedb: sqlite3.Connection, pgdb: psycopg.Connection, sql: str, rule: str) -> None:
    """Both engines refuse `sql`, naming `rule` (a constraint's name, or the guard's message), and
    keep nothing of it."""
    with pytest.raises(sqlite3.IntegrityError) as lite:
        litedb.execute(sql)
    assert SQLITE_SAYS.get(rule, rule) in str(lite.value), (sql, str(lite.value))
    with pytest.raises(psycopg.errors.IntegrityError) as exc:
        pgdb.execute(sql)
    named = exc.value.diag.constraint_name if rule != GUARD_MESSAGE else exc.value.diag.message_primary
    assert named == rule, (sql, str(exc.value))


# (what must be there first, the write, the rule that refuses it): every named rule, and the
# unnamed ones the tests of the store and the verbs write against (tests/test_store.py, test_front.py).
REFUSALS = [
    ((), job("j", kind="chat"), "job_kind_valid"),
    ((), job("j", state="finished"), "job_state_valid"),
    ((), job("j", lane="urgent"), "job_lane_valid"),
    ((), job("j", subject_from_parent=2), "job_subject_from_parent_flag"),
    ((), job("j", state="done", finished_at=None), "job_finished_when_ended"),
    ((), job("j", finished_at="2026-01-01T00:00:00.000000Z"), "job_finished_when_ended"),
    ((job("j"),), "UPDATE job SET state = 'done' WHERE id = 'j'", "job_finished_when_ended"),
    ((), job("j", endpoint="/api/chat"), "job_request_kept_until_pruned"),
    ((), job("j", request="{}"), "job_request_with_endpoint"),
    ((), job("j", pruned_at="2026-02-01T00:00:00.000000Z"), "job_pruned_when_ended"),
    (
        (job("j", state="done", endpoint="/api/chat", request="{}"),),
        "UPDATE job SET request = NULL WHERE id = 'j'",
        "job_request_kept_until_pruned",
    ),
    ((), job("j", kind="embed"), "job_embed_from_front_door"),
    ((job("j"), job("k")), "UPDATE job SET state = 'running'", "job_one_running_per_node"),
    (
        (job("j"),),
        "INSERT INTO run (id, job_id, node, model, state, started_at, progress_at, finished_at) VALUES"
        " (1, 'j', 'a', 'm', 'paused', 'x', 'x', 'x')",
        "run_state_valid",
    ),
    (
        (job("j"),),
        "INSERT INTO run (id, job_id, node, model, state, started_at, progress_at) VALUES"
        " (1, 'j', 'a', 'm', 'done', 'x', 'x')",
        "run_finished_when_ended",
    ),
    ((job("j"),), "UPDATE node_load SET queued = -1", "node_load_queued_counted"),
    ((job("j"), "UPDATE node_load SET queued = 0"), "DELETE FROM job WHERE id = 'j'", "node_load_queued_counted"),
    ((job("j", state="running"),), "UPDATE node_load SET running = -1", "node_load_running_counted"),
    ((), "INSERT INTO config_reload (at, actor, path, ok) VALUES ('x', 'a', 'p', 2)", "config_reload_ok_flag"),
    ((), "INSERT INTO config_reload (at, actor, path, ok) VALUES ('x', 'a', 'p', 1)", "config_reload_says_what"),
    (
        (),
        "INSERT INTO config_reload (at, actor, path, ok, changes, error) VALUES ('x', 'a', 'p', 0, '{}', 'e')",
        "config_reload_says_what",
    ),
]


@pytest.mark.parametrize(("before", "sql", "rule"), REFUSALS, ids=[f"{r[2]}-{i}" for i, r in enumerate(REFUSALS)])
def test_every_named_rule_refuses_what_sqlites_refuses(litedb, pgdb, before, sql, rule):
    both(litedb, pgdb, *NODES, *before)
    _refused_by_both(litedb, pgdb, sql, rule)


def alert(kind: str = "node_down", deliver: int = 0, more: str = "") -> str:
    return (
        "INSERT INTO alert (alert, node, since, message, fix, fired_at, deliver"
        + (", " + more if more else "")
        + f") VALUES ('{kind}', 'a', 'x', 'm', 'f', 'x', {deliver}"
        + (", 'x'" if more else "")
        + ")"
    )


UNNAMED = [  # SQLite names no rule here; both refuse
    "INSERT INTO node (name, url, rank, roles, model, up) VALUES ('c', 'u', 3, 'task', 'm', 2)",
    alert("fire"),
    alert(deliver=2),
    alert(deliver=1, more="resolved_sent_at"),  # a resolved notice sent for an alert never resolved
    "INSERT INTO alert_delivery (alert_id, status, at, attempt, ok) VALUES (1, 'lost', 'x', 1, 1)",
    "INSERT INTO alert_delivery (alert_id, status, at, attempt, ok) VALUES (1, 'firing', 'x', 1, 3)",
    alert(),  # a second open firing of one condition (alert_open)
    job("c", kind="critique", parent_id="nobody"),  # a reference to no job
    "INSERT INTO event (job_id, at, to_state, actor) VALUES ('nobody', 'x', 'queued', 'cli')",
    "INSERT INTO job (id, kind, node, model, position, placement, created_at)"
    " VALUES ('j', 'task', 'a', 'm', 1, 'p', 'x')",  # no prompt
]


@pytest.mark.parametrize("sql", UNNAMED, ids=range(len(UNNAMED)))
def test_the_unnamed_rules_refuse_what_sqlites_refuse(litedb, pgdb, sql):
    both(litedb, pgdb, *NODES, alert())
    with pytest.raises(sqlite3.IntegrityError):
        litedb.execute(sql)
    with pytest.raises(psycopg.errors.IntegrityError):
        pgdb.execute(sql)


# -- the views and the counts, the same rows in both engines -------------------------------------

T0 = "2026-01-01T00:00:00.000000Z"
LONG_AGO, FAR_AHEAD = "2001-01-01T00:00:00.000000Z", "2999-01-01T00:00:00.000000Z"

ROWS = [
    *NODES,
    "INSERT INTO node (name, url, rank, roles, model, max_runtime_s) VALUES ('c', 'http://c', 3, 'task', 'mc', 30.5)",
    "INSERT INTO router_setting (key, value) VALUES ('stale_after_s', 120), ('stale_grace_s', 15.5),"
    " ('max_runtime_s', 3600)",
    # a parent running, its held critique, its plain critique; a parent done and its critique now ready
    job("p1", "a", state="running", run_id=1, prompt="ünïcödé " * 60, position=2048),
    job("h1", "b", "critique", parent_id="p1", subject_from_parent=1, group_id="g1"),
    job("h2", "c", "critique", parent_id="p1", group_id="g1", position=3072, lane="interactive"),
    job("p2", "b", state="done", run_id=2),
    job("r1", "c", "critique", parent_id="p2", subject_from_parent=1, position=4096),
    job("q1", "a", position=512, owner="ada", client="curl/8", think='{"on": true}', options='{"k": 1}'),
    job("e1", "b", "embed", endpoint="/api/embed", request='{"path": "/api/embed"}', position=100),
    job("x1", "c", state="failed", error="boom"),
    # runs: p1's (running, no progress for long: stale), p2's (done; old-style text then chunks),
    # b2's and c3's running heads (b2 past the grace after Ollama finished; c3 past c's own max)
    f"INSERT INTO run (id, job_id, node, model, started_at, progress_at)"
    f" VALUES (1, 'p1', 'a', 'm', '{T0}', '{LONG_AGO}')",
    f"INSERT INTO run (id, job_id, node, model, state, started_at, progress_at, finished_at, output, thinking)"
    f" VALUES (2, 'p2', 'b', 'm', 'done', '{T0}', '{T0}', '{T0}', 'old ', 'hmm ')",
    "INSERT INTO run_chunk (run_id, seq, at, output, thinking) VALUES (2, 2, 'x', 'world', NULL),"
    " (2, 1, 'x', 'hello ', 'so '), (1, 1, 'x', NULL, 'thinking…')",
    job("b2", "b", state="running", run_id=3, position=1),
    f"INSERT INTO run (id, job_id, node, model, started_at, progress_at, work_done_at) VALUES"
    f" (3, 'b2', 'b', 'm', '{FAR_AHEAD}', '{FAR_AHEAD}', '{LONG_AGO}')",
    job("c3", "c", state="running", run_id=4, position=1),
    f"INSERT INTO run (id, job_id, node, model, started_at, progress_at)"
    f" VALUES (4, 'c3', 'c', 'm', '{LONG_AGO}', '{FAR_AHEAD}')",
    "INSERT INTO event (job_id, at, to_state, actor, run_id) VALUES ('p1', 'x', 'running', 'router', 1)",
]

VIEWS = {
    # Every column of job, by name: each engine keeps its own column order (SQLite's long values
    # last, migrations 005 and 016), and the view is `SELECT j.*`.
    "ready_job": "SELECT id, kind, state, node, model, model_pinned, parent_id, group_id, position, placement,"
    " run_id, error, findings, timeout_s, created_at, finished_at, subject_from_parent, think,"
    " options, endpoint, owner, client, lane, prompt_excerpt, prompt_bytes, request, prompt"
    " FROM ready_job ORDER BY id",
    "held_job": "SELECT * FROM held_job ORDER BY id",
    "run_text": "SELECT * FROM run_text ORDER BY run_id, seq",
    "run_output": "SELECT * FROM run_output ORDER BY run_id",
    "stale_setting": "SELECT * FROM stale_setting",
    "stale_heads": "SELECT * FROM stale_heads ORDER BY id",
    "node_load": "SELECT node, queued, running FROM node_load WHERE queued + running > 0 ORDER BY node",
    "job": "SELECT id, prompt_excerpt, prompt_bytes, lane, model_pinned FROM job ORDER BY id",
}


def answers(db: sqlite3.Connection | psycopg.Connection) -> dict[str, list[tuple]]:
    got = {name: [tuple(r) for r in db.execute(sql).fetchall()] for name, sql in VIEWS.items()}
    staleness = db.execute("SELECT id, rank, reason, since, stale_at FROM head_staleness ORDER BY id, rank").fetchall()
    got["head_staleness"] = [(*r[:4], None if r[4] is None else round(r[4], 6)) for r in staleness]
    return got


CHANGES = [  # the same writes in both, then the same answers again (node counts, held, ready)
    "UPDATE job SET state = 'done', finished_at = 'x' WHERE id = 'p1'",
    "UPDATE run SET state = 'done', finished_at = 'x' WHERE id = 1",
    "UPDATE job SET node = 'a' WHERE id = 'e1'",
    "UPDATE job SET state = 'failed', finished_at = 'x' WHERE id = 'b2'",
    "UPDATE job SET state = 'running' WHERE id = 'h1'",
    "DELETE FROM job WHERE id = 'q1'",
    "UPDATE job SET state = 'queued', finished_at = NULL, error = NULL WHERE id = 'x1'",
    "DELETE FROM run WHERE id = 1",
]


def test_the_views_answer_as_sqlites_for_the_same_rows(litedb, pgdb):
    both(litedb, pgdb, *ROWS)
    lite, ours = answers(litedb), answers(pgdb)
    assert ours == lite
    # the cases are all there: a held critique, ready jobs, text in pieces, every staleness reason
    assert [r[0] for r in lite["held_job"]] == ["h1"]
    assert {r[0] for r in lite["ready_job"]} == {"h2", "r1", "q1", "e1"}
    assert lite["run_output"][1][3:] == ("old hello world", "hmm so ")
    assert [r[:1] + r[4:5] for r in lite["stale_heads"]] == [
        ("b2", "ollama finished but the job was not closed"),
        ("c3", "ran past max_runtime"),
        ("p1", "ran past max_runtime"),
    ]
    [p1] = [r for r in lite["job"] if r[0] == "p1"]
    assert p1[1:3] == (("ünïcödé " * 60)[:300], len("ünïcödé ".encode()) * 60)  # characters; bytes
    for sql in CHANGES:
        both(litedb, pgdb, sql)
        assert answers(pgdb) == answers(litedb), sql
    assert pgdb.execute("SELECT count(*) FROM event WHERE run_id IS NULL").fetchone()[0] == 1  # run 1 went
    assert pgdb.execute("SELECT count(*) FROM run_chunk WHERE run_id = 1").fetchone()[0] == 0


def test_a_rolled_back_write_takes_its_counts_back(pgdb):
    pgdb.execute(NODES[0])
    pgdb.execute(job("j"))
    with pytest.raises(psycopg.errors.CheckViolation):
        with pgdb.transaction():
            pgdb.execute(job("k"))
            pgdb.execute("UPDATE node_load SET running = -1")
    assert pgdb.execute("SELECT queued, running FROM node_load").fetchall() == [(1, 0)]


# -- the wake-up -------------------------------------------------------------------------------


def test_a_state_change_notifies_its_ids_at_commit_and_a_rolled_back_one_never(pg_dsn, pgdb):
    with connect(pg_dsn) as listener:
        listener.execute("LISTEN gpuq_job")
        pgdb.execute(NODES[0])
        pgdb.execute(job("j"))
        with pytest.raises(psycopg.errors.CheckViolation):
            with pgdb.transaction():
                pgdb.execute("UPDATE job SET state = 'cancelled', finished_at = 'x' WHERE id = 'j'")
                pgdb.execute("UPDATE node_load SET running = -1")  # the write fails: rolled back
        pgdb.execute("UPDATE job SET state = 'running' WHERE id = 'j'")
        pgdb.execute("UPDATE job SET error = 'not a change of state' WHERE id = 'j'")
        pgdb.execute("DELETE FROM job WHERE id = 'j'")
        got = [(n.channel, json.loads(n.payload)) for n in listener.notifies(timeout=30, stop_after=3)]
    assert [channel for channel, _ in got] == ["gpuq_job"] * 3
    assert [payload for _, payload in got] == [  # created, claimed, deleted: never the rolled-back cancel
        {"id": "j", "node": "a", "state": "queued"},
        {"id": "j", "node": "a", "state": "running"},
        {"id": "j", "node": "a", "state": "running"},
    ]
