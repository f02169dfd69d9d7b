"""Upgrades that cannot strand a database (issue 35): a database made at every earlier schema
level (SQLite's migrations applied up to N, then the jobs a lab has at that level written in that
level's own columns: queued jobs with their positions, a running job with its run, a done job
with its output, a critique of it, a front-door call) opens with today's Store, which migrates it
the rest of the way, and every job is intact and each queue in the same order. A migration that
rebuilds a table says so in the log, with the table's rows."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path

import psycopg
import pytest

from gpuq.jobs import compact_json
from gpuq.store import MIGRATIONS_DIR, Store
from gpuq.store import postgres as pg_engine

PG_MIGRATIONS_DIR = pg_engine.MIGRATIONS_DIR

FILES = sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql"))
LEVELS = [int(f.name[:3]) for f in FILES]
T = "2026-06-01T08:00:00.000000Z"
OUTPUT = "the answer ✓\nline two"
REQUEST = compact_json(
    {
        "path": "/api/chat",
        "user_agent": "ui/1",
        "body": {"model": "mb", "messages": [{"role": "user", "content": "hi"}]},
    }
)


def migrated_to(path: Path, level: int) -> sqlite3.Connection:
    """A database as gpuq of that level made it: its migrations, each with its record."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(
        "CREATE TABLE schema_migration (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    for f in FILES:
        if int(f.name[:3]) <= level:
            db.executescript("BEGIN;\n" + f.read_text(encoding="utf-8") + "\nCOMMIT;")
            db.execute("INSERT INTO schema_migration VALUES (?, ?, ?)", (int(f.name[:3]), f.stem, T))
    db.execute("PRAGMA foreign_keys = ON")
    return db


class Pg:
    """A PostgreSQL connection with the few calls the lab's rows need, in sqlite3's words."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn

    def execute(self, sql: str, params: tuple | list = ()) -> psycopg.Cursor:
        return self.conn.execute(sql.replace("?", "%s"), params or None)

    def close(self) -> None:
        self.conn.close()


def columns(db, table: str) -> set[str]:
    if isinstance(db, Pg):
        rows = db.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?", (table,))
        return {r[0] for r in rows}
    return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}


def insert(db, table: str, **values) -> int:
    """A row in the columns the table has at this level (a later column is left out)."""
    have = columns(db, table)
    values = {k: v for k, v in values.items() if k in have}
    marks = ",".join("?" * len(values))
    sql = f"INSERT INTO {table} ({','.join(values)}) VALUES ({marks})"
    if isinstance(db, Pg):
        returning = " RETURNING id" if "id" in have and "id" not in values else ""
        row = db.execute(sql + returning, list(values.values())).fetchone() if returning else None
        if not returning:
            db.execute(sql, list(values.values()))
        return row[0] if row else 0
    cur = db.execute(sql, list(values.values()))
    return cur.lastrowid or 0


def job(db, job_id: str, node: str, state: str, position: int, prompt: str, **more) -> None:
    ended = state not in ("queued", "running")
    insert(
        db,
        "job",
        id=job_id,
        kind=more.pop("kind", "task"),
        state=state,
        node=node,
        model="ma" if node == "a" else "mb",
        prompt=prompt,
        position=position,
        placement="first free by rank",
        created_at=T,
        finished_at=T if ended else None,
        owner="alice",
        lane="interactive",
        client="walk/1",
        **more,
    )
    insert(db, "event", job_id=job_id, at=T, from_state=None, to_state="queued", actor="api", reason="placed")


def run(db, job_id: str, node: str, state: str, output: str = "") -> int:
    ended = state != "running"
    old_text = "run_chunk" not in tables(db)
    run_id = insert(
        db,
        "run",
        job_id=job_id,
        node=node,
        model="ma" if node == "a" else "mb",
        state=state,
        started_at=T,
        progress_at=T,
        finished_at=T if ended else None,
        output=output if old_text else "",
        eval_count=7 if ended else None,
    )
    if output and not old_text:  # since 011 a run's text is in its chunks
        insert(db, "run_chunk", run_id=run_id, seq=1, at=T, output=output[:5], thinking=None)
        insert(db, "run_chunk", run_id=run_id, seq=2, at=T, output=output[5:], thinking=None)
    db.execute("UPDATE job SET run_id = ? WHERE id = ?", (run_id, job_id))
    return run_id


def tables(db) -> set[str]:
    if isinstance(db, Pg):
        return {
            r[0] for r in db.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'")
        }
    return {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def lab_at(db, level: int) -> dict:
    """The lab's jobs at this level; what each must still be after the upgrade."""
    for rank, (name, roles, model) in enumerate((("a", "task,critique", "ma"), ("b", "critique,task", "mb")), 1):
        insert(db, "node", name=name, url=f"http://{name}:11434", rank=rank, roles=roles, model=model)
    db.execute("BEGIN")
    # a's queue: positions out of insertion order, so the order is the positions', not the rows'
    job(db, "1780000000-0000000a", "a", "queued", 3072, "third in a's queue")
    job(db, "1780000000-0000000b", "a", "queued", 1024, "first in a's queue")
    job(db, "1780000000-0000000c", "a", "queued", 2048, "second in a's queue")
    job(db, "1780000000-0000000d", "a", "running", 0, "running on a")
    run(db, "1780000000-0000000d", "a", "running")
    job(db, "1780000000-0000000e", "a", "done", 0, "done on a")
    run(db, "1780000000-0000000e", "a", "done", OUTPUT)
    job(
        db,
        "1780000000-0000000f",
        "b",
        "done",
        0,
        "review of the done job",
        kind="critique",
        parent_id="1780000000-0000000e",
        findings="[]",
    )
    run(db, "1780000000-0000000f", "b", "done", "no findings")
    front = "endpoint" in columns(db, "job")
    if front:  # since 006: a front-door call, its route and request
        job(db, "1780000000-00000010", "b", "queued", 1024, "hi", endpoint="/api/chat", request=REQUEST)
    db.execute("COMMIT")
    return {"front": front}


async def upgraded_intact(where: str | Path, made: dict, events_before: int, levels: list[int]) -> None:
    """Open the old database with today's Store (which migrates it the rest of the way) and find
    the lab's jobs as they were: states, prompts, output, the critique's parent, the front-door
    call's request, every event, and a's queue in its order."""
    store = Store(where)
    await store.open()
    try:
        applied = [r["version"] for r in await store.read("SELECT version FROM schema_migration ORDER BY version")]
        assert applied == levels
        running, queued, count = await store.queue("a", 100)
        assert [j["id"] for j in queued] == ["1780000000-0000000b", "1780000000-0000000c", "1780000000-0000000a"]
        assert count == 3 and running is not None and running["id"] == "1780000000-0000000d"
        assert [j["prompt_excerpt"] for j in queued] == [
            "first in a's queue",
            "second in a's queue",
            "third in a's queue",
        ]
        done = await store.job_detail("1780000000-0000000e")
        assert (done["state"], done["output"], done["prompt"]) == ("done", OUTPUT, "done on a")
        assert [c["id"] for c in done["children"]] == ["1780000000-0000000f"]
        critique = await store.job_detail("1780000000-0000000f")
        assert (critique["kind"], critique["parent_id"], critique["node"], critique["output"]) == (
            "critique",
            "1780000000-0000000e",
            "b",
            "no findings",
        )
        if made["front"]:
            call = await store.job_detail("1780000000-00000010")
            assert (call["state"], call["endpoint"], call["node"]) == ("queued", "/api/chat", "b")
            assert json.loads(call["request"]) == json.loads(REQUEST)
            assert await store.whole_request("1780000000-00000010") == REQUEST
        events = await store.read("SELECT COUNT(*) AS n FROM event")
        assert events[0]["n"] == events_before
        assert await store.claim("a") is None  # a's running job still holds it: one head per node
    finally:
        await store.close()


@pytest.mark.parametrize("level", LEVELS[:-1], ids=[f"from-{n:03d}" for n in LEVELS[:-1]])
async def test_a_database_of_every_earlier_level_upgrades_with_its_jobs_and_queues_intact(tmp_path, level):
    path = tmp_path / "old.db"
    db = migrated_to(path, level)
    try:
        made = lab_at(db, level)
        events_before = db.execute("SELECT COUNT(*) FROM event").fetchone()[0]
    finally:
        db.close()
    await upgraded_intact(path, made, events_before, LEVELS)


PG_FILES = sorted(PG_MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql"))
PG_LEVELS = [int(f.name[:3]) for f in PG_FILES]


@pytest.mark.postgres
@pytest.mark.parametrize("level", PG_LEVELS[:-1], ids=[f"pg-from-{n:03d}" for n in PG_LEVELS[:-1]])
async def test_a_postgresql_database_of_every_earlier_level_upgrades_intact(pg_dsn, level):
    conn = psycopg.connect(pg_dsn, autocommit=True)
    try:
        pg_engine.migrate(conn, [f for f in PG_FILES if int(f.name[:3]) <= level], 0.0, "test")
        db = Pg(conn)
        made = lab_at(db, level)
        events_before = db.execute("SELECT COUNT(*) FROM event").fetchone()[0]
    finally:
        conn.close()
    await upgraded_intact(pg_dsn, made, events_before, PG_LEVELS)


def test_a_migration_that_rebuilds_a_table_says_so_with_its_rows(tmp_path, caplog):
    rebuilds = [n for n, f in zip(LEVELS, FILES, strict=True) if "RENAME TO job" in f.read_text()]
    assert rebuilds, "no migration rebuilds job"
    last = rebuilds[-1]
    db = migrated_to(tmp_path / "old.db", last - 1)
    try:
        lab_at(db, last - 1)
    finally:
        db.close()
    from gpuq.store import sqlite as engine  # the runner, as Store.open calls it

    db = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    try:
        with caplog.at_level(logging.INFO, logger="gpuq"):
            engine.migrate(db, FILES, 0.0, tmp_path / "old.db")
    finally:
        db.close()
    name = FILES[LEVELS.index(last)].stem
    messages = [r.getMessage() for r in caplog.records]
    jobs = 7 if last - 1 >= 6 else 6
    assert f"migration {name}: rebuilding table job ({jobs} rows)..." in messages
    assert any(m.startswith(f"migration {name}: done in ") for m in messages)


def test_a_new_database_is_made_without_rebuild_messages(tmp_path, caplog):
    """Rebuilding empty tables is quick: a database being made says nothing of rebuilds."""
    from gpuq.store import sqlite as engine

    db = sqlite3.connect(tmp_path / "new.db", isolation_level=None)
    try:
        with caplog.at_level(logging.INFO, logger="gpuq"):
            engine.migrate(db, FILES, 0.0, tmp_path / "new.db")
    finally:
        db.close()
    assert not [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()]
