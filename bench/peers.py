"""The physical limit and the peers, in-process: raw sqlite3 commits, Huey's SqliteStorage,
persist-queue's SQLiteAckQueue and gpuq's own Store, all with WAL + synchronous=FULL on the
same disk. Each loop is bounded by a count and a time limit."""

from __future__ import annotations

import shutil
import sqlite3
import time
from pathlib import Path

from gpuq.store import NewJob, NodeInfo, Store

SYNC_FULL = 2  # PRAGMA synchronous value for FULL


def _fresh(path: Path) -> Path:
    if path.is_dir():
        shutil.rmtree(path)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return path


def raw_commits(path: Path, count: int, limit_s: float) -> float:
    """Single-row INSERT commits per second: the floor every durable queue stands on."""
    db = sqlite3.connect(_fresh(path), isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = FULL")
        assert db.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
        body = "x" * 64
        start = time.perf_counter()
        done = 0
        while done < count and time.perf_counter() - start < limit_s:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t (body) VALUES (?)", (body,))
            db.execute("COMMIT")
            done += 1
        return done / (time.perf_counter() - start)
    finally:
        db.close()


def huey_round_trips(path: Path, count: int, limit_s: float) -> float:
    """Huey SqliteStorage: enqueue then dequeue (which deletes the row), fsync=True = FULL."""
    from huey.storage import SqliteStorage

    storage = SqliteStorage(name="bench", filename=str(_fresh(path)), fsync=True, journal_mode="wal")
    conn = storage.conn
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    body = b"x" * 64
    try:
        start = time.perf_counter()
        done = 0
        while done < count and time.perf_counter() - start < limit_s:
            storage.enqueue(body)
            assert storage.dequeue() == body
            done += 1
        return done / (time.perf_counter() - start)
    finally:
        storage.close()


def persist_round_trips(path: Path, count: int, limit_s: float) -> float:
    """persist-queue SQLiteAckQueue: put, get, ack; synchronous set to FULL on its connections
    (it leaves the compiled-in default, so the bench sets it rather than trust the build)."""
    from persistqueue import SQLiteAckQueue

    queue = SQLiteAckQueue(str(_fresh(path)), auto_commit=True)
    for conn in {id(c): c for c in (queue._getter, queue._putter)}.values():
        conn.execute("PRAGMA synchronous = FULL")
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    body = "x" * 64
    try:
        start = time.perf_counter()
        done = 0
        while done < count and time.perf_counter() - start < limit_s:
            queue.put(body)
            item = queue.get(block=False)
            queue.ack(item)
            done += 1
        return done / (time.perf_counter() - start)
    finally:
        queue.close()


BENCH_NODES = [NodeInfo("n1", 1, ("task", "critique"), "m1", True)]


async def store_round_trips(path: Path, count: int, limit_s: float) -> float:
    """gpuq's Store: submit -> claim -> finish, one job at a time, as the worker runs it in
    steady state: the finish of one job claims the next in the same transaction, so a job
    costs two durable commits (its submit; its predecessor's finish + its claim). gpuq also
    writes a run row and three event rows that the peers do not."""
    store = Store(_fresh(path))
    await store.open()
    try:
        await store.configure({"stale_after_s": 600, "stale_grace_s": 30, "max_runtime_s": 3600}, [])
        job = NewJob("task", "x" * 64, node="n1")
        await store.submit(job, BENCH_NODES, "bench")
        claimed = await store.claim("n1")
        start = time.perf_counter()
        done = 0
        while done < count and time.perf_counter() - start < limit_s:
            [made] = await store.submit(job, BENCH_NODES, "bench")
            nxt = await store.finish(claimed["id"], claimed["run_id"], "done", None, "out", claim_node="n1")
            assert nxt is not None and nxt["id"] == made["id"]
            claimed = nxt
            done += 1
        return done / (time.perf_counter() - start)
    finally:
        await store.close()


# -- the same round trips with several workers at once ----------------------------------------
# Huey's consumer runs several worker threads against one storage; persist-queue is used the
# same way; gpuq runs one worker per node. Each worker repeats the full round trip.

def _threaded(cycle, workers: int, count: int, limit_s: float) -> float:
    import threading

    done = 0
    lock = threading.Lock()
    start = time.perf_counter()

    def worker() -> None:
        nonlocal done
        while time.perf_counter() - start < limit_s:
            with lock:
                if done >= count:
                    return
            cycle()
            with lock:
                done += 1

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit_s + 30)
    return done / (time.perf_counter() - start)


def huey_concurrent(path: Path, workers: int, count: int, limit_s: float) -> float:
    from huey.storage import SqliteStorage

    storage = SqliteStorage(name="bench", filename=str(_fresh(path)), fsync=True, journal_mode="wal")
    assert storage.conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
    body = b"x" * 64

    def cycle() -> None:
        storage.enqueue(body)
        deadline = time.perf_counter() + 5
        while storage.dequeue() is None:  # another worker took it: take the next one
            if time.perf_counter() > deadline:
                raise RuntimeError("huey: nothing to dequeue for 5s")

    try:
        return _threaded(cycle, workers, count, limit_s)
    finally:
        storage.close()


def persist_concurrent(path: Path, workers: int, count: int, limit_s: float) -> float:
    from persistqueue import SQLiteAckQueue

    queue = SQLiteAckQueue(str(_fresh(path)), auto_commit=True, multithreading=True)
    for conn in {id(c): c for c in (queue._getter, queue._putter)}.values():
        conn.execute("PRAGMA synchronous = FULL")
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
    body = "x" * 64

    def cycle() -> None:
        queue.put(body)
        item = queue.get(block=True, timeout=5)
        queue.ack(item)

    try:
        return _threaded(cycle, workers, count, limit_s)
    finally:
        queue.close()


async def store_concurrent(path: Path, workers: int, count: int, limit_s: float) -> float:
    import asyncio

    nodes = [NodeInfo(f"n{i}", i, ("task",), "m1", True) for i in range(1, workers + 1)]
    store = Store(_fresh(path))
    await store.open()
    done = 0
    start = time.perf_counter()

    async def worker(node: str) -> None:
        nonlocal done
        job = NewJob("task", "x" * 64, node=node)
        await store.submit(job, nodes, "bench")
        claimed = await store.claim(node)
        while done < count and time.perf_counter() - start < limit_s:
            [made] = await store.submit(job, nodes, "bench")
            nxt = await store.finish(claimed["id"], claimed["run_id"], "done", None, "out", claim_node=node)
            assert nxt is not None and nxt["id"] == made["id"]
            claimed = nxt
            done += 1

    try:
        await store.configure({"stale_after_s": 600, "stale_grace_s": 30, "max_runtime_s": 3600}, [])
        start = time.perf_counter()
        await asyncio.gather(*(worker(n.name) for n in nodes))
        return done / (time.perf_counter() - start)
    finally:
        await store.close()
