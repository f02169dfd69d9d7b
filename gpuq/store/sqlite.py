"""The store's one seam to its engine, SQLite: what a second engine (PostgreSQL) would write
again, and nothing else. The connections (the writer's and the reader's, with their pragmas), the
SQL that is SQLite's own dialect (the write transaction's BEGIN, time arithmetic on ISO text,
JSON functions, the migration bookkeeping) and the mapping of sqlite3's errors to gpuq's. The verbs
and the reads write portable SQL (bound parameters, ON CONFLICT, RETURNING, views) and reach the
engine's specifics only through these names."""

from __future__ import annotations

import logging
import re
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiosqlite

from ..budget import human_bytes
from ..errors import GUARD_MESSAGE, GpuqError, GuardRefused, NewerSchema, SchemaViolated, StartupError, StoreUnavailable
from ..jobs import iso

log = logging.getLogger("gpuq")

Connection = sqlite3.Connection
Error = sqlite3.Error

# SQLite's auto_vacuum modes, as `PRAGMA auto_vacuum` reads them.
INCREMENTAL = 2

# The writer's transaction takes the write lock at its start, so a batch never fails half-way
# for want of it (a deferred BEGIN would upgrade at its first write, and could deadlock there).
BEGIN_WRITE = "BEGIN IMMEDIATE"


def seconds_between(start: str, end: str) -> str:
    """SQL for the seconds from `start` to `end`, two columns of ISO-8601 text (never negative)."""
    return f"MAX((julianday({end}) - julianday({start})) * 86400.0, 0)"


def whole(expr: str) -> str:
    """SQL for the whole part of a number never negative (a usage step's index)."""
    return f"CAST({expr} AS INTEGER)"


# A done critique's findings (a JSON array in job.findings): how many, and the highest severity.
FINDING_COUNT = "json_array_length(findings)"
TOP_SEVERITY = (
    "(SELECT json_extract(f.value, '$.severity') FROM json_each(findings) f ORDER BY"
    " CASE json_extract(f.value, '$.severity') WHEN 'high' THEN 0 WHEN 'medium' THEN 1 ELSE 2 END"
    " LIMIT 1)"
)


# The running heads stale at :now (ISO text), each with the first reason that holds: the view
# stale_heads (migration 012) with the caller's clock for 'now'. The rule is the view head_staleness.
STALE_SQL = """SELECT id, node, state, since, reason, run_id FROM (
    SELECT id, node, state, since, reason, run_id, MIN(rank) FROM head_staleness
    WHERE stale_at < julianday(:now) GROUP BY id)"""


# Users' max_running, a JSON object {user: limit} bound as :limits: its rows as (key, value).
LIMITS_ROWS = "json_each(:limits) l"
LIMIT_VALUE = "l.value"

LIKE = "LIKE"  # ignores ASCII case, as history's text search wants

# A table's stored columns (:table), generated STORED ones too (hidden 3; a virtual one, 2, takes no room).
COLUMNS_SQL = "SELECT name FROM pragma_table_xinfo(:table) WHERE hidden IN (0, 3) ORDER BY cid"


def byte_length(text: str) -> str:
    """SQL for the UTF-8 bytes of a text column (0 for NULL): what retention says it frees."""
    return f"COALESCE(length(CAST({text} AS BLOB)), 0)"


def indexed_by(index: str) -> str:
    """Pin a read to its index (the planner would otherwise scan on a few shapes, see the callers)."""
    return f" INDEXED BY {index}"


# -- connections ------------------------------------------------------------------------------


def connect_writer(path: Path, busy_timeout_s: float, max_bytes: int | None) -> sqlite3.Connection:
    """The writer's connection, opened in (and used only by) the writer's thread: WAL, every
    commit on disk before it is acknowledged (synchronous=FULL), foreign keys checked."""
    new = not path.exists() or path.stat().st_size == 0
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        db.row_factory = sqlite3.Row
        if new:  # before WAL writes the file's first page: a new database needs no VACUUM for it
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        db.execute("PRAGMA journal_mode = WAL").fetchall()
        db.execute("PRAGMA synchronous = FULL")
        db.execute("PRAGMA foreign_keys = ON")
        if max_bytes is not None:  # past it, writes fail as on a full disk: SQLITE_FULL
            page_size = db.execute("PRAGMA page_size").fetchone()[0]
            # Read to its end: a statement left with a row to give keeps the connection
            # reading, and a migration that drops a table then fails with "table is locked".
            db.execute(f"PRAGMA max_page_count = {max(max_bytes // page_size, 1)}").fetchall()
    except BaseException:
        db.close()
        raise
    return db


def _dict_rows() -> Callable[[sqlite3.Cursor, tuple[Any, ...]], dict[str, Any]]:
    """Rows as dicts, made in the reader's thread as they are fetched: the event loop then has
    nothing to convert (a listing of 300 jobs was 300 dict(sqlite3.Row) on the loop, which a
    /health waited behind). The column names are read once per statement."""
    last: list[Any] = [None, ()]

    def make(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
        if cursor.description is not last[0]:
            last[:] = [cursor.description, tuple(d[0] for d in cursor.description)]
        return dict(zip(last[1], row))

    return make


async def connect_reader(path: Path, busy_timeout_s: float) -> aiosqlite.Connection:
    """The readers' connection (aiosqlite's thread), beside the writer's: WAL lets it in."""
    conn = await aiosqlite.connect(path, isolation_level=None)
    conn.row_factory = _dict_rows()  # type: ignore[assignment]  # (aiosqlite types it as a class; sqlite3 takes any callable)
    await conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
    await conn.execute("PRAGMA foreign_keys = ON")
    return conn


# -- migrations -------------------------------------------------------------------------------


def migrate(db: sqlite3.Connection, files: list[Path], now: float, path: Path) -> None:
    """Apply migrations/NNN_*.sql in order, each with its record, in its own transaction."""
    known = {int(f.name[:3]): f for f in files}
    db.execute(
        "CREATE TABLE IF NOT EXISTS schema_migration ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    applied = refuse_newer(db, known, path)
    # Foreign keys off while migrating, as SQLite's table rebuild procedure asks (a rebuild
    # drops a table others refer to), and checked before each commit instead.
    db.execute("PRAGMA foreign_keys = OFF")
    try:
        for version, f in sorted(known.items()):
            if version not in applied:
                _apply_migration(db, version, f, now)
    finally:
        db.execute("PRAGMA foreign_keys = ON")
    make_incremental(db, path)


def make_incremental(db: sqlite3.Connection, path: Path) -> float | None:
    """auto_vacuum = INCREMENTAL, so the pages a retention sweep frees go back to the disk
    (give_back). A database made before 017 needs one full VACUUM for it (it rewrites the file,
    and cannot run inside a transaction): done here once, at the start after the upgrade, and
    logged with its time. Returns the seconds it took, or None when there was nothing to do."""
    if db.execute("PRAGMA auto_vacuum").fetchone()[0] == INCREMENTAL:
        return None
    size = path.stat().st_size if path.exists() else 0
    log.info("database %s (%d MB): a one-time VACUUM for auto_vacuum = INCREMENTAL ...", path, size >> 20)
    started = time.monotonic()
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("VACUUM")
    took = time.monotonic() - started
    log.info("database %s: VACUUM done in %.1fs; retention's sweeps now give freed space back", path, took)
    return took


def give_back(db: sqlite3.Connection, pages: int) -> int:
    """After a sweep: up to `pages` free pages go back to the file system (auto_vacuum =
    INCREMENTAL), a bounded step so the writer is held briefly; returns how many went. Run
    outside a transaction (it is one of its own). executescript, because sqlite3's execute steps
    `incremental_vacuum` once, which frees one page."""
    free = int(db.execute("PRAGMA freelist_count").fetchone()[0])
    if free:
        db.executescript(f"PRAGMA incremental_vacuum({int(pages)});")
    return free - int(db.execute("PRAGMA freelist_count").fetchone()[0])


def compact(db: sqlite3.Connection) -> float:
    """The whole file rewritten without the space pruned rows left empty inside their pages,
    which incremental_vacuum (whole free pages only) cannot give back; then the WAL, which the
    rewrite filled, truncated. Outside a transaction (VACUUM cannot run in one). Its seconds."""
    started = time.monotonic()
    db.execute("VACUUM")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return time.monotonic() - started


def refuse_newer(db: sqlite3.Connection, known: Iterable[int], where: object) -> set[int]:
    """The migrations applied to `db`; NewerSchema when one is newer than this gpuq knows (a
    newer gpuq wrote it): the store's start and a restore's check both refuse it here."""
    known = set(known)
    applied = {int(r[0]) for r in db.execute("SELECT version FROM schema_migration")}
    newer = sorted(applied - known)
    if newer:
        raise NewerSchema(where, newer, max(known))
    return applied


log = logging.getLogger("gpuq")

# A migration that rebuilds a table (SQLite's way to change a column or a rule: copy the rows into
# a new table, drop the old, rename the new) ends with this rename; its time grows with the rows.
REBUILD = re.compile(r"ALTER\s+TABLE\s+\w+\s+RENAME\s+TO\s+(\w+)", re.IGNORECASE)
PROGRESS_S = 5.0  # a long migration says it is still at work this often
PROGRESS_STEPS = 200_000  # SQLite's virtual machine steps between two looks at the clock


def rebuilt_tables(script: str) -> list[str]:
    """The tables a migration script rebuilds (it renames a new table to their name)."""
    return list(dict.fromkeys(REBUILD.findall(script)))


def announce_rebuilds(db: sqlite3.Connection, name: str, tables: list[str]) -> bool:
    """Say, before a migration that rebuilds tables runs, which and how many rows each holds:
    on a large database it takes a while, and the router answers nothing meanwhile. Silent
    (False) when they hold nothing, as in a database being made: a quick rebuild needs no word."""
    counts = {}
    for table in tables:
        exists = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        counts[table] = db.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0] if exists else 0
    if not any(counts.values()):
        return False
    for table, rows in counts.items():
        log.info("migration %s: rebuilding table %s (%d rows)...", name, table, rows)
    return True


def still_at_work(name: str, started: float) -> Callable[[], int]:
    """SQLite's progress handler during a rebuild: every PROGRESS_S, a log line saying the
    migration still runs and for how long (SQLite cannot say how far a statement has got)."""
    said = [started]

    def tick() -> int:
        now = time.monotonic()
        if now - said[0] >= PROGRESS_S:
            said[0] = now
            log.info("migration %s: still rebuilding, %.0fs so far", name, now - started)
        return 0  # 0: go on

    return tick


def _apply_migration(db: sqlite3.Connection, version: int, f: Path, now: float) -> None:
    script = f.read_text(encoding="utf-8")
    started = time.monotonic()
    rebuilt = announce_rebuilds(db, f.stem, rebuilt_tables(script))
    if rebuilt:
        db.set_progress_handler(still_at_work(f.stem, started), PROGRESS_STEPS)
    try:  # executescript runs the script in the transaction it opens; its record joins it
        db.executescript(f"{BEGIN_WRITE};\n" + script)
        broken = db.execute("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise StartupError(
                f"migration {f.name} would leave {len(broken)} broken reference(s), "
                f"the first in table {broken[0][0]}; nothing was changed"
            )
        db.execute("INSERT INTO schema_migration VALUES (?, ?, ?)", (version, f.stem, iso(now)))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    finally:
        if rebuilt:
            db.set_progress_handler(None, 0)
    if rebuilt:
        log.info("migration %s: done in %.1fs", f.stem, time.monotonic() - started)


# -- errors -----------------------------------------------------------------------------------


def from_sqlite(exc: BaseException) -> GpuqError:
    """The one mapping of a database error to what a user sees, by SQLite's own error name.
    A store that is busy or cannot be written is a 503 (retry later); a write the schema
    refuses is gpuq's own bug, a 500 naming the rule it broke (retrying cannot help)."""
    name, text = getattr(exc, "sqlite_errorname", None) or "", str(exc)
    if name == "SQLITE_CONSTRAINT_TRIGGER" and text == GUARD_MESSAGE:
        return GuardRefused()
    if name.startswith("SQLITE_CONSTRAINT"):
        rule = text.split("constraint failed: ", 1)[1] if "constraint failed: " in text else text
        return SchemaViolated(
            f"the database refused a write that breaks its rule {rule} ({text}): a bug in"
            " gpuq, please report it; nothing was changed",
            constraint=rule,
        )
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreUnavailable(f"the database is locked by another process ({text}); nothing was changed")
    if name.startswith(("SQLITE_FULL", "SQLITE_IOERR")):
        return StoreUnavailable(f"the database cannot be written: {text}; nothing was changed")
    if name.startswith("SQLITE_READONLY"):
        return StoreUnavailable(f"the database is read-only: {text}; nothing was changed")
    return StoreUnavailable(f"database error: {text}; nothing was changed")


from_error = from_sqlite


def cap_reached(exc: BaseException, db: sqlite3.Connection, path: Path, max_bytes: int) -> GpuqError | None:
    """A write refused as full (SQLITE_FULL) that router.max_database_bytes refused, not the disk:
    the error naming the cap. The cap is the database's pages (page_count x page_size, free pages
    included; not the WAL); the tighter of its room and the disk's free space is what ran out.
    None for any other error. In the writer's thread, on its connection (after the rollback)."""
    if not (getattr(exc, "sqlite_errorname", None) or "").startswith("SQLITE_FULL"):
        return None
    page_size = int(db.execute("PRAGMA page_size").fetchone()[0])
    pages = int(db.execute("PRAGMA page_count").fetchone()[0])
    cap_pages = int(db.execute("PRAGMA max_page_count").fetchone()[0])
    room = max(cap_pages - pages, 0) * page_size
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    if free is not None and free <= room:  # the disk had less room than the cap left: the disk is full
        return None
    return StoreUnavailable(
        f"the database cannot be written: it reached router.max_database_bytes ({human_bytes(max_bytes)};"
        f" {human_bytes(pages * page_size)} of pages, the WAL not counted); raise it (gpuq.toml, then a"
        " restart) or prune what the queue no longer needs; nothing was changed"
    )
