"""The store's two engines behind one written interface: what the verbs, the writer and
the store's core ask of an engine, written down as Protocols the type checker holds both engines to.

An engine is a module: gpuq/store/sqlite.py (a file's path: one router) or gpuq/store/postgres.py
(a `postgresql://` DSN: several routers on one queue). `Engine` is its face: the few statements
written in its own dialect, the write transaction's BEGIN, its errors and their mapping to gpuq's.
`Connection` (with its `Cursor`) is the writer's connection as the verbs use it: sqlite3's own, or
postgres.Connection, which takes the verbs' SQL (sqlite3's placeholders) as sqlite3 does.

`ENGINES` is the dialect switch, typed: each module is checked against `Engine` there (mypy
--strict, pyproject.toml), so a name one engine lacks, or spells with another type, fails the
check. What is not in the Protocol differs by engine on purpose and the core (core.py) calls it on the
module itself: how a connection is opened (a file with its pragmas and size cap; a DSN with a
connect timeout), the readers (aiosqlite's thread; psycopg's pool), the migration runner (its
arguments name the file, or the DSN without its password) and PostgreSQL's watch of other
routers' changes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from ..errors import GpuqError
from . import postgres, sqlite

# A statement's parameters: by position (`?`) or by name (`:name`), as sqlite3 takes them.
Params = Sequence[Any] | Mapping[str, Any]


class Cursor(Protocol):
    """A statement's result, as the verbs read it. Its rows are read by position (row[0]) and by
    column name (row["id"]), and dict(row): sqlite3.Row, postgres.Row. They are `Any`: a row's
    columns are whatever its SQL selects."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """The writer's connection (sqlite3.Connection, postgres.Connection): the verbs' one handle on
    the database, inside the transaction the writer opened (writer.py)."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, parameters: Params = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Iterable[Sequence[Any]], /) -> Cursor: ...

    def close(self) -> None: ...


class Engine(Protocol):
    """An engine module's face: the same names in both, each in its engine's words."""

    @property
    def Error(self) -> type[Exception]:
        """The driver's base error (sqlite3.Error, psycopg.Error): what `from_error` maps."""

    # The writer's transaction: BEGIN IMMEDIATE; PostgreSQL's BEGIN and its one write lock.
    BEGIN_WRITE: str
    # The running heads stale at :now (ISO text), each with the first reason that holds.
    STALE_SQL: str
    # A done critique's findings (a JSON array in job.findings): how many, the highest severity.
    FINDING_COUNT: str
    TOP_SEVERITY: str
    # Users' max_running, a JSON object bound as :limits, read as rows `l` of (key, value).
    LIMITS_ROWS: str
    LIMIT_VALUE: str
    # The operator that matches text ignoring ASCII case (history's search).
    LIKE: str
    # The stored columns of the table bound as :table, each a row {name}.
    COLUMNS_SQL: str

    def seconds_between(self, start: str, end: str) -> str:
        """SQL for the seconds from `start` to `end`, two columns of ISO-8601 text."""

    def whole(self, expr: str) -> str:
        """SQL for the whole part of `expr`, a number never negative (a usage step's index)."""

    def byte_length(self, text: str) -> str:
        """SQL for the UTF-8 bytes of a text column, 0 for NULL."""

    def indexed_by(self, index: str) -> str:
        """SQL that pins a read to its index, where the engine's planner needs it ('' if not)."""

    def from_error(self, exc: BaseException) -> GpuqError:
        """The one mapping of the engine's error to what a user sees."""


# The dialect switch. Typed: mypy checks each engine module against Engine here.
ENGINES: dict[str, Engine] = {"sqlite": sqlite, "postgres": postgres}


def engine_for(database: object) -> Engine:
    """The engine of a database: PostgreSQL for a `postgresql://` DSN, else SQLite (a file's path)."""
    return ENGINES["postgres" if postgres.is_dsn(database) else "sqlite"]


def dialect(db: Connection) -> Engine:
    """The engine whose SQL the writer's connection `db` speaks, for the few statements written
    per engine."""
    return ENGINES["postgres" if isinstance(db, postgres.Connection) else "sqlite"]
