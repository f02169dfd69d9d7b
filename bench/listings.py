"""Listings over large prompts (issue 11, item 8): 300 jobs with 1 MB prompts wait on the
router, and clients fetch `/api/queue` and `/api/jobs?limit=300` while `/health` is sampled.
Before listings carried excerpts, each listing answered every prompt in full (300 MB)."""

from __future__ import annotations

import asyncio
import time

from .http import Conn
from .procs import Router

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


async def health_under_listings(router: Router, clients: int, window_s: float,
                                max_fetches: int) -> tuple[list[float], list[float]]:
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
        await asyncio.wait_for(asyncio.gather(probe(), *(lister(c, k) for k, c in enumerate(listers))),
                               window_s + 120)
    finally:
        for conn in (*listers, prober):
            await conn.close()
    return health_ms, listing_ms
