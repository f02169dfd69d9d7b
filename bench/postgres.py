"""`--only postgres`: the PostgreSQL driver for the store (issue 27), chosen by measurement.

Against a throwaway cluster (tests/pg.py's Cluster, durable: fsync on, synchronous_commit on,
its data dir in /tmp, which is on the same disk as the bench's SQLite files here), three
drivers side by side, interleaved in each repeat so they share the machine's noise:

- psycopg 3's AsyncConnection, taken from a psycopg_pool AsyncConnectionPool;
- asyncpg, from its own pool;
- psycopg 3's sync Connection on a thread, as the store runs sqlite3 today (gpuq/store/writer.py:
  one writer thread owns the connection, callers on the event loop hop to it). asyncpg has no
  sync API, so only psycopg can keep that design.

What each measures:
1. round trip, one at a time: the store's claim shape, from asyncio, two transactions: INSERT ...
   RETURNING id (a submit, autocommit), then BEGIN, SELECT ... FOR UPDATE SKIP LOCKED, UPDATE,
   COMMIT (a claim): the same five statements on each driver;
2. durable inserts, 32 concurrent clients, each INSERT its own committed transaction (for the
   sync connection: 32 threads with a connection each, and one writer thread that commits every
   insert waiting in one transaction, writer.py's group commit);
3. LISTEN/NOTIFY wake-up: from a NOTIFY sent on one connection to the listener's code running
   with it on another."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import asyncpg
import psycopg
from psycopg_pool import AsyncConnectionPool

from tests.pg import Cluster

if TYPE_CHECKING:
    from .core import Bench

CLIENTS = 32
SCHEMA = """
CREATE TABLE jobs (id bigserial PRIMARY KEY, state text NOT NULL DEFAULT 'queued', node text,
                   prompt text NOT NULL, created timestamptz NOT NULL DEFAULT now(), claimed timestamptz);
CREATE INDEX jobs_queued ON jobs (id) WHERE state = 'queued';
"""
SUBMIT = "INSERT INTO jobs (prompt) VALUES ({}) RETURNING id"
CLAIM = "SELECT id FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED"
MARK = "UPDATE jobs SET state = 'running', node = {}, claimed = now() WHERE id = {}"
INSERT = "INSERT INTO jobs (prompt) VALUES ({})"
DRIVERS = {
    "psycopg": "psycopg 3 AsyncConnection (psycopg_pool)",
    "asyncpg": "asyncpg (its pool)",
    "sync": "psycopg 3 sync Connection on one thread",
}


def ps(sql: str, n: int = 1) -> str:
    return sql.format(*["%s"] * n)


def ap(sql: str, n: int = 1) -> str:
    return sql.format(*[f"${i + 1}" for i in range(n)])


# -- 1: one round trip at a time -----------------------------------------------------------------


async def rt_psycopg(pool: AsyncConnectionPool, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        async with pool.connection() as conn:
            await conn.execute(ps(SUBMIT), (f"job {i}",))
        async with pool.connection() as conn, conn.transaction():
            row = await (await conn.execute(CLAIM)).fetchone()
            await conn.execute(ps(MARK, 2), ("n1", row[0]))
    return n / (time.perf_counter() - t)


async def rt_asyncpg(pool: asyncpg.Pool, n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        async with pool.acquire() as conn:
            await conn.fetchval(ap(SUBMIT), f"job {i}")
        async with pool.acquire() as conn:
            async with conn.transaction():
                job = await conn.fetchval(CLAIM)
                await conn.execute(ap(MARK, 2), "n1", job)
    return n / (time.perf_counter() - t)


def sync_submit(conn: psycopg.Connection, i: int) -> int:
    return conn.execute(ps(SUBMIT), (f"job {i}",)).fetchone()[0]


def sync_claim(conn: psycopg.Connection) -> None:
    with conn.transaction():
        job = conn.execute(CLAIM).fetchone()[0]
        conn.execute(ps(MARK, 2), ("n1", job))


async def rt_sync(writer: ThreadPoolExecutor, conn: psycopg.Connection, n: int) -> float:
    loop = asyncio.get_running_loop()
    t = time.perf_counter()
    for i in range(n):
        await loop.run_in_executor(writer, sync_submit, conn, i)
        await loop.run_in_executor(writer, sync_claim, conn)
    return n / (time.perf_counter() - t)


# -- 2: 32 clients, durable inserts ------------------------------------------------------------


async def clients(one, seconds: float) -> float:
    """CLIENTS tasks each awaiting `one(i)` in a loop for `seconds`; inserts per second."""
    done = 0
    stop = time.perf_counter() + seconds

    async def client(c: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < stop:
            await one(f"c{c} {i}")
            i += 1
            done += 1

    t = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(CLIENTS)))
    return done / (time.perf_counter() - t)


class GroupWriter:
    """writer.py's shape over psycopg's sync connection: one thread, every insert waiting
    committed in one transaction (each in its own SAVEPOINT), each caller answered after it."""

    def __init__(self, dsn: str):
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        self.commits = 0

    def run(self) -> None:
        while True:
            batch = [self.queue.get()]
            if batch[0] is None:
                return
            while True:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            stop = batch[-1] is None
            batch = [b for b in batch if b is not None]
            with self.conn.transaction():
                for prompt, _, _ in batch:
                    with self.conn.transaction():  # a SAVEPOINT, as writer.py's
                        self.conn.execute(ps(INSERT), (prompt,))
            self.commits += 1
            for _, loop, fut in batch:
                loop.call_soon_threadsafe(fut.set_result, None)
            if stop:
                return

    async def insert(self, prompt: str) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.queue.put((prompt, loop, fut))
        await fut

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(30)
        self.conn.close()


# -- 3: LISTEN/NOTIFY wake-up -------------------------------------------------------------------


async def wake_psycopg(dsn: str, n: int) -> list[float]:
    listener = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    notifier = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    waiting: dict[str, asyncio.Future] = {}
    try:
        await listener.execute("LISTEN bench")

        async def listen() -> None:
            async for note in listener.notifies():
                waiting.pop(note.payload).set_result(time.perf_counter())

        task = asyncio.create_task(listen())
        out = []
        for i in range(n):
            fut = waiting[str(i)] = asyncio.get_running_loop().create_future()
            t = time.perf_counter()
            await notifier.execute(f"NOTIFY bench, '{i}'")
            out.append((await asyncio.wait_for(fut, 10) - t) * 1000)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return out
    finally:
        await notifier.close()
        await listener.close()


async def wake_asyncpg(dsn: str, n: int) -> list[float]:
    listener = await asyncpg.connect(dsn)
    notifier = await asyncpg.connect(dsn)
    waiting: dict[str, asyncio.Future] = {}
    try:
        await listener.add_listener(
            "bench", lambda _c, _pid, _ch, payload: waiting.pop(payload).set_result(time.perf_counter())
        )
        out = []
        for i in range(n):
            fut = waiting[str(i)] = asyncio.get_running_loop().create_future()
            t = time.perf_counter()
            await notifier.execute(f"NOTIFY bench, '{i}'")
            out.append((await asyncio.wait_for(fut, 10) - t) * 1000)
        return out
    finally:
        await notifier.close()
        await listener.close()


async def wake_sync(dsn: str, n: int) -> list[float]:
    """The listener a thread of its own blocked in notifies(), the notifier a sync connection on
    a writer thread: the sync design's wake-up, event loop to thread and back."""
    loop = asyncio.get_running_loop()
    listener = psycopg.connect(dsn, autocommit=True)
    notifier = psycopg.connect(dsn, autocommit=True)
    listener.execute("LISTEN bench")
    waiting: dict[str, asyncio.Future] = {}
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            for note in listener.notifies(timeout=0.2):
                fut = waiting.pop(note.payload)
                loop.call_soon_threadsafe(fut.set_result, time.perf_counter())

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    writer = ThreadPoolExecutor(1)
    try:
        out = []
        for i in range(n):
            fut = waiting[str(i)] = loop.create_future()
            t = time.perf_counter()
            await loop.run_in_executor(writer, notifier.execute, f"NOTIFY bench, '{i}'")
            out.append((await asyncio.wait_for(fut, 10) - t) * 1000)
        return out
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 10)
        writer.shutdown()
        notifier.close()
        listener.close()


# -- the section ---------------------------------------------------------------------------------


async def postgres_section(bench: Bench) -> None:
    n_rt, seconds, n_wake = (300, 2.0, 100) if bench.quick else (1000, 4.0, 300)
    cluster = await asyncio.to_thread(Cluster(durable=True).start)
    try:
        name = await asyncio.to_thread(cluster.create_database)
        dsn = cluster.dsn(name)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(SCHEMA)
            settings = {
                k: conn.execute(f"SHOW {k}").fetchone()[0] for k in ("fsync", "synchronous_commit", "server_version")
            }
        bench.say(f"postgres: {settings} in {cluster.dir}")
        assert settings["fsync"] == "on" and settings["synchronous_commit"] == "on", settings
        rt = {
            d: bench.metric(
                f"pg_rt_{d}",
                f"PostgreSQL {label}: submit + claim round trip, one at a time (2 commits)",
                "round trips/s",
                "rate",
            )
            for d, label in DRIVERS.items()
        }
        ins = {
            d: bench.metric(
                f"pg_insert32_{d}",
                f"PostgreSQL {label}: durable inserts, {CLIENTS} clients (a commit each)",
                "inserts/s",
                "rate",
            )
            for d, label in DRIVERS.items()
            if d != "sync"
        }
        ins["threads"] = bench.metric(
            "pg_insert32_threads",
            f"PostgreSQL psycopg 3 sync Connection, {CLIENTS} threads with a connection each (a commit each)",
            "inserts/s",
            "rate",
        )
        ins["group"] = bench.metric(
            "pg_insert32_group",
            "PostgreSQL psycopg 3 sync Connection, one writer"
            f" thread, group commit (writer.py's shape), {CLIENTS} clients",
            "inserts/s",
            "rate",
        )
        wake = {
            d: bench.metric(f"pg_wake_{d}", f"PostgreSQL {label}: LISTEN/NOTIFY wake-up", "ms", "ms")
            for d, label in DRIVERS.items()
        }
        ratio_rt = bench.metric(
            "pg_rt_ratio", "  psycopg 3 async / asyncpg, round trip (same run)", "ratio", "ratio", better="higher"
        )
        ratio_ins = bench.metric(
            "pg_insert32_ratio",
            f"  psycopg 3 async / asyncpg, {CLIENTS} clients (same run)",
            "ratio",
            "ratio",
            better="higher",
        )

        ppool = AsyncConnectionPool(dsn, min_size=CLIENTS, max_size=CLIENTS, open=False, kwargs={"autocommit": True})
        await ppool.open(wait=True, timeout=60)
        apool = await asyncpg.create_pool(dsn, min_size=CLIENTS, max_size=CLIENTS)
        sync_conn = psycopg.connect(dsn, autocommit=True)
        writer = ThreadPoolExecutor(1)
        local = threading.local()
        thread_conns: list[psycopg.Connection] = []
        threads = ThreadPoolExecutor(CLIENTS)

        def thread_insert(prompt: str) -> None:
            if not hasattr(local, "conn"):
                local.conn = psycopg.connect(dsn, autocommit=True)
                thread_conns.append(local.conn)
            local.conn.execute(ps(INSERT), (prompt,))

        async def p_insert(prompt: str) -> None:
            async with ppool.connection() as conn:
                await conn.execute(ps(INSERT), (prompt,))

        async def a_insert(prompt: str) -> None:
            await apool.execute(ap(INSERT), prompt)

        loop = asyncio.get_running_loop()
        try:
            for rep in range(bench.repeats):
                got = {}
                for d in DRIVERS:
                    with psycopg.connect(dsn, autocommit=True) as conn:
                        conn.execute("TRUNCATE jobs")
                    got[d] = await {
                        "psycopg": lambda: rt_psycopg(ppool, n_rt),
                        "asyncpg": lambda: rt_asyncpg(apool, n_rt),
                        "sync": lambda: rt_sync(writer, sync_conn, n_rt),
                    }[d]()
                    rt[d].add_run(got[d])
                ratio_rt.add_run(got["psycopg"] / got["asyncpg"])
                group = GroupWriter(dsn)
                try:
                    runs = {
                        "psycopg": p_insert,
                        "asyncpg": a_insert,
                        "group": group.insert,
                        "threads": lambda p: loop.run_in_executor(threads, thread_insert, p),
                    }
                    for d, one in runs.items():
                        got[d] = await clients(one, seconds)
                        ins[d].add_run(got[d])
                finally:
                    await asyncio.to_thread(group.close)
                ratio_ins.add_run(got["psycopg"] / got["asyncpg"])
                wake["psycopg"].add_run(await wake_psycopg(dsn, n_wake))
                wake["asyncpg"].add_run(await wake_asyncpg(dsn, n_wake))
                wake["sync"].add_run(await wake_sync(dsn, n_wake))
                bench.say(
                    f"postgres run {rep + 1}: round trips/s "
                    + ", ".join(f"{d} {m.runs[-1][0]:.0f}" for d, m in rt.items())
                    + f"; {CLIENTS} clients inserts/s "
                    + ", ".join(f"{d} {m.runs[-1][0]:.0f}" for d, m in ins.items())
                )
        finally:
            writer.shutdown()
            threads.shutdown()
            for conn in thread_conns:
                conn.close()
            sync_conn.close()
            await apool.close()
            await ppool.close()
    finally:
        await asyncio.to_thread(cluster.stop)
