"""The store's seam to PostgreSQL, the engine for several routers sharing one queue: the
twin of gpuq/store/sqlite.py, under the same names. The migration runner (migrations/postgres/NNN_*.sql
in order, each in its own transaction with its schema_migration row, each under one advisory lock,
so two routers starting together migrate once), the SQL that is PostgreSQL's own dialect, the
writer's connection (psycopg 3, chosen by bench/postgres.py) that takes the verbs' SQL as sqlite3's
does, the readers' pool, and the mapping of PostgreSQL's errors to gpuq's. psycopg is imported
at start-up (a main dependency, with its binary libpq: nothing else to install)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..config import safe_dsn as safe_dsn  # postgres.safe_dsn: the DSN without its password, config's
from ..errors import GUARD_MESSAGE, GpuqError, GuardRefused, NewerSchema, SchemaViolated, StoreUnavailable
from ..jobs import iso
from ..shipped import shipped_dir

Error = psycopg.Error

# The advisory lock's key, one bigint for the whole database: 'gpuq' in ASCII, then 'mig'.
MIGRATE_LOCK = 0x67707571_006D6967

SCHEMA_MIGRATION = (
    "CREATE TABLE IF NOT EXISTS schema_migration ("
    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
)


# migrations/postgres/, shipped as the package gpuq.store.migrations.postgres (pyproject.toml).
MIGRATIONS_DIR = shipped_dir("store.migrations.postgres")


def migrate(conn: psycopg.Connection[Any], files: list[Path], now: float, where: str) -> None:
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
        raise NewerSchema(where, newer, max(known))
    for version, f in sorted(known.items()):
        if version not in applied:
            _apply_migration(conn, version, f, now)


@contextmanager
def _locked(conn: psycopg.Connection[Any]) -> Iterator[None]:
    """A transaction holding the migrations' advisory lock. READ COMMITTED, so each statement after
    the lock sees what the router that held it before committed."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK,))
        yield


def _apply_migration(conn: psycopg.Connection[Any], version: int, f: Path, now: float) -> None:
    """One migration and its record, committed together or not at all (PostgreSQL's DDL is
    transactional: a migration that fails half-way leaves nothing behind)."""
    with _locked(conn):
        if conn.execute("SELECT 1 FROM schema_migration WHERE version = %s", (version,)).fetchone():
            return  # another router applied it while this one waited for the lock
        conn.execute(f.read_text(encoding="utf-8"))  # without parameters: the whole script at once
        conn.execute("INSERT INTO schema_migration VALUES (%s, %s, %s)", (version, f.stem, iso(now)))


# -- the engine's dialect: the names gpuq/store/sqlite.py has, in PostgreSQL's words -----------

# The writer's transaction: READ COMMITTED, then the queue's one write lock, taken first and held
# to the commit. The verbs read and then write (a queue's positions, the claim's "nothing runs on
# the node", placement's counts), as they do on SQLite under BEGIN IMMEDIATE, so two routers'
# transactions never interleave: one writer at a time across all routers, each router still
# group-committing the writes that arrive together (writer.py). A transaction's lock goes with
# its commit, its rollback or its dead connection.
WRITE_LOCK = 0x67707571_00717565  # 'gpuq', then 'que'
BEGIN_WRITE = f"BEGIN ISOLATION LEVEL READ COMMITTED; SELECT pg_advisory_xact_lock({WRITE_LOCK})"


def seconds_between(start: str, end: str) -> str:
    """SQL for the seconds from `start` to `end`, two columns of ISO-8601 text (never negative)."""
    return f"GREATEST((julianday({end}) - julianday({start})) * 86400.0, 0)"


def whole(expr: str) -> str:
    """SQL for the whole part of a number never negative (a usage step's index)."""
    return f"FLOOR({expr})::bigint"


FINDING_COUNT = "json_array_length(findings::json)"
TOP_SEVERITY = (
    "(SELECT f.value ->> 'severity' FROM json_array_elements(findings::json) f(value) ORDER BY"
    " CASE f.value ->> 'severity' WHEN 'high' THEN 0 WHEN 'medium' THEN 1 ELSE 2 END LIMIT 1)"
)

# The running heads stale at :now, each with the first reason that holds (the view stale_heads
# with the caller's clock for 'now'; SQLite's takes MIN(rank) in a GROUP BY, here DISTINCT ON).
STALE_SQL = """SELECT DISTINCT ON (id) id, node, state, since, reason, run_id FROM head_staleness
    WHERE stale_at < julianday(:now) ORDER BY id, rank"""

# Users' max_running, a JSON object {user: limit} bound as :limits: its rows as (key, value).
LIMITS_ROWS = "json_each_text(:limits) l(key, value)"
LIMIT_VALUE = "l.value::bigint"

# SQLite's LIKE ignores ASCII case; history's text search keeps doing so here.
LIKE = "ILIKE"

# A table's columns (:table), in gpuq's schema.
COLUMNS_SQL = """SELECT column_name AS name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = :table ORDER BY ordinal_position"""


def byte_length(text: str) -> str:
    """SQL for the UTF-8 bytes of a text column (0 for NULL): what retention says it frees."""
    return f"COALESCE(octet_length({text}), 0)"


def indexed_by(index: str) -> str:
    """SQLite's INDEXED BY pins a plan; PostgreSQL's planner has no such hint (and needs none)."""
    return ""


# -- connections --------------------------------------------------------------------------------

_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|::|:(\w+)|\?|%")


@lru_cache(maxsize=1024)
def translate(sql: str) -> str:
    """The verbs' SQL, written with sqlite3's placeholders (`?`, `:name`), in psycopg's
    (`%s`, `%(name)s`); every literal `%` doubled (psycopg reads them in quoted text too); `?`
    and `:` in quoted text and `::` casts left alone."""

    def one(m: re.Match[str]) -> str:
        token = m.group(0)
        if m.group(1):
            return f"%({m.group(1)})s"
        return {"?": "%s", "%": "%%", "::": "::"}.get(token, token.replace("%", "%%"))

    return _TOKEN.sub(one, sql)


class Row:
    """A row read by position (row[0]) and by column name (row["id"]), and dict(row): what
    sqlite3.Row gives the verbs."""

    __slots__ = ("_values", "_index")

    def __init__(self, values: tuple[Any, ...], index: dict[str, int]):
        self._values, self._index = values, index

    def __getitem__(self, key: int | str) -> Any:
        return self._values[key if isinstance(key, (int, slice)) else self._index[key]]

    def keys(self) -> list[str]:
        return list(self._index)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Row({dict(zip(self._index, self._values))!r})"


def row_factory(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    index = {c.name: i for i, c in enumerate(cursor.description or ())}
    return lambda values: Row(tuple(values), index)


class Connection:
    """The writer's connection: a psycopg connection in autocommit mode (the writer's BEGIN
    opens each transaction) that takes the verbs' SQL as sqlite3's connection does. A connection
    the server dropped (a restart, a failover) is opened again before the next transaction, never
    inside one: the batch that met the break fails whole, loudly, and nothing is half-stored."""

    def __init__(self, dsn: str, connect_timeout_s: float):
        self._dsn, self._timeout = dsn, connect_timeout_s
        self._conn = self._open()

    def _open(self) -> psycopg.Connection[Row]:
        return psycopg.Connection[Row].connect(
            self._dsn, autocommit=True, row_factory=row_factory, connect_timeout=max(int(self._timeout), 1)
        )

    @property
    def in_transaction(self) -> bool:
        return self._conn.info.transaction_status in (
            TransactionStatus.INTRANS,
            TransactionStatus.INERROR,
            TransactionStatus.ACTIVE,
        )

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = (), /) -> psycopg.Cursor[Row]:
        if self._conn.broken or self._conn.closed:
            if not sql.startswith("BEGIN"):  # mid-transaction: never go on in another session
                raise psycopg.OperationalError(
                    "the connection to the database broke inside a transaction; nothing of it was committed"
                )
            self._conn = self._open()
        if not params:  # sent as written: psycopg reads no placeholders then (a script may be several statements)
            return self._conn.execute(sql)
        return self._conn.execute(translate(sql), params)

    @property
    def backend_pid(self) -> int | None:
        """The server process of this connection: a notice it sent carries it."""
        return None if self._conn.closed else self._conn.info.backend_pid

    @property
    def raw(self) -> psycopg.Connection[Row]:
        """The psycopg connection itself (the migration runner's)."""
        return self._conn

    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> psycopg.Cursor[Row]:
        cur = self._conn.cursor()
        cur.executemany(translate(sql), list(params))
        return cur

    def close(self) -> None:
        self._conn.close()


def connect_writer(dsn: str, connect_timeout_s: float) -> Connection:
    return Connection(dsn, connect_timeout_s)


# The readers' pool; its connections make Rows (connect_reader's row_factory).
Pool = AsyncConnectionPool[psycopg.AsyncConnection[Row]]


async def connect_reader(dsn: str, connect_timeout_s: float, size: int = 4) -> Pool:
    """The readers' pool: reads in autocommit, each its own snapshot, several at once (a slow
    listing does not hold /health's read up). A connection the server dropped is replaced."""
    pool: Pool = AsyncConnectionPool(
        dsn,
        min_size=1,
        max_size=size,
        open=False,
        timeout=connect_timeout_s,
        check=AsyncConnectionPool.check_connection,
        kwargs={"autocommit": True, "row_factory": row_factory},
    )
    try:
        await pool.open(wait=True, timeout=connect_timeout_s)
    except PoolTimeout as exc:  # the server's own refusal is in the pool's log; say it as psycopg does
        await pool.close()
        raise psycopg.OperationalError(f"no connection to the server within {connect_timeout_s:g}s ({exc})") from exc
    return pool


async def fetchall(pool: Pool, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Row]:
    try:
        async with pool.connection() as conn:
            cur = await conn.execute(translate(sql), params) if params else await conn.execute(sql)
            return await cur.fetchall()
    except PoolTimeout as exc:  # every connection busy or none can be made: the server is not answering
        raise psycopg.OperationalError(str(exc)) from exc


# -- errors -------------------------------------------------------------------------------------


def from_postgres(exc: BaseException) -> GpuqError:
    """The one mapping of a PostgreSQL error to what a user sees, by its SQLSTATE (the twin of
    sqlite.from_sqlite): the guard's refusal is 409; a write the schema refuses is gpuq's own bug,
    a 500 naming the rule; a server that cannot be reached, is shutting down, is out of disk or
    cancelled the statement is a 503 (retry later). Nothing was changed in every case."""
    state = getattr(exc, "sqlstate", None) or ""
    diag = getattr(exc, "diag", None)
    text = (getattr(diag, "message_primary", None) or str(exc)).strip()
    if text == GUARD_MESSAGE:
        return GuardRefused()
    if state.startswith("23"):
        rule = getattr(diag, "constraint_name", None) or text
        return SchemaViolated(
            f"the database refused a write that breaks its rule {rule} ({text}): a bug in"
            " gpuq, please report it; nothing was changed",
            constraint=rule,
        )
    if state.startswith(("53", "58")):  # insufficient resources (disk full), system error
        return StoreUnavailable(f"the database cannot be written: {text}; nothing was changed")
    if state == "25006":
        return StoreUnavailable(f"the database is read-only: {text}; nothing was changed")
    if state.startswith(("08", "57", "40")) or not state:  # connection, shutdown/cancel, deadlock
        return StoreUnavailable(f"the database is not answering: {text}; nothing was changed")
    return StoreUnavailable(f"database error: {text}; nothing was changed")


from_error = from_postgres


def is_dsn(database: object) -> bool:
    """A PostgreSQL connection string (libpq's URI), not a SQLite file's path."""
    return isinstance(database, str) and database.startswith(("postgresql://", "postgres://"))


# -- other routers' changes ---------------------------------------------------------------------

CHANNEL = "gpuq_job"  # the trigger job_notify's: {"id", "node", "state"} of each job that changed


async def watch(
    dsn: str,
    connect_timeout_s: float,
    on_change: Callable[[dict[str, Any] | None], None],
    own_pid: Callable[[], int | None],
    poll_s: float,
) -> None:
    """Tell `on_change` of every job change another router commits: its notice's payload
    ({id, node, state}), or None for "something changed, look at everything" (at each connect,
    when changes happened unseen). A notice from this router's own writer is skipped.

    LISTEN on a connection of its own; and, as NOTIFY never reaches a client behind a
    transaction-pooling PgBouncer, a poll: each `poll_s` without a notice, the newest event's id
    is read, and a change no notice told of is still seen within `poll_s`. Returns when the
    connection fails (the caller's loop supervisor starts it again)."""
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, connect_timeout=max(int(connect_timeout_s), 1)
    ) as conn:
        await conn.execute(f"LISTEN {CHANNEL}")
        on_change(None)  # what changed before this LISTEN, no notice will tell
        newest = None
        while True:
            told = False
            async for notice in conn.notifies(timeout=poll_s):
                told = True
                if notice.pid != own_pid():
                    try:
                        on_change(json.loads(notice.payload))
                    except ValueError:
                        on_change(None)
            cur = await conn.execute("SELECT COALESCE(MAX(id), 0) FROM event")
            top = row[0] if (row := await cur.fetchone()) else 0
            if newest is not None and top != newest and not told:
                on_change(None)  # events no notice told of (a pooler in between?)
            newest = top
