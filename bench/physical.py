"""Sections `physical` and `peers`: the disk's raw commit rate, then the store's round trip
beside Huey's and persist-queue's, one at a time and with 8 workers, and where its time goes
(issue 8, items 1 and 2)."""

from __future__ import annotations

import asyncio
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from gpuq.store import Store

from . import peers
from .core import Bench
from .machine import disk_write_cache
from .stats import Metric, fmt

CONCURRENT_WORKERS = 8


async def timed_ms(awaitable) -> float:
    t = time.perf_counter()
    await awaitable
    return (time.perf_counter() - t) * 1000


async def physical_and_peers(bench: Bench) -> None:
    cache = disk_write_cache(bench.workdir)
    raw = bench.metric(
        "raw_commits",
        f"raw sqlite3 single-row commits (WAL, synchronous=FULL; disk write cache: {cache['write_cache']})",
        "commits/s",
        "rate",
    )
    raw.note = f"device {cache['device']}, write_cache {cache['write_cache']}, fua {cache['fua']}"
    commit_ms = bench.metric("commit_ms", "  one durable commit (1 / raw commits/s)", "ms", "ms")
    n_raw, n_rt = (400, 150) if bench.quick else (2000, 600)
    for rep in range(bench.repeats):
        # Interleaved within each repeat, so the ratios share the machine's noise.
        r = peers.raw_commits(bench.workdir / "raw.db", n_raw, 5.0)
        raw.add_run(r)
        commit_ms.add_run(1000 / r)
        if bench.wants("peers"):
            await one_at_a_time(bench, r, n_rt)
            await hop_costs(bench)
            await eight_workers(bench, n_rt)
        bench.say(
            f"physical/peers run {rep + 1}/{bench.repeats}: raw {r:,.0f}/s"
            + (
                "; "
                + ", ".join(
                    f"{k} {bench.metrics[k].runs[-1][0]:,.0f}/s"
                    for k in ("store_rt", "huey_rt", "pq_rt", "store_rt_c", "store_off_rt_c", "huey_rt_c", "pq_rt_c")
                )
                if bench.wants("peers")
                else ""
            )
        )
    if bench.wants("peers"):
        name_commits(bench)


def commits_row(bench: Bench, key: str, who: str) -> Metric:
    return bench.metric(
        f"{key}_commits", f"  {who}: durable commits per round trip (counted in the WAL)", "commits", "count"
    )


async def one_at_a_time(bench: Bench, raw: float, count: int) -> None:
    """The round trip one job at a time, beside Huey's and persist-queue's, and where its
    time goes: the durable commits it counted at this run's raw commit time, and the rest."""
    labels = {
        "store": (
            "gpuq",
            "gpuq Store submit->claim->finish, one at a time ({store} commits: the submit;"
            " the finish, which claims the next)",
        ),
        "huey": ("Huey", "Huey SqliteStorage enqueue->dequeue, one at a time ({huey} commits)"),
        "pq": ("persist-queue", "persist-queue SQLiteAckQueue put->get->ack, one at a time ({pq} commits)"),
    }
    runs = {
        "huey": peers.huey_round_trips(bench.workdir / "huey.db", count, 5.0),
        "pq": peers.persist_round_trips(bench.workdir / "pq", count, 5.0),
        "store": await peers.store_round_trips(bench.workdir / "store.db", count, 5.0),
    }
    for who in ("store", "huey", "pq"):
        short, label = labels[who]
        rate, commits = runs[who]
        bench.metric(f"{who}_rt", label, "round trips/s", "rate").add_run(rate)
        commits_row(bench, who, short).add_run(commits)
    (s, s_c), (h, h_c), (p, _) = runs["store"], runs["huey"], runs["pq"]
    bench.metric(
        "store_vs_huey",
        "gpuq Store round trip / Huey's, one at a time (same run)",
        "ratio",
        "ratio",
        ">= 1.00x",
        better="higher",
    ).add_run(s / h)
    bench.metric(
        "store_vs_pq",
        "gpuq Store round trip / persist-queue's, one at a time (same run)",
        "ratio",
        "ratio",
        better="higher",
    ).add_run(s / p)
    for key, who, rate, commits in (("store", "gpuq", s, s_c), ("huey", "Huey", h, h_c)):
        # How much of the disk's commit rate each turns into work; 1.00x = nothing but fsyncs.
        bench.metric(
            f"{key}_commit_share",
            f"{who} round trips x its commits / raw commits/s (same run)",
            "ratio",
            "ratio",
            better="higher",
        ).add_run(rate * commits / raw)
        total_ms, disk_ms = 1000 / rate, commits * 1000 / raw
        bench.metric(f"{key}_rt_ms", f"  {who} round trip time, one at a time", "ms", "ms").add_run(total_ms)
        bench.metric(
            f"{key}_rt_disk_ms", "    its commits x one durable commit (the disk's share)", "ms", "ms"
        ).add_run(disk_ms)
        bench.metric(
            f"{key}_rt_rest_ms", "    the rest: CPU, thread hops, SQL (time - the disk's share)", "ms", "ms"
        ).add_run(total_ms - disk_ms)


async def eight_workers(bench: Bench, count: int) -> None:
    """8 workers at once: gpuq's group commit, gpuq with batching emulated off, and the peers'
    one commit per operation."""
    w = CONCURRENT_WORKERS
    runs = {
        "huey": peers.huey_concurrent(bench.workdir / "huey-c.db", w, count, 5.0),
        "pq": peers.persist_concurrent(bench.workdir / "pq-c", w, count, 5.0),
        "store": await peers.store_concurrent(bench.workdir / "store-c.db", w, count, 5.0),
        "store_off": await peers.store_concurrent(bench.workdir / "store-off.db", w, count, 5.0, batching=False),
    }
    labels = {
        "store": (
            f"gpuq Store, {w} workers (one per node), group commit ({{store_c}} commits per round trip)",
            "gpuq, group commit",
        ),
        "store_off": (
            f"gpuq Store, {w} workers, batching off: one write in flight at a time"
            " ({store_off_c} commits per round trip)",
            "gpuq, batching off",
        ),
        "huey": (f"Huey, {w} worker threads, a commit per operation ({{huey_c}} commits per round trip)", "Huey"),
        "pq": (
            f"persist-queue, {w} worker threads, a commit per operation ({{pq_c}} commits per round trip)",
            "persist-queue",
        ),
    }
    for who in ("store", "store_off", "huey", "pq"):
        (label, short), (rate, commits) = labels[who], runs[who]
        bench.metric(f"{who}_rt_c", label, "round trips/s", "rate").add_run(rate)
        commits_row(bench, f"{who}_c", f"{short}, {w} workers").add_run(commits)
    s, off, h, p = (runs[k][0] for k in ("store", "store_off", "huey", "pq"))
    for key, label, value in (
        ("store_vs_huey_c", f"gpuq group commit / Huey's per-operation commit, {w} workers (same run)", s / h),
        ("store_off_vs_huey_c", f"gpuq batching off / Huey, {w} workers (same run)", off / h),
        ("store_vs_pq_c", f"gpuq group commit / persist-queue, {w} workers (same run)", s / p),
        ("store_vs_off_c", f"gpuq group commit / gpuq batching off, {w} workers (same run)", s / off),
    ):
        bench.metric(key, label, "ratio", "ratio", better="higher").add_run(value)


async def hop_costs(bench: Bench) -> None:
    """What one hop from the event loop to a thread and back costs here: an asyncio program
    on a blocking database driver pays one on every call, whatever the disk."""
    hop = bench.metric("thread_hop", "  one thread hop: event loop -> a worker thread -> back (a no-op)", "ms", "ms")
    read = bench.metric(
        "store_read", "  Store.read('SELECT 1'): the reader connection's thread, there and back", "ms", "ms"
    )
    loop = asyncio.get_running_loop()
    samples = 100 if bench.quick else 300
    with ThreadPoolExecutor(1) as pool:
        await loop.run_in_executor(pool, int)
        hop.add_run([await timed_ms(loop.run_in_executor(pool, int)) for _ in range(samples)])
    store = Store(bench.workdir / "hops.db")
    await store.open()
    try:
        await store.read("SELECT 1")
        read.add_run([await timed_ms(store.read("SELECT 1")) for _ in range(samples)])
    finally:
        await store.close()


def name_commits(bench: Bench) -> None:
    """Put the counted commits (their median over the runs) into the labels that name them:
    `{store}` in a label is replaced by the median of the row `store_commits`."""
    for key, counted in list(bench.metrics.items()):
        if key.endswith("_commits") and counted.pooled:
            value = fmt(statistics.median(counted.pooled), "count").removesuffix(".00")
            for m in bench.metrics.values():
                m.label = m.label.replace("{" + key.removesuffix("_commits") + "}", value)
