"""Section `unload_policy`: jobs per minute on one node with a realistic cold load, unloading
after each job (the default) vs "when-idle"."""

from __future__ import annotations

import asyncio
import time

from .core import Bench
from .procs import Router, node_table


async def unload_policy_section(bench: Bench) -> None:
    """Jobs per minute on one node, back to back for one model, with a realistic cold load
    (2 s) and unload (0.2 s): unload after each job (the default) vs "when-idle"."""
    from gpuq.demo import FakeOllama, Script

    jobs = 6 if bench.quick else 12
    rates = {
        policy: bench.metric(
            f"unload_{policy}",
            f"jobs/min, one node, {jobs} back-to-back jobs, 2 s cold load, unload = {policy}",
            "jobs/min",
            "rate",
        )
        for policy in ("after-each", "when-idle")
    }
    fake = FakeOllama(
        models={"qwen3-coder:30b"},
        script=Script(tokens=40, token_delay_s=0.01, load_delay_s=2.0, unload="delay", unload_delay_s=0.2),
    )
    await fake.start()
    try:
        for rep in range(max(bench.repeats // 2, 1)):
            for policy, metric in rates.items():
                node = dict(node_table("n1", fake.url, 1, "qwen3-coder:30b"), unload=policy)
                router = await Router(bench.workdir, [node], bench.workdir / f"unload-{policy}-{rep}.db").start()
                conn = await router.connect()
                try:
                    t = time.perf_counter()
                    ids = []
                    for i in range(jobs):
                        status, body = await conn.request("POST", "/api/jobs", {"kind": "task", "prompt": f"job {i}"})
                        assert status == 201, body
                        ids.append(body["jobs"][0]["id"])
                    while True:
                        status, body = await conn.request("GET", f"/api/jobs/{ids[-1]}")
                        if body["state"] not in ("queued", "running"):
                            break
                        await asyncio.sleep(0.05)
                    assert body["state"] == "done", body
                    metric.add_run(jobs / ((time.perf_counter() - t) / 60))
                finally:
                    await conn.close()
                    await router.stop()
            bench.say(
                f"unload policy run {rep + 1}: "
                + ", ".join(f"{p} {m.runs[-1][0]:.1f} jobs/min" for p, m in rates.items())
            )
    finally:
        await fake.stop()
