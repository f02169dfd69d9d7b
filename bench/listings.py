"""Listings over large prompts (issue 11, item 8): 300 jobs with 1 MB prompts wait on the
router, and clients fetch `/api/queue` and `/api/jobs?limit=300` while `/health` is sampled.
Before listings carried excerpts, each listing answered every prompt in full (300 MB).
`listings_section` is the section `listings` of `python -m bench.run`."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path

from .core import NODES, Bench
from .http import Conn
from .procs import Router, free_port, node_table, rss_mb

PROMPT_BYTES = 1_000_000  # router.max_prompt_bytes' default: the largest prompt a router takes
JOBS = 300
LISTINGS = ("/api/queue", f"/api/jobs?limit={JOBS}")


def big_prompt(i: int) -> str:
    """Exactly PROMPT_BYTES of UTF-8, with two-byte characters, so characters != bytes."""
    head = f"job {i:03d}: résumé the export job's retry budget, line by line.\n"
    unit = "naïve retries double the load; "
    text = head + unit * (PROMPT_BYTES // len(unit.encode()) + 1)
    cut = text.encode()[:PROMPT_BYTES].decode(errors="ignore")
    return cut + "x" * (PROMPT_BYTES - len(cut.encode()))


async def fill(router: Router, nodes: list[str], jobs: int = JOBS) -> None:
    """`jobs` tasks with 1 MB prompts, spread over the nodes, each answered 201."""
    conn = await router.connect()
    try:
        for i in range(jobs):
            body = {"kind": "task", "prompt": big_prompt(i), "node": nodes[i % len(nodes)]}
            status, raw = await conn.send(conn.encode("POST", "/api/jobs", body))
            if status != 201:
                raise RuntimeError(f"submit {i}: {status} {raw[:300]!r}")
    finally:
        await conn.close()


async def timed(conn: Conn, path: str) -> tuple[int, float]:
    """(body bytes, ms) of one GET; the body is not parsed (it was 300 MB before the fix)."""
    t = time.perf_counter()
    status, raw = await conn.send(conn.encode("GET", path))
    if status not in (200, 503):
        raise RuntimeError(f"GET {path}: {status} {raw[:300]!r}")
    return len(raw), (time.perf_counter() - t) * 1000


async def health_under_listings(
    router: Router, clients: int, window_s: float, max_fetches: int
) -> tuple[list[float], list[float]]:
    """`clients` connections fetch the listings back to back for `window_s` (at most
    `max_fetches` in all) while one connection samples /health every 10 ms.
    Returns (health ms samples, listing ms samples)."""
    listers = [await router.connect() for _ in range(clients)]
    prober = await router.connect()
    health_ms: list[float] = []
    listing_ms: list[float] = []
    started = 0
    deadline = time.monotonic() + window_s

    async def lister(conn: Conn, k: int) -> None:
        nonlocal started
        while time.monotonic() < deadline and started < max_fetches:
            started += 1
            listing_ms.append((await timed(conn, LISTINGS[(started + k) % len(LISTINGS)]))[1])

    async def probe() -> None:
        while time.monotonic() < deadline:
            health_ms.append((await timed(prober, "/health"))[1])
            await asyncio.sleep(0.01)  # a sampling interval, not a wait on anything

    try:
        # A listing in flight at the deadline finishes (bounded: 120 s) before the next phase.
        await asyncio.wait_for(asyncio.gather(probe(), *(lister(c, k) for k, c in enumerate(listers))), window_s + 120)
    finally:
        for conn in (*listers, prober):
            await conn.close()
    return health_ms, listing_ms


async def listings_section(bench: Bench) -> None:
    jobs, mb = JOBS, PROMPT_BYTES / 1e6
    size = {
        path: bench.metric(
            f"listing_kb_{i}", f"GET {path} response ({jobs} x {mb:g} MB prompts waiting)", "KB", "mb", "<= 300 KB"
        )
        for i, path in enumerate(LISTINGS)
    }
    alone = {path: bench.metric(f"listing_ms_{i}", f"GET {path}, alone", "ms", "ms") for i, path in enumerate(LISTINGS)}
    health_idle = bench.metric("listing_health_idle", "GET /health, no listing in flight", "ms", "ms")
    health_busy = bench.metric(
        "listing_health_busy", "GET /health while 2 clients fetch listings back to back", "ms", "ms", "p95 <= 50 ms"
    )
    busy = bench.metric("listing_busy_ms", "  a listing fetched by those 2 clients", "ms", "ms")
    rss = bench.metric("listing_rss", "router RSS after the listings (VmRSS)", "MB", "mb", "<= 200 MB")
    hwm = bench.metric("listing_hwm", "router peak RSS over the whole section (VmHWM)", "MB", "mb", "<= 200 MB")
    window = 3.0 if bench.quick else 6.0
    # Both nodes are down (nothing listens on their ports): every job stays queued.
    nodes = [node_table(n, f"http://127.0.0.1:{free_port()}", rank, m) for rank, (n, m) in enumerate(NODES.items(), 1)]
    router = await Router(bench.workdir, nodes, bench.workdir / "db").start()
    try:
        t0 = time.perf_counter()
        await fill(router, list(NODES))
        bench.say(f"listings: {jobs} jobs of {mb:g} MB queued in {time.perf_counter() - t0:.1f}s")
        conn = await router.connect()
        try:
            for rep in range(bench.repeats):
                for path in LISTINGS:
                    samples = []
                    for _ in range(3 if bench.quick else 5):
                        n, ms = await timed(conn, path)
                        samples.append(ms)
                    size[path].add_run(n / 1000)
                    alone[path].add_run(samples)
                health_idle.add_run([(await timed(conn, "/health"))[1] for _ in range(20)])
                h, fetched = await health_under_listings(router, 2, window, 400)
                health_busy.add_run(h)
                busy.add_run(fetched)
                rss.add_run(rss_mb(router.pid))
                bench.say(
                    f"listings run {rep + 1}/{bench.repeats}: "
                    + ", ".join(f"{p} {size[p].runs[-1][0]:,.1f} KB" for p in LISTINGS)
                    + f"; /health under load p50 {statistics.median(h):.2f} ms, max {max(h):.1f} ms"
                    f" ({len(fetched)} listings); RSS {rss.runs[-1][0]:.1f} MB"
                )
        finally:
            await conn.close()
        hwm.add_run(rss_mb(router.pid, "VmHWM"))
        hwm.note = f"database file {(bench.workdir / 'db').stat().st_size / 1e6:.0f} MB"
    finally:
        await router.stop()
        for suffix in ("", "-wal", "-shm"):
            Path(str(bench.workdir / "db") + suffix).unlink(missing_ok=True)
