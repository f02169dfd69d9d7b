"""Section `retention`: the retention sweep beside the queue's own writes (issue 35). A database
with a long history (bench/growth.py's seed: finished jobs over 30 days, each with its run, its
output and its three events), its store's clock 60 days on, so the sweep archives and prunes the
done and cancelled ones in batches of 100 ([retention] batch). Measured: a submit and a claim with
its finish, alone and while the sweep runs (the sweep's batches share the one writer with them);
the longest a batch's write took (queueing included); the sweep's whole time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from gpuq.config import Settings
from gpuq.store import NewJob, NodeInfo, Store
from gpuq.upkeep.retention import Sweeper

from . import growth
from .core import NODES, SETTINGS, Bench

DAY = 86400.0


async def _one_round(store: Store, infos: list[NodeInfo]) -> tuple[float, float]:
    """A submit, then the claim of the job and its finish: each one's time in ms."""
    t0 = time.perf_counter()
    [job] = await store.submit(NewJob("task", "x" * 64, node="n1"), infos, "bench")
    t1 = time.perf_counter()
    claimed = await store.claim("n1")
    assert claimed is not None and claimed["id"] == job["id"]
    await store.finish(job["id"], claimed["run_id"], "done", None, output="ok")
    t2 = time.perf_counter()
    return (t1 - t0) * 1000, (t2 - t1) * 1000


async def retention_section(bench: Bench) -> None:
    history = 5_000 if bench.quick else 20_000
    samples = 40 if bench.quick else 100
    labels = {"submit": "submit (Store.submit, 1 job)", "claim": "claim and finish (Store.claim + Store.finish)"}
    alone = {k: bench.metric(f"retention_{k}_alone", f"{v}, no sweep", "ms", "ms") for k, v in labels.items()}
    during = {k: bench.metric(f"retention_{k}_during", f"{v}, during a sweep", "ms", "ms") for k, v in labels.items()}
    ratio = {
        k: bench.metric(
            f"retention_{k}_ratio", f"{v}: p95 during a sweep / alone", "x", "ratio", "<= 1.5", better="lower"
        )
        for k, v in labels.items()
    }
    longest = bench.metric(
        "retention_batch_max",
        f"the sweep's longest hold of the writer (a batch of 100 jobs) @ {history:,} history",
        "ms",
        "ms",
        "<= 50",
    )
    round_trip = bench.metric(
        "retention_batch_rt", "the sweep's longest batch, its queueing and durable commit included", "ms", "ms"
    )
    whole = bench.metric("retention_sweep_s", f"the whole sweep (archived, pruned) @ {history:,} history", "s", "count")
    infos = [NodeInfo(n, rank, ("task", "critique"), m, True) for rank, (n, m) in enumerate(NODES.items(), 1)]
    for repeat in range(bench.repeats):
        path = bench.workdir / f"retention-{repeat}.db"
        now = time.time()
        await growth.seed(path, history, 0, list(NODES.items()), now, SETTINGS)
        store = Store(path, clock=lambda: time.time() + 60 * DAY)
        await store.open()
        try:
            settings = Settings(retention_archive=bench.workdir / f"archive-{repeat}")
            sweeper = Sweeper(store, lambda settings=settings: settings, lambda: None)
            times: dict[str, list[float]] = {"submit": [], "claim": []}
            for _ in range(samples):
                s, c = await _one_round(store, infos)
                times["submit"].append(s)
                times["claim"].append(c)
            busy: dict[str, list[float]] = {"submit": [], "claim": []}
            sweep = asyncio.ensure_future(sweeper.run_once())
            while not sweep.done():
                s, c = await _one_round(store, infos)
                busy["submit"].append(s)
                busy["claim"].append(c)
            swept = sweep.result()
            bench.say(f"retention sweep {repeat + 1}: {swept.json()} ({len(busy['submit'])} rounds during it)")
            for key in labels:
                alone[key].add_run(times[key])
                during[key].add_run(busy[key] or times[key])
                p95 = sorted(busy[key] or times[key])[int(0.95 * (len(busy[key] or times[key]) - 1))]
                base = sorted(times[key])[int(0.95 * (len(times[key]) - 1))]
                ratio[key].add_run(p95 / base)
            longest.add_run(swept.longest_hold_ms)
            round_trip.add_run(swept.longest_batch_ms)
            whole.add_run(swept.seconds)
        finally:
            await store.close()
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
