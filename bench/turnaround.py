"""Section `turnaround`: one node works through a queue; the gap from a job's last byte to the
next job's request, cut into segments at what the fake saw."""

from __future__ import annotations

import statistics
import time

from .core import Bench
from .procs import Router

UNLOAD_S = 0.2  # how long a real Ollama lists a model in /api/ps after keep_alive: 0 (its runner exits)


async def turnaround_section(bench: Bench, router: Router) -> None:
    """One node works through a queue; the gap from a job's last byte to the next job's request,
    with the simulator unloading at once, then as Ollama does (the model listed by /api/ps
    for UNLOAD_S after keep_alive: 0, while its runner exits)."""
    rows = (
        (
            "gap",
            "turnaround gap: final Ollama byte -> next request (1 node, simulator unloads instantly)",
            "p50 <= 5 ms",
            40 if bench.quick else 100,
            0.0,
        ),
        (
            "gap_real",
            f"turnaround gap, realistic unload (the model listed by /api/ps for"
            f" {UNLOAD_S * 1000:.0f} ms after keep_alive: 0)",
            "",
            6 if bench.quick else 15,
            UNLOAD_S,
        ),
    )
    node = "n1"
    await bench.wait_idle(router, node, 30)
    conn = await router.connect()
    try:
        for rep in range(bench.repeats):
            for key, label, target, jobs, unload in rows:
                metric = bench.metric(key, label, "ms", "ms", target)  # before its segments' rows
                await bench.fakes.call("script", node, unload_delay=unload)
                gaps = await queue_gaps(bench, router, conn, node, jobs, metric.key)
                metric.add_run(gaps)
                bench.say(
                    f"turnaround run {rep + 1}/{bench.repeats}, unload {unload * 1000:.0f} ms:"
                    f" gap p50 {statistics.median(gaps):.2f} ms ({len(gaps)} gaps)"
                )
    finally:
        await bench.fakes.call("script", node, unload_delay=0)
        await conn.close()


async def queue_gaps(bench: Bench, router: Router, conn, node: str, jobs: int, key: str) -> list[float]:
    """`jobs` jobs queued behind a held head, then released: each gap (ms), cut into segments."""
    await bench.fakes.call("reset", node)
    await bench.fakes.call("hold", node)
    await conn.request("POST", "/api/jobs", {"kind": "task", "prompt": "head", "node": node})
    for i in range(jobs):
        status, body = await conn.request("POST", "/api/jobs", {"kind": "task", "prompt": f"job {i}", "node": node})
        assert status == 201, body
    since = time.monotonic()
    await bench.fakes.call("release", node)
    await bench.wait_idle(router, node, 60)
    log = await bench.fakes.log(node)
    gens = sorted((e for e in log if e[3] and e[2] >= since), key=lambda e: e[1])
    gaps, parts = [], {}
    for prev, nxt in zip(gens, gens[1:]):
        gaps.append((nxt[1] - prev[2]) * 1000)
        bench.segments(
            key, [("final byte", prev[2]), *bench.fake_points(log, prev[2], nxt[1]), ("next request", nxt[1])], parts
        )
    if len(gaps) < jobs - 1:
        raise RuntimeError(f"only {len(gaps)} gaps recorded for {jobs} jobs")
    bench.add_segments(key, parts)
    return gaps
