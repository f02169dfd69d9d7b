"""The store's seam to PostgreSQL, the engine for several routers sharing one queue (issue 27).
So far its migration runner only, the twin of gpuq/store/sqlite.py's: migrations/postgres/NNN_*.sql
applied in order, each in its own transaction with its schema_migration row, each under one
advisory lock, so two routers starting together against one database migrate it once (the second
waits, then finds each version applied). The driver is psycopg 3; the connection is passed in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import GpuqError
from ..models import iso
from ..shipped import shipped_dir

if TYPE_CHECKING:  # psycopg is needed only where PostgreSQL is configured
    import psycopg

# The advisory lock's key, one bigint for the whole database: 'gpuq' in ASCII, then 'mig'.
MIGRATE_LOCK = 0x67707571_006D6967

SCHEMA_MIGRATION = ("CREATE TABLE IF NOT EXISTS schema_migration ("
                    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")


# migrations/postgres/, shipped as the package gpuq.store.migrations.postgres (pyproject.toml).
MIGRATIONS_DIR = shipped_dir("store.migrations.postgres")


def migrate(conn: psycopg.Connection, files: list[Path], now: float, where: str) -> None:
    """Apply migrations/postgres/NNN_*.sql in order, each with its record, in its own transaction.

    `conn` is in autocommit mode (each migration opens its own transaction); `where` names the
    database in an error (its DSN without the password). Each transaction takes the advisory lock
    first and reads what is applied under it: a second router starting at the same moment waits
    for the first's migration to commit, then finds it applied and skips it. A transaction's lock
    (not a session's) goes with its commit, its rollback or its dead connection, and works through
    a transaction-pooling PgBouncer too."""
    if not conn.autocommit:
        raise ValueError("migrate needs a connection in autocommit mode: each migration is its own transaction")
    known = {int(f.name[:3]): f for f in files}
    with _locked(conn):
        conn.execute(SCHEMA_MIGRATION)
        applied = {r[0] for r in conn.execute("SELECT version FROM schema_migration")}
    newer = sorted(applied - set(known))
    if newer:
        raise GpuqError(
            f"{where} was written by a newer gpuq (schema version {newer[-1]}; this gpuq "
            f"knows up to {max(known)}); upgrade gpuq or use another database", status=2)
    for version, f in sorted(known.items()):
        if version not in applied:
            _apply_migration(conn, version, f, now)


@contextmanager
def _locked(conn: psycopg.Connection) -> Iterator[None]:
    """A transaction holding the migrations' advisory lock. READ COMMITTED, so each statement after
    the lock sees what the router that held it before committed."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        yield


def _apply_migration(conn: psycopg.Connection, version: int, f: Path, now: float) -> None:
    """One migration and its record, committed together or not at all (PostgreSQL's DDL is
    transactional: a migration that fails half-way leaves nothing behind)."""
    with _locked(conn):
        if conn.execute("SELECT 1 FROM schema_migration WHERE version = %s", (version,)).fetchone():
            return  # another router applied it while this one waited for the lock
        conn.execute(f.read_text(encoding="utf-8"))  # without parameters: the whole script at once
        conn.execute("INSERT INTO schema_migration VALUES (%s, %s, %s)", (version, f.stem, iso(now)))
