"""`python -m bench.run [--quick] [--only SECTION,...]`: every measurement of issue 8 in one
run, one table on stdout, JSON in bench/results.json. Loopback only; every loop is bounded
in count and in time. GPUQ_BENCH_QUICK=1 is the same as --quick."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from . import (
    backup,
    bigbatch,
    bodies,
    first_token,
    front,
    growth_section,
    listings,
    neighbours,
    pgstore,
    physical,
    postgres,
    replay,
    retention,
    scale,
    stalled,
    storm,
    submit,
    turnaround,
    unload_policy,
    written,
    year,
)
from .core import NODES, Bench
from .machine import disk_write_cache, machine
from .procs import Fakes, rss_mb
from .stats import fmt, table

BENCH_DIR = Path(__file__).resolve().parent
SECTIONS = (
    "physical",
    "peers",
    "submit",
    "turnaround",
    "first_token",
    "written",
    "growth",
    "listings",
    "unload_policy",
    "front",
    "warm",
    "storm",
    "stalled",
    "bodies",
    "postgres",
    "pgstore",
    "replay",
    "scale",
    "retention",
    "backup",
    "bigbatch",
    "year",
    "neighbours",
)


async def run_sections(bench: Bench) -> None:
    """The chosen sections in order; those on the shared fake nodes last, around one router."""
    if bench.wants("physical") or bench.wants("peers"):
        await physical.physical_and_peers(bench)
    if bench.wants("unload_policy"):
        await unload_policy.unload_policy_section(bench)
    if bench.wants("front"):  # its own nodes and router
        await front.front_section(bench)
    if bench.wants("warm"):  # its own node and routers
        await front.warm_section(bench)
    if bench.wants("storm"):  # its own nodes and router: the autocomplete storm
        await storm.storm_section(bench)
    if bench.wants("stalled"):  # its own nodes and router
        await stalled.stalled_section(bench)
    if bench.wants("bodies"):  # its own node and router: batch files uploaded and downloaded
        await bodies.bodies_section(bench)
    if bench.wants("postgres"):  # its own throwaway PostgreSQL cluster
        await postgres.postgres_section(bench)
    if bench.wants("pgstore"):  # its own cluster, fakes and routers: gpuq on each engine
        await pgstore.pgstore_section(bench)
    if bench.wants("replay"):  # its own routers and simulated nodes, one per policy
        await replay.replay_section(bench)
    if bench.wants("scale"):  # its own routers, nodes and Chromium
        await scale.scale_section(bench)
    if bench.wants("neighbours"):  # its own nodes, gpuq and the peers (LiteLLM, ollama-herd)
        await neighbours.neighbours_section(bench)
    if bench.wants("retention"):  # its own store, in-process
        await retention.retention_section(bench)
    needs_router = any(
        bench.wants(s)
        for s in ("submit", "turnaround", "first_token", "written", "growth", "listings", "backup", "bigbatch", "year")
    )
    if not needs_router:
        return
    bench.fakes = await Fakes(NODES, bench.workdir / "fakes.log").start()
    try:
        if any(bench.wants(s) for s in ("submit", "turnaround", "first_token")):
            router = await bench.start_router(bench.workdir / "router.db")
            try:
                idle = bench.metric("rss_idle", "router RSS, idle (fresh database)", "MB", "mb")
                await asyncio.sleep(0.5)
                idle.add_run(rss_mb(router.pid))
                if bench.wants("submit"):
                    await submit.submit_section(bench, router)
                if bench.wants("turnaround"):
                    await turnaround.turnaround_section(bench, router)
                if bench.wants("first_token"):
                    await first_token.first_token_section(bench, router)
            finally:
                await router.stop()
        if bench.wants("written"):  # its own router and database
            await written.written_section(bench)
        if bench.wants("growth"):
            await growth_section.growth_section(bench)
        if bench.wants("listings"):
            await listings.listings_section(bench)
        if bench.wants("backup"):  # its own 1 GB database and router
            await backup.backup_section(bench)
        if bench.wants("bigbatch"):  # its own stores and routers
            await bigbatch.bigbatch_section(bench)
        if bench.wants("year"):  # its own stores, then two routers side by side
            await year.year_section(bench)
    finally:
        await bench.fakes.stop()


def judge(bench: Bench) -> None:
    m = bench.metrics

    def med(key):
        return m[key].summary()["median"] if key in m and m[key].pooled else None

    checks = {
        "submit_32": lambda v: v >= 2000,
        "batch_10000": lambda v: v >= 5000,
        "store_vs_huey": lambda v: v >= 1.0,
        "gap": lambda v: v <= 5.0,
        "ttft_overhead": lambda v: v <= 2.0,
        "front_ttft_overhead": lambda v: v <= 2.0,
        "front_rate_1_ratio": lambda v: v >= 0.95,
        "front_rate_20_ratio": lambda v: v >= 0.95,
        "front_cpu_20": lambda v: v <= 50.0,
        "front_stalled_rss": lambda v: v <= 30.0,
        "growth_claim_ratio": lambda v: v <= 2.0,
        "growth_stale_ratio": lambda v: v <= 2.0,
        "growth_health_ratio": lambda v: v <= 2.0,
        "growth_metrics_ratio": lambda v: v <= 2.0,
        "rss_100000": lambda v: v <= 100.0,
        "listing_kb_0": lambda v: v <= 300.0,
        "listing_kb_1": lambda v: v <= 300.0,
        "listing_rss": lambda v: v <= 200.0,
        "listing_hwm": lambda v: v <= 200.0,
        "scale_page_10000": lambda v: v < 1000.0,
        "scale_claim_ratio": lambda v: v <= 2.0,
        "retention_submit_ratio": lambda v: v <= 1.5,
        "retention_claim_ratio": lambda v: v <= 1.5,
        "retention_batch_max": lambda v: v <= 50.0,
        "backup_s": lambda v: v <= 60.0,
        "backup_health_max": lambda v: v < 1000.0,
        "backup_submit_max": lambda v: v < 1000.0,
        "bigbatch_hold": lambda v: v <= 100.0,
        "bigbatch_health_p99": lambda v: v < 500.0,
        "bigbatch_health_red": lambda v: v == 0,
        "year_db_ratio": lambda v: v <= 0.10,
        "year_sweep_hold": lambda v: v <= 50.0,
        **{f"year_{k}_ratio": (lambda v: v <= 1.5) for k in ("claim", "submit", "health", "queue")},
        **{
            k: (lambda v: v <= 1.0)
            for k in (
                "scale_q_ratio",
                "scale_qp_ratio",
                "scale_page_ratio",
                "scale_events_cpu_ratio",
                "scale_front_rss_ratio",
                "scale_front_fds_ratio",
            )
        },
        "pgs_failover": lambda v: v <= (pgstore.LEASE_S + pgstore.LEASE_S / 3) * 1000,
    }
    if "listing_health_busy" in m and m["listing_health_busy"].pooled:  # its target is on p95
        m["listing_health_busy"].met = m["listing_health_busy"].summary()["p95"] <= 50.0
    for key, ok in checks.items():
        if med(key) is not None:
            m[key].met = bool(ok(med(key)))
    storm.judge(m)
    bodies.judge(m)


def targets(bench: Bench) -> str:
    """Every target judged in this run, and for the ones about cost, where the time goes:
    the disk's share (durable commits counted, at this run's raw commit time) and the rest."""
    m = bench.metrics

    def med(key: str) -> float:
        return m[key].summary()["median"]

    def share(key: str) -> str:
        return (
            f"{med(key + '_commits'):g} commits x one durable commit = {med(key + '_disk'):.2f} ms;"
            f" the rest {med(key + '_rest'):.2f} ms"
        )

    why = {
        "store_vs_huey": lambda: (
            f"per round trip gpuq {med('store_rt_ms'):.2f} ms = disk {med('store_rt_disk_ms'):.2f} + rest"
            f" {med('store_rt_rest_ms'):.2f}; Huey {med('huey_rt_ms'):.2f} = {med('huey_rt_disk_ms'):.2f} +"
            f" {med('huey_rt_rest_ms'):.2f}; a thread hop {med('thread_hop') * 1000:.0f} us"
        ),
        "ttft_overhead": lambda: share("ttft"),
        "front_ttft_overhead": lambda: share("front_ttft"),
        "front_cpu_20": lambda: 'a token step by step: bench/README, "The relay, step by step"',
        "scale_page_10000": lambda: 'step by step: bench/README, "The queue page\'s first render"',
    }
    for key in m:  # the replayed day's rows, one per policy
        if key.startswith("replay_") and key.endswith("_wait_q"):
            why[key] = lambda: 'the slowest calls step by step: bench/README, "Interactive calls and the gaps"'
        elif key.startswith("replay_") and key.endswith("_busy"):
            k = key[: -len("_busy")]
            why[key] = lambda k=k: (
                f"idle with work in the node's own queue (between jobs) {med(k + '_idle_own'):.0%},"
                f" with work only on other nodes {med(k + '_idle_elsewhere'):.0%}"
            )
    rows = ["| target | measured: median (range) | met | where the time goes |", "| --- | --- | --- | --- |"]
    for key, metric in m.items():
        if not metric.target or metric.met is None:
            continue
        s = metric.summary()
        measured = f"{fmt(s['median'], metric.kind)} ({fmt(s['min'], metric.kind)}-{fmt(s['max'], metric.kind)})"
        if metric.target.startswith("p95"):  # judged on its p95
            measured = f"p95 {fmt(s['p95'], metric.kind)}, median {measured}"
        try:
            detail = why[key]() if key in why else ""
        except KeyError:  # a row it needs was not measured in this run
            detail = ""
        unit = "" if metric.kind == "ratio" else f" {metric.unit}"
        rows.append(
            f"| {metric.label.strip()} {metric.target} | {measured}{unit} |"
            f" {'yes' if metric.met else 'NO'} | {detail} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 repeats instead of 7, fewer samples (about a minute)")
    parser.add_argument("--only", default="", help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--seed", type=int, default=1, help="the replayed day's seed (section replay)")
    parser.add_argument("--out", default=str(BENCH_DIR / "results.json"), help="where to write the JSON")
    parser.add_argument(
        "--dir", default=str(BENCH_DIR), help="where the bench's databases live (must be the disk gpuq's database uses)"
    )
    args = parser.parse_args()
    quick = args.quick or os.environ.get("GPUQ_BENCH_QUICK") == "1"
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    workdir = Path(tempfile.mkdtemp(prefix=".work-", dir=args.dir))
    bench = Bench(quick, only, workdir, args.seed)
    started = time.time()
    try:
        asyncio.run(run_sections(bench))
    except BaseException:
        print(f"bench failed; its databases and logs are kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    judge(bench)
    metrics = list(bench.metrics.values())
    print(table(metrics))
    print("\nTargets, each against the same run's peers and disk:\n")
    print(targets(bench))
    fs = ""
    mounts = machine()["mounts"]
    best = max((m for m in mounts if str(Path(args.dir).resolve()).startswith(m)), key=len, default=None)
    if best:
        fs = mounts[best]
    cache = disk_write_cache(Path(args.dir))
    print(
        f"\n{len(metrics)} measures, {bench.repeats} repeats each, {time.time() - started:.0f}s;"
        f" databases on {fs or 'unknown filesystem'}, disk {cache['device']} write cache"
        f" {cache['write_cache']!r} (fua {cache['fua']}). The p95 column is the pessimistic end:"
        " the 5th percentile where higher is better (rates, most ratios), the 95th where lower is"
        " (latencies, sizes, ratios of growth); latencies: median/p95 over all samples, min-max of"
        " per-run medians."
    )
    out = {
        "meta": {
            **machine(),
            "quick": quick,
            "repeats": bench.repeats,
            "only": sorted(only),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
            "seconds": round(time.time() - started, 1),
            "database_fs": fs,
            "disk": cache,
        },
        "metrics": [m.as_json() for m in metrics],
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
