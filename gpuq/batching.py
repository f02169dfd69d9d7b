"""Group commit on the store's one writer connection.

Writes that arrive while the writer is busy (or in the same event-loop turn) are applied in
one `BEGIN IMMEDIATE ... COMMIT`, so one fsync covers all of them. Each write runs inside its
own SAVEPOINT: one that raises is rolled back alone and gets its own error, while the others
commit. Every caller is answered only after the COMMIT that holds its write has returned, so
an acknowledged write is on disk (synchronous=FULL). When the transaction itself fails (BEGIN
or COMMIT refused, or an error that aborts the whole transaction such as a full disk), it is
rolled back and every write of the batch gets that error: nothing is half-stored.

There is no timer: a lone write is applied at once; batches form only from writes that queue
up behind the one in flight, so group commit adds no latency to a single client.

A write is a plain function of the sqlite3 connection and a per-batch `ctx` dict. It runs in
the connection's own thread (aiosqlite's), so it must not await or touch the event loop.
`ctx` lives for one transaction: a write may cache what it read there (for example per-node
counts) and must keep the cache true for the writes after it. A write's changes to `ctx`
should be made only once all its statements have succeeded: if it raises, its savepoint is
rolled back but `ctx` is not."""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any, Callable, TypeVar

import aiosqlite

T = TypeVar("T")
Write = Callable[[sqlite3.Connection, dict], Any]

SAVEPOINT = "gpuq_batch_item"


class BatchAborted(Exception):
    """The batch's transaction is gone; `cause` is the error that ended it."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


def apply_batch(db: sqlite3.Connection, writes: list[Write]) -> list[tuple[bool, Any]]:
    """Run `writes` in one transaction, each in its own savepoint; (ok, result-or-error) each.

    Raises (after a ROLLBACK) when the transaction as a whole cannot commit."""
    outcomes: list[tuple[bool, Any]] = []
    ctx: dict = {}
    db.execute("BEGIN IMMEDIATE")
    if len(writes) == 1:  # alone in its transaction: no savepoint needed to fail alone
        try:
            result = writes[0](db, ctx)
        except Exception as exc:
            if db.in_transaction:
                try:
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # the write's own error is the one to report
            return [(False, exc)]
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        try:
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return [(True, result)]
    try:
        for write in writes:
            db.execute(f"SAVEPOINT {SAVEPOINT}")
            try:
                result = write(db, ctx)
            except Exception as exc:
                if not db.in_transaction:  # SQLite rolled the whole transaction back
                    raise BatchAborted(exc) from exc
                db.execute(f"ROLLBACK TO {SAVEPOINT}")
                db.execute(f"RELEASE {SAVEPOINT}")
                outcomes.append((False, exc))
            else:
                db.execute(f"RELEASE {SAVEPOINT}")
                outcomes.append((True, result))
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            try:
                db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        raise
    return outcomes


async def in_writer_thread(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run `fn(sqlite3_connection)` in aiosqlite's connection thread, as one queued call.

    aiosqlite has no public call for this; `_execute` and `_conn` are what every one of its own
    methods uses (stable since aiosqlite 0.11). tests/test_batching.py fails loudly if that
    ever changes."""
    return await conn._execute(lambda: fn(conn._conn))


class WriteBatcher:
    """Queues writes and applies them in batches on `conn()`, holding `lock` (the store's
    write lock, so a batch never interleaves with the store's other transactions)."""

    def __init__(self, conn: Callable[[], aiosqlite.Connection | None], lock: asyncio.Lock,
                 translate: Callable[[sqlite3.Error], Exception], max_batch: int = 256):
        self._conn = conn
        self._lock = lock
        self._translate = translate
        self.max_batch = max_batch
        self._queue: list[tuple[Write, asyncio.Future]] = []
        self._task: asyncio.Task | None = None
        self._closed = False
        self.batches = 0  # counters for tests and the bench
        self.writes = 0

    def _error(self, exc: BaseException) -> BaseException:
        """sqlite3 errors become the store's errors; a write's own errors pass unchanged."""
        return self._translate(exc) if isinstance(exc, sqlite3.Error) else exc

    def _batch_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, BatchAborted):
            exc = exc.cause
        if not isinstance(exc, sqlite3.Error):  # e.g. aiosqlite's "Connection closed"
            exc = sqlite3.OperationalError(f"{exc}; nothing was changed")
        return self._translate(exc)

    async def run(self, write: Write) -> Any:
        """Apply `write` durably; its result once its transaction has committed."""
        if self._closed:
            raise self._translate(sqlite3.OperationalError("the store is closed; nothing was changed"))
        future = asyncio.get_running_loop().create_future()
        self._queue.append((write, future))
        if self._task is None:
            self._task = asyncio.create_task(self._flush(), name="gpuq-write-batcher")
        return await future

    async def _flush(self) -> None:
        try:
            while self._queue:
                async with self._lock:
                    # Taken only once the lock is ours: writes that queued up while another
                    # transaction held it all go into this one.
                    batch = [(w, f) for w, f in self._queue[:self.max_batch] if not f.done()]
                    del self._queue[:self.max_batch]
                    if batch:
                        await self._apply(batch)
        except BaseException as exc:  # cancelled (shutdown) or a bug: nobody may wait forever
            for _, future in self._queue:
                if not future.done():
                    future.set_exception(self._batch_error(sqlite3.OperationalError(
                        f"the store stopped before this write ran ({exc!r}); nothing was changed")))
            self._queue.clear()
            raise
        finally:
            self._task = None

    async def _apply(self, batch: list[tuple[Write, asyncio.Future]]) -> None:
        conn = self._conn()
        try:
            if conn is None:
                raise sqlite3.OperationalError("the store is not open")
            outcomes = await in_writer_thread(conn, lambda db: apply_batch(db, [w for w, _ in batch]))
        except asyncio.CancelledError:
            for _, future in batch:  # the batch may or may not have committed: say neither
                future.cancel()
            raise
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(self._batch_error(exc))
            return
        self.batches += 1
        self.writes += len(batch)
        for (_, future), (ok, value) in zip(batch, outcomes):
            if future.done():  # its caller went away; the write stands, like any lost reply
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(self._error(value))

    async def close(self, timeout_s: float = 10.0) -> None:
        """Let the batch in flight finish, then refuse new writes."""
        self._closed = True
        task = self._task
        if task is not None:
            try:
                async with asyncio.timeout(timeout_s):
                    await asyncio.shield(task)
            except TimeoutError:
                task.cancel()
            except asyncio.CancelledError:
                task.cancel()
                raise
