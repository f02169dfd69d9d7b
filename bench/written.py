"""Bytes written for a long job: one job of 20,000 tokens (and one of 5,000, to show how the
cost grows with length) through the real router and a fake node streaming at a fixed pace.

What is counted: the router process's `write_bytes` in /proc/<pid>/io over the job (every
page it dirtied in a file on a block device: the WAL's frames, the database pages its own
automatic checkpoints copied, and its log; the log's growth is taken off), plus the bytes the
final checkpoint writes to copy the job's pages still in the WAL into the database file (the
bench runs that checkpoint itself, `PRAGMA wal_checkpoint(TRUNCATE)`, and counts its own
`write_bytes`; it empties the WAL first the same way, so nothing written before the job is
counted). The WAL is written at synchronous=FULL, so a page rewritten by each commit is
counted by each commit, as the disk writes it.

Progress is written at most every HEARTBEAT_S while tokens stream: a job that rewrites its
whole output at each heartbeat writes O(tokens x heartbeats) bytes, one that appends only what
is new O(tokens). The job's duration sets how many heartbeats it gets, so it is reported too."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .procs import Router

if TYPE_CHECKING:
    from .core import Bench

NODE = "n2"  # llama3.2: not a thinking model, so the output is the answer alone
LENGTHS = (5_000, 20_000)
TINY = 4  # tokens: a job whose text is next to nothing
PACE_S = 0.001  # between tokens (asyncio sleeps at least this): a 20,000-token job streams for 20 s or more


def write_bytes(pid: int | str = "self") -> int:
    """Bytes a process caused to be sent to storage so far (dirtied page-cache pages)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    raise RuntimeError(f"no write_bytes in /proc/{pid}/io")


def checkpoint(database: Path) -> int:
    """Copy every page in the WAL into the database file and empty the WAL, from a connection
    of our own; returns the bytes this process wrote doing it."""
    before = write_bytes()
    db = sqlite3.connect(database, timeout=10)
    try:
        busy, _, _ = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        db.close()
    if busy:
        raise RuntimeError(f"could not checkpoint {database}: busy")
    return write_bytes() - before


async def run_job(bench: Bench, router: Router, tokens: int) -> dict:
    """One job of `tokens` tokens on an otherwise idle router; what it cost in bytes written."""
    await bench.fakes.call("script", NODE, tokens=tokens, delay=PACE_S)
    conn = await router.connect()
    try:
        await bench.wait_idle(router, NODE, 30)
        checkpoint(router.database)
        log_size, router_bytes = router.log.stat().st_size, write_bytes(router.pid)
        started = time.monotonic()
        status, body = await conn.request(
            "POST", "/api/jobs", {"kind": "task", "prompt": "write at length", "node": NODE}
        )
        assert status == 201, body
        job_id = body["jobs"][0]["id"]
        deadline = started + 60 + tokens * PACE_S * 10
        while True:
            status, job = await conn.request("GET", f"/api/jobs/{job_id}")
            assert status == 200, job
            if job["state"] not in ("queued", "running"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the {tokens}-token job did not finish in {deadline - started:.0f}s")
            await asyncio.sleep(0.1)  # a poll interval, not a wait on anything
        elapsed = time.monotonic() - started
        await bench.wait_idle(router, NODE, 30)  # its unload checked, nothing more to write
        by_router = write_bytes(router.pid) - router_bytes - (router.log.stat().st_size - log_size)
        by_checkpoint = checkpoint(router.database)
    finally:
        await conn.close()
    assert job["state"] == "done", (job["state"], job.get("error"))
    run = job["runs"][-1]
    if run.get("eval_count") != tokens:
        raise RuntimeError(f"the job streamed {run.get('eval_count')} tokens, not {tokens}")
    return {
        "bytes": by_router + by_checkpoint,
        "router": by_router,
        "checkpoint": by_checkpoint,
        "output": len(job["output"].encode()),
        "seconds": elapsed,
    }


async def written_section(bench: Bench) -> None:
    long = LENGTHS[-1]
    total = bench.metric("written", f"bytes written for one {long:,}-token job (WAL + database files)", "MB", "mb")
    per_token = bench.metric("written_per_token", f"  bytes written per token, {long:,}-token job", "bytes", "mb")
    amplification = bench.metric(
        "written_vs_output", f"  bytes written / bytes of output, {long:,}-token job", "ratio", "ratio", better="lower"
    )
    fixed = bench.metric(
        "written_fixed", f"  a {TINY}-token job (the part of every job that is not its text)", "KB", "mb"
    )
    growth = bench.metric(
        "written_growth",
        f"  bytes per token beyond a {TINY}-token job's: {long:,}-token job /"
        f" {LENGTHS[0]:,}-token job (1.00x: linear in length)",
        "ratio",
        "ratio",
        better="lower",
    )
    seconds = bench.metric(
        "written_seconds",
        f"  the {long:,}-token job's duration (the fake paced at"
        f" {PACE_S * 1000:g} ms a token or more; progress written about once a second)",
        "s",
        "mb",
    )
    router = await bench.start_router(bench.workdir / "written.db")
    try:
        await run_job(bench, router, TINY)  # the router's first writes (node health) happen here
        for rep in range(1 if bench.quick else 2):
            tiny, short, full = [await run_job(bench, router, n) for n in (TINY, *LENGTHS)]
            total.add_run(full["bytes"] / 1e6)
            per_token.add_run(full["bytes"] / long)
            amplification.add_run(full["bytes"] / full["output"])
            fixed.add_run(tiny["bytes"] / 1e3)
            # Every job writes its rows and events whatever its length: what grows with length is
            # the rest, and per token it stays flat when nothing is written twice.
            growth.add_run(((full["bytes"] - tiny["bytes"]) / long) / ((short["bytes"] - tiny["bytes"]) / LENGTHS[0]))
            seconds.add_run(full["seconds"])
            bench.say(
                f"written run {rep + 1}: {long:,} tokens in {full['seconds']:.1f}s, output"
                f" {full['output'] / 1e3:,.0f} KB, written {full['bytes'] / 1e6:,.2f} MB (router"
                f" {full['router'] / 1e6:,.2f} MB, final checkpoint {full['checkpoint'] / 1e6:,.2f} MB);"
                f" {LENGTHS[0]:,} tokens: {short['bytes'] / 1e6:,.2f} MB"
            )
    finally:
        await router.stop()
        await bench.fakes.call("script", NODE, tokens=4, delay=0)
        for suffix in ("", "-wal", "-shm"):
            Path(str(bench.workdir / "written.db") + suffix).unlink(missing_ok=True)
