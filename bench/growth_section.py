"""Section `growth`: the store's calls and the router's reads over 100, 10,000 and 100,000
jobs of history (seeded by bench/growth.py), side by side, and the router's RSS (issue 8,
items 5 and 6)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from gpuq.store import NewJob, NodeInfo, Store

from . import growth
from .core import NODES, SETTINGS, Bench
from .procs import Router, rss_mb
from .stats import Metric


async def growth_section(bench: Bench) -> None:
    sizes = (100, 10_000, 100_000)
    waiting = 1000
    samples = 15 if bench.quick else 30
    labels = {
        "claim": "claim (Store.claim)",
        "claim_sql": "claim, SQL only (synchronous=OFF)",
        "stale": "staleness (Store.stale_heads)",
        "submit": "submit (Store.submit, 1 job)",
        "health": "GET /health",
        "queue": "GET /api/queue (1,000 waiting: output grows with waiting)",
        "metrics": "GET /metrics (a steady scrape)",
        "history": "GET /api/history (the newest 50 finished, and the count)",
        "activity": "GET /api/activity (the day's counts, each node's last hour)",
    }
    per: dict[tuple[str, int], Metric] = {}
    for size in sizes:
        for key, label in labels.items():
            per[key, size] = bench.metric(f"growth_{key}_{size}", f"{label} @ {size:,} history", "ms", "ms")
    first_scrape = {
        size: bench.metric(
            f"growth_metrics_first_{size}",
            f"GET /metrics, first scrape after start (reads the history) @ {size:,}",
            "ms",
            "ms",
        )
        for size in sizes
    }
    rss = {
        size: bench.metric(
            f"rss_{size}",
            f"router RSS after the queries @ {size:,} history",
            "MB",
            "mb",
            "<= 100 MB" if size == 100_000 else "",
        )
        for size in sizes
    }
    infos = [NodeInfo(n, rank, ("task", "critique"), m, True) for rank, (n, m) in enumerate(NODES.items(), 1)]
    paths = {}
    for size in sizes:
        t0 = time.perf_counter()
        paths[size] = await growth.seed(
            bench.workdir / f"history-{size}.db", size, waiting, list(NODES.items()), time.time(), SETTINGS
        )
        bench.say(f"growth: seeded {size:,} jobs of history + {waiting:,} waiting in {time.perf_counter() - t0:.1f}s")
    # The sizes take turns sample by sample (three stores open side by side), so the disk's
    # and the machine's changing load falls on every size alike and cannot pass for growth.
    for _rep in range(bench.repeats):
        stores = {size: Store(paths[size]) for size in sizes}
        for store in stores.values():
            await store.open()
        try:
            runs = {(k, size): [] for k in ("claim", "claim_sql", "stale", "submit") for size in sizes}
            # The claim with its fsync, then without it: the SQL work alone, where growth would show.
            for key, synchronous in (("claim", "FULL"), ("claim_sql", "OFF")):
                for store in stores.values():
                    await store._writer.call(
                        lambda db, synchronous=synchronous: db.execute(f"PRAGMA synchronous = {synchronous}")
                    )
                for i in range(samples):
                    node = "n1" if i % 2 == 0 else "n2"
                    for size, store in stores.items():
                        t = time.perf_counter()
                        job = await store.claim(node)
                        runs[key, size].append((time.perf_counter() - t) * 1000)
                        await store.finish(job["id"], job["run_id"], "done", None, "out")
            for store in stores.values():
                await store._writer.call(lambda db: db.execute("PRAGMA synchronous = FULL"))
            heads = {size: [await store.claim(n) for n in NODES] for size, store in stores.items()}
            for _ in range(samples * 5):  # tens of microseconds each: more samples
                for size, store in stores.items():
                    t = time.perf_counter()
                    await store.stale_heads()
                    runs["stale", size].append((time.perf_counter() - t) * 1000)
            for size, store in stores.items():
                for h in heads[size]:
                    await store.finish(h["id"], h["run_id"], "done", None, "out")
            for _ in range(samples):
                for size, store in stores.items():
                    t = time.perf_counter()
                    await store.submit(NewJob("task", "one more"), infos, "bench")
                    runs["submit", size].append((time.perf_counter() - t) * 1000)
        finally:
            for store in stores.values():
                await store.close()
        for (key, size), values in runs.items():
            per[key, size].add_run(values)
    # One router per database, side by side, each node busy with a (held) running job.
    for name in NODES:
        await bench.fakes.call("hold", name)
    routers: dict[int, Router] = {}
    conns = {}
    try:
        for size in sizes:
            routers[size] = await bench.start_router(paths[size])
            conns[size] = await routers[size].connect()
            await conns[size].request("GET", "/api/queue")  # warm
            t = time.perf_counter()
            status, _ = await conns[size].request("GET", "/metrics")
            first_scrape[size].add_run([(time.perf_counter() - t) * 1000])
            assert status == 200, status
        for _rep in range(bench.repeats):
            health_ms = {size: [] for size in sizes}
            queue_ms = {size: [] for size in sizes}
            metrics_ms = {size: [] for size in sizes}
            page_ms = {key: {size: [] for size in sizes} for key in ("history", "activity")}
            for _ in range(samples):
                for size, conn in conns.items():
                    t = time.perf_counter()
                    status, _ = await conn.request("GET", "/health")
                    health_ms[size].append((time.perf_counter() - t) * 1000)
                    assert status in (200, 503)
                    t = time.perf_counter()
                    status, body = await conn.request("GET", "/api/queue")
                    queue_ms[size].append((time.perf_counter() - t) * 1000)
                    assert status == 200 and body["queue_depth"] > waiting // 2, body["queue_depth"]
                    t = time.perf_counter()
                    status, _ = await conn.request("GET", "/metrics")
                    metrics_ms[size].append((time.perf_counter() - t) * 1000)
                    assert status == 200
                    for key, path in (("history", "/api/history"), ("activity", "/api/activity")):
                        t = time.perf_counter()
                        status, _ = await conn.request("GET", path)
                        page_ms[key][size].append((time.perf_counter() - t) * 1000)
                        assert status == 200, (path, status)
            for size in sizes:
                for key in page_ms:
                    per[key, size].add_run(page_ms[key][size])
                per["metrics", size].add_run(metrics_ms[size])
                per["health", size].add_run(health_ms[size])
                per["queue", size].add_run(queue_ms[size])
        for size in sizes:
            rss[size].add_run(rss_mb(routers[size].pid))
            rss[size].note = f"database file {paths[size].stat().st_size / 1e6:.0f} MB"
    finally:
        for conn in conns.values():
            await conn.close()
        for router in routers.values():
            await router.stop()
        for name in NODES:
            await bench.fakes.call("release", name)
    for size in sizes:
        bench.say(
            f"growth @ {size:,}: claim {statistics.median(per['claim', size].pooled):.2f} ms,"
            f" stale {statistics.median(per['stale', size].pooled):.3f} ms,"
            f" /health {statistics.median(per['health', size].pooled):.2f} ms,"
            f" /api/queue {statistics.median(per['queue', size].pooled):.1f} ms,"
            f" RSS {rss[size].pooled[0]:.1f} MB"
        )
        for suffix in ("", "-wal", "-shm"):
            Path(str(paths[size]) + suffix).unlink(missing_ok=True)
    for key in ("claim", "claim_sql", "stale", "health", "queue", "submit", "metrics", "history", "activity"):
        ratio = bench.metric(
            f"growth_{key}_ratio",
            f"{labels[key].split(' (')[0]}: 100,000 / 100 history",
            "ratio",
            "ratio",
            "<= 2.00x" if key in ("claim", "stale", "health", "metrics") else "",
            better="lower",
        )
        low, high = per[key, 100], per[key, 100_000]
        for a, b in zip(low.per_run, high.per_run):
            ratio.add_run(b / a)
