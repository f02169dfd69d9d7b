"""The store: an async facade over the queue's verbs and every read.

Each write is a verb, a plain function of a connection (a job's life cycle: gpuq/store/lifecycle.py;
queue control: control.py; the router's records: records.py), run in the writer's own thread on
its connection, in a savepoint of a group commit (`BEGIN IMMEDIATE` ... `COMMIT`, see writer.py),
checked against the job's current state inside it. Reads go through a second connection
(aiosqlite's, its public API; psycopg's pool), which WAL lets in alongside; their SQL is in
gpuq/store/reads.py, whose `Reads` is Store's base.

The engine is SQLite (a file's path: one router) or PostgreSQL (a `postgresql://` DSN: any number
of routers on one queue, gpuq/store/postgres.py): the same verbs, reads and answers; the few
statements written per engine come from its module (`self.engine`)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from ..config import NodeConfig
from ..errors import Conflict, GpuqError, StartupError, StoreUnavailable
from ..jobs import Interrupted, JobState, NewJob, NodeInfo
from ..shipped import shipped_dir, shipped_files
from . import backup, batches, control, leases, lifecycle, parts, postgres, records, retention, sqlite, storage
from .dbfile import DatabaseFile
from .engine import Connection, Engine, Params, engine_for
from .health import SLOW_CALL_S, Health
from .reads import Reads
from .sqlite import STALE_SQL
from .steps import Row, rows
from .writer import Writer

__all__ = ["Interrupted", "NewJob", "NodeInfo", "Row", "Store", "STALE_SQL", "MIGRATIONS_DIR"]

MIGRATIONS_DIR = shipped_dir("store.migrations")
log = logging.getLogger("gpuq")


def migration_files() -> list[Path]:
    """SQLite's migrations, as shipped: what a store opens with and a restore checks against."""
    return shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations")


T = TypeVar("T")


class BackupBusy(Conflict):
    """Another backup of this database is being made (a scheduled one waits for its turn)."""


class _Abandoned(Exception):
    """A bounded write its caller stopped waiting for, before the writer's thread ran it."""


class Store(Reads):
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
        # Users' max_running ({user: limit}, the dispatcher's from gpuq.toml): every claim skips
        # a job whose owner runs that many already.
        self.max_running: dict[str, int] = {}
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
                self.engine.from_error,
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

    # -- the router's own writes ----------------------------------------------------------------

    async def configure(self, settings_s: dict[str, float], nodes: Sequence[NodeConfig]) -> None:
        """Record the thresholds (read by the view stale_heads) and the nodes in force."""
        await self._write(partial(records.configure, settings_s=settings_s, nodes=nodes))

    async def remove_nodes(
        self,
        names: list[str],
        force: bool,
        reason: str,
        refused: Callable[[dict[str, list[str]], dict[str, str]], str | None],
    ) -> list[Row]:
        """Nodes leaving the config: refused while jobs wait or run there, unless forced (then the
        waiting ones fail with `reason`)."""
        return await self._write(
            partial(control.remove_nodes, names=names, force=force, reason=reason, now=self.clock(), refused=refused)
        )

    async def record_reload(self, actor: str, path: str, changes: dict[str, Any] | None, error: str | None) -> None:
        await self._write(
            partial(records.record_reload, actor=actor, path=path, changes=changes, error=error, now=self.clock())
        )

    async def set_node_health(self, name: str, up: bool, error: str | None) -> None:
        await self._write(partial(records.set_node_health, name=name, up=up, error=error, now=self.clock()))

    async def record_node_models(self, name: str, models: Sequence[str]) -> None:
        """The models the node's Ollama lists, for the other routers' placement (nodes_driven_elsewhere)."""
        await self._write(partial(records.record_node_models, name=name, models=models))

    async def record_asked_unload(self, name: str, record: dict[str, Any]) -> None:
        """The node's last unload a client asked (`ollama stop`), kept across restarts."""
        await self._write(partial(records.record_asked_unload, name=name, record=record))

    async def note_stale(self, now: float | None = None) -> list[Row]:
        """Write one event per newly stale head (not one per check); returns the new ones."""
        return await self._write(partial(lifecycle.note_stale, now=self.clock() if now is None else now))

    async def note(self, job_id: str, reason: str, actor: str = "router") -> None:
        """An event that changes no state: an unload that failed, a stale head, a node flag."""
        await self._write(partial(lifecycle.note, job_id=job_id, reason=reason, actor=actor, now=self.clock()))

    async def fail_orphans(self) -> list[Row]:
        """At start-up: a job still running belonged to a dead router. Fail it, loudly."""
        return await self._write(partial(lifecycle.fail_orphans, now=self.clock()))

    async def cancel_clientless(self, nodes: list[str]) -> list[Row]:
        """At start-up: a front-door call still waiting on the nodes this router now drives lost
        its client with the old router."""
        return await self._write(partial(lifecycle.cancel_clientless, now=self.clock(), nodes=nodes))

    async def fire_alert(self, alert: dict[str, Any], deliver: bool) -> Row:
        return await self._write(partial(records.fire_alert, alert=alert, deliver=deliver, now=self.clock()))

    async def resolve_alert(self, alert_id: int, resolution: str) -> None:
        await self._write(partial(records.resolve_alert, alert_id=alert_id, resolution=resolution, now=self.clock()))

    async def owe_open_alerts(self) -> int:
        return await self._write(records.owe_open_alerts)

    async def record_delivery(
        self, alert_id: int, status: str, attempt: int, ok: bool, http_status: int | None, error: str | None
    ) -> None:
        await self._write(
            partial(
                records.record_delivery,
                alert_id=alert_id,
                status=status,
                attempt=attempt,
                ok=ok,
                http_status=http_status,
                error=error,
                now=self.clock(),
            )
        )

    # -- the queue's verbs ----------------------------------------------------------------------

    async def submit(
        self,
        new: NewJob,
        nodes: list[NodeInfo],
        actor: str,
        hand_over: Callable[[Row], None] | None = None,
        *,
        fair: bool = False,
        max_waiting: int | None = None,
    ) -> list[Row]:
        """Place and insert a job (a task, or a critique's whole fan-out), durably: answered
        only once its transaction has committed. On a node whose worker waits idle
        (NodeInfo.idle) the same commit claims the node's head, and `hand_over` gives it to
        that worker on the loop right after the commit, whether or not the caller still waits."""
        assert hand_over is not None or not any(n.idle for n in nodes), "a claim needs its worker"

        def handed(result: tuple[list[Row], list[Row]]) -> None:
            for job in result[1]:
                hand_over(job)  # type: ignore[misc]

        write = partial(
            lifecycle.submit_and_claim,
            new=new,
            nodes=nodes,
            actor=actor,
            now=self.clock(),
            fair=fair,
            max_waiting=max_waiting,
            max_running=dict(self.max_running),
        )
        if self.submit_timeout_s is None:
            created, _ = await self._write(write, handed if hand_over else None)
        else:
            created, _ = await self._bounded_write(
                write, handed if hand_over else None, self.submit_timeout_s, "submit", "router.submit_timeout"
            )
        return created

    async def claim(self, node: str) -> Row | None:
        """Take the head of the node's queue: it becomes running with a new run row."""
        return await self._write(
            partial(lifecycle.claim, node=node, now=self.clock(), max_running=dict(self.max_running))
        )

    async def heartbeat(self, run_id: int, output: str, thinking: str | None = None) -> None:
        """Progress: `output` and `thinking` are the text that came since the last write (appended)."""
        await self._write(
            partial(lifecycle.heartbeat, run_id=run_id, output=output, thinking=thinking, now=self.clock())
        )

    async def work_done(self, run_id: int, output: str, stats: dict[str, Any], thinking: str | None = None) -> None:
        """Ollama's stream ended (`output`: the text not stored yet); the job is not finished
        until its model has left VRAM."""
        await self._write(
            partial(lifecycle.work_done, run_id=run_id, output=output, stats=stats, thinking=thinking, now=self.clock())
        )

    async def save_output(self, run_id: int, output: str, thinking: str | None = None) -> None:
        """Keep the last, unsaved output of an interrupted run, whatever state it ended in."""
        await self._write(
            partial(lifecycle.append_output, run_id=run_id, output=output, thinking=thinking, now=self.clock())
        )

    async def finish(
        self,
        job_id: str,
        run_id: int,
        state: str,
        error: str | None,
        output: str | None = None,
        actor: str = "router",
        findings: list[Any] | None = None,
        claim_node: str | None = None,
        thinking: str | None = None,
        streamed: int = 0,
    ) -> Row | None:
        """Finish a run that is still the job's running run; anything else is a GuardMiss.

        `streamed` pieces (one token each) count as a failed run's tokens: Ollama counts them in
        its last line, which a reply that broke off never sent.

        With `claim_node`, the node's next job is claimed in the same transaction and returned:
        a worker going from job to job pays one durable commit between them, not two."""
        assert state in (JobState.DONE, JobState.FAILED)
        return await self._write(
            partial(
                lifecycle.finish,
                job_id=job_id,
                run_id=run_id,
                state=state,
                error=error,
                now=self.clock(),
                output=output,
                actor=actor,
                findings=findings,
                claim_node=claim_node,
                thinking=thinking,
                streamed=streamed,
                max_running=dict(self.max_running),
            )
        )

    async def move(
        self,
        job_id: str,
        nodes: list[NodeInfo],
        actor: str,
        *,
        position: int | None = None,
        before: str | None = None,
        after: str | None = None,
        node: str | None = None,
    ) -> Row:
        """Reorder a queued job within its node's queue or move it to another node's queue."""
        return await self._write(
            partial(
                control.move,
                job_id=job_id,
                nodes=nodes,
                actor=actor,
                now=self.clock(),
                position=position,
                before=before,
                after=after,
                node=node,
            )
        )

    async def preempt(
        self,
        job_id: str,
        actor: str,
        only_owner: str | None = None,
        rule: Callable[[str], bool] | None = None,
        reason: str | None = None,
        to: str | None = None,
        nodes: Sequence[NodeInfo] = (),
    ) -> tuple[Row, Interrupted | None]:
        """The queued job runs next: to the head, and the node's running job goes back behind it
        (`only_owner`: a member's name; someone else's running job refuses it, 403). `rule`: the
        router's own preempt, only when it holds for the running job's lane (else nothing
        changes); `to`: on that node, moved there in the same transaction; `reason`: what the
        interrupted job's event says."""
        return await self._write(
            partial(
                control.preempt,
                job_id=job_id,
                actor=actor,
                now=self.clock(),
                only_owner=only_owner,
                rule=rule,
                reason=reason,
                to=to,
                nodes=nodes,
            )
        )

    async def delete(self, job_id: str, actor: str, reason: str = "deleted") -> tuple[Row, Interrupted | None]:
        """A queued or running job is cancelled with the reason ('deleted'); its rows stay."""
        return await self._write(partial(control.delete, job_id=job_id, actor=actor, reason=reason, now=self.clock()))

    async def clear(
        self, node: str, actor: str, running: bool = False, reason: str = "cleared", only_owner: str | None = None
    ) -> tuple[list[str], Interrupted | None]:
        """`only_owner`: a member's name; the node's jobs of anyone else refuse the whole clear (403)."""
        return await self._write(
            partial(
                control.clear,
                node=node,
                actor=actor,
                running=running,
                now=self.clock(),
                reason=reason,
                only_owner=only_owner,
            )
        )

    async def retry(
        self, job_id: str, actor: str, nodes: frozenset[str] | None = None, max_waiting: dict[str, int] | None = None
    ) -> Row:
        """Only by explicit request: a failed or cancelled job goes to the tail of its node's queue
        (on a node there still is, within its owner's max_waiting)."""
        return await self._write(
            partial(control.retry, job_id=job_id, actor=actor, now=self.clock(), nodes=nodes, max_waiting=max_waiting)
        )

    async def drop_unreferenced_parts(self) -> Row:
        """The stored request parts (images, gpuq/store/parts.py) that no job refers to any more
        (their jobs deleted, or their requests emptied by retention), dropped: {"parts", "bytes"}.
        A part some job still refers to is never dropped."""
        return await self._write(parts.drop_unreferenced)

    async def requeue_unsent(self, sent: dict[str, int | None], reason: str) -> list[Row]:
        """When the router stops: the running job of each node in `sent` whose run is not the one
        its worker last sent to Ollama never reached it; it goes back to the head of its queue."""
        return await self._write(partial(lifecycle.requeue_unsent, sent=sent, reason=reason, now=self.clock()))

    async def put_back(self, job_id: str, run_id: int, reason: str) -> bool:
        """The run's request never reached Ollama (the node refused the connection): the job goes
        back to the head of its queue. False when the run had already ended (deleted meanwhile)."""
        return await self._write(
            partial(lifecycle.put_back, job_id=job_id, run_id=run_id, reason=reason, now=self.clock())
        )

    # -- batches (gpuq/store/batches.py) ------------------------------------------------------

    async def add_file(self, file_id: str, purpose: str, filename: str, content: bytes, owner: str | None) -> Row:
        """A file kept in the database (a batch's input), content and all."""
        return await self._write(
            partial(
                batches.add_file,
                file_id=file_id,
                purpose=purpose,
                filename=filename,
                content=content,
                owner=owner,
                now=self.clock(),
            )
        )

    async def delete_file(self, file_id: str, only_owner: str | None = None) -> None:
        """`only_owner`: a member's name; another's file is not found (404)."""
        await self._write(partial(batches.delete_file, file_id=file_id, only_owner=only_owner))

    async def create_batch(
        self,
        batch: batches.NewBatch,
        lines: Sequence[batches.NewLine],
        nodes: list[NodeInfo],
        actor: str,
        hand_over: Callable[[Row], None] | None = None,
        *,
        fair: bool = False,
        max_waiting: int | None = None,
    ) -> Row:
        """A batch and every line of it queued, in one commit (or, refused, nothing); the heads of
        idle nodes claimed in it go to their workers through `hand_over` after the commit."""
        assert hand_over is not None or not any(n.idle for n in nodes), "a claim needs its worker"

        def handed(result: tuple[Row, list[Row]]) -> None:
            for job in result[1]:
                hand_over(job)  # type: ignore[misc]

        row, _ = await self._write(
            partial(
                batches.create_batch,
                batch=batch,
                lines=lines,
                nodes=nodes,
                actor=actor,
                now=self.clock(),
                fair=fair,
                max_waiting=max_waiting,
                max_running=dict(self.max_running),
            ),
            handed if hand_over else None,
        )
        return row

    async def keep_batch_response(self, job_id: str, response: str) -> bool:
        """A batch line's reply (JSON, its endpoint's shape), kept as its run ends."""
        return await self._write(partial(batches.keep_response, job_id=job_id, response=response))

    async def cancel_batch(self, batch_id: str, actor: str, only_owner: str | None = None) -> tuple[Row, int]:
        """Its waiting lines cancelled now; it is cancelled once its running ones end."""
        return await self._write(
            partial(batches.cancel_batch, batch_id=batch_id, actor=actor, now=self.clock(), only_owner=only_owner)
        )

    async def expire_batches(self, actor: str) -> list[tuple[str, int]]:
        """The waiting lines of every batch past its completion_window cancelled as expired."""
        return await self._write(partial(batches.expire_due, now=self.clock(), actor=actor))

    async def finalize_batch(self, batch_id: str, render: Callable[[Row, list[Row]], batches.Rendered]) -> Row | None:
        """Write a batch's output and error files once every line has ended; None if not due."""
        return await self._write(partial(batches.finalize, batch_id=batch_id, render=render, now=self.clock()))

    async def delete_batch(self, batch_id: str, only_owner: str | None = None) -> Row:
        """An ended batch deleted with its output and error files (its jobs stay in the history)."""
        return await self._write(partial(batches.delete_batch, batch_id=batch_id, only_owner=only_owner))

    async def retry_batch(
        self,
        batch_id: str,
        actor: str,
        only_owner: str | None = None,
        nodes: frozenset[str] | None = None,
        max_waiting: dict[str, int] | None = None,
        window_s: float | None = None,
    ) -> tuple[Row, list[str]]:
        """Its failed and cancelled lines queued again, on request; the batch in progress again
        (one past its expiry given a new completion window of `window_s` from now)."""
        return await self._write(
            partial(
                batches.retry_failed,
                batch_id=batch_id,
                actor=actor,
                now=self.clock(),
                only_owner=only_owner,
                nodes=nodes,
                max_waiting=max_waiting,
                window_s=window_s,
            )
        )

    # -- other routers' changes (PostgreSQL) --------------------------------------------------

    async def watch(self, on_change: Callable[[dict[str, Any] | None], None], poll_s: float = 1.0) -> None:
        """Until it fails: each job change another router commits, as postgres.watch tells it
        (on SQLite no other router writes: nothing to watch, returns at once)."""
        if self.dsn:
            await postgres.watch(self.dsn, self.busy_timeout_s, on_change, self._writer_pid, poll_s)

    def _writer_pid(self) -> int | None:
        db = self._writer.db if self._writer is not None else None
        return getattr(db, "backend_pid", None)

    # -- reading (every read but this one: gpuq/store/reads.py, Store's base) ----------------------

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

    # -- a backup while the router runs (gpuq/store/backup.py) ----------------------------------

    async def backup(self, path: str, force: bool = False, scheduled: bool = False) -> dict[str, Any]:
        """A consistent, checked copy of the database at `path` (absolute, on the router's
        machine; an existing file replaced only with `force`), made in a thread with a connection
        of its own: the writer and the readers go on meanwhile. Answered once the copy is in place.
        Each copy tried (its path accepted) is recorded in the backup table, made or failed, with
        `scheduled` (the router's own, gpuq/upkeep/backups.py). On PostgreSQL: Conflict, naming pg_dump."""
        if self.dsn:
            raise Conflict(backup.pg_dump_advice(self.dsn))
        if (lost := self.lost) is not None:  # a copy of whatever now stands at the path is no backup
            raise StoreUnavailable(lost)
        database = self._sqlite_path()
        started = self.clock()
        accepted: list[Path] = []  # the target, once its checks passed

        def run() -> dict[str, Any]:
            # Taken in the thread: a caller that goes away does not free it while the copy runs.
            if not self._backing_up.acquire(blocking=False):
                raise BackupBusy("a backup of this database is being made already; wait for it to finish")
            try:
                target = backup.target_of(database, path, force)
                accepted.append(target)
                return backup.back_up(database, target, self.busy_timeout_s)
            finally:
                self._backing_up.release()

        try:
            made = await asyncio.to_thread(run)
        except BackupBusy:
            raise
        except GpuqError as exc:
            # A copy that failed is on the record; a path refused only for a scheduled backup
            # (a person asking is told at once, and a typo is no failed backup).
            if accepted or scheduled:
                await self._record_backup_quietly(path, scheduled, started, None, exc.message)
            raise
        await self._record_backup_quietly(made["path"], scheduled, started, made, None)
        return made

    async def _record_backup_quietly(
        self, path: str, scheduled: bool, started: float, made: dict[str, Any] | None, error: str | None
    ) -> None:
        """A backup made is made even when the database refuses its record (full, locked): the
        schedule keeps its own time of it too (gpuq/upkeep/backups.py), and the log says the record
        is missing (rotation, which goes by the records, leaves that file alone)."""
        try:
            await self.record_backup(path, scheduled, started, made, error)
        except GpuqError as exc:
            log.error("backup of %s: not recorded: %s", path, exc.message)

    async def record_backup(
        self, path: str, scheduled: bool, started: float, made: dict[str, Any] | None, error: str | None
    ) -> Row:
        """One backup taken (`made`: what Store.backup answered) or failed (`error`), on the record."""
        return await self._write(
            partial(
                records.record_backup,
                path=path,
                scheduled=scheduled,
                started=started,
                made=made,
                error=error,
                now=self.clock(),
            )
        )

    async def record_sweep(
        self, router: str | None, asked: bool, started: float, swept: dict[str, Any], error: str | None
    ) -> Row:
        """One retention sweep that ran, done or failed (`error`), with what it did: on the record
        every router reads (gpuq/upkeep/retention.py)."""
        return await self._write(
            partial(
                records.record_sweep,
                router=router,
                asked=asked,
                started=started,
                swept=swept,
                error=error,
                now=self.clock(),
            )
        )

    async def backups_removed(self, ids: list[int]) -> None:
        """Rotation deleted these scheduled backups' files (gpuq/upkeep/backups.py)."""
        await self._write(partial(records.backups_removed, ids=ids, now=self.clock()))

    # -- the storage budget (gpuq/store/storage.py) ------------------------------------------------

    async def storage_now(self) -> dict[str, Any]:
        """The database's bytes now (a SQLite file's and its WAL's; PostgreSQL's pg_database_size)
        and the free bytes on its disk (None on PostgreSQL: the server's disk is not ours to see)."""
        if self.dsn:
            size = int((await self.read(storage.PG_DATABASE_BYTES_SQL))[0]["bytes"])
            return {"database_bytes": size, "file_bytes": size, "wal_bytes": 0, "free_bytes": None}
        path = self._sqlite_path()
        main, wal = await asyncio.to_thread(storage.file_bytes, path)
        free = await asyncio.to_thread(storage.disk_free, path)
        return {"database_bytes": main + wal, "file_bytes": main, "wal_bytes": wal, "free_bytes": free}

    async def record_storage_sample(self, database_bytes: int, free_bytes: int | None, min_gap_s: float) -> bool:
        """A sample of the database's size (none within `min_gap_s` of the last); True when recorded."""
        return await self._write(
            partial(
                records.record_storage_sample,
                database_bytes=database_bytes,
                free_bytes=free_bytes,
                min_gap_s=min_gap_s,
                now=self.clock(),
            )
        )

    async def relations(self) -> dict[str, Any]:
        """Which tables and indexes hold the bytes, largest first, how they were counted
        ("dbstat", "estimate" or "postgres"), and the bytes a SQLite file holds empty (`empty_bytes`:
        counted by dbstat, else None; on PostgreSQL None, its VACUUM's business)."""
        if self.dsn:
            found = storage.pg_relations(await self.read(storage.PG_RELATIONS_SQL))
            return {"method": "postgres", "relations": found, "empty_bytes": None}
        method, found, empty = await asyncio.to_thread(
            storage.sqlite_relations, self._sqlite_path(), self.busy_timeout_s
        )
        return {"method": method, "relations": found, "empty_bytes": empty}

    async def compact(self) -> dict[str, Any] | None:
        """SQLite: the file rewritten without its empty space (VACUUM, then the WAL truncated),
        holding the writer meanwhile; {"before", "after", "seconds"} (bytes of file and WAL).
        None on PostgreSQL, whose autovacuum reuses the space (docs/operations)."""
        if self.dsn or self._writer is None:
            return None
        path = self._sqlite_path()
        before = sum(await asyncio.to_thread(storage.file_bytes, path))

        def compact(db: Connection) -> float:
            assert isinstance(db, sqlite3.Connection)
            return sqlite.compact(db)

        seconds: float = await self._writer.call(compact)
        after = sum(await asyncio.to_thread(storage.file_bytes, path))
        return {"before": before, "after": after, "seconds": seconds}

    # -- retention (gpuq/store/retention.py; its reads are in reads.py) -------------------------

    async def prune(self, ids: list[str], cutoffs: retention.Cutoffs) -> dict[str, Any]:
        """Shed the bulk (request, output, reasoning) of the jobs of `ids` still due; what went
        (and how long its statements held the writer, `held_ms`)."""
        return await self._write(partial(retention.prune, ids=ids, cutoffs=cutoffs, now=self.clock()))

    async def delete_ended(self, ids: list[str], cutoffs: retention.Cutoffs) -> dict[str, Any]:
        """Delete the jobs of `ids` still due, with their runs and events; what went (`held_ms`
        as prune's)."""
        return await self._write(partial(retention.delete, ids=ids, cutoffs=cutoffs))

    async def prune_batches(self, ids: list[str], cutoffs: retention.Cutoffs) -> dict[str, Any]:
        """The ended batches of `ids` still due lose their files and their lines' replies."""
        return await self._write(partial(retention.prune_batches, ids=ids, cutoffs=cutoffs, now=self.clock()))

    async def delete_batches(self, ids: list[str], cutoffs: retention.Cutoffs) -> dict[str, Any]:
        """The ended batches of `ids` still due go, with their lines and files (their jobs after)."""
        return await self._write(partial(retention.delete_batches, ids=ids, cutoffs=cutoffs))

    async def give_back_space(self, pages: int = 2048) -> int:
        """SQLite: up to `pages` free pages back to the file system (PostgreSQL's autovacuum does
        its own); returns how many went."""
        if self.dsn or self._writer is None:
            return 0

        def give_back(db: Connection) -> int:
            assert isinstance(db, sqlite3.Connection)
            return sqlite.give_back(db, pages)

        freed: int = await self._writer.call(give_back)
        return freed

    async def take_service(self, router: leases.Router, service: str, lease_s: float) -> bool:
        """Does this router run the maintenance `service` (its lease taken or renewed)?"""
        return await self._write(
            partial(leases.take_service, router=router, service=service, lease_s=lease_s, now=self._lease_now())
        )

    # -- per-node leases (gpuq/store/leases.py): exactly one router drives a node ----------------

    @property
    def alone(self) -> bool:
        """SQLite: one router per database file (its lock file), so every other router is dead and
        a router starting takes every node at once. On PostgreSQL other routers may be alive."""
        return self.dsn is None

    def _lease_now(self) -> float | None:
        """The clock leases are written with: the router's on SQLite (it is alone); on PostgreSQL
        None, the server's own (leases.clock), so routers whose clocks disagree still agree on
        when a lease runs out."""
        return self.clock() if self.dsn is None else None

    async def _lease_clock(self) -> float:
        """Now, by the clock leases are judged by (the database server's on PostgreSQL), for a read."""
        now = self._lease_now()
        return now if now is not None else float((await self.read(leases.DB_NOW_SQL + " AS now"))[0]["now"])

    async def take_nodes(
        self, router: leases.Router, nodes: list[str], lease_s: float, alone: bool = False
    ) -> leases.Taken:
        """Take (or renew) the leases this router may hold; the jobs left running on nodes taken
        from dead routers fail, naming them."""
        return await self._write(
            partial(leases.take, router=router, nodes=nodes, lease_s=lease_s, now=self._lease_now(), alone=alone)
        )

    async def end_dead_routers(self, router: leases.Router, alive: Callable[[int], bool]) -> list[str]:
        """Routers this host ran whose process is gone (`alive(pid)` says no): their leases end
        now. Returns the nodes freed."""
        rows = await self.read(leases.ON_HOST_SQL, (router.host, router.id))
        dead = [r["id"] for r in rows if not alive(r["pid"])]
        return await self._write(partial(leases.end_dead, router_ids=dead, now=self._lease_now())) if dead else []

    async def nodes_driven_elsewhere(self, router_id: str) -> list[NodeInfo]:
        """The nodes other live routers drive now (their lease not run out, by the database's
        clock on PostgreSQL), as their rows say them: health, installed models (migration 023).
        None is idle for this router (their workers are the others'). On SQLite the router is
        alone (its start ended every other router's leases): none."""
        rows = await self.read(leases.DRIVEN_ELSEWHERE_SQL, (router_id, await self._lease_clock()))
        return [leases.node_info(r) for r in rows]

    async def renew_nodes(self, router: leases.Router, nodes: list[str], lease_s: float) -> list[str]:
        """Renew this router's leases; returns the nodes it still holds."""
        return await self._write(
            partial(leases.renew, router=router, nodes=nodes, lease_s=lease_s, now=self._lease_now())
        )

    async def release_nodes(self, router: leases.Router) -> list[str]:
        """A clean stop: this router's leases are freed for the next router."""
        return await self._write(partial(leases.release, router=router, now=self.clock()))

    async def routers(self, lease_s: float) -> dict[str, Any]:
        """The routers alive (seen within `lease_s`), the nodes each holds, each node's holder."""
        now = await self._lease_clock()
        return leases.alive(
            await self.read(leases.ROUTERS_SQL, (now - lease_s,)), await self.read(leases.LEASES_SQL), now
        )
