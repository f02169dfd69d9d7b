"""Databases with a long history, seeded by direct SQL consistent with the schema: finished
jobs (each with its run and its three events) plus a number of waiting jobs spread over the
nodes. The schema itself comes from gpuq's migrations (a Store opens the file first)."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

from gpuq.models import POSITION_GAP, iso
from gpuq.store import Store

PROMPT = "review the retry budget of the export job and say what breaks " * 3
OUTPUT = "the export job retries forever when the budget is unset; cap it and log each retry. " * 6


async def seed(path: Path, history: int, waiting: int, nodes: list[tuple[str, str]],
               now: float, settings: dict) -> Path:
    """`history` finished jobs over the past weeks, then `waiting` queued jobs."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    store = Store(path)
    await store.open()
    await store.configure(settings, [])
    await store.close()

    rng = random.Random(history)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = OFF")  # seeding only: the measurements run at FULL
        db.execute("BEGIN")
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
            jobs.append((job_id, "task", state, node, model, PROMPT, (i + 1) * POSITION_GAP, "asked",
                         run_id, error, iso(created), iso(ended)))
            runs.append((run_id, job_id, node, model, state, iso(began), iso(ended), iso(ended),
                         iso(ended), OUTPUT, error, "stop" if state == "done" else None))
            events.append((job_id, iso(created), None, "queued", "api 127.0.0.1", f"placed on {node} (asked)"))
            events.append((job_id, iso(began), "queued", "running", "router", f"claimed by {node}"))
            events.append((job_id, iso(ended), "running", state, "router", error))
        for k in range(waiting):
            node, model = nodes[k % len(nodes)]
            created = now - waiting + k
            job_id = f"{int(created)}-{history + k:08x}"
            jobs.append((job_id, "task", "queued", node, model, PROMPT, (k + 1) * POSITION_GAP, "asked",
                         None, None, iso(created), None))
            events.append((job_id, iso(created), None, "queued", "api 127.0.0.1", f"placed on {node} (asked)"))
        db.executemany(
            "INSERT INTO job (id, kind, state, node, model, prompt, position, placement, run_id, error,"
            " created_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", jobs)
        db.executemany(
            "INSERT INTO run (id, job_id, node, model, state, started_at, progress_at, work_done_at,"
            " finished_at, output, error, done_reason) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", runs)
        db.executemany(
            "INSERT INTO event (job_id, at, from_state, to_state, actor, reason) VALUES (?,?,?,?,?,?)",
            events)
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
    # Seeding skipped fsync: flush the file now, or the first durable commits measured would
    # wait for the whole seeded history to reach the disk (ext4 flushes it with them).
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    return path
