"""Section `first_token`: submit -> `/stream` -> first text line on an idle node, minus the
same chat request straight to the fake, in pairs; segments and the disk's share."""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp

from .core import NODES, Bench
from .procs import QUIET_S, Router, first_stream_line


async def first_token_section(bench: Bench, router: Router) -> None:
    through = bench.metric("ttft_gpuq", "first token through gpuq (submit -> /stream), idle node", "ms", "ms")
    direct = bench.metric("ttft_direct", "first token straight from the fake Ollama", "ms", "ms")
    overhead = bench.metric("ttft_overhead", "first-token overhead (gpuq - direct, paired)", "ms", "ms", "p50 <= 2 ms")
    bench.disk_share_rows("ttft")
    submit_metric = bench.metric("ttft_submit", "  the submit's own round trip (POST -> 201, committed)", "ms", "ms")
    pairs = 10 if bench.quick else 20
    node, model = "n2", NODES["n2"]
    await bench.wait_idle(router, node, 30)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def straight() -> float:
            body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "stream": True, "keep_alive": 0}
            t0 = time.monotonic()
            async with session.post(bench.fakes.urls[node] + "/api/chat", json=body) as resp:
                await first_stream_line(resp, "message")
                t = time.monotonic() - t0
                await resp.read()
            return t * 1000

        async def via_gpuq() -> tuple[float, list[tuple[str, float]]]:
            t0 = time.monotonic()
            async with session.post(
                router.url + "/api/jobs", json={"kind": "task", "prompt": "hello", "node": node}
            ) as resp:
                assert resp.status == 201, await resp.text()
                job_id = (await resp.json())["jobs"][0]["id"]
            answered = time.monotonic()
            async with session.get(router.url + f"/api/jobs/{job_id}/stream") as resp:
                await first_stream_line(resp, "text")
                t1 = time.monotonic()
                async for _ in resp.content:  # to the end: the node is idle again after it
                    pass
            return (t1 - t0) * 1000, [("submit sent", t0), ("submit answered (201)", answered), ("", t1)]

        await straight()  # warm both paths' connections
        await via_gpuq()
        for rep in range(bench.repeats):
            g_run, d_run, o_run, parts, submit_rtt = [], [], [], {}, []
            await bench.fakes.call("reset", node)
            for _ in range(pairs):
                await bench.wait_idle(router, node, 30)
                # An idle node, as when a person submits to a quiet lab.
                await asyncio.sleep(QUIET_S)
                d = await straight()
                g, points = await via_gpuq()
                d_run.append(d)
                g_run.append(g)
                o_run.append(g - d)
                log = await bench.fakes.log(node)
                t0, acked, t1 = (p[1] for p in points)
                submit_rtt.append((acked - t0) * 1000)
                chat = [e for e in log if e[3] and t0 <= e[1] <= t1]
                if chat:
                    # The worker's path (the client's stream request runs beside it).
                    timeline = [
                        ("submit sent", t0),
                        *bench.fake_points(log, t0, chat[0][1]),
                        ("chat request arrives", chat[0][1]),
                        ("first token at client", t1),
                    ]
                    bench.segments("ttft", timeline, parts)
            through.add_run(g_run)
            direct.add_run(d_run)
            overhead.add_run(o_run)
            submit_metric.add_run(submit_rtt)
            bench.add_segments("ttft", parts)
            await bench.wait_idle(router, node, 30)
            await asyncio.sleep(QUIET_S)  # idle, as in the pairs
            await bench.disk_share("ttft", bench.fakes, node, router.database, via_gpuq, o_run)
            bench.say(
                f"first-token run {rep + 1}/{bench.repeats}: gpuq {statistics.median(g_run):.2f} ms,"
                f" direct {statistics.median(d_run):.2f} ms"
            )
