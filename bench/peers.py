"""The physical limit and the peers, in-process: raw sqlite3 commits, Huey's SqliteStorage,
persist-queue's SQLiteAckQueue and gpuq's own Store, all with WAL + synchronous=FULL on the
same disk. Each loop is bounded by a count and a time limit.

Every round trip function returns (round trips/s, durable commits per round trip). The commits
are counted, not assumed: before its timed loop each one runs COUNTED round trips and counts
the commit frames they added to the database's WAL (`wal_commits`)."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpuq.store import NewJob, NodeInfo, Store

SYNC_FULL = 2  # PRAGMA synchronous value for FULL
COUNTED = 24  # round trips whose commits are counted (few enough that no checkpoint restarts the WAL)


def wal_commits(db_path: Path) -> tuple[bytes, int]:
    """(the WAL's salt, its commit frames). In WAL mode every transaction that changes the
    database appends its pages as frames and marks the last one as a commit frame (a non-zero
    "database size" field), and at synchronous=FULL syncs the WAL at that commit: the count is
    the durable commits since the log last restarted. Frames left over from before a restart
    carry the old salt, so counting stops at the first of them [sqlite.org/fileformat.html, 4.1]."""
    try:
        data = Path(str(db_path) + "-wal").read_bytes()
    except FileNotFoundError:
        return b"", 0
    if len(data) < 32:
        return b"", 0
    page_size = int.from_bytes(data[8:12], "big")
    salt, frame = data[16:24], 24 + page_size
    commits, offset = 0, 32
    while offset + frame <= len(data) and data[offset + 8 : offset + 16] == salt:
        commits += int.from_bytes(data[offset + 4 : offset + 8], "big") != 0
        offset += frame
    return salt, commits


def restart_wal(db_path: Path) -> None:
    """Checkpoint and empty the WAL (from a connection of our own, while the queue is idle), so
    the commits counted next cannot be cut by an automatic checkpoint's restart."""
    db = sqlite3.connect(db_path)
    try:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise RuntimeError(f"could not checkpoint {db_path}: it is busy")
    finally:
        db.close()


def commits_per(db_path: Path, rounds: int, before: tuple[bytes, int]) -> float:
    salt, after = wal_commits(db_path)
    if before[0] and salt != before[0]:  # (an empty WAL, as restart_wal leaves it, has no salt yet)
        raise RuntimeError(f"the WAL of {db_path} restarted while its commits were counted")
    return (after - before[1]) / rounds


def _count(db_path: Path, cycle: Callable[[], None], rounds: int = COUNTED) -> float:
    restart_wal(db_path)
    before = wal_commits(db_path)
    for _ in range(rounds):
        cycle()
    return commits_per(db_path, rounds, before)


async def _count_async(db_path: Path, cycle: Callable[[], Awaitable[None]], rounds: int = COUNTED) -> float:
    restart_wal(db_path)
    before = wal_commits(db_path)
    for _ in range(rounds):
        await cycle()
    return commits_per(db_path, rounds, before)


def _timed(cycle: Callable[[], None], count: int, limit_s: float) -> float:
    start = time.perf_counter()
    done = 0
    while done < count and time.perf_counter() - start < limit_s:
        cycle()
        done += 1
    return done / (time.perf_counter() - start)


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


def _huey(path: Path):
    from huey.storage import SqliteStorage

    storage = SqliteStorage(name="bench", filename=str(_fresh(path)), fsync=True, journal_mode="wal")
    conn = storage.conn
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    return storage


def huey_round_trips(path: Path, count: int, limit_s: float) -> tuple[float, float]:
    """Huey SqliteStorage: enqueue then dequeue (which deletes the row), fsync=True = FULL."""
    storage = _huey(path)
    body = b"x" * 64

    def cycle() -> None:
        storage.enqueue(body)
        assert storage.dequeue() == body

    try:
        commits = _count(path, cycle)
        return _timed(cycle, count, limit_s), commits
    finally:
        storage.close()


def _persist(path: Path, **kwargs):
    """persist-queue's SQLiteAckQueue with synchronous set to FULL on its connections (it leaves
    the compiled-in default, so the bench sets it rather than trust the build)."""
    from persistqueue import SQLiteAckQueue

    queue = SQLiteAckQueue(str(_fresh(path)), auto_commit=True, **kwargs)
    for conn in {id(c): c for c in (queue._getter, queue._putter)}.values():
        conn.execute("PRAGMA synchronous = FULL")
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == SYNC_FULL
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    return queue


def persist_round_trips(path: Path, count: int, limit_s: float) -> tuple[float, float]:
    """persist-queue SQLiteAckQueue: put, get, ack."""
    queue = _persist(path)
    db_file = path / "data.db"
    body = "x" * 64

    def cycle() -> None:
        queue.put(body)
        queue.ack(queue.get(block=False))

    try:
        commits = _count(db_file, cycle)
        return _timed(cycle, count, limit_s), commits
    finally:
        queue.close()


STORE_SETTINGS = {"stale_after_s": 600, "stale_grace_s": 30, "max_runtime_s": 3600}


async def _store(path: Path) -> Store:
    store = Store(_fresh(path))
    await store.open()
    try:
        await store.configure(STORE_SETTINGS, [])
    except BaseException:
        await store.close()
        raise
    return store


class StoreWorker:
    """One node's worker as gpuq runs it in steady state, through the Store's public verbs:
    submit a job, then finish the running one, which claims the next in the same call."""

    def __init__(self, store: Store, node: str, nodes: list[NodeInfo], gate: asyncio.Lock | None = None):
        self.store, self.node, self.nodes = store, node, nodes
        self.gate = gate  # when set, every write holds it: one write in flight in the whole store
        self.job = NewJob("task", "x" * 64, node=node)
        self.running = None

    async def _one(self, write: Awaitable):
        if self.gate is None:
            return await write
        async with self.gate:
            return await write

    async def start(self) -> None:
        await self._one(self.store.submit(self.job, self.nodes, "bench"))
        self.running = await self._one(self.store.claim(self.node))
        assert self.running is not None

    async def cycle(self) -> None:
        [made] = await self._one(self.store.submit(self.job, self.nodes, "bench"))
        nxt = await self._one(
            self.store.finish(self.running["id"], self.running["run_id"], "done", None, "out", claim_node=self.node)
        )
        assert nxt is not None and nxt["id"] == made["id"], (nxt, made)
        self.running = nxt


async def store_round_trips(path: Path, count: int, limit_s: float) -> tuple[float, float]:
    """gpuq's Store: submit -> claim -> finish, one job at a time, as the worker runs it in
    steady state (the finish of one job claims the next in the same call). gpuq also writes a
    run row and three event rows that the peers do not."""
    nodes = [NodeInfo("n1", 1, ("task", "critique"), "m1", True)]
    store = await _store(path)
    try:
        worker = StoreWorker(store, "n1", nodes)
        await worker.start()
        commits = await _count_async(path, worker.cycle)
        start = time.perf_counter()
        done = 0
        while done < count and time.perf_counter() - start < limit_s:
            await worker.cycle()
            done += 1
        return done / (time.perf_counter() - start), commits
    finally:
        await store.close()


# -- the same round trips with several workers at once ----------------------------------------
# Huey's consumer runs several worker threads against one storage; persist-queue is used the
# same way; gpuq runs one worker per node. Each worker repeats the full round trip.


def _threaded(cycle, workers: int, count: int, limit_s: float) -> float:
    done = 0
    lock = threading.Lock()
    start = time.perf_counter()

    def worker() -> None:
        nonlocal done
        while time.perf_counter() - start < limit_s:
            with lock:
                if done >= count:
                    return
                done += 1  # this worker's claim on one of the `count` round trips
            cycle()

    threads = [threading.Thread(target=worker) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(limit_s + 30)
    return done / (time.perf_counter() - start)


def huey_concurrent(path: Path, workers: int, count: int, limit_s: float) -> tuple[float, float]:
    storage = _huey(path)
    body = b"x" * 64

    def cycle() -> None:
        storage.enqueue(body)
        deadline = time.perf_counter() + 5
        while storage.dequeue() is None:  # another worker took it: take the next one
            if time.perf_counter() > deadline:
                raise RuntimeError("huey: nothing to dequeue for 5s")

    try:
        restart_wal(path)
        before = wal_commits(path)
        _threaded(cycle, workers, COUNTED, 30.0)
        commits = commits_per(path, COUNTED, before)
        return _threaded(cycle, workers, count, limit_s), commits
    finally:
        storage.close()


def persist_concurrent(path: Path, workers: int, count: int, limit_s: float) -> tuple[float, float]:
    queue = _persist(path, multithreading=True)
    db_file = path / "data.db"
    body = "x" * 64

    def cycle() -> None:
        queue.put(body)
        queue.ack(queue.get(block=True, timeout=5))

    try:
        restart_wal(db_file)
        before = wal_commits(db_file)
        _threaded(cycle, workers, COUNTED, 30.0)
        commits = commits_per(db_file, COUNTED, before)
        return _threaded(cycle, workers, count, limit_s), commits
    finally:
        queue.close()


async def store_concurrent(
    path: Path, workers: int, count: int, limit_s: float, batching: bool = True
) -> tuple[float, float]:
    """`workers` nodes' workers on one Store at once. With `batching=False`, gpuq's group commit
    is emulated away: every write holds one lock, so only one is ever in flight and each gets
    a transaction (a commit, an fsync) of its own, as with Huey's per-operation commit."""
    nodes = [NodeInfo(f"n{i}", i, ("task",), "m1", True) for i in range(1, workers + 1)]
    store = await _store(path)
    gate = None if batching else asyncio.Lock()
    done = 0

    async def run(worker: StoreWorker, total: int, limit: float, started: float) -> None:
        nonlocal done
        while done < total and time.perf_counter() - started < limit:
            done += 1  # this worker's claim on one of the `total` round trips
            await worker.cycle()

    async def together(total: int, limit: float) -> float:
        nonlocal done
        done = 0
        started = time.perf_counter()
        await asyncio.gather(*(run(w, total, limit, started) for w in crew))
        return done / (time.perf_counter() - started)

    try:
        crew = [StoreWorker(store, n.name, nodes, gate) for n in nodes]
        for w in crew:
            await w.start()
        restart_wal(path)
        before = wal_commits(path)
        await together(COUNTED, 30.0)
        commits = commits_per(path, COUNTED, before)
        return await together(count, limit_s), commits
    finally:
        await store.close()
