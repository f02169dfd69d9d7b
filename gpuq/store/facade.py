"""The store: an async facade over the queue's verbs (gpuq/store/verbs.py) and every read.

Each write is a verb, a plain function of a connection, run in the writer's own thread on its
connection, in a savepoint of a group commit (`BEGIN IMMEDIATE` ... `COMMIT`, see writer.py),
checked against the job's current state inside it. Reads go through a second connection
(aiosqlite's, its public API), which WAL lets in alongside; their SQL is here.

The engine is SQLite (a file's path: one router) or PostgreSQL (a `postgresql://` DSN: any number
of routers on one queue, gpuq/store/postgres.py): the same verbs, reads and answers; the few
statements written per engine come from its module (`self.engine`)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TypeVar

import aiosqlite

from . import leases, postgres, sqlite, verbs
from .engine import Connection, Engine, Params, engine_for
from .writer import Writer
from .dbfile import DatabaseFile
from ..config import NodeConfig
from ..errors import NotFound, StartupError, StoreUnavailable
from ..jobs import Interrupted, JobState, NewJob, NodeCounts, NodeInfo, iso
from ..placement import INTERACTIVE
from ..shipped import shipped_dir, shipped_files
from .sqlite import STALE_SQL
from .verbs import QUEUE_POSITION_SQL, Row, rows

__all__ = ["Interrupted", "NewJob", "NodeInfo", "Row", "Store", "STALE_SQL", "MIGRATIONS_DIR"]

MIGRATIONS_DIR = shipped_dir("store.migrations")

T = TypeVar("T")

# The parent a held critique waits for (NULL for any other job): the view held_job is the one
# statement of the rule (migration 003, and ready_job its complement since 012).
WAITING_FOR = "(SELECT h.parent_id FROM held_job h WHERE h.id = j.id) AS waiting_for"

# A listing (/api/queue, /api/jobs) carries each prompt's first 300 characters and its size in
# UTF-8 bytes, which SQLite stores beside the prompt when it is written (migration 005): 300
# waiting 1 MB prompts are neither read from the file nor held in the router's memory. Only a
# single job's read (/api/jobs/{id}) adds the whole prompt.
LISTING_COLUMNS = """j.id, j.kind, j.state, j.node, j.model, j.parent_id, j.group_id,
    j.position, j.placement, j.run_id, j.error, j.findings, j.timeout_s, j.created_at, j.finished_at,
    j.think, j.options, j.endpoint, j.prompt_excerpt, j.prompt_bytes, j.owner, j.client, j.lane,
    r.started_at, r.progress_at, r.work_done_at, r.eval_count, r.prompt_eval_count,
    r.eval_duration_ns, r.total_duration_ns, r.done_reason,
    (SELECT COUNT(*) FROM run p WHERE p.job_id = j.id AND p.state = 'preempted') AS preempted_runs,
    """ + WAITING_FOR
DETAIL_COLUMNS = LISTING_COLUMNS + ", j.prompt"

JOB_FROM = "FROM job j LEFT JOIN run r ON r.id = j.run_id"

# A call to the database (a read, or a write with its commit) that has not returned after this
# long means the store is not answering: /health says so from memory, without asking it.
SLOW_CALL_S = 2.0


class _Abandoned(Exception):
    """A bounded write its caller stopped waiting for, before the writer's thread ran it."""


class Store:
    def __init__(self, path: Path | str, busy_timeout_s: float = 5.0, clock: Callable[[], float] = time.time,
                 max_bytes: int | None = None, submit_timeout_s: float | None = None):
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
        # the calls waiting for it now (monotonic start per kind), and the last refused write.
        self._waiting: dict[str, dict[int, float]] = {"read": {}, "write": {}}
        self._refused: tuple[float, float, str] | None = None  # (since, wall; last, monotonic; why)
        # Users' max_running ({user: limit}, the dispatcher's from gpuq.toml): every claim skips
        # a job whose owner runs that many already.
        self.max_running: dict[str, int] = {}

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
            self._writer = Writer(self._connect_writer, self.engine.from_error, engine=self.engine,
                                  refuse=self._refusal if self._file else None)
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
            files = shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations")
            path = self._sqlite_path()

            def migrate(db: Connection) -> None:
                assert isinstance(db, sqlite3.Connection)
                sqlite.migrate(db, files=files, now=now, path=path)
        await self._writer.call(migrate)

    async def _write(self, verb: Callable[[Connection], T],
                     after: Callable[[T], None] | None = None) -> T:
        """Run `verb` as one transaction (a savepoint of a group commit) in the writer's thread.
        Writes that arrive together share one commit, each is answered only after it, and one
        that raises is rolled back alone. `after` gets the result once committed (see Writer.run)."""
        if self._writer is None:
            raise StoreUnavailable("the store is not open; nothing was changed")
        if self._file and self._file.lost is not None:  # known lost: not even queued
            raise StoreUnavailable(self._file.lost)
        with self._call("write"):
            try:
                result = await self._writer.run(verb, after)
            except StoreUnavailable as exc:
                self._note_refused(exc.message)
                raise
        return result

    async def _bounded_write(self, verb: Callable[[Connection], T], after: Callable[[T], None] | None,
                             wait_s: float, what: str, setting: str) -> T:
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
                self._note_refused(f"a {what} waited {wait_s:g}s for the database")
                raise StoreUnavailable(f"the database did not take the {what} within {wait_s:g}s ({setting}):"
                                       f" {why}; nothing was changed")
            done, _ = await asyncio.wait({task}, timeout=wait_s)
            if not done:
                raise StoreUnavailable(
                    f"the database did not confirm the {what} within {2 * wait_s:g}s ({setting}): its commit"
                    " is still waiting on the disk, so it may or may not be stored; look before sending it again")
        return task.result()

    # -- the store's health, from memory ---------------------------------------------------------

    @contextmanager
    def _call(self, kind: str) -> Iterator[None]:
        """Count a read or a write as waiting for the store while it runs."""
        key = object()
        self._waiting[kind][id(key)] = time.monotonic()
        try:
            yield
        finally:
            del self._waiting[kind][id(key)]

    def _note_refused(self, why: str) -> None:
        now = time.monotonic()
        since = self._refused[0] if self._refused and now - self._refused[1] < self._refusal_hold_s() else time.time()
        self._refused = (since, now, why)

    def _refusal_hold_s(self) -> float:
        """A refusal counts for this long: while a lock is held every write is refused, one
        after another, each after the busy timeout; writes between refusals may still land
        (a full disk takes the small ones)."""
        return 2 * self.busy_timeout_s + 2.0

    def trouble(self, slow_s: float = SLOW_CALL_S) -> dict[str, str] | None:
        """What is wrong with the store now, as the router lives it, or None: a call waiting past
        `slow_s` (the store does not answer), else writes refused within the last few seconds.
        Never asks the store, so it answers whatever the store does."""
        now = time.monotonic()
        for kind in ("read", "write"):
            started = min(self._waiting[kind].values(), default=None)
            if started is not None and now - started >= slow_s:
                return {"problem": f"the database is not answering: a {kind} has waited {now - started:.1f}s",
                        "since": iso(time.time() - (now - started))}
        if self._refused is not None and now - self._refused[1] < self._refusal_hold_s():
            since, _, why = self._refused
            return {"problem": f"the database refuses writes (for {time.time() - since:.0f}s): {why}",
                    "since": iso(since)}
        return None

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
        await self._write(partial(verbs.configure, settings_s=settings_s, nodes=nodes))

    async def remove_nodes(self, names: list[str], force: bool, reason: str,
                           refused: Callable[[dict[str, list[str]], dict[str, str]], str | None]) -> list[Row]:
        """Nodes leaving the config: refused while jobs wait or run there, unless forced (then the
        waiting ones fail with `reason`)."""
        return await self._write(partial(verbs.remove_nodes, names=names, force=force, reason=reason,
                                         now=self.clock(), refused=refused))

    async def record_reload(self, actor: str, path: str, changes: dict[str, Any] | None, error: str | None) -> None:
        await self._write(partial(verbs.record_reload, actor=actor, path=path, changes=changes, error=error,
                                  now=self.clock()))

    async def set_node_health(self, name: str, up: bool, error: str | None) -> None:
        await self._write(partial(verbs.set_node_health, name=name, up=up, error=error, now=self.clock()))

    async def note_stale(self, now: float | None = None) -> list[Row]:
        """Write one event per newly stale head (not one per check); returns the new ones."""
        return await self._write(partial(verbs.note_stale, now=self.clock() if now is None else now))

    async def note(self, job_id: str, reason: str, actor: str = "router") -> None:
        """An event that changes no state: an unload that failed, a stale head, a node flag."""
        await self._write(partial(verbs.note, job_id=job_id, reason=reason, actor=actor, now=self.clock()))

    async def fail_orphans(self) -> list[Row]:
        """At start-up: a job still running belonged to a dead router. Fail it, loudly."""
        return await self._write(partial(verbs.fail_orphans, now=self.clock()))

    async def cancel_clientless(self, nodes: list[str]) -> list[Row]:
        """At start-up: a front-door call still waiting on the nodes this router now drives lost
        its client with the old router."""
        return await self._write(partial(verbs.cancel_clientless, now=self.clock(), nodes=nodes))

    async def fire_alert(self, alert: dict[str, Any], deliver: bool) -> Row:
        return await self._write(partial(verbs.fire_alert, alert=alert, deliver=deliver, now=self.clock()))

    async def resolve_alert(self, alert_id: int, resolution: str) -> None:
        await self._write(partial(verbs.resolve_alert, alert_id=alert_id, resolution=resolution, now=self.clock()))

    async def owe_open_alerts(self) -> int:
        return await self._write(verbs.owe_open_alerts)

    async def record_delivery(self, alert_id: int, status: str, attempt: int, ok: bool,
                              http_status: int | None, error: str | None) -> None:
        await self._write(partial(verbs.record_delivery, alert_id=alert_id, status=status, attempt=attempt,
                                  ok=ok, http_status=http_status, error=error, now=self.clock()))

    # -- the queue's verbs ----------------------------------------------------------------------

    async def submit(self, new: NewJob, nodes: list[NodeInfo], actor: str,
                     hand_over: Callable[[Row], None] | None = None, *, fair: bool = False,
                     max_waiting: int | None = None) -> list[Row]:
        """Place and insert a job (a task, or a critique's whole fan-out), durably: answered
        only once its transaction has committed. On a node whose worker waits idle
        (NodeInfo.idle) the same commit claims the node's head, and `hand_over` gives it to
        that worker on the loop right after the commit, whether or not the caller still waits."""
        assert hand_over is not None or not any(n.idle for n in nodes), "a claim needs its worker"

        def handed(result: tuple[list[Row], list[Row]]) -> None:
            for job in result[1]:
                hand_over(job)  # type: ignore[misc]
        write = partial(verbs.submit_and_claim, new=new, nodes=nodes, actor=actor, now=self.clock(), fair=fair,
                        max_waiting=max_waiting, max_running=dict(self.max_running))
        if self.submit_timeout_s is None:
            created, _ = await self._write(write, handed if hand_over else None)
        else:
            created, _ = await self._bounded_write(write, handed if hand_over else None, self.submit_timeout_s,
                                                   "submit", "router.submit_timeout")
        return created

    async def claim(self, node: str) -> Row | None:
        """Take the head of the node's queue: it becomes running with a new run row."""
        return await self._write(partial(verbs.claim, node=node, now=self.clock(),
                                         max_running=dict(self.max_running)))

    async def heartbeat(self, run_id: int, output: str, thinking: str | None = None) -> None:
        """Progress: `output` and `thinking` are the text that came since the last write (appended)."""
        await self._write(partial(verbs.heartbeat, run_id=run_id, output=output, thinking=thinking,
                                  now=self.clock()))

    async def work_done(self, run_id: int, output: str, stats: dict[str, Any], thinking: str | None = None) -> None:
        """Ollama's stream ended (`output`: the text not stored yet); the job is not finished
        until its model has left VRAM."""
        await self._write(partial(verbs.work_done, run_id=run_id, output=output, stats=stats, thinking=thinking,
                                  now=self.clock()))

    async def save_output(self, run_id: int, output: str, thinking: str | None = None) -> None:
        """Keep the last, unsaved output of an interrupted run, whatever state it ended in."""
        await self._write(partial(verbs.append_output, run_id=run_id, output=output, thinking=thinking,
                                  now=self.clock()))

    async def finish(self, job_id: str, run_id: int, state: str, error: str | None,
                     output: str | None = None, actor: str = "router",
                     findings: list[Any] | None = None, claim_node: str | None = None,
                     thinking: str | None = None, streamed: int = 0) -> Row | None:
        """Finish a run that is still the job's running run; anything else is a GuardMiss.

        `streamed` pieces (one token each) count as a failed run's tokens: Ollama counts them in
        its last line, which a reply that broke off never sent.

        With `claim_node`, the node's next job is claimed in the same transaction and returned:
        a worker going from job to job pays one durable commit between them, not two."""
        assert state in (JobState.DONE, JobState.FAILED)
        return await self._write(partial(
            verbs.finish, job_id=job_id, run_id=run_id, state=state, error=error, now=self.clock(),
            output=output, actor=actor, findings=findings, claim_node=claim_node, thinking=thinking,
            streamed=streamed, max_running=dict(self.max_running)))

    async def move(self, job_id: str, nodes: list[NodeInfo], actor: str, *, position: int | None = None,
                   before: str | None = None, after: str | None = None, node: str | None = None) -> Row:
        """Reorder a queued job within its node's queue or move it to another node's queue."""
        return await self._write(partial(verbs.move, job_id=job_id, nodes=nodes, actor=actor, now=self.clock(),
                                         position=position, before=before, after=after, node=node))

    async def preempt(self, job_id: str, actor: str, only_owner: str | None = None,
                      rule: Callable[[str], bool] | None = None,
                      reason: str | None = None, to: str | None = None,
                      nodes: Sequence[NodeInfo] = ()) -> tuple[Row, Interrupted | None]:
        """The queued job runs next: to the head, and the node's running job goes back behind it
        (`only_owner`: a member's name; someone else's running job refuses it, 403). `rule`: the
        router's own preempt, only when it holds for the running job's lane (else nothing
        changes); `to`: on that node, moved there in the same transaction; `reason`: what the
        interrupted job's event says."""
        return await self._write(partial(verbs.preempt, job_id=job_id, actor=actor, now=self.clock(),
                                         only_owner=only_owner, rule=rule, reason=reason, to=to, nodes=nodes))

    async def delete(self, job_id: str, actor: str, reason: str = "deleted") -> tuple[Row, Interrupted | None]:
        """A queued or running job is cancelled with the reason ('deleted'); its rows stay."""
        return await self._write(partial(verbs.delete, job_id=job_id, actor=actor, reason=reason, now=self.clock()))

    async def clear(self, node: str, actor: str, running: bool = False, reason: str = "cleared",
                    only_owner: str | None = None) -> tuple[list[str], Interrupted | None]:
        """`only_owner`: a member's name; the node's jobs of anyone else refuse the whole clear (403)."""
        return await self._write(partial(verbs.clear, node=node, actor=actor, running=running, now=self.clock(),
                                         reason=reason, only_owner=only_owner))

    async def retry(self, job_id: str, actor: str, nodes: frozenset[str] | None = None,
                    max_waiting: dict[str, int] | None = None) -> Row:
        """Only by explicit request: a failed or cancelled job goes to the tail of its node's queue
        (on a node there still is, within its owner's max_waiting)."""
        return await self._write(partial(verbs.retry, job_id=job_id, actor=actor, now=self.clock(), nodes=nodes,
                                         max_waiting=max_waiting))

    async def requeue_unsent(self, sent: dict[str, int | None], reason: str) -> list[Row]:
        """When the router stops: the running job of each node in `sent` whose run is not the one
        its worker last sent to Ollama never reached it; it goes back to the head of its queue."""
        return await self._write(partial(verbs.requeue_unsent, sent=sent, reason=reason, now=self.clock()))

    async def put_back(self, job_id: str, run_id: int, reason: str) -> bool:
        """The run's request never reached Ollama (the node refused the connection): the job goes
        back to the head of its queue. False when the run had already ended (deleted meanwhile)."""
        return await self._write(partial(verbs.put_back, job_id=job_id, run_id=run_id, reason=reason,
                                         now=self.clock()))

    # -- other routers' changes (PostgreSQL) --------------------------------------------------

    async def watch(self, on_change: Callable[[dict[str, Any] | None], None], poll_s: float = 1.0) -> None:
        """Until it fails: each job change another router commits, as postgres.watch tells it
        (on SQLite no other router writes: nothing to watch, returns at once)."""
        if self.dsn:
            await postgres.watch(self.dsn, self.busy_timeout_s, on_change, self._writer_pid, poll_s)

    def _writer_pid(self) -> int | None:
        db = self._writer.db if self._writer is not None else None
        return getattr(db, "backend_pid", None)

    # -- reading ------------------------------------------------------------------------------

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
        self._waiting["read"][key] = time.monotonic()
        task.add_done_callback(lambda t: (self._waiting["read"].pop(key, None), t.cancelled() or t.exception()))
        try:
            found = await asyncio.shield(task)
            answer: list[Row] = rows(found) if self._pool else found  # SQLite's reader makes dicts in its thread
            return answer
        except (sqlite.Error, postgres.Error) as exc:
            raise self.engine.from_error(exc) from exc

    async def lanes_in_play(self, job_id: str) -> list[Row]:
        """Each running job's node, lane and model, and the interactive jobs waiting (but
        `job_id`): what placement.preempt_elsewhere weighs."""
        return await self.read("SELECT node, state, lane, model FROM job WHERE state = 'running'"
                               " OR (state = 'queued' AND lane = ? AND id != ?)", (INTERACTIVE, job_id))

    async def stale_heads(self, now: float | None = None) -> list[Row]:
        return await self.read(self.engine.STALE_SQL, {"now": iso(self.clock() if now is None else now)})

    async def job(self, job_id: str, columns: str = LISTING_COLUMNS) -> Row:
        """A job as listings show it (its prompt's excerpt and size, not the prompt)."""
        rows = await self.read(f"SELECT {columns} {JOB_FROM} WHERE j.id = ?", (job_id,))
        if not rows:
            raise NotFound(f"no job with id '{job_id}'")
        return rows[0]

    async def job_detail(self, job_id: str) -> Row:
        """The whole job: its full prompt, output, runs, events and critiques."""
        job = await self.job(job_id, DETAIL_COLUMNS)
        job["runs"] = await self.runs(job_id)
        job["events"] = await self.read(
            "SELECT at, from_state, to_state, actor, reason FROM event WHERE job_id = ? ORDER BY id",
            (job_id,),
        )
        job["children"] = await self.read(  # each critique's finding count and highest severity too
            f"SELECT id, kind, state, node, model, {self.engine.FINDING_COUNT} AS finding_count,"
            f" {self.engine.TOP_SEVERITY} AS top_severity FROM job WHERE parent_id = ? ORDER BY created_at, id",
            (job_id,),
        )
        if job.get("endpoint"):  # a front-door call: the request as received, for forensics
            job["request"] = (await self.read("SELECT request FROM job WHERE id = ?", (job_id,)))[0]["request"]
        job["output"] = job["runs"][-1]["output"] if job["runs"] else ""
        job["thinking"] = job["runs"][-1]["thinking"] if job["runs"] else None
        if job["state"] == JobState.QUEUED:
            job["queue_position"] = await self.queue_position(job)
        return job

    async def runs(self, job_id: str) -> list[Row]:
        """A job's runs, oldest first, each with its whole text (output, thinking) from the view
        run_text (see verbs.run_text_query), not the run row's columns, which hold only the text
        of runs written before migration 011."""
        runs = await self.read("SELECT * FROM run WHERE job_id = ? ORDER BY id", (job_id,))
        texts = await self.run_texts([r["id"] for r in runs]) if runs else {}
        for r in runs:
            r.update(texts[r["id"]])
        return runs

    async def run_texts(self, run_ids: list[int]) -> dict[int, verbs.RunText]:
        """Runs' whole text, each {"output", "thinking"}: the one read of it (verbs.run_text_query)."""
        return verbs.joined_text(run_ids, await self.read(*verbs.run_text_query(run_ids)))

    async def queue_position(self, job: Row) -> int:
        rows = await self.read(QUEUE_POSITION_SQL, {k: job[k] for k in ("node", "position", "id")})
        n: int = rows[0]["n"]
        return n

    async def jobs(self, node: str | None = None, state: str | None = None, limit: int = 100) -> list[Row]:
        where, params = [], []
        if node:
            where.append("j.node = ?")
            params.append(node)
        if state:
            where.append("j.state = ?")
            params.append(state)
        sql = f"SELECT {LISTING_COLUMNS} {JOB_FROM}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return await self.read(sql + " ORDER BY j.created_at DESC, j.id DESC LIMIT ?", (*params, limit))

    async def queue(self, node: str, limit: int, offset: int = 0) -> tuple[Row | None, list[Row], int]:
        """The node's running job, `limit` of its queued jobs in order from the `offset`-th (0:
        the head), and how many wait."""
        running = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM} WHERE j.node = ? AND j.state = 'running'", (node,)
        )
        queued = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM} WHERE j.node = ? AND j.state = 'queued'"
            " ORDER BY j.position, j.id LIMIT ? OFFSET ?",
            (node, limit, offset),
        )
        count = await self.read("SELECT COUNT(*) AS n FROM job WHERE node = ? AND state = 'queued'", (node,))
        return (running[0] if running else None), queued, count[0]["n"]

    async def active_by_node(self) -> dict[str, NodeCounts]:
        """Running and queued jobs per node (one row per node: the table node_load)."""
        rows = await self.read("SELECT node, running, queued FROM node_load")
        return {r["node"]: NodeCounts(r["running"], r["queued"]) for r in rows}

    async def running_by_owner(self, owners: Iterable[str]) -> dict[str, int]:
        """How many jobs each of `owners` runs now (an owner running none is not in it)."""
        owners = tuple(owners)
        if not owners:
            return {}
        rows = await self.read(f"SELECT owner, COUNT(*) AS n FROM job WHERE state = 'running'"
                               f" AND owner IN ({','.join('?' * len(owners))}) GROUP BY owner", owners)
        return {r["owner"]: r["n"] for r in rows}

    async def finished_totals(self, after_event: int, duration_bounds: Sequence[float],
                              wait_bounds: Sequence[float]) -> list[Row]:
        """Jobs that ended after event `after_event`, summed per (node, kind, state, model, owner) for
        /metrics: counts, tokens, and each histogram's count, sum and cumulative count per
        bound. A range of the event table's primary key, grouped in SQL: one query, however
        long the history. Each end is counted with its own run (event.run_id, migration 012), not
        the job's latest: a failed run's tokens are not the retried run's."""
        le = ", ".join([f"SUM(CASE WHEN d <= {float(b)!r} THEN 1 ELSE 0 END) AS d_le_{i}"
                        for i, b in enumerate(duration_bounds)]
                       + [f"SUM(CASE WHEN w <= {float(b)!r} THEN 1 ELSE 0 END) AS w_le_{i}"
                          for i, b in enumerate(wait_bounds)])
        between = self.engine.seconds_between
        return await self.read(
            f"SELECT node, kind, state, model, owner, COUNT(*) AS n, SUM(tokens) AS tokens, MAX(event_id) AS last_event,"
            f" COUNT(d) AS d_n, COALESCE(SUM(d), 0.0) AS d_sum, COUNT(w) AS w_n, COALESCE(SUM(w), 0.0) AS w_sum,"
            f" {le} FROM ("
            " SELECT e.id AS event_id, e.to_state AS state, j.node, j.kind, COALESCE(r.model, j.model) AS model,"
            "  COALESCE(j.owner, '') AS owner,"
            "  COALESCE(r.eval_count, 0) AS tokens,"
            "  CASE WHEN e.to_state <> 'cancelled' AND r.finished_at IS NOT NULL"
            f"   THEN {between('r.started_at', 'r.finished_at')} END AS d,"
            f"  {between('j.created_at', '(SELECT MIN(f.started_at) FROM run f WHERE f.job_id = j.id)')}"
            "   AS w"
            " FROM event e JOIN job j ON j.id = e.job_id LEFT JOIN run r ON r.id = e.run_id"
            " WHERE e.id > ? AND e.to_state IN ('done', 'failed', 'cancelled') AND e.from_state <> e.to_state"
            ") AS ended GROUP BY node, kind, state, model, owner", (after_event,))

    async def next_ready(self, node: str) -> Row | None:
        """The job the node would claim next (None: nothing is ready)."""
        rows = await self.read("SELECT id, model FROM ready_job WHERE node = ? ORDER BY position, id LIMIT 1", (node,))
        return rows[0] if rows else None

    async def next_ready_model(self, node: str) -> str | None:
        """The model of the job the node would claim next (None: nothing is ready)."""
        rows = await self.read("SELECT model FROM ready_job WHERE node = ? ORDER BY position, id LIMIT 1", (node,))
        return rows[0]["model"] if rows else None

    # -- start estimates (gpuq/eta.py) ---------------------------------------------------------

    async def queue_plans(self, nodes: list[str], depth: int) -> list[Row]:
        """Each node's running job and first `depth` waiting jobs (held critiques included), with
        the few columns a start estimate needs; one statement, each part on an index."""
        if not nodes:
            return []
        waiting = ("SELECT * FROM (SELECT j.id, j.node, j.state, j.model, j.position, NULL AS started_at,"
                   f" {WAITING_FOR} FROM job j WHERE j.node = ? AND j.state = 'queued'"
                   " ORDER BY j.position, j.id LIMIT ?) AS waiting")
        running = ("SELECT j.id, j.node, j.state, j.model, 0 AS position, r.started_at, NULL AS waiting_for"
                   " FROM job j JOIN run r ON r.id = j.run_id WHERE j.state = 'running'")
        params: list[Any] = []
        for name in nodes:
            params += [name, depth]
        rows = await self.read(" UNION ALL ".join([running] + [waiting] * len(nodes)), params)
        rows.sort(key=lambda r: (r["node"], r["state"] != JobState.RUNNING, r["position"], r["id"]))
        return rows

    async def recent_durations(self, node_models: set[tuple[str, str]], nodes: set[str],
                               last: int = 20) -> list[Row]:
        """How long the last `last` done runs took, per node and model and per node: rows of
        (node, model or NULL for the node's, seconds). Each part reads its partial index."""
        seconds = self.engine.seconds_between("started_at", "finished_at") + " AS seconds"
        by_node, by_model = self.engine.indexed_by("run_done_node"), self.engine.indexed_by("run_done_node_model")
        parts: list[tuple[str, tuple[Any, ...]]] = [(f"SELECT * FROM (SELECT node, NULL AS model, {seconds} FROM run{by_node}"
                  " WHERE state = 'done' AND node = ? ORDER BY id DESC LIMIT ?) AS last", (node, last))
                 for node in sorted(nodes)]
        parts += [(f"SELECT * FROM (SELECT node, model, {seconds} FROM run{by_model}"
                   " WHERE state = 'done' AND node = ? AND model = ? ORDER BY id DESC LIMIT ?) AS last",
                   (node, model, last))
                  for node, model in sorted(node_models)]
        rows: list[Row] = []
        for at in range(0, len(parts), 400):  # SQLite compounds at most 500 SELECTs
            chunk = parts[at:at + 400]
            rows += await self.read(" UNION ALL ".join(sql for sql, _ in chunk), [p for _, ps in chunk for p in ps])
        return rows

    # -- history and utilisation (the history page, the busy strips) ---------------------------

    async def history(self, state: str | None, node: str | None, kind: str | None, text: str | None,
                      limit: int, offset: int, owner: str | None = None) -> tuple[list[Row], int]:
        """Finished jobs, newest first, filtered (by owner too); and how many match in all."""
        where, params = ["j.finished_at IS NOT NULL"], []
        for column, value in (("j.state", state), ("j.node", node), ("j.kind", kind), ("j.owner", owner)):
            if value:
                where.append(f"{column} = ?")
                params.append(value)
        if text:
            like = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            where.append("(" + " OR ".join(f"{c} {self.engine.LIKE} ? ESCAPE '\\'" for c in
                                           ("j.id", "j.model", "j.error", "j.prompt")) + ")")
            params += [like] * 4
        cond = " AND ".join(where)
        rows = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM.replace('job j', 'job j' + self.engine.indexed_by('job_finished'))}"
            f" WHERE {cond}"
            " ORDER BY j.finished_at DESC, j.id DESC"
            " LIMIT ? OFFSET ?", (*params, limit, offset))
        total = await self.read(f"SELECT COUNT(*) AS n FROM job j WHERE {cond}", params)
        return rows, total[0]["n"]

    async def finished_since(self, since: float) -> dict[str, int]:
        """How many jobs ended in each final state since `since` (index job_finished)."""
        rows = await self.read(f"SELECT state, COUNT(*) AS n FROM job{self.engine.indexed_by('job_finished')}"
                               " WHERE finished_at >= ?"
                               " GROUP BY state",
                               (iso(since),))
        return {r["state"]: r["n"] for r in rows}

    async def runs_since(self, since: float) -> list[Row]:
        """Every run that was on a node at some time after `since`: the running ones and those
        that ended after it (index run_finished), oldest first."""
        return await self.read(
            "SELECT node, state, started_at, finished_at FROM run WHERE finished_at >= ?"
            " UNION ALL SELECT node, state, started_at, finished_at FROM run WHERE state = 'running'"
            " ORDER BY started_at", (iso(since),))

    # -- alerts (gpuq/node/alerts.py) -----------------------------------------------------------------

    async def open_alerts(self) -> list[Row]:
        """Firings not resolved yet (a restart picks them up where the last router left them)."""
        return await self.read("SELECT * FROM alert WHERE resolved_at IS NULL ORDER BY id")

    async def alerts_owed(self) -> list[Row]:
        """Notices not delivered yet, oldest firing first, with how many tries the next one has had."""
        return await self.read(
            "SELECT a.*, (SELECT COUNT(*) FROM alert_delivery d WHERE d.alert_id = a.id AND d.status ="
            " CASE WHEN a.fired_sent_at IS NULL THEN 'firing' ELSE 'resolved' END) AS attempts"
            f" FROM alert a{self.engine.indexed_by('alert_owed')} WHERE a.deliver = 1 AND (a.fired_sent_at IS NULL"
            " OR (a.resolved_at IS NOT NULL AND a.resolved_sent_at IS NULL)) ORDER BY a.id")

    async def alerts(self, limit: int) -> list[Row]:
        """The latest firings, newest first, each with its delivery attempts."""
        rows = await self.read("SELECT * FROM alert ORDER BY id DESC LIMIT ?", (limit,))
        if rows:
            tries = await self.read(
                "SELECT * FROM alert_delivery WHERE alert_id BETWEEN ? AND ? ORDER BY id",
                (rows[-1]["id"], rows[0]["id"]))
            for row in rows:
                row["deliveries"] = [t for t in tries if t["alert_id"] == row["id"]]
        return rows

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

    async def take_nodes(self, router: leases.Router, nodes: list[str], lease_s: float,
                         alone: bool = False) -> leases.Taken:
        """Take (or renew) the leases this router may hold; the jobs left running on nodes taken
        from dead routers fail, naming them."""
        return await self._write(partial(leases.take, router=router, nodes=nodes, lease_s=lease_s,
                                         now=self._lease_now(), alone=alone))

    async def end_dead_routers(self, router: leases.Router, alive: Callable[[int], bool]) -> list[str]:
        """Routers this host ran whose process is gone (`alive(pid)` says no): their leases end
        now. Returns the nodes freed."""
        rows = await self.read(leases.ON_HOST_SQL, (router.host, router.id))
        dead = [r["id"] for r in rows if not alive(r["pid"])]
        return await self._write(partial(leases.end_dead, router_ids=dead, now=self._lease_now())) if dead else []

    async def renew_nodes(self, router: leases.Router, nodes: list[str], lease_s: float) -> list[str]:
        """Renew this router's leases; returns the nodes it still holds."""
        return await self._write(partial(leases.renew, router=router, nodes=nodes, lease_s=lease_s,
                                         now=self._lease_now()))

    async def release_nodes(self, router: leases.Router) -> list[str]:
        """A clean stop: this router's leases are freed for the next router."""
        return await self._write(partial(leases.release, router=router, now=self.clock()))

    async def routers(self, lease_s: float) -> dict[str, Any]:
        """The routers alive (seen within `lease_s`), the nodes each holds, each node's holder."""
        now = self.clock() if self.dsn is None else float((await self.read(leases.DB_NOW_SQL + " AS now"))[0]["now"])
        return leases.alive(await self.read(leases.ROUTERS_SQL, (now - lease_s,)),
                            await self.read(leases.LEASES_SQL), now)
