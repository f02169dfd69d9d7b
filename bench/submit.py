"""Section `submit`: durable `POST /api/jobs` against the real router, 1 and 32 clients with
each node holding a running job, then 32 clients while the workers run jobs to completion."""

from __future__ import annotations

import json
import time

from . import peers
from .core import NODES, Bench
from .procs import Router, clear_queues


async def submit_section(bench: Bench, router: Router) -> None:
    one = bench.metric(
        "submit_1", "durable submit POST /api/jobs, 1 client, nodes busy with a held job", "jobs/s", "rate"
    )
    many = bench.metric(
        "submit_32",
        "durable submit POST /api/jobs, 32 clients, nodes busy with a held job",
        "jobs/s",
        "rate",
        ">= 2,000",
    )
    scale = bench.metric(
        "submit_32_vs_1", "submit: 32 clients / 1 client (same run)", "ratio", "ratio", better="higher"
    )
    vs_raw = bench.metric(
        "submit_32_vs_raw", "submit, 32 clients / raw commits/s (same run)", "ratio", "ratio", better="higher"
    )
    working = bench.metric(
        "submit_32_working",
        f"durable submit, 32 clients, while {len(NODES)} nodes' workers run jobs to completion",
        "jobs/s",
        "rate",
    )
    finished = bench.metric(
        "submit_32_working_done",
        "  jobs the workers ran meanwhile (their last byte sent; 4-token replies, instant unload)",
        "jobs/s",
        "rate",
    )
    working_vs = bench.metric(
        "submit_32_working_vs_held",
        "submit, 32 clients: workers running / nodes held (same run)",
        "ratio",
        "ratio",
        better="higher",
    )
    batch = bench.metric(
        "batch_10000",
        f"batch submit POST /api/batches, {BATCH_LINES:,} lines in one request, nodes busy with a held job",
        "lines/s",
        "rate",
        ">= 5,000",
    )
    batch_vs = bench.metric(
        "batch_vs_submit_32",
        "batch submit lines/s / durable submit, 32 clients, jobs/s (same run)",
        "ratio",
        "ratio",
        better="higher",
    )
    n1, n32 = (150, 1600) if bench.quick else (300, 3200)
    for rep in range(bench.repeats):
        # A real lab's jobs run for minutes: each node holds one running job during the burst.
        for name in NODES:
            await bench.fakes.call("hold", name)
        try:
            r1 = await bench.submit_burst(router, 1, n1, 10.0)
            await clear(bench, router)
            r32 = await bench.submit_burst(router, 32, n32, 15.0)
            await clear(bench, router)
            rb = await batch_submit(router, BATCH_LINES)
            await clear(bench, router)
        finally:
            for name in NODES:
                await bench.fakes.call("release", name)
        raw = peers.raw_commits(bench.workdir / "raw-submit.db", 600, 3.0)
        rw, done = await submit_while_working(bench, router, n32)
        one.add_run(r1)
        many.add_run(r32)
        scale.add_run(r32 / r1)
        vs_raw.add_run(r32 / raw)
        working.add_run(rw)
        finished.add_run(done)
        working_vs.add_run(rw / r32)
        batch.add_run(rb)
        batch_vs.add_run(rb / r32)
        bench.say(
            f"submit run {rep + 1}/{bench.repeats}: 1 client {r1:,.0f}/s, 32 clients {r32:,.0f}/s,"
            f" raw commits {raw:,.0f}/s; 32 clients while the workers run jobs {rw:,.0f}/s"
            f" ({done:,.0f} jobs/s finished meanwhile); a {BATCH_LINES:,}-line batch {rb:,.0f} lines/s"
        )


BATCH_LINES = 10_000


async def batch_submit(router: Router, lines: int) -> float:
    """One `gpuq batch submit` of `lines` chat requests (POST /api/batches, answered once every
    line is queued, durably, in one commit); lines/s to the answer."""
    model = NODES["n1"]
    text = "".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": model, "messages": [{"role": "user", "content": "q"}]},
            },
            separators=(",", ":"),
        )
        + "\n"
        for i in range(lines)
    )
    conn = await router.connect()
    try:
        start = time.perf_counter()
        status, body = await conn.request("POST", "/api/batches", {"input": text, "name": "bench"})
        elapsed = time.perf_counter() - start
    finally:
        await conn.close()
    if status != 201 or body["batch"]["total"] != lines:
        raise RuntimeError(f"batch submit refused during the bench: {status} {str(body)[:200]}")
    return lines / elapsed


async def clear(bench: Bench, router: Router) -> None:
    await clear_queues(router, NODES)


async def submit_while_working(bench: Bench, router: Router, total: int) -> tuple[float, float]:
    """32 clients submit while every node's worker claims, runs and finishes jobs (the fakes
    answer at once): the submits' commits share the writer with the workers' claims, outputs
    and finishes. Returns (submits/s, jobs finished per second during the burst)."""
    for name in NODES:
        await bench.wait_idle(router, name, 30)
        await bench.fakes.call("reset", name)
    t0 = time.monotonic()
    rate = await bench.submit_burst(router, 32, total, 15.0)
    t1 = time.monotonic()
    await clear(bench, router)
    ends = [e[2] for name in NODES for e in await bench.fakes.log(name, since=t0) if e[3]]
    for name in NODES:
        await bench.wait_idle(router, name, 30)
    finished = sum(t0 <= end <= t1 for end in ends)
    if not finished:
        raise RuntimeError("no job finished while the clients submitted: the workers did not run")
    return rate, finished / (t1 - t0)
