"""`python -m bench.storesteps [--rounds N]`: where gpuq's store round trip goes, step by step
(issue 28, session 8). The round trip is the peers row's (bench/peers.StoreWorker): submit a job;
finish the running one, which claims the next in the same transaction.

1. In-process on the writer's own kind of connection (stdlib sqlite3, WAL), no event loop: the
   two transactions of a round trip (BEGIN IMMEDIATE, the verbs, COMMIT), at synchronous=OFF and
   FULL; every statement timed by a thin wrapper of the connection (its own cost measured too
   and taken out), grouped by the record it writes; the rest of the transactions is the verbs'
   Python.
2. The same with node_load's triggers dropped, and (CPU time, interleaved blocks) each record's
   triggers or indexes dropped in turn: what keeping each costs (`WITHOUT`).
3. Through the Store (its writer thread and event loop), at OFF and FULL, beside a bare
   event-loop -> thread -> event-loop hop (the writer's `call` of a no-op, and run_in_executor).

Each measure is taken in rounds, the variants interleaved inside each round; medians over rounds."""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from gpuq.jobs import NewJob, NodeInfo
from gpuq.store import lifecycle
from gpuq.store.facade import Store

from .peers import STORE_SETTINGS, StoreWorker

NODES = [NodeInfo("n1", 1, ("task", "critique"), "m1", True)]
JOB = NewJob("task", "x" * 64, node="n1")


def record_of(sql: str) -> str:
    """The record (or step) a statement serves."""
    s = " ".join(sql.split())
    for prefix, name in (
        ("BEGIN", "BEGIN"),
        ("COMMIT", "COMMIT"),
        ("SELECT node, running, queued FROM node_load", "submit: placement's counts (node_load)"),
        ("SELECT 1 FROM job WHERE id", "submit: the new id unused"),
        ("SELECT MAX(position)", "submit: the queue's tail"),
        ("INSERT INTO job", "submit: job row (+ node_load trigger)"),
        ("INSERT INTO event", "event rows (x3: placed, claimed, done)"),
        ("UPDATE job SET state = ?, error = ?, finished_at", "finish: job done (+ node_load trigger)"),
        ("INSERT INTO run_chunk", "finish: output chunk"),
        ("UPDATE run SET state", "finish: run row ended"),
        ("UPDATE job SET state = 'running'", "claim: UPDATE via ready_job (+ node_load trigger)"),
        ("INSERT INTO run", "claim: run row"),
        ("UPDATE job SET run_id", "claim: job's run_id"),
    ):
        if s.startswith(prefix):
            return name
    return "other: " + s[:40]


class Timed:
    """A sqlite3 connection whose execute is timed per statement (the verbs call only execute,
    fetchone/fetchall on its cursor; the fetch of a RETURNING/SELECT is inside the step)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.spent: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)

    def execute(self, sql, params=()):
        t = time.perf_counter()
        cur = self.db.execute(sql, params)
        rows = cur.fetchall()
        self.spent[record_of(sql)] += time.perf_counter() - t
        self.count[record_of(sql)] += 1
        return _Rows(rows, cur.rowcount)

    def __getattr__(self, name):
        return getattr(self.db, name)


class _Rows:
    def __init__(self, rows, rowcount):
        self._rows, self.rowcount = rows, rowcount

    def fetchone(self):
        return self._rows[0] if self._rows else None

    def fetchall(self):
        return self._rows

    def __iter__(self):
        return iter(self._rows)


async def fresh_db(path: Path) -> None:
    store = Store(path)
    await store.open()
    await store.configure(STORE_SETTINGS, [])
    await store.close()


def connect(path: Path, sync: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode = WAL").fetchall()
    db.execute(f"PRAGMA synchronous = {sync}")
    db.execute("PRAGMA foreign_keys = ON")
    return db


def tx(db, verb) -> object:
    db.execute("BEGIN IMMEDIATE")
    result = verb(db)
    db.execute("COMMIT")
    return result


def round_trips(db, n: int) -> tuple[float, dict[str, float], dict[str, int]]:
    """n round trips on `db` (plain or Timed): us per round trip, and per step."""
    now = time.time()
    running = db.execute("SELECT id, run_id FROM job WHERE state = 'running'").fetchone()
    if running is None:
        tx(db, lambda d, now=now: lifecycle.submit(d, JOB, NODES, "bench", now))
        running = tx(db, lambda d: lifecycle.claim(d, now, {}, "n1"))
    if isinstance(db, Timed):
        db.spent.clear()
        db.count.clear()
    t = time.perf_counter()
    for _ in range(n):
        now = time.time()
        tx(db, lambda d, now=now: lifecycle.submit(d, JOB, NODES, "bench", now))
        running = tx(
            db,
            lambda d, running=running, now=now: lifecycle.finish(
                d, now, {}, running["id"], running["run_id"], "done", None, output="out", claim_node="n1"
            ),
        )
    total = (time.perf_counter() - t) / n * 1e6
    if isinstance(db, Timed):
        return total, {k: v / n * 1e6 for k, v in db.spent.items()}, {k: c / n for k, c in db.count.items()}
    return total, {}, {}


def wrapper_cost(db: sqlite3.Connection, n: int = 2000) -> float:
    """What Timed adds per statement, beside the bare execute: us."""
    timed = Timed(db)
    db.execute("SELECT 1").fetchall()
    t = time.perf_counter()
    for _ in range(n):
        db.execute("SELECT 1").fetchall()
    bare = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(n):
        timed.execute("SELECT 1").fetchall()
    return ((time.perf_counter() - t) - bare) / n * 1e6


def drop_load_triggers(db: sqlite3.Connection) -> None:
    for name in ("node_load_insert", "node_load_update", "node_load_delete"):
        db.execute(f"DROP TRIGGER IF EXISTS {name}")


async def through_store(path: Path, sync: str, n: int) -> float:
    store = Store(path)
    await store.open()
    try:
        await store.configure(STORE_SETTINGS, [])
        await store._writer.call(lambda db: db.execute(f"PRAGMA synchronous = {sync}"))  # type: ignore[union-attr]
        worker = StoreWorker(store, "n1", NODES)
        await worker.start()
        for _ in range(20):
            await worker.cycle()
        t = time.perf_counter()
        for _ in range(n):
            await worker.cycle()
        return (time.perf_counter() - t) / n * 1e6
    finally:
        await store.close()


async def hops(path: Path, n: int) -> dict[str, tuple[float, float]]:
    """A bare hop and the writer's own path, each as (wall us, CPU us of the whole process) per
    call: the writer's `call` of a no-op (hop there and back), its `run` of a no-op (the hop plus
    BEGIN IMMEDIATE, the file-identity check and an empty COMMIT), and run_in_executor's hop."""
    store = Store(path)
    await store.open()
    loop = asyncio.get_running_loop()
    writer = store._writer  # type: ignore[union-attr]
    ways = {
        "writer.call(no-op)": lambda: writer.call(lambda db: None),
        "writer.run(no-op): + BEGIN, check, COMMIT": lambda: writer.run(lambda db: None),
        "run_in_executor(no-op)": lambda: loop.run_in_executor(None, lambda: None),
    }
    got = {}
    try:
        for name, way in ways.items():
            for _ in range(50):
                await way()
            c, t = time.process_time(), time.perf_counter()
            for _ in range(n):
                await way()
            got[name] = ((time.perf_counter() - t) / n * 1e6, (time.process_time() - c) / n * 1e6)
        return got
    finally:
        await store.close()


# What each kept record's upkeep costs: the same round trips on copies of the schema without it
# (triggers or indexes dropped; placement still reads node_load, its counts are then wrong).
WITHOUT = {
    "as shipped": [],
    "no node_load triggers (placement's and /health's counts)": [
        "DROP TRIGGER node_load_insert",
        "DROP TRIGGER node_load_update",
        "DROP TRIGGER node_load_delete",
    ],
    "no job indexes job_created, job_finished, job_owner_state, job_parent (history, listings, quotas, critiques)": [
        "DROP INDEX job_created",
        "DROP INDEX job_finished",
        "DROP INDEX job_owner_state",
        "DROP INDEX job_parent",
    ],
    "no run indexes run_done_node, run_done_node_model, run_finished (estimates, history)": [
        "DROP INDEX run_done_node",
        "DROP INDEX run_done_node_model",
        "DROP INDEX run_finished",
    ],
    "no event indexes event_job, event_run (the job page's events, /metrics)": [
        "DROP INDEX event_job",
        "DROP INDEX event_run",
    ],
}


def upkeep(where: Path, blocks: int, n: int) -> dict[str, list[float]]:
    """CPU us per round trip (the thread's own time, so other processes' load counts less) at
    synchronous=OFF, each variant in turn, the order reversed every block."""
    dbs = {}
    for i, (name, statements) in enumerate(WITHOUT.items()):
        path = where / f"upkeep-{i}.db"
        asyncio.run(fresh_db(path))
        db = connect(path, "OFF")
        for statement in statements:
            db.execute(statement)
        round_trips(db, 100)
        dbs[name] = db
    got: dict[str, list[float]] = {name: [] for name in dbs}
    for b in range(blocks):
        for name in list(dbs) if b % 2 == 0 else list(reversed(dbs)):
            c = time.thread_time()
            round_trips(dbs[name], n)
            got[name].append((time.thread_time() - c) / n * 1e6)
    for db in dbs.values():
        db.close()
    return got


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.storesteps", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("-n", type=int, default=500, help="round trips per measure")
    args = parser.parse_args()
    where = Path(tempfile.mkdtemp(prefix=".work-steps-", dir=Path(__file__).resolve().parent))
    got: dict[str, list[float]] = defaultdict(list)
    steps: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    counts: dict[str, float] = {}
    for r in range(args.rounds):
        for sync in ("OFF", "FULL"):
            for variant in ("kept", "no node_load triggers"):
                path = where / f"steps-{r}-{sync}-{variant[:2]}.db"
                asyncio.run(fresh_db(path))
                db = connect(path, sync)
                if variant != "kept":
                    drop_load_triggers(db)
                plain, _, _ = round_trips(db, args.n)
                timed, per, counts_now = round_trips(Timed(db), args.n)
                overhead = wrapper_cost(db) * sum(counts_now.values())
                got[f"{sync} {variant}: in-process"].append(plain)
                got[f"{sync} {variant}: timed, wrapper taken out"].append(timed - overhead)
                for k, v in per.items():
                    steps[f"{sync} {variant}"][k].append(v - overhead / sum(counts_now.values()) * counts_now[k])
                if variant == "kept" and sync == "OFF":
                    counts = counts_now
                got[f"{sync} {variant}: Python (timed - statements)"].append(timed - sum(per.values()))
                db.close()
            got[f"{sync}: through the Store (loop + writer thread)"].append(
                asyncio.run(through_store(where / f"store-{r}-{sync}.db", sync, args.n))
            )
        for name, (wall, cpu) in asyncio.run(hops(where / f"hop-{r}.db", args.n)).items():
            got[f"hop, {name}: wall"].append(wall)
            got[f"hop, {name}: CPU"].append(cpu)
        print(f"[storesteps] round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    print(f"\n{args.rounds} rounds x {args.n} round trips; medians (us per round trip)\n")
    print("| measure | us |\n| --- | --- |")
    for k, v in got.items():
        print(f"| {k} | {statistics.median(v):.1f} |")
    for variant, per in steps.items():
        print(f"\n{variant}: per statement group (us per round trip; statements per round trip)\n")
        print("| step | us | statements |\n| --- | --- | --- |")
        for k, v in sorted(per.items(), key=lambda kv: -statistics.median(kv[1])):
            print(f"| {k} | {statistics.median(v):.1f} | {counts.get(k, 0):g} |")
    print(
        f"\nUpkeep of each record's indexes and triggers: CPU us per round trip at synchronous=OFF,"
        f" {args.rounds * 3} interleaved blocks of 250\n"
    )
    print("| schema | CPU us | beside as shipped |\n| --- | --- | --- |")
    kept = upkeep(where, args.rounds * 3, 250)
    base = statistics.median(kept["as shipped"])
    for name, v in kept.items():
        print(f"| {name} | {statistics.median(v):.1f} | {statistics.median(v) - base:+.1f} |")
    for p in where.iterdir():
        p.unlink()
    where.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
