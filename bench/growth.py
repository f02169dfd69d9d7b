"""Databases with a long history, seeded by direct SQL consistent with the schema: finished
jobs (each with its run and its three events) plus a number of waiting jobs spread over the
nodes. The schema itself comes from gpuq's migrations (a Store opens the file first)."""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
from pathlib import Path

from gpuq.jobs import POSITION_GAP, iso
from gpuq.store import Store

PROMPT = "review the retry budget of the export job and say what breaks " * 3
JOB = "id, kind, state, node, model, prompt, position, placement, run_id, error, created_at, finished_at"
RUN = "id, job_id, node, model, state, started_at, progress_at, work_done_at, finished_at, output, error, done_reason"
EVENT = "job_id, at, from_state, to_state, actor, reason"
OUTPUT = "the export job retries forever when the budget is unset; cap it and log each retry. " * 6


async def seed(
    path: Path,
    history: int,
    waiting: int,
    nodes: list[tuple[str, str]],
    now: float,
    settings: dict,
    made: tuple[list, list, list] | None = None,
) -> Path:
    """`history` finished jobs over the past weeks, then `waiting` queued jobs (`made`: those
    rows, from `rows`, when another database gets the same)."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    store = Store(path)
    await store.open()
    await store.configure(settings, [])
    await store.close()

    jobs, runs, events = made or rows(history, waiting, nodes, now)

    def load() -> None:  # in a thread: another database may be seeded meanwhile
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = OFF")  # seeding only: the measurements run at FULL
            db.execute("BEGIN")
            db.executemany(f"INSERT INTO job ({JOB}) VALUES ({marks(JOB)})", jobs)
            db.executemany(f"INSERT INTO run ({RUN}) VALUES ({marks(RUN)})", runs)
            db.executemany(f"INSERT INTO event ({EVENT}) VALUES ({marks(EVENT)})", events)
            db.execute("COMMIT")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
        # Seeding skipped fsync: flush the file now, or the first durable commits measured would
        # wait for the whole seeded history to reach the disk (ext4 flushes it with them).
        with open(path, "rb+") as f:
            os.fsync(f.fileno())

    await asyncio.to_thread(load)
    return path


def rows(history: int, waiting: int, nodes: list[tuple[str, str]], now: float) -> tuple[list, list, list]:
    """The rows of `history` finished jobs (each with its run and three events) over the past
    weeks, then `waiting` queued jobs: (jobs, runs, events), in the columns of JOB, RUN, EVENT."""
    rng = random.Random(history)
    start = now - 30 * 86400
    step = (30 * 86400 - 3600) / max(history, 1)
    jobs, runs, events = [], [], []
    for i in range(history):
        node, model = nodes[i % len(nodes)]
        created = start + i * step
        began, ended = created + 1.0, created + 1.0 + rng.uniform(30, 600)
        state = rng.choices(("done", "failed", "cancelled"), (90, 7, 3))[0]
        job_id = f"{int(created)}-{i:08x}"
        error = None if state == "done" else ("deleted" if state == "cancelled" else "stalled: no bytes")
        run_id = i + 1
        jobs.append(
            (
                job_id,
                "task",
                state,
                node,
                model,
                PROMPT,
                (i + 1) * POSITION_GAP,
                "asked",
                run_id,
                error,
                iso(created),
                iso(ended),
            )
        )
        runs.append(
            (
                run_id,
                job_id,
                node,
                model,
                state,
                iso(began),
                iso(ended),
                iso(ended),
                iso(ended),
                OUTPUT,
                error,
                "stop" if state == "done" else None,
            )
        )
        events.append((job_id, iso(created), None, "queued", "api 127.0.0.1", f"placed on {node} (asked)"))
        events.append((job_id, iso(began), "queued", "running", "router", f"claimed by {node}"))
        events.append((job_id, iso(ended), "running", state, "router", error))
    for k in range(waiting):
        node, model = nodes[k % len(nodes)]
        created = now - waiting + k
        job_id = f"{int(created)}-{history + k:08x}"
        jobs.append(
            (
                job_id,
                "task",
                "queued",
                node,
                model,
                PROMPT,
                (k + 1) * POSITION_GAP,
                "asked",
                None,
                None,
                iso(created),
                None,
            )
        )
        events.append((job_id, iso(created), None, "queued", "api 127.0.0.1", f"placed on {node} (asked)"))
    return jobs, runs, events


def marks(columns: str) -> str:
    return ",".join("?" * len(columns.split(",")))


async def seed_postgres(
    dsn: str,
    history: int,
    waiting: int,
    nodes: list[tuple[str, str]],
    now: float,
    settings: dict,
    made: tuple[list, list, list] | None = None,
) -> str:
    """The same rows as `seed`, in a fresh PostgreSQL database (its schema from gpuq's
    migrations), by COPY. The finished history goes in with the triggers off
    (`session_replication_role = replica`): on a finished job or its run they would only send a
    NOTIFY per row and stamp runs with a lease holder there is none of; the waiting jobs go in
    with them on (they count the jobs per node as a submit does). Then ANALYZE and a CHECKPOINT:
    the measurements start on a flushed database, as `seed`'s fsync leaves SQLite's."""
    import psycopg

    store = Store(dsn)
    await store.open()
    await store.configure(settings, [])
    await store.close()
    jobs, runs, events = made or rows(history, waiting, nodes, now)

    def copy(cur, table: str, columns: str, values: list) -> None:
        with cur.copy(f"COPY {table} ({columns}) FROM STDIN") as out:
            for row in values:
                out.write_row(row)

    def load() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET synchronous_commit = off")  # seeding only: the measurements commit durably
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SET LOCAL session_replication_role = replica")
                copy(cur, "job", JOB, jobs[:history])
                copy(cur, "run", RUN, runs)
                copy(cur, "event", EVENT, events[: 3 * history])
                cur.execute("SET LOCAL session_replication_role = origin")
                copy(cur, "job", JOB, jobs[history:])
                copy(cur, "event", EVENT, events[3 * history :])
                cur.execute("SELECT setval(pg_get_serial_sequence('run', 'id'), (SELECT max(id) FROM run))")
            conn.execute("ANALYZE")
            conn.execute("CHECKPOINT")

    await asyncio.to_thread(load)
    return dsn
