"""The store's one writer: a dedicated thread with its own stdlib sqlite3 connection.

Callers on the event loop queue writes; the thread takes every write waiting (up to
`max_batch`) and applies them in one `BEGIN IMMEDIATE ... COMMIT`, so one fsync covers all of
them (group commit). Each write runs inside its own SAVEPOINT: one that raises is rolled back
alone and gets its own error, while the others commit. Every caller is answered (through
`loop.call_soon_threadsafe`) only after the COMMIT that holds its write has returned, so an
acknowledged write is on disk (synchronous=FULL). When the transaction itself fails (BEGIN or
COMMIT refused, or an error that aborts the whole transaction such as a full disk), it is rolled
back and every write of the batch gets that error: nothing is half-stored.

There is no timer: a lone write is applied at once; batches form from writes that queue up
behind the one in flight, and from writes made in the same turn of the event loop (handed to
the thread together at the end of that turn, so the thread does not wake for the first alone),
so group commit adds no latency to a single client. One thread owns the connection, so a write
costs one hop to it and one back, whatever it does.

A write is a plain function of the sqlite3 connection. It runs in the writer's thread, so it
must not await or touch the event loop."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from . import sqlite
from .engine import Connection, Engine

# A write: a function of the writer's connection (a verb with its arguments bound), run in the
# writer's thread; its result is the caller's answer.
Write = Callable[[Connection], Any]

T = TypeVar("T")

SAVEPOINT = "gpuq_batch_item"


class BatchAborted(Exception):
    """The batch's transaction is gone; `cause` is the error that ended it."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class Refused(Exception):
    """The writer's `refuse` check said no just before a COMMIT: every write of the batch is
    rolled back and gets `error` (the store refuses to commit into a file no longer at its path)."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def _rollback(db: Connection) -> None:
    if db.in_transaction:
        try:
            db.execute("ROLLBACK")
        except Exception:
            pass  # the error that got us here is the one to report


def apply_batch(
    db: Connection,
    writes: list[Write],
    before_commit: Callable[[], None] | None = None,
    begin: str = sqlite.BEGIN_WRITE,
) -> list[tuple[bool, Any]]:
    """Run `writes` in one transaction, each in its own savepoint; (ok, result-or-error) each.

    Raises (after a ROLLBACK) when the transaction as a whole cannot commit, or `before_commit`
    (called last before the COMMIT) raises."""
    db.execute(begin)
    try:
        if len(writes) == 1:  # alone in its transaction: no savepoint needed to fail alone
            try:
                outcomes: list[tuple[bool, Any]] = [(True, writes[0](db))]
            except Exception as exc:
                _rollback(db)
                return [(False, exc)]
        else:
            outcomes = [_in_savepoint(db, write) for write in writes]
        if before_commit is not None:
            before_commit()
        db.execute("COMMIT")
    except BaseException:
        _rollback(db)
        raise
    return outcomes


def _in_savepoint(db: Connection, write: Write) -> tuple[bool, Any]:
    """One write of a batch: rolled back alone when it raises, unless SQLite rolled back the
    whole transaction (BatchAborted: every write of the batch fails)."""
    db.execute(f"SAVEPOINT {SAVEPOINT}")
    try:
        result = write(db)
    except Exception as exc:
        if not db.in_transaction:
            raise BatchAborted(exc) from exc
        db.execute(f"ROLLBACK TO {SAVEPOINT}")
        db.execute(f"RELEASE {SAVEPOINT}")
        return False, exc
    db.execute(f"RELEASE {SAVEPOINT}")
    return True, result


@dataclass
class _Item:
    fn: Write | None  # None: stop
    future: asyncio.Future[Any]
    alone: bool = False  # run as is, outside any transaction (migrations, pragmas)
    after: Callable[[Any], None] | None = None  # given the result on the loop once committed


class Writer:
    """Owns the writer thread and its connection; `run` queues a write, `call` runs a function
    of the connection alone (outside a transaction), `close` lets the queued writes finish."""

    def __init__(
        self,
        connect: Callable[[], Connection],
        translate: Callable[[BaseException], Exception],
        max_batch: int = 256,
        refuse: Callable[[], Exception | None] | None = None,
        engine: Engine = sqlite,
    ):
        self._connect = connect
        self._engine = engine  # gpuq/store/sqlite.py or postgres.py: its BEGIN and its errors
        self._translate = translate
        self._refuse = refuse  # asked in the thread before each COMMIT: an error refuses the batch
        self.max_batch = max_batch
        self._queue: queue.SimpleQueue[list[_Item]] = queue.SimpleQueue()
        self._turn: list[_Item] = []  # made in this turn of the event loop, not handed over yet
        self._waiting = 0  # items handed over and not taken by the thread yet (under _count_lock)
        self._count_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.db: Connection | None = None  # the thread's connection, once open (read elsewhere for its identity only)
        self._closed = False
        self.batches = 0  # counters for tests and the bench (read on the loop, written by the thread)
        self.writes = 0

    @property
    def waiting(self) -> int:
        """Writes queued and not yet taken by the thread."""
        with self._count_lock:
            return self._waiting + len(self._turn)

    def _hand_over(self) -> None:
        """At the end of the loop's turn: every write of the turn, to the thread in one put."""
        items, self._turn = self._turn, []
        if not items:  # close() handed this turn's writes over already
            return
        with self._count_lock:
            self._waiting += len(items)
        self._queue.put(items)

    async def open(self) -> None:
        """Start the thread; its connection is open (or its error raised) when this returns."""
        opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._thread = threading.Thread(target=self._main, args=(opened,), name="gpuq-writer", daemon=True)
        self._thread.start()
        await opened

    async def run(self, write: Callable[[Connection], T], after: Callable[[T], None] | None = None) -> T:
        """Apply `write` durably; its result once its transaction has committed. `after` gets the
        result on the event loop right after the commit, even when the caller has gone away
        (a claimed job must reach its worker whatever became of the request that claimed it)."""
        result: T = await self._put(write, alone=False, after=after)
        return result

    async def call(self, fn: Write) -> Any:
        """Run `fn(connection)` in the writer's thread, between batches, with no transaction of
        the writer's around it (fn opens its own, as a migration does)."""
        return await self._put(fn, alone=True)

    async def _put(self, fn: Write, alone: bool, after: Callable[[Any], None] | None = None) -> Any:
        if self._closed or self._thread is None:
            raise self._translate(self._engine.Error("the store is closed; nothing was changed"))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._turn.append(_Item(fn, future, alone, after))
        if len(self._turn) == 1:
            loop.call_soon(self._hand_over)
        return await future

    async def close(self, timeout_s: float = 10.0) -> None:
        """Refuse new writes, let those already queued commit (or fail), close the connection."""
        if self._closed:
            return
        self._closed = True
        if self._thread is None or not self._thread.is_alive():  # never opened, or failed to
            return
        stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._hand_over()  # the writes of this turn go first
        self._queue.put([_Item(None, stopped)])
        try:
            await asyncio.wait_for(stopped, timeout_s)
        except TimeoutError:
            pass  # stuck on a busy database: the daemon thread dies with the process

    # -- the thread -----------------------------------------------------------------------------

    @staticmethod
    def _answer(
        future: asyncio.Future[Any] | None, ok: bool, value: Any, after: Callable[[Any], None] | None = None
    ) -> None:
        """Settle `future` from the writer's thread, on the event loop that made it."""
        if future is not None:
            Writer._settle_on_loop(future.get_loop(), [(future, ok, value, after)])

    @staticmethod
    def _settle_on_loop(
        loop: asyncio.AbstractEventLoop,
        answers: list[tuple[asyncio.Future[Any], bool, Any, Callable[[Any], None] | None]],
    ) -> None:
        """Settle futures from the writer's thread in one hand-over to their loop (one wake-up
        of it, however many writes the batch held)."""

        def settle_all() -> None:
            for future, ok, value, after in answers:
                try:  # one write's trouble never leaves the others' callers waiting
                    if not future.done():  # else its caller went away; the write stands
                        if ok:
                            future.set_result(value)
                        else:
                            future.set_exception(value)
                    if ok and after is not None:  # last: should it raise, the caller has its answer
                        after(value)
                except BaseException as exc:  # reported as the loop reports a callback's error
                    loop.call_exception_handler({"message": "settling a write's answer failed", "exception": exc})

        try:
            loop.call_soon_threadsafe(settle_all)
        except RuntimeError:
            pass  # the event loop is closed: nobody is waiting any more

    def _error(self, exc: BaseException) -> BaseException:
        """sqlite3 errors become the store's errors; a write's own errors pass unchanged."""
        return self._translate(exc) if isinstance(exc, self._engine.Error) else exc

    def _main(self, opened: asyncio.Future[None]) -> None:
        try:
            db = self.db = self._connect()
        except BaseException as exc:
            self._answer(opened, False, exc)
            return
        self._answer(opened, True, None)
        stop = None
        try:
            stop = self._serve(db)
        finally:
            db.close()
            self._answer(stop.future if stop is not None else None, True, None)

    def _take(self, block: bool) -> list[_Item]:
        try:
            items = self._queue.get(block)
        except queue.Empty:
            return []
        with self._count_lock:
            self._waiting -= len(items)
        return items

    def _serve(self, db: Connection) -> _Item:
        """Apply what is queued, in order, until the stop item comes; return it."""
        todo: list[_Item] = []
        while True:
            while not todo:  # (an empty hand-over is never put; this loop does not rely on it)
                todo = self._take(block=True)
            while len(todo) < self.max_batch and (more := self._take(block=False)):
                todo += more  # everything waiting by now joins this batch
            item = todo[0]
            if item.fn is None:
                return item
            if item.alone:
                todo.pop(0)
                self._run_alone(db, item)
                continue
            n = 0  # the run of plain writes at the head, up to max_batch
            while n < len(todo) and n < self.max_batch and todo[n].fn is not None and not todo[n].alone:
                n += 1
            batch, todo = todo[:n], todo[n:]
            self._apply(db, batch)

    def _run_alone(self, db: Connection, item: _Item) -> None:
        try:
            result = item.fn(db)  # type: ignore[misc]
        except Exception as exc:
            self._answer(item.future, False, self._error(exc))
        else:
            self._answer(item.future, True, result)

    def _before_commit(self) -> None:
        if self._refuse is not None and (error := self._refuse()) is not None:
            raise Refused(error)

    def _apply(self, db: Connection, batch: list[_Item]) -> None:
        try:
            outcomes = apply_batch(
                db,
                [i.fn for i in batch],  # type: ignore[misc]
                self._before_commit,
                self._engine.BEGIN_WRITE,
            )
        except Refused as exc:
            for item in batch:
                self._answer(item.future, False, exc.error)
            return
        except Exception as exc:
            cause = exc.cause if isinstance(exc, BatchAborted) else exc
            if not isinstance(cause, self._engine.Error):
                cause = self._engine.Error(f"{cause}; nothing was changed")
            for item in batch:
                self._answer(item.future, False, self._translate(cause))
            return
        self.batches += 1
        self.writes += len(batch)
        answers = [
            (item.future, ok, value if ok else self._error(value), item.after)
            for item, (ok, value) in zip(batch, outcomes)
        ]
        self._settle_on_loop(batch[0].future.get_loop(), answers)
