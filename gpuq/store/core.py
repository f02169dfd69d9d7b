"""The store's core: its engine, its connections (the one writer and the readers), migrations,
its health as the router lives it, and the two ways in: `_write` (every write, through the one
writer thread: writer.py) and `read`. Every part of Store (facade.py) is a Core.

`write`, `write_untimed` and `write_limited` make a Store method of a verb (a plain function of
the writer's connection, lifecycle.py's and the others'): the method runs the verb through
`_write` with what the store gives every write first (its clock's now; users' max_running),
then the caller's arguments, as the verb's signature types them."""

from __future__ import annotations

import asyncio
import functools
import inspect
import sqlite3
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

import aiosqlite

from ..errors import StartupError, StoreUnavailable
from ..jobs import NodeInfo
from ..shipped import shipped_dir, shipped_files
from . import lifecycle, postgres, sqlite
from .dbfile import DatabaseFile
from .engine import Connection, Engine, Params, engine_for
from .health import SLOW_CALL_S, Health
from .steps import Row, rows
from .writer import Writer

MIGRATIONS_DIR = shipped_dir("store.migrations")

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


def migration_files() -> list[Path]:
    """SQLite's migrations, as shipped: what a store opens with and a restore checks against."""
    return shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations")


class _Abandoned(Exception):
    """A bounded write its caller stopped waiting for, before the writer's thread ran it."""


class Core:
    def __init__(
        self,
        path: Path | str,
        busy_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        max_bytes: int | None = None,
        submit_timeout_s: float | None = None,
    ):
        # A `postgresql://` DSN, or a SQLite file's path (engine's SQL and errors: its module).
        self.engine: Engine = engine_for(path)
        self.dsn: str | None = str(path) if self.engine is postgres else None
        self.path: Path | None = None if self.dsn else Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.max_bytes = max_bytes
        self.submit_timeout_s = submit_timeout_s  # the longest a submit waits for its commit
        self.clock = clock
        self._writer: Writer | None = None  # every write, group-committed in its own thread
        self._reader: aiosqlite.Connection | None = None
        self._pool: postgres.Pool | None = None  # PostgreSQL's readers
        # Is the open database still the file at its path? (SQLite's alone: a server has no path.)
        self._file = DatabaseFile(self.path) if self.path else None
        # The store's health as the router lives it, in memory (it cannot be asked of the store):
        # the calls waiting for it now, and the last refused write (gpuq/store/health.py).
        self._health = Health(busy_timeout_s)
        # Users' max_running ({user: limit}, gpuq.toml's, set by set_max_running): every claim
        # skips a job whose owner runs that many already. Replaced whole, never changed in place:
        # a write queued with it keeps the limits of its call.
        self._max_running: Mapping[str, int] = lifecycle.NO_LIMITS
        self._backing_up = threading.Lock()  # one backup at a time (held by its thread)

    # -- connections and migrations ---------------------------------------------------------

    @property
    def where(self) -> str:
        """The database, as errors and logs name it: its file, or its DSN without the password."""
        return str(self.path) if self.path else postgres.safe_dsn(self.dsn or "")

    def _sqlite_path(self) -> Path:
        """The SQLite file (a store on PostgreSQL has its DSN instead)."""
        assert self.path is not None, "a store on PostgreSQL has no file"
        return self.path

    def _writers_error(self, exc: BaseException) -> Exception:
        """The writer's error as a user sees it (asked in the writer's thread): a SQLite write
        refused as full where router.max_database_bytes, not the disk, ran out names the cap."""
        db = self._writer.db if self._writer is not None else None
        if self.path is not None and self.max_bytes is not None and isinstance(db, sqlite3.Connection):
            capped = sqlite.cap_reached(exc, db, self.path, self.max_bytes)
            if capped is not None:
                return capped
        return self.engine.from_error(exc)

    def _connect_writer(self) -> Connection:
        """The writer's connection, opened in (and used only by) the writer's thread."""
        if self.dsn:
            return postgres.connect_writer(self.dsn, self.busy_timeout_s)
        return sqlite.connect_writer(self._sqlite_path(), self.busy_timeout_s, self.max_bytes)

    async def open(self) -> None:
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if not self.path.exists():
                self.path.touch(mode=0o600)  # the queue holds a person's prompts
        try:
            self._writer = Writer(
                self._connect_writer,
                self._writers_error,
                engine=self.engine,
                refuse=self._refusal if self._file else None,
            )
            await self._writer.open()
            await self._migrate()
            if self.dsn:
                self._pool = await postgres.connect_reader(self.dsn, self.busy_timeout_s)
            else:
                self._reader = await sqlite.connect_reader(self._sqlite_path(), self.busy_timeout_s)
                if self._file is not None:
                    self._file.record()
        except BaseException as exc:
            await self.close()  # an open connection's thread would keep a router that failed alive
            if isinstance(exc, self.engine.Error):
                raise StartupError(f"cannot open the database {self.where}: {exc}") from exc
            raise

    async def close(self) -> None:
        if self._writer is not None:
            await self._writer.close()  # the writes queued commit (or fail) first
        if self._reader is not None:
            await self._reader.close()
        if self._pool is not None:
            await self._pool.close()
        self._reader = self._writer = self._pool = None

    async def _migrate(self) -> None:
        assert self._writer is not None, "the writer opens first"
        now, where = self.clock(), self.where
        if self.dsn:
            files = shipped_files(postgres.MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "PostgreSQL migrations")

            def migrate(db: Connection) -> None:
                assert isinstance(db, postgres.Connection)
                postgres.migrate(db.raw, files=files, now=now, where=where)
        else:
            files = migration_files()
            path = self._sqlite_path()

            def migrate(db: Connection) -> None:
                assert isinstance(db, sqlite3.Connection)
                sqlite.migrate(db, files=files, now=now, path=path)

        await self._writer.call(migrate)

    async def _write(self, verb: Callable[[Connection], T], after: Callable[[T], None] | None = None) -> T:
        """Run `verb` as one transaction (a savepoint of a group commit) in the writer's thread.
        Writes that arrive together share one commit, each is answered only after it, and one
        that raises is rolled back alone. `after` gets the result once committed (see Writer.run)."""
        if self._writer is None:
            raise StoreUnavailable("the store is not open; nothing was changed")
        if self._file and self._file.lost is not None:  # known lost: not even queued
            raise StoreUnavailable(self._file.lost)
        with self._health.call("write"):
            try:
                result = await self._writer.run(verb, after)
            except StoreUnavailable as exc:
                self._health.note_refused(exc.message)
                raise
        return result

    async def _bounded_write(
        self, verb: Callable[[Connection], T], after: Callable[[T], None] | None, wait_s: float, what: str, setting: str
    ) -> T:
        """`_write`, answered within `wait_s`: a write the writer's thread has not started by then
        is dropped (it will raise there, changing nothing) and the caller hears 503; one it has
        started (its commit hangs: a frozen disk) gets as long again, then the caller is told it
        may or may not have landed. Whatever lands still reaches `after`."""
        lock, state = threading.Lock(), ["queued"]

        def guarded(db: Connection) -> T:
            with lock:
                if state[0] == "abandoned":
                    raise _Abandoned()
                state[0] = "started"
            return verb(db)

        task = asyncio.ensure_future(self._write(guarded, after))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # read here or below
        done, _ = await asyncio.wait({task}, timeout=wait_s)
        if not done:
            with lock:
                started = state[0] == "started"
                state[0] = "abandoned" if not started else state[0]
            if not started:
                trouble = self.trouble(slow_s=wait_s)  # the call it queued behind, or a refusal
                why = trouble["problem"] if trouble else "the writes ahead of it took that long"
                self._health.note_refused(f"a {what} waited {wait_s:g}s for the database")
                raise StoreUnavailable(
                    f"the database did not take the {what} within {wait_s:g}s ({setting}): {why}; nothing was changed"
                )
            done, _ = await asyncio.wait({task}, timeout=wait_s)
            if not done:
                raise StoreUnavailable(
                    f"the database did not confirm the {what} within {2 * wait_s:g}s ({setting}): its commit"
                    " is still waiting on the disk, so it may or may not be stored; look before sending it again"
                )
        return task.result()

    # -- the store's health, from memory ---------------------------------------------------------

    def trouble(self, slow_s: float = SLOW_CALL_S) -> dict[str, str] | None:
        """What is wrong with the store now, as the router lives it, or None: a call waiting past
        `slow_s` (the store does not answer), else writes refused within the last few seconds.
        Never asks the store, so it answers whatever the store does."""
        return self._health.trouble(slow_s)

    @property
    def lost(self) -> str | None:
        """What happened to the database's files, once one is no longer at its path (else None)."""
        return self._file.check() if self._file else None

    def _refusal(self) -> StoreUnavailable | None:
        """Asked by the writer's thread right before each COMMIT (three os.stat, ~7 us, once per
        batch): a batch is never committed, so never acknowledged, into a file no longer at its path."""
        lost = self._file.check() if self._file is not None else None
        return None if lost is None else StoreUnavailable(lost)

    # -- reading (the reads themselves: reads.py, batch_reads.py) ----------------------------------

    async def read(self, sql: str, params: Params = ()) -> list[Row]:
        # Counted as waiting until the reader's thread answers, even when its caller stopped
        # waiting (/health's bounded read): the thread is still stuck in it.
        task: asyncio.Future[Any]
        if self._pool is not None:
            task = asyncio.ensure_future(postgres.fetchall(self._pool, sql, params))
        else:
            assert self._reader is not None, "store is not open"
            task = asyncio.ensure_future(self._reader.execute_fetchall(sql, params))
        key = id(task)
        self._health.waiting["read"][key] = time.monotonic()
        task.add_done_callback(lambda t: (self._health.waiting["read"].pop(key, None), t.cancelled() or t.exception()))
        try:
            found = await asyncio.shield(task)
            answer: list[Row] = rows(found) if self._pool else found  # SQLite's reader makes dicts in its thread
            return answer
        except (sqlite.Error, postgres.Error) as exc:
            raise self.engine.from_error(exc) from exc


def handing_over(
    hand_over: Callable[[Row], None] | None, nodes: Sequence[NodeInfo]
) -> Callable[[tuple[Any, list[Row]]], None] | None:
    """What gives the heads a write claimed on idle nodes (its result's second part) to their
    workers, on the loop right after the commit; None when no worker waits."""
    assert hand_over is not None or not any(n.idle for n in nodes), "a claim needs its worker"
    if hand_over is None:
        return None
    give = hand_over

    def handed(result: tuple[Any, list[Row]]) -> None:
        for job in result[1]:
            give(job)

    return handed


class Verb(Generic[P, R]):
    """A verb as a Store method (made by `write`, `write_untimed`, `write_limited`): each call runs
    `verb(db, *given, *args, **kwargs)` on the writer, `given` being what the store gives the
    verb first. Read on a store, it is an async method whose parameters are the verb's after
    those (its signature and docstring the verb's); read on the class, this declaration."""

    def __init__(self, verb: Callable[..., R], given: Callable[[Core], tuple[object, ...]], n_given: int) -> None:
        self.verb = verb
        self.given = given
        self.name = verb.__name__
        self.__doc__ = verb.__doc__
        self.__wrapped__ = verb
        signature = inspect.signature(verb)
        self.signature = signature.replace(parameters=list(signature.parameters.values())[1 + n_given :])

    def __set_name__(self, owner: type[Core], name: str) -> None:
        self.name = name

    @overload
    def __get__(self, store: None, owner: type[Core]) -> Self: ...

    @overload
    def __get__(self, store: Core, owner: type[Core]) -> Callable[P, Coroutine[Any, Any, R]]: ...

    def __get__(self, store: Core | None, owner: type[Core]) -> Self | Callable[P, Coroutine[Any, Any, R]]:
        if store is None:
            return self
        verb, given = self.verb, self.given

        async def method(*args: P.args, **kwargs: P.kwargs) -> R:
            first = given(store)  # at the call, as the caller's arguments are
            return await store._write(lambda db: verb(db, *first, *args, **kwargs))

        functools.update_wrapper(method, verb)
        method.__name__ = method.__qualname__ = self.name
        method.__signature__ = self.signature  # type: ignore[attr-defined]
        vars(store)[self.name] = method  # made once per store: its next reads find it as an attribute
        return method


def write(verb: Callable[Concatenate[Connection, float, P], R]) -> Verb[P, R]:
    """The Store method of `verb(db, now, ...)`: `now` is the store's clock's, at the call."""
    return Verb(verb, lambda store: (store.clock(),), 1)


def write_untimed(verb: Callable[Concatenate[Connection, P], R]) -> Verb[P, R]:
    """The Store method of `verb(db, ...)`, a write that needs no time."""
    return Verb(verb, lambda store: (), 0)


def write_limited(verb: Callable[Concatenate[Connection, float, Mapping[str, int], P], R]) -> Verb[P, R]:
    """The Store method of `verb(db, now, max_running, ...)`, a write that may claim a job: now,
    and users' max_running as the store holds them (set_max_running)."""
    return Verb(verb, lambda store: (store.clock(), store._max_running), 2)
