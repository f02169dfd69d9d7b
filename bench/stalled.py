"""The front door's memory per stalled client (issue 35): three clients each send a streamed
/api/chat for a long answer (60,000 tokens, about 9 MB of the node's lines, each on a node of its
own) and never read; the router's resident memory (VmRSS) before, at its peak while the three
jobs run, and after they end. Unbounded, the router held every chunk for them (about 90x the
answer's text per client); bounded, it holds at most relay.CLIENT_BACKLOG_BYTES per call."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import TYPE_CHECKING

import aiohttp

from .front import _wait_front
from .procs import Fakes, Router, free_port, node_table, rss_mb

if TYPE_CHECKING:
    from .core import Bench

MODEL = "qwen3-coder:30b"
CLIENTS = 3
TOKENS = 60_000


def stalled_client(port: int, prompt: str) -> socket.socket:
    """Sends its request, then never reads (a small receive buffer: the kernel takes little for it)."""
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True})
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"POST /api/chat HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    return sock


async def _jobs(session: aiohttp.ClientSession, router: Router, prompts: set[str]) -> list[dict]:
    async with session.get(router.url + "/api/jobs?limit=100") as resp:
        return [j for j in (await resp.json())["jobs"] if j["prompt_excerpt"] in prompts]


async def one_round(session: aiohttp.ClientSession, router: Router, port: int, round_no: int) -> tuple[float, float]:
    """The router's RSS growth (MB) at its peak while the stalled clients' jobs run, and after."""
    before = rss_mb(router.pid)
    prompts = {f"never read {round_no}.{i}" for i in range(CLIENTS)}
    socks = [stalled_client(port, p) for p in sorted(prompts)]
    peak, deadline = before, time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            peak = max(peak, rss_mb(router.pid))
            jobs = await _jobs(session, router, prompts)
            if len(jobs) == CLIENTS and all(j["state"] not in ("queued", "running") for j in jobs):
                break
            await asyncio.sleep(0.05)
        else:
            raise RuntimeError("the stalled clients' jobs did not end within 300s")
        if any(j["state"] != "done" for j in jobs):
            raise RuntimeError(f"a stalled client's job did not finish: {[j['state'] for j in jobs]}")
        after = rss_mb(router.pid)
    finally:
        for sock in socks:
            sock.close()
    return peak - before, after - before


async def stalled_section(bench: Bench) -> None:
    peak = bench.metric(
        "front_stalled_rss",
        f"front door: router RSS growth, {CLIENTS} clients that never read a {TOKENS}-token stream (peak)",
        "MB",
        "mb",
        "<= 30 MB",
    )
    after = bench.metric("front_stalled_rss_after", "  the same, once their jobs ended", "MB", "mb")
    nodes = {f"s{i}": MODEL for i in range(1, CLIENTS + 1)}
    fakes = await Fakes(nodes, bench.workdir / "stalled-fakes.log").start()
    port = free_port()
    table = [node_table(name, fakes.urls[name], rank, MODEL, roles=("task",)) for rank, name in enumerate(nodes, 1)]
    router = await Router(bench.workdir, table, bench.workdir / "stalled.db", ollama_listen=f"127.0.0.1:{port}").start()
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await _wait_front(session, f"http://127.0.0.1:{port}", len(nodes))
            warm = {"model": MODEL, "messages": [{"role": "user", "content": "warm up"}], "stream": True}
            async with session.post(f"http://127.0.0.1:{port}/api/chat", json=warm) as resp:
                await resp.read()  # what the router loads once (its modules, caches) is in `before`
            for name in nodes:
                await fakes.call("script", name, tokens=TOKENS, delay=0)
            rounds = 1 if bench.quick else 3
            for round_no in range(rounds):
                grew, kept = await one_round(session, router, port, round_no)
                peak.add_run(grew)
                after.add_run(kept)
                bench.say(f"stalled clients: RSS +{grew:.1f} MB at the peak, +{kept:.1f} MB after")
    finally:
        await router.stop()
        await fakes.stop()
