"""Every SQL statement gpuq runs. The methods are the queue's verbs. Each write is a plain
function run in the one writer connection's thread, in a savepoint of a group commit
(`BEGIN IMMEDIATE` ... `COMMIT`, see batching.py), checked against the job's current state
inside it; reads go through a second connection, which WAL lets in alongside."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

import aiosqlite

from . import placement as rules
from .batching import WriteBatcher, in_writer_thread
from .critique import parent_subject
from .errors import (
    GUARD_MESSAGE, BadRequest, Conflict, GpuqError, GuardRefused, NotFound, StoreUnavailable,
    Unprocessable,
)
from .models import ACTIVE, POSITION_GAP, JobState, iso, new_job_id
from .shipped import shipped_dir, shipped_files

MIGRATIONS_DIR = shipped_dir("migrations")

Row = dict[str, Any]
T = TypeVar("T")

# A listing (/api/queue, /api/jobs) carries each prompt's first 300 characters and its size in
# UTF-8 bytes, which SQLite stores beside the prompt when it is written (migration 005): 300
# waiting 1 MB prompts are neither read from the file nor held in the router's memory. Only a
# single job's read (/api/jobs/{id}) adds the whole prompt.
LISTING_COLUMNS = """j.id, j.kind, j.state, j.node, j.model, j.parent_id, j.group_id,
    j.position, j.placement, j.run_id, j.error, j.findings, j.timeout_s, j.created_at, j.finished_at,
    j.think, j.options, j.endpoint, j.prompt_excerpt, j.prompt_bytes,
    r.started_at, r.progress_at, r.work_done_at, r.eval_count, r.prompt_eval_count,
    r.eval_duration_ns, r.total_duration_ns, r.done_reason,
    (SELECT COUNT(*) FROM run p WHERE p.job_id = j.id AND p.state = 'preempted') AS preempted_runs,
    CASE WHEN j.state = 'queued' AND j.subject_from_parent = 1
              AND (SELECT p.state FROM job p WHERE p.id = j.parent_id) <> 'done'
         THEN j.parent_id END AS waiting_for"""
DETAIL_COLUMNS = LISTING_COLUMNS + ", j.prompt"

JOB_FROM = "FROM job j LEFT JOIN run r ON r.id = j.run_id"


# A running head is stale when Ollama finished but the job did not within the grace (the
# 49-minute case), when it ran past max_runtime, or when no tokens came for stale_after.
# Only running rows are read (the partial index job_one_running_per_node), so the cost stays
# flat as history grows. `:now` is the caller's clock; the stale_heads view uses 'now'.
STALE_SQL = """
SELECT id, node, state, since, reason, run_id FROM (
    SELECT j.id, j.node, j.state, j.run_id,
        CASE
            WHEN r.work_done_at IS NOT NULL
                 AND julianday(:now) - julianday(r.work_done_at) > s.grace / 86400.0
                THEN 'ollama finished but the job was not closed'
            WHEN julianday(:now) - julianday(r.started_at) > COALESCE(n.max_runtime_s, s.max_runtime) / 86400.0
                THEN 'ran past max_runtime'
            WHEN julianday(:now) - julianday(r.progress_at) > s.stale_after / 86400.0
                THEN 'no progress'
        END AS reason,
        CASE
            WHEN r.work_done_at IS NOT NULL
                 AND julianday(:now) - julianday(r.work_done_at) > s.grace / 86400.0 THEN r.work_done_at
            WHEN julianday(:now) - julianday(r.started_at) > COALESCE(n.max_runtime_s, s.max_runtime) / 86400.0
                THEN r.started_at
            ELSE r.progress_at
        END AS since
    FROM job j INDEXED BY job_one_running_per_node
    JOIN run r ON r.id = j.run_id
    LEFT JOIN node n ON n.name = j.node
    JOIN (SELECT
            (SELECT value FROM router_setting WHERE key = 'stale_after_s') AS stale_after,
            (SELECT value FROM router_setting WHERE key = 'stale_grace_s') AS grace,
            (SELECT value FROM router_setting WHERE key = 'max_runtime_s') AS max_runtime) s
    WHERE j.state = 'running'
) WHERE reason IS NOT NULL"""


@dataclass(frozen=True)
class NewJob:
    kind: str
    prompt: str | None  # None: a critique of its parent's prompt and result
    model: str | None = None  # None: the node's model
    node: str | None = None  # asked for; None lets placement choose
    parent: str | None = None
    timeout_s: float | None = None
    think: bool | str | None = None  # Ollama's think; None: the node's default
    options: dict | None = None  # Ollama model options, over the node's
    # A front-door call (gpuq/front.py): the route it came in on, the request as received
    # (JSON text), and the id its client chose, so that it can follow the job from the start.
    endpoint: str | None = None
    request: str | None = None
    job_id: str | None = None


@dataclass(frozen=True)
class NodeInfo:
    """What the store needs to know of a node to place and move jobs."""

    name: str
    rank: int
    roles: tuple[str, ...]
    model: str
    up: bool
    models: frozenset[str] | None = None  # installed, as of its last health check; None: unknown


@dataclass(frozen=True)
class Interrupted:
    """A running job that an operation took off its node; its worker must abort it."""

    job_id: str
    node: str
    run_id: int


class IdTaken(GpuqError):
    """A client-chosen job id collided with one in the table (its chooser picks another)."""

    status = 409


class GuardMiss(GpuqError):
    """A worker tried to finish a run that is no longer the job's running run."""

    status = 409


def _translate(exc: sqlite3.Error) -> GpuqError:
    text = str(exc)
    if GUARD_MESSAGE in text:
        return GuardRefused()
    if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        return StoreUnavailable(f"the database is locked by another process ({text}); nothing was changed")
    if isinstance(exc, sqlite3.OperationalError) and ("disk" in text or "full" in text):
        return StoreUnavailable(f"the database cannot be written: {text}; nothing was changed")
    if "readonly" in text or "read-only" in text:
        return StoreUnavailable(f"the database is read-only: {text}; nothing was changed")
    return StoreUnavailable(f"database error: {text}")


def _rows(cursor_rows: list[sqlite3.Row]) -> list[Row]:
    return [dict(r) for r in cursor_rows]


def _event(db: sqlite3.Connection, job_id: str, from_state: str | None, to_state: str, actor: str,
           reason: str | None, now: float) -> None:
    """The event row every state change (and every move) writes, in the same transaction."""
    db.execute("INSERT INTO event (job_id, at, from_state, to_state, actor, reason) VALUES (?,?,?,?,?,?)",
               (job_id, iso(now), from_state, to_state, actor, reason))


def _unused_id(db: sqlite3.Connection, now: float) -> str:
    """A fresh job id. 32 random bits a second collide now and then in a burst of thousands
    (the birthday bound), so look before using one."""
    while True:
        job_id = new_job_id(now)
        if db.execute("SELECT 1 FROM job WHERE id = ?", (job_id,)).fetchone() is None:
            return job_id


def _claim(db: sqlite3.Connection, node: str, now: float) -> Row | None:
    """The first ready job of the node's queue becomes running, with a new run row (never a
    second head). Ready (the view ready_job, migration 003): not a critique held for its
    parent's result, so a held critique never blocks the jobs behind it."""
    row = db.execute(
        "UPDATE job SET state = 'running' WHERE id = (SELECT id FROM ready_job WHERE node = ?"
        " ORDER BY position, id LIMIT 1)"
        " AND NOT EXISTS (SELECT 1 FROM job WHERE node = ? AND state = 'running') RETURNING *",
        (node, node)).fetchone()
    if row is None:
        return None
    job = dict(row)
    if job["subject_from_parent"]:  # the parent is done (ready_job says so): review its result
        parent = db.execute("SELECT j.prompt, r.output FROM job j JOIN run r ON r.id = j.run_id WHERE j.id = ?",
                            (job["parent_id"],)).fetchone()
        job["prompt"] = parent_subject(parent["prompt"], parent["output"])
        db.execute("UPDATE job SET prompt = ? WHERE id = ?", (job["prompt"], job["id"]))
    job["run_id"] = db.execute("INSERT INTO run (job_id, node, model, started_at, progress_at) VALUES (?,?,?,?,?)",
                               (job["id"], node, job["model"], iso(now), iso(now))).lastrowid
    db.execute("UPDATE job SET run_id = ? WHERE id = ?", (job["run_id"], job["id"]))
    _event(db, job["id"], "queued", "running", "router", f"claimed by {node}", now)
    return job


# -- helpers of the user's verbs, run inside their transaction in the writer's thread ---------

def _job_for_update(db: sqlite3.Connection, job_id: str) -> Row:
    row = db.execute("SELECT * FROM job WHERE id = ?", (job_id,)).fetchone()
    if row is None:
        raise NotFound(f"no job with id '{job_id}'")
    return dict(row)


def _renumber(db: sqlite3.Connection, node: str) -> None:
    """Spread a node's queued positions out again when a gap has run out."""
    rows = db.execute("SELECT id FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id",
                      (node,)).fetchall()
    db.executemany("UPDATE job SET position = ? WHERE id = ?",
                   [((i + 1) * POSITION_GAP, r[0]) for i, r in enumerate(rows)])


def _position_at(db: sqlite3.Connection, node: str, job_id: str, index: int) -> int:
    """A position that puts the job at 0-based `index` among the node's other queued jobs."""
    for attempt in range(2):
        positions = [r[0] for r in db.execute(
            "SELECT position FROM job WHERE node = ? AND state = 'queued' AND id <> ?"
            " ORDER BY position, id LIMIT 2 OFFSET ?", (node, job_id, max(index - 1, 0)))]
        if index == 0:
            before, after = None, (positions[0] if positions else None)
        else:
            before = positions[0] if positions else None
            after = positions[1] if len(positions) > 1 else None
            if before is None:  # past the tail: the tail
                before = db.execute("SELECT MAX(position) FROM job WHERE node = ? AND state = 'queued'"
                                    " AND id <> ?", (node, job_id)).fetchone()[0]
        found = rules.position_between(before, after, POSITION_GAP)
        if found is not None:
            return found
        if attempt == 0:
            _renumber(db, node)
    raise GpuqError("no queue position found after renumbering")  # unreachable by construction


def _index_of(db: sqlite3.Connection, node: str, other_id: str, job_id: str) -> int:
    other = db.execute("SELECT node, state, position FROM job WHERE id = ?", (other_id,)).fetchone()
    if other is None:
        raise Unprocessable(f"unknown job '{other_id}'")
    if other["state"] != "queued" or other["node"] != node:
        raise Conflict(f"job {other_id} is not waiting in node {node}'s queue")
    return db.execute(
        "SELECT COUNT(*) FROM job WHERE node = ? AND state = 'queued' AND id <> ?"
        " AND (position < ? OR (position = ? AND id < ?))",
        (node, job_id, other["position"], other["position"], other_id)).fetchone()[0]


def _end_held_critiques(db: sqlite3.Connection, parent_id: str, why: str, now: float) -> list[str]:
    """A task that ended without a result leaves its held critiques nothing to review: they end
    cancelled, each with an event naming the parent and why; they never run."""
    held = _rows(db.execute("SELECT * FROM job WHERE parent_id = ? AND subject_from_parent = 1"
                            " AND state = 'queued'", (parent_id,)).fetchall())
    for job in held:
        _cancel(db, job, "router", f"parent task {parent_id} {why}; nothing to critique", now)
    return [j["id"] for j in held]


def _cancel(db: sqlite3.Connection, job: Row, actor: str, reason: str, now: float) -> Interrupted | None:
    db.execute("UPDATE job SET state = 'cancelled', error = ?, finished_at = ? WHERE id = ?",
               (reason, iso(now), job["id"]))
    _event(db, job["id"], job["state"], "cancelled", actor, reason, now)
    _end_held_critiques(db, job["id"], f"was cancelled ({reason})", now)
    if job["state"] != "running":
        return None
    db.execute("UPDATE run SET state = 'cancelled', error = ?, finished_at = ? WHERE id = ?",
               (reason, iso(now), job["run_id"]))
    return Interrupted(job["id"], job["node"], job["run_id"])


class Store:
    def __init__(self, path: Path, busy_timeout_s: float = 5.0, clock: Callable[[], float] = time.time,
                 max_bytes: int | None = None):
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.max_bytes = max_bytes
        self.clock = clock
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._write_lock = asyncio.Lock()
        self._batcher: WriteBatcher | None = None  # group commit for submits, on the writer

    # -- connections and migrations ---------------------------------------------------------

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        conn.row_factory = sqlite3.Row
        await conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        await conn.execute("PRAGMA journal_mode = WAL")
        await conn.execute("PRAGMA synchronous = FULL")
        await conn.execute("PRAGMA foreign_keys = ON")
        if self.max_bytes is not None:  # past it, writes fail as on a full disk: SQLITE_FULL
            page_size = (await conn.execute_fetchall("PRAGMA page_size"))[0][0]
            # Read to its end: a statement left with a row to give keeps the connection reading,
            # and a migration that drops a table then fails with "database table is locked".
            await conn.execute_fetchall(f"PRAGMA max_page_count = {max(self.max_bytes // page_size, 1)}")
        return conn

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            self.path.touch(mode=0o600)  # the queue holds a person's prompts
        try:
            self._writer = await self._connect()
            await self._migrate()
            self._reader = await self._connect()
        except BaseException as exc:
            await self.close()  # an open connection's thread would keep a router that failed alive
            if isinstance(exc, sqlite3.Error):
                raise GpuqError(f"cannot open the database {self.path}: {exc}", status=2) from exc
            raise
        self._batcher = WriteBatcher(lambda: self._writer, self._write_lock, _translate)

    async def close(self) -> None:
        if self._batcher is not None:
            await self._batcher.close()  # the batch in flight commits (or fails) first
        for conn in (self._reader, self._writer):
            if conn is not None:
                await conn.close()
        self._reader = self._writer = None

    async def _migrate(self) -> None:
        """Apply migrations/NNN_*.sql in order, each with its record, in its own transaction."""
        files = shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations")
        known = {int(f.name[:3]): f for f in files}
        now = iso(self.clock())

        def migrate(db: sqlite3.Connection) -> None:
            db.execute("CREATE TABLE IF NOT EXISTS schema_migration ("
                       " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
            applied = {r[0] for r in db.execute("SELECT version FROM schema_migration")}
            newer = sorted(applied - set(known))
            if newer:
                raise GpuqError(
                    f"{self.path} was written by a newer gpuq (schema version {newer[-1]}; this gpuq "
                    f"knows up to {max(known)}); upgrade gpuq or use another database", status=2)
            # Foreign keys off while migrating, as SQLite's table rebuild procedure asks (a
            # rebuild drops a table others refer to), and checked before each commit instead.
            db.execute("PRAGMA foreign_keys = OFF")
            try:
                for version, f in sorted(known.items()):
                    if version not in applied:
                        apply(db, version, f)
            finally:
                db.execute("PRAGMA foreign_keys = ON")

        def apply(db: sqlite3.Connection, version: int, f: Path) -> None:
            try:  # executescript runs the script in the transaction it opens; its record joins it
                db.executescript("BEGIN IMMEDIATE;\n" + f.read_text(encoding="utf-8"))
                broken = db.execute("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise GpuqError(f"migration {f.name} would leave {len(broken)} broken reference(s), "
                                    f"the first in table {broken[0][0]}; nothing was changed", status=2)
                db.execute("INSERT INTO schema_migration VALUES (?, ?, ?)", (version, f.stem, now))
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

        try:
            await in_writer_thread(self._writer, migrate)
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` as one transaction (a savepoint of a group commit) in the writer's thread.

        Every write goes through the write batcher (gpuq/batching.py): writes that arrive
        together share one commit, each is answered only after it, and one that raises is
        rolled back alone. `fn` must not await: it runs in aiosqlite's thread."""
        assert self._batcher is not None, "store is not open"

        def run(db: sqlite3.Connection, ctx: dict) -> T:
            ctx.pop("submit_counts", None)  # queue counts a submit cached may no longer hold
            return fn(db)
        return await self._batcher.run(run)

    async def configure(self, settings_s: dict[str, float], nodes: list) -> None:
        """Record the thresholds and nodes in force, and (re)create the stale_heads view."""
        def configure_in(db: sqlite3.Connection) -> None:
            db.executemany("INSERT OR REPLACE INTO router_setting (key, value) VALUES (?, ?)",
                           list(settings_s.items()))
            for n in nodes:
                db.execute(
                    "INSERT INTO node (name, url, rank, roles, model, max_runtime_s) VALUES (?,?,?,?,?,?)"
                    " ON CONFLICT (name) DO UPDATE SET url = excluded.url, rank = excluded.rank,"
                    " roles = excluded.roles, model = excluded.model, max_runtime_s = excluded.max_runtime_s",
                    (n.name, n.url, n.rank, ",".join(n.roles), n.model, n.max_runtime_s))
            db.execute("DROP VIEW IF EXISTS stale_heads")
            db.execute("CREATE VIEW stale_heads AS " + STALE_SQL.replace(":now", "'now'"))
        await self._write(configure_in)

    async def set_node_health(self, name: str, up: bool, error: str | None) -> None:
        at = iso(self.clock())
        await self._write(lambda db: db.execute(
            "UPDATE node SET up = ?, last_error = ?, since = ? WHERE name = ?", (int(up), error, at, name)))

    async def stale_heads(self, now: float | None = None) -> list[Row]:
        return await self.read(STALE_SQL, {"now": iso(self.clock() if now is None else now)})

    async def note_stale(self, now: float | None = None) -> list[Row]:
        """Write one event per newly stale head (not one per check); returns the new ones."""
        now = self.clock() if now is None else now

        def note_stale_in(db: sqlite3.Connection) -> list[Row]:
            fresh = []
            for head in _rows(db.execute(STALE_SQL, {"now": iso(now)}).fetchall()):
                cur = db.execute("UPDATE run SET stale_reason = ? WHERE id = ? AND stale_reason IS NOT ?",
                                 (head["reason"], head["run_id"], head["reason"]))
                if cur.rowcount:
                    _event(db, head["id"], "running", "running", "router",
                           f"stale: {head['reason']} since {head['since']}", now)
                    fresh.append(head)
            return fresh
        return await self._write(note_stale_in)

    async def read(self, sql: str, params: tuple | dict = ()) -> list[Row]:
        assert self._reader is not None, "store is not open"
        try:
            return _rows(await self._reader.execute_fetchall(sql, params))
        except sqlite3.Error as exc:
            raise _translate(exc) from exc

    # -- reading ------------------------------------------------------------------------------

    @staticmethod
    def _views(nodes: list[NodeInfo], counts: dict[str, tuple[int, int]]) -> list[rules.NodeView]:
        return [
            rules.NodeView(n.name, n.rank, n.roles, n.up, counts.get(n.name, (0, 0))[0] > 0,
                           counts.get(n.name, (0, 0))[1], n.models)
            for n in nodes
        ]

    async def job(self, job_id: str, columns: str = LISTING_COLUMNS) -> Row:
        """A job as listings show it (its prompt's excerpt and size, not the prompt)."""
        rows = await self.read(f"SELECT {columns} {JOB_FROM} WHERE j.id = ?", (job_id,))
        if not rows:
            raise NotFound(f"no job with id '{job_id}'")
        return rows[0]

    async def job_detail(self, job_id: str) -> Row:
        """The whole job: its full prompt, output, runs, events and critiques."""
        job = await self.job(job_id, DETAIL_COLUMNS)
        job["runs"] = await self.read("SELECT * FROM run WHERE job_id = ? ORDER BY id", (job_id,))
        job["events"] = await self.read(
            "SELECT at, from_state, to_state, actor, reason FROM event WHERE job_id = ? ORDER BY id",
            (job_id,),
        )
        job["children"] = await self.read(  # each critique's finding count and highest severity too
            "SELECT id, kind, state, node, model, json_array_length(findings) AS finding_count,"
            " (SELECT json_extract(f.value, '$.severity') FROM json_each(findings) f ORDER BY"
            "  CASE json_extract(f.value, '$.severity') WHEN 'high' THEN 0 WHEN 'medium' THEN 1 ELSE 2 END"
            "  LIMIT 1) AS top_severity"
            " FROM job WHERE parent_id = ? ORDER BY created_at, id",
            (job_id,),
        )
        if job.get("endpoint"):  # a front-door call: the request as received, for forensics
            job["request"] = (await self.read("SELECT request FROM job WHERE id = ?", (job_id,)))[0]["request"]
        job["output"] = job["runs"][-1]["output"] if job["runs"] else ""
        job["thinking"] = job["runs"][-1]["thinking"] if job["runs"] else None
        if job["state"] == JobState.QUEUED.value:
            job["queue_position"] = await self.queue_position(job)
        return job

    async def queue_position(self, job: Row) -> int:
        rows = await self.read(
            "SELECT COUNT(*) AS n FROM job WHERE node = ? AND state = 'queued'"
            " AND (position < ? OR (position = ? AND id < ?))",
            (job["node"], job["position"], job["position"], job["id"]),
        )
        return rows[0]["n"] + 1

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

    async def queue(self, node: str, limit: int) -> tuple[Row | None, list[Row], int]:
        """The node's running job, its first `limit` queued jobs in order, and how many wait."""
        running = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM} WHERE j.node = ? AND j.state = 'running'", (node,)
        )
        queued = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM} WHERE j.node = ? AND j.state = 'queued'"
            " ORDER BY j.position, j.id LIMIT ?",
            (node, limit),
        )
        count = await self.read("SELECT COUNT(*) AS n FROM job WHERE node = ? AND state = 'queued'", (node,))
        return (running[0] if running else None), queued, count[0]["n"]

    async def active_by_node(self) -> dict[str, tuple[int, int]]:
        """(queued, running) per node, in one query over the active rows only (index job_state)."""
        rows = await self.read(
            "SELECT node, SUM(state = 'queued') AS queued, SUM(state = 'running') AS running FROM job"
            " WHERE state IN ('queued', 'running') GROUP BY node")
        return {r["node"]: (r["queued"], r["running"]) for r in rows}

    async def finished_totals(self, after_event: int, duration_bounds: tuple, wait_bounds: tuple) -> list[Row]:
        """Jobs that ended after event `after_event`, summed per (node, kind, state, model) for
        /metrics: counts, tokens, and each histogram's count, sum and cumulative count per
        bound. A range of the event table's primary key, grouped in SQL: one query, however
        long the history."""
        le = ", ".join([f"SUM(d <= {float(b)!r}) AS d_le_{i}" for i, b in enumerate(duration_bounds)]
                       + [f"SUM(w <= {float(b)!r}) AS w_le_{i}" for i, b in enumerate(wait_bounds)])
        return await self.read(
            f"SELECT node, kind, state, model, COUNT(*) AS n, SUM(tokens) AS tokens, MAX(event_id) AS last_event,"
            f" COUNT(d) AS d_n, TOTAL(d) AS d_sum, COUNT(w) AS w_n, TOTAL(w) AS w_sum, {le} FROM ("
            " SELECT e.id AS event_id, e.to_state AS state, j.node, j.kind, COALESCE(r.model, j.model) AS model,"
            "  COALESCE(r.eval_count, 0) AS tokens,"
            "  CASE WHEN e.to_state <> 'cancelled' AND r.finished_at IS NOT NULL"
            "   THEN MAX((julianday(r.finished_at) - julianday(r.started_at)) * 86400.0, 0) END AS d,"
            "  MAX((julianday((SELECT MIN(f.started_at) FROM run f WHERE f.job_id = j.id))"
            "   - julianday(j.created_at)) * 86400.0, 0) AS w"
            " FROM event e JOIN job j ON j.id = e.job_id LEFT JOIN run r ON r.id = j.run_id"
            " WHERE e.id > ? AND e.to_state IN ('done', 'failed', 'cancelled') AND e.from_state <> e.to_state"
            ") GROUP BY node, kind, state, model", (after_event,))

    async def next_ready_model(self, node: str) -> str | None:
        """The model of the job the node would claim next (None: nothing is ready)."""
        rows = await self.read("SELECT model FROM ready_job WHERE node = ? ORDER BY position, id LIMIT 1", (node,))
        return rows[0]["model"] if rows else None

    async def has_waiting(self, node: str) -> bool:
        """A job waits on the node that may run now (a held critique does not count)."""
        rows = await self.read("SELECT EXISTS (SELECT 1 FROM ready_job WHERE node = ?) AS waiting", (node,))
        return bool(rows[0]["waiting"])

    # -- start estimates (gpuq/eta.py) ---------------------------------------------------------

    async def queue_plans(self, nodes: list[str], depth: int) -> list[Row]:
        """Each node's running job and first `depth` waiting jobs (held critiques included), with
        the few columns a start estimate needs; one statement, each part on an index."""
        if not nodes:
            return []
        waiting = ("SELECT * FROM (SELECT j.id, j.node, j.state, j.model, j.position, NULL AS started_at,"
                   " CASE WHEN j.subject_from_parent = 1 AND (SELECT p.state FROM job p WHERE p.id = j.parent_id)"
                   " <> 'done' THEN j.parent_id END AS waiting_for FROM job j WHERE j.node = ? AND j.state = 'queued'"
                   " ORDER BY j.position, j.id LIMIT ?)")
        running = ("SELECT j.id, j.node, j.state, j.model, 0 AS position, r.started_at, NULL AS waiting_for"
                   " FROM job j JOIN run r ON r.id = j.run_id WHERE j.state = 'running'")
        params: list = []
        for name in nodes:
            params += [name, depth]
        rows = await self.read(" UNION ALL ".join([running] + [waiting] * len(nodes)), params)
        rows.sort(key=lambda r: (r["node"], r["state"] != "running", r["position"], r["id"]))
        return rows

    async def recent_durations(self, node_models: set[tuple[str, str]], nodes: set[str],
                               last: int = 20) -> list[Row]:
        """How long the last `last` done runs took, per node and model and per node: rows of
        (node, model or NULL for the node's, seconds). Each part reads its partial index."""
        seconds = "MAX((julianday(finished_at) - julianday(started_at)) * 86400.0, 0) AS seconds"
        parts = [(f"SELECT * FROM (SELECT node, NULL AS model, {seconds} FROM run INDEXED BY run_done_node"
                  " WHERE state = 'done' AND node = ? ORDER BY id DESC LIMIT ?)", (node, last))
                 for node in sorted(nodes)]
        parts += [(f"SELECT * FROM (SELECT node, model, {seconds} FROM run INDEXED BY run_done_node_model"
                   " WHERE state = 'done' AND node = ? AND model = ? ORDER BY id DESC LIMIT ?)", (node, model, last))
                  for node, model in sorted(node_models)]
        rows: list[Row] = []
        for at in range(0, len(parts), 400):  # SQLite compounds at most 500 SELECTs
            chunk = parts[at:at + 400]
            rows += await self.read(" UNION ALL ".join(sql for sql, _ in chunk), [p for _, ps in chunk for p in ps])
        return rows

    # -- history and utilisation (the history page, the busy strips) ---------------------------

    async def history(self, state: str | None, node: str | None, kind: str | None, text: str | None,
                      limit: int, offset: int) -> tuple[list[Row], int]:
        """Finished jobs, newest first, filtered; and how many match in all."""
        where, params = ["j.finished_at IS NOT NULL"], []
        for column, value in (("j.state", state), ("j.node", node), ("j.kind", kind)):
            if value:
                where.append(f"{column} = ?")
                params.append(value)
        if text:
            like = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            where.append("(" + " OR ".join(f"{c} LIKE ? ESCAPE '\\'" for c in
                                           ("j.id", "j.model", "j.error", "j.prompt")) + ")")
            params += [like] * 4
        cond = " AND ".join(where)
        rows = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM.replace('job j', 'job j INDEXED BY job_finished')} WHERE {cond}"
            " ORDER BY j.finished_at DESC, j.id DESC"
            " LIMIT ? OFFSET ?", (*params, limit, offset))
        total = await self.read(f"SELECT COUNT(*) AS n FROM job j WHERE {cond}", params)
        return rows, total[0]["n"]

    async def finished_since(self, since: float) -> dict[str, int]:
        """How many jobs ended in each final state since `since` (index job_finished)."""
        rows = await self.read("SELECT state, COUNT(*) AS n FROM job INDEXED BY job_finished WHERE finished_at >= ?"
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

    # -- alerts (gpuq/alerts.py) -----------------------------------------------------------------

    async def open_alerts(self) -> list[Row]:
        """Firings not resolved yet (a restart picks them up where the last router left them)."""
        return await self.read("SELECT * FROM alert WHERE resolved_at IS NULL ORDER BY id")

    async def fire_alert(self, alert: dict, deliver: bool) -> Row:
        now = iso(self.clock())
        return await self._write(lambda db: dict(db.execute(
            "INSERT INTO alert (alert, node, job_id, model, since, message, fix, fired_at, deliver)"
            " VALUES (?,?,?,?,?,?,?,?,?) RETURNING *",
            (alert["alert"], alert["node"], alert["job"], alert.get("model"), alert["since"], alert["message"],
             alert["fix"], now, int(deliver))).fetchone()))

    async def resolve_alert(self, alert_id: int, resolution: str) -> None:
        now = iso(self.clock())
        await self._write(lambda db: db.execute(
            "UPDATE alert SET resolved_at = ?, resolution = ? WHERE id = ? AND resolved_at IS NULL",
            (now, resolution, alert_id)))

    async def owe_open_alerts(self) -> int:
        """At start-up with alert_url set: firings still open are owed their notices, even those
        seen while no alert_url was configured (they still fire)."""
        return await self._write(lambda db: db.execute(
            "UPDATE alert SET deliver = 1 WHERE resolved_at IS NULL AND deliver = 0").rowcount)

    async def alerts_owed(self) -> list[Row]:
        """Notices not delivered yet, oldest firing first, with how many tries the next one has had."""
        return await self.read(
            "SELECT a.*, (SELECT COUNT(*) FROM alert_delivery d WHERE d.alert_id = a.id AND d.status ="
            " CASE WHEN a.fired_sent_at IS NULL THEN 'firing' ELSE 'resolved' END) AS attempts"
            " FROM alert a INDEXED BY alert_owed WHERE a.deliver = 1 AND (a.fired_sent_at IS NULL"
            " OR (a.resolved_at IS NOT NULL AND a.resolved_sent_at IS NULL)) ORDER BY a.id")

    async def record_delivery(self, alert_id: int, status: str, attempt: int, ok: bool,
                              http_status: int | None, error: str | None) -> None:
        """One try to deliver a notice; a delivered one is marked sent in the same transaction."""
        now = iso(self.clock())
        sent_column = {"firing": "fired_sent_at", "resolved": "resolved_sent_at"}[status]

        def record_in(db: sqlite3.Connection) -> None:
            db.execute("INSERT INTO alert_delivery (alert_id, status, at, attempt, ok, http_status, error)"
                       " VALUES (?,?,?,?,?,?,?)", (alert_id, status, now, attempt, int(ok), http_status, error))
            if ok:
                db.execute(f"UPDATE alert SET {sent_column} = ? WHERE id = ?", (now, alert_id))
        await self._write(record_in)

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

    # -- submitting ---------------------------------------------------------------------------

    async def submit(self, new: NewJob, nodes: list[NodeInfo], actor: str) -> list[Row]:
        """Place and insert a job (a task, or a critique's whole fan-out), durably.

        Group commit (gpuq/batching.py): submits that arrive together share one transaction
        and one fsync; each runs in its own savepoint and is answered only after that commit,
        and one refused submit never fails the others. Placement sees the jobs submitted
        before it in the same batch."""
        assert self._batcher is not None, "store is not open"
        now = self.clock()
        return await self._batcher.run(lambda db, ctx: self._submit_in(db, ctx, new, nodes, actor, now))

    @staticmethod
    def _submit_in(db: sqlite3.Connection, ctx: dict, new: NewJob, nodes: list[NodeInfo], actor: str,
                   now: float) -> list[Row]:
        """Submit's statements, in the writer's thread, inside the batch's transaction."""
        by_name = {n.name: n for n in nodes}
        parent = None
        if new.parent is not None:
            parent = db.execute("SELECT id, kind, node, state, prompt FROM job WHERE id = ?", (new.parent,)).fetchone()
            if parent is None:
                raise Unprocessable(f"unknown parent job '{new.parent}'")
            if parent["kind"] != "task":
                raise Unprocessable(f"parent job '{new.parent}' is a {parent['kind']}, not a task")
            if new.kind != "critique":
                raise BadRequest("only a critique takes a parent")
        elif new.prompt is None:
            raise BadRequest("field 'prompt' must not be empty")
        parent_node = parent["node"] if parent else None
        # Per-node (running, queued) counts, read once per batch and kept true by each submit
        # of the batch, so a burst does not count the whole queue once per job.
        counts = ctx.get("submit_counts")
        if counts is None:
            counts = {r[0]: (r[1], r[2]) for r in db.execute(
                "SELECT node, SUM(state = 'running'), SUM(state = 'queued') FROM job"
                " WHERE state IN ('queued', 'running') GROUP BY node")}
        views = Store._views(nodes, counts)
        if new.kind != "critique":  # a task, or an embedding (placed as a task)
            placements = [rules.place_task(views, new.node, new.model)]
        else:  # the guard is judged here, first, whatever state the parent is in
            placements = rules.place_critique(views, parent_node, new.node, new.model)
        prompt, from_parent = new.prompt, new.prompt is None
        if from_parent:  # reviews the parent's prompt and result; held until the parent is done
            if parent["state"] in ("failed", "cancelled"):
                raise Conflict(f"parent task {parent['id']} is {parent['state']}: there is no result to "
                               f"critique; retry it first (gpuq retry {parent['id']}) or critique a file")
            prompt = parent_subject(parent["prompt"], f"(the result of task {parent['id']}, once it is done)")
        group = None  # a fan-out's children share the first child's id as their group
        at = iso(now)
        created = []
        for p in placements:
            job_id = new.job_id or _unused_id(db, now)
            if new.job_id and db.execute("SELECT 1 FROM job WHERE id = ?", (job_id,)).fetchone():
                raise IdTaken(f"job id {job_id} is taken")
            if new.kind == "critique" and group is None:
                group = job_id
            tail = db.execute("SELECT MAX(position) FROM job WHERE node = ? AND state = 'queued'",
                              (p.node,)).fetchone()
            position = (tail[0] or 0) + POSITION_GAP
            model = new.model or by_name[p.node].model
            db.execute(
                "INSERT INTO job (id, kind, node, model, model_pinned, prompt, parent_id, group_id,"
                " position, placement, timeout_s, created_at, subject_from_parent, think, options,"
                " endpoint, request) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (job_id, new.kind, p.node, model, int(new.model is not None), prompt, new.parent,
                 group, position, p.reason, new.timeout_s, at, int(from_parent),
                 None if new.think is None else dumps(new.think), None if new.options is None else dumps(new.options),
                 new.endpoint, new.request),
            )
            waiting_for = new.parent if from_parent and parent["state"] != "done" else None
            held = f"; waiting for parent {waiting_for}" if waiting_for else ""
            _event(db, job_id, None, "queued", actor, f"placed on {p.node} ({p.reason}){held}", now)
            waiting = counts.get(p.node, (0, 0))[1]
            created.append({"id": job_id, "kind": new.kind, "node": p.node, "model": model,
                            "state": "queued", "position": waiting + 1, "reason": p.reason,
                            "parent": new.parent, "group": group, "waiting_for": waiting_for})
        for job in created:  # every statement succeeded: only now does the batch's cache change
            running, queued = counts.get(job["node"], (0, 0))
            counts[job["node"]] = (running, queued + 1)
        ctx["submit_counts"] = counts
        return created

    # -- the worker's verbs -------------------------------------------------------------------

    async def claim(self, node: str) -> Row | None:
        """Take the head of the node's queue: it becomes running with a new run row."""
        now = self.clock()
        return await self._write(lambda db: _claim(db, node, now))

    async def heartbeat(self, run_id: int, output: str, thinking: str | None = None) -> None:
        at = iso(self.clock())
        await self._write(lambda db: db.execute(
            "UPDATE run SET output = ?, thinking = ?, progress_at = ? WHERE id = ? AND state = 'running'",
            (output, thinking, at, run_id)))

    async def work_done(self, run_id: int, output: str, stats: dict, thinking: str | None = None) -> None:
        """Ollama's stream ended; the job is not finished until its model has left VRAM.
        (One call in the writer's thread, on the write batcher, like claim and finish.)"""
        now = iso(self.clock())

        def work_done_in(db: sqlite3.Connection) -> None:
            db.execute(
                "UPDATE run SET output = ?, thinking = ?, progress_at = ?, work_done_at = ?, done_reason = ?,"
                " eval_count = ?, prompt_eval_count = ?, total_duration_ns = ?,"
                " load_duration_ns = ?, eval_duration_ns = ? WHERE id = ? AND state = 'running'",
                (output, thinking, now, now, stats.get("done_reason"), stats.get("eval_count"),
                 stats.get("prompt_eval_count"), stats.get("total_duration"),
                 stats.get("load_duration"), stats.get("eval_duration"), run_id),
            )

        await self._write(work_done_in)

    async def save_output(self, run_id: int, output: str, thinking: str | None = None) -> None:
        """Keep the partial output of an interrupted run, whatever state it ended in."""
        await self._write(lambda db: db.execute("UPDATE run SET output = ?, thinking = ? WHERE id = ?",
                                                (output, thinking, run_id)))

    async def finish(self, job_id: str, run_id: int, state: str, error: str | None,
                     output: str | None = None, actor: str = "router",
                     findings: list | None = None, claim_node: str | None = None,
                     thinking: str | None = None, streamed: int = 0) -> Row | None:
        """Finish a run that is still the job's running run; anything else is a GuardMiss.

        `streamed` pieces (one token each) count as a failed run's tokens: Ollama counts them in
        its last line, which a reply that broke off never sent.

        With `claim_node`, the node's next job is claimed in the same transaction and returned:
        a worker going from job to job pays one durable commit between them, not two."""
        assert state in ("done", "failed")
        now = self.clock()
        tokens = streamed if state == "failed" and streamed else None

        def finish_in(db: sqlite3.Connection) -> Row | None:
            rows = db.execute(
                "UPDATE job SET state = ?, error = ?, finished_at = ?, findings = ? WHERE id = ?"
                " AND state = 'running' AND run_id = ? RETURNING id",
                (state, error, iso(now), None if findings is None else dumps(findings), job_id, run_id),
            ).fetchall()
            if not rows:
                raise GuardMiss(f"job {job_id} run {run_id} is no longer running; finish refused")
            db.execute(
                "UPDATE run SET state = ?, error = ?, finished_at = ?, output = COALESCE(?, output),"
                " thinking = COALESCE(?, thinking), eval_count = COALESCE(eval_count, ?) WHERE id = ?",
                (state, error, iso(now), output, thinking, tokens, run_id),
            )
            _event(db, job_id, "running", state, actor, error, now)
            if state == "failed":
                _end_held_critiques(db, job_id, f"failed ({error})", now)
            return _claim(db, claim_node, now) if claim_node else None

        return await self._write(finish_in)

    async def note(self, job_id: str, reason: str, actor: str = "router") -> None:
        """An event that changes no state: an unload that failed, a stale head, a node flag."""
        now = self.clock()

        def note_in(db: sqlite3.Connection) -> None:
            state = db.execute("SELECT state FROM job WHERE id = ?", (job_id,)).fetchone()
            if state:
                _event(db, job_id, state[0], state[0], actor, reason, now)
        await self._write(note_in)

    async def fail_orphans(self) -> list[Row]:
        """At start-up: a job still running belonged to a dead router. Fail it, loudly."""
        now = self.clock()
        reason = "router restarted while running"

        def fail_orphans_in(db: sqlite3.Connection) -> list[Row]:
            rows = _rows(db.execute(
                "UPDATE job SET state = 'failed', error = ?, finished_at = ? WHERE state = 'running'"
                " RETURNING id, node, model, run_id", (reason, iso(now))).fetchall())
            for r in rows:
                db.execute("UPDATE run SET state = 'failed', error = ?, finished_at = ? WHERE id = ?"
                           " AND state = 'running'", (reason, iso(now), r["run_id"]))
                _event(db, r["id"], "running", "failed", "router", reason, now)
                _end_held_critiques(db, r["id"], f"failed ({reason})", now)
            return rows
        return await self._write(fail_orphans_in)

    async def cancel_clientless(self) -> list[Row]:
        """At start-up: a front-door call still waiting lost its client with the old router (its
        connection is gone). It would run for no one: cancel it, loudly; `gpuq retry` runs it."""
        now = self.clock()
        reason = "client gone: the router restarted while it waited (gpuq retry runs it, its output on its page)"

        def cancel_in(db: sqlite3.Connection) -> list[Row]:
            rows = _rows(db.execute("SELECT * FROM job WHERE state = 'queued' AND endpoint IS NOT NULL").fetchall())
            for job in rows:
                _cancel(db, job, "router", reason, now)
            return rows
        return await self._write(cancel_in)

    # -- the user's verbs: each one transaction, checked against the job's state inside it ----

    async def move(self, job_id: str, nodes: list[NodeInfo], actor: str, *, position: int | None = None,
                   before: str | None = None, after: str | None = None, node: str | None = None) -> Row:
        """Reorder a queued job within its node's queue or move it to another node's queue."""
        if sum(x is not None for x in (position, before, after)) > 1:
            raise BadRequest("give only one of 'position', 'before' and 'after'")
        if job_id in (before, after):
            raise BadRequest(f"job {job_id} cannot be moved before or after itself")
        if position is None and before is None and after is None and node is None:
            raise BadRequest("say where to move the job: 'position', 'before', 'after' or 'node'")
        if position is not None and position < 1:
            raise BadRequest(f"position must be 1 or more, got {position}")
        now = self.clock()

        def move_in(db: sqlite3.Connection) -> Row:
            job = _job_for_update(db, job_id)
            if job["state"] != "queued":
                raise Conflict(f"job {job_id} is {job['state']}; only queued jobs move")
            target = node or job["node"]
            if target != job["node"]:
                parent_node = _job_for_update(db, job["parent_id"])["node"] if job["parent_id"] else None
                views = {v.name: v for v in self._views(nodes, {})}
                rules.check_move(job["kind"], views.get(target), target, parent_node,
                                 job["model"] if job["model_pinned"] else None)
            if before is not None:
                index = _index_of(db, target, before, job_id)
            elif after is not None:
                index = _index_of(db, target, after, job_id) + 1
            elif position is not None:
                index = position - 1
            else:  # a bare node move goes to the tail (of the queue it is already in: stays)
                index = 1 << 62 if target != job["node"] else None
            if index is not None:
                # A job that did not ask for a model runs the model of the node it moves to.
                target_model = next((n.model for n in nodes if n.name == target), job["model"])
                db.execute("UPDATE job SET node = ?, position = ?, placement = CASE WHEN node <> ?"
                           " THEN 'moved' ELSE placement END, model = CASE WHEN model_pinned"
                           " THEN model ELSE ? END WHERE id = ?",
                           (target, _position_at(db, target, job_id, index), target, target_model, job_id))
            moved = dict(job, node=target)
            moved["position"] = db.execute(
                "SELECT COUNT(*) FROM job j, job me WHERE me.id = ? AND j.node = me.node AND"
                " j.state = 'queued' AND (j.position < me.position OR (j.position = me.position"
                " AND j.id <= me.id))", (job_id,)).fetchone()[0]
            where = f"to {target} " if target != job["node"] else ""
            _event(db, job_id, "queued", "queued", actor, f"moved {where}at position {moved['position']}", now)
            return moved
        return await self._write(move_in)

    async def preempt(self, job_id: str, actor: str) -> tuple[Row, Interrupted | None]:
        """The queued job runs next: to the head, and the node's running job goes back behind it."""
        now = self.clock()

        def preempt_in(db: sqlite3.Connection) -> tuple[Row, Interrupted | None]:
            job = _job_for_update(db, job_id)
            if job["state"] != "queued":
                raise Conflict(f"job {job_id} is {job['state']}; only a queued job can preempt")
            if not db.execute("SELECT 1 FROM ready_job WHERE id = ?", (job_id,)).fetchone():
                raise Conflict(f"job {job_id} is waiting for parent {job['parent_id']} to finish; "
                               "it cannot run before")
            node = job["node"]
            db.execute("UPDATE job SET position = ? WHERE id = ?", (_position_at(db, node, job_id, 0), job_id))
            _event(db, job_id, "queued", "queued", actor, "preempt: moved to the head", now)
            running = db.execute("SELECT id, run_id FROM job WHERE node = ? AND state = 'running'",
                                 (node,)).fetchone()
            if not running:
                return dict(job, position=1), None
            victim, run_id = running["id"], running["run_id"]
            behind = _position_at(db, node, victim, 1)
            db.execute("UPDATE job SET state = 'queued', position = ? WHERE id = ?", (behind, victim))
            db.execute("UPDATE run SET state = 'preempted', finished_at = ?, error = ? WHERE id = ?",
                       (iso(now), f"preempted by {job_id}", run_id))
            _event(db, victim, "running", "queued", actor, f"preempted by {job_id}", now)
            return dict(job, position=1), Interrupted(victim, node, run_id)
        return await self._write(preempt_in)

    async def delete(self, job_id: str, actor: str, reason: str = "deleted") -> tuple[Row, Interrupted | None]:
        """A queued or running job is cancelled with the reason ('deleted'); its rows stay."""
        now = self.clock()

        def delete_in(db: sqlite3.Connection) -> tuple[Row, Interrupted | None]:
            job = _job_for_update(db, job_id)
            if job["state"] not in ACTIVE:
                raise Conflict(f"job {job_id} is already {job['state']}; only queued or running jobs can be deleted")
            return dict(job, state="cancelled"), _cancel(db, job, actor, reason, now)
        return await self._write(delete_in)

    async def clear(self, node: str, actor: str, running: bool = False) -> tuple[list[str], Interrupted | None]:
        now = self.clock()
        states = ACTIVE if running else ("queued",)

        def clear_in(db: sqlite3.Connection) -> tuple[list[str], Interrupted | None]:
            jobs = _rows(db.execute(
                f"SELECT * FROM job WHERE node = ? AND state IN ({','.join('?' * len(states))})"
                " ORDER BY state = 'queued', position, id", (node, *states)).fetchall())
            interrupted = None
            for job in jobs:
                interrupted = _cancel(db, job, actor, "cleared", now) or interrupted
            return [j["id"] for j in jobs], interrupted
        return await self._write(clear_in)

    async def retry(self, job_id: str, actor: str) -> Row:
        """Only by explicit request: a failed or cancelled job goes to the tail of its node's queue."""
        now = self.clock()

        def retry_in(db: sqlite3.Connection) -> Row:
            job = _job_for_update(db, job_id)
            if job["state"] not in ("failed", "cancelled"):
                raise Conflict(f"job {job_id} is {job['state']}; only failed or cancelled jobs can be retried")
            if job["parent_id"]:  # the parent may have moved onto this node since (no trigger sees a retry)
                parent = _job_for_update(db, job["parent_id"])
                if parent["node"] == job["node"]:
                    raise GuardRefused()
                if job["subject_from_parent"] and parent["state"] in ("failed", "cancelled"):
                    raise Conflict(f"parent task {parent['id']} is {parent['state']}: there is no result to "
                                   f"critique; retry the parent first (gpuq retry {parent['id']})")
            tail = db.execute("SELECT MAX(position) FROM job WHERE node = ? AND state = 'queued'",
                              (job["node"],)).fetchone()[0]
            db.execute("UPDATE job SET state = 'queued', error = NULL, finished_at = NULL, position = ?"
                       " WHERE id = ?", ((tail or 0) + POSITION_GAP, job_id))
            _event(db, job_id, job["state"], "queued", actor, "retry requested", now)
            return dict(job, state="queued")
        return await self._write(retry_in)

    async def requeue_unsent(self, sent: dict[str, int | None], reason: str) -> list[Row]:
        """When the router stops: the running job of each node in `sent` whose run is not the one
        its worker last sent to Ollama never reached it; it goes back to the head of its queue."""
        now = self.clock()
        return await self._write(lambda db: _requeue_unsent(db, sent, reason, now))

    async def put_back(self, job_id: str, run_id: int, reason: str) -> bool:
        """The run's request never reached Ollama (the node refused the connection): the job goes
        back to the head of its queue. False when the run had already ended (deleted meanwhile)."""
        now = self.clock()
        return await self._write(lambda db: _put_back_run(db, job_id, run_id, reason, now))


def _requeue_unsent(db: sqlite3.Connection, sent: dict[str, int | None], reason: str, now: float) -> list[Row]:
    """The claim of a job whose request never left is undone: the job is queued at the head
    again, its run ends cancelled with `reason` (kept for forensics), an event says why."""
    rows = _rows(db.execute(
        f"SELECT id, node, run_id FROM job WHERE state = 'running' AND node IN ({','.join('?' * len(sent))})",
        tuple(sent)).fetchall())
    unsent = [r for r in rows if r["run_id"] != sent[r["node"]]]
    for r in unsent:
        _put_back(db, r, reason, now)
    return unsent


def _put_back(db: sqlite3.Connection, job: Row, reason: str, now: float) -> None:
    """Undo a claim whose request never reached Ollama: the job is queued at the head again,
    its run ends cancelled with `reason` (kept for forensics), an event says why."""
    db.execute("UPDATE job SET state = 'queued', position = ? WHERE id = ?",
               (_position_at(db, job["node"], job["id"], 0), job["id"]))
    db.execute("UPDATE run SET state = 'cancelled', finished_at = ?, error = ? WHERE id = ?",
               (iso(now), reason, job["run_id"]))
    _event(db, job["id"], "running", "queued", "router", reason, now)


def _put_back_run(db: sqlite3.Connection, job_id: str, run_id: int, reason: str, now: float) -> bool:
    job = db.execute("SELECT id, node, run_id, state FROM job WHERE id = ?", (job_id,)).fetchone()
    if job is None or job["state"] != "running" or job["run_id"] != run_id:
        return False  # deleted or preempted meanwhile: that already ended the run
    _put_back(db, job, reason, now)
    return True


def job_json(row: Row, public_url: str) -> Row:
    """The API's shape of a job row: `prompt` (and `output`) only when the row is a job's detail."""
    out = {
        "id": row["id"], "kind": row["kind"], "state": row["state"], "node": row["node"],
        "model": row["model"], "prompt_excerpt": row["prompt_excerpt"], "prompt_bytes": row["prompt_bytes"],
        "parent": row.get("parent_id"),
        "group": row.get("group_id"), "placement": row.get("placement"), "error": row.get("error"),
        "created_at": row.get("created_at"), "started_at": row.get("started_at"),
        "finished_at": row.get("finished_at"), "progress_at": row.get("progress_at"),
        "work_done_at": row.get("work_done_at"), "eval_count": row.get("eval_count"),
        "eval_duration_ns": row.get("eval_duration_ns"), "done_reason": row.get("done_reason"),
        "preempted_runs": row.get("preempted_runs", 0), "timeout_s": row.get("timeout_s"),
        "run_id": row.get("run_id"), "preview_url": f"{public_url}/jobs/{row['id']}",
        "waiting_for": row.get("waiting_for"),  # a held critique: the parent it waits for
    }
    if row.get("endpoint"):
        out["endpoint"] = row["endpoint"]
    for key in ("findings", "think", "options", "request"):  # JSON columns
        if row.get(key) is not None:
            out[key] = json.loads(row[key])
    for key in ("prompt", "output", "thinking", "runs", "events", "children", "queue_position"):
        if key in row:
            out[key] = row[key]
    return out


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)
