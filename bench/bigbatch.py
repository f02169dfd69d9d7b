"""Section `bigbatch`: a 100,000-line batch created beside `/health` (issue 43, item 4). Two parts:

- In-process, on gpuq's own store: the batch's lines made as the batch service makes them
  (parse_openai, line_job), then created as the dispatcher creates a large batch (begin, a
  piece of at most 500 lines at a time, then the short commit that opens it), each write timed
  alone (its hold of the writer and its durable commit); and, for comparison, the same lines in
  one transaction, as every batch was created before.
- Through the real router: `POST /api/batches` (what `gpuq batch submit` sends) of the same
  100,000 lines, answered once the batch is whole, while `/health` is asked every 50 ms and a
  job submitted every 200 ms (one connection each, as bench/backup.py's probe): the create's whole
  time, `/health`'s p99 and longest, the submit's longest, and how many `/health` answers were 503.

`bigbatch_section` is the section `bigbatch` of `python -m bench.run`; alone:
`.venv/bin/python -m bench.run --only bigbatch [--quick]`."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from gpuq.batches.parse import endpoint_of, line_job, parse_openai
from gpuq.store import NodeInfo, Store
from gpuq.store.batch_create import pieces
from gpuq.store.batches import NewBatch, NewLine

from .core import NODES, Bench
from .procs import Router
from .stats import percentile

LINES = 100_000
ENDPOINT = "/v1/chat/completions"


def batch_text(lines: int) -> str:
    model = NODES["n1"]
    return "".join(
        json.dumps(
            {
                "custom_id": f"l{i}",
                "method": "POST",
                "url": ENDPOINT,
                "body": {"model": model, "messages": [{"role": "user", "content": f"label item {i}"}]},
            },
            separators=(",", ":"),
        )
        + "\n"
        for i in range(lines)
    )


def new_lines(text: str, batch_id: str) -> list[NewLine]:
    """The lines as the batch service makes them (gpuq/batches/service.py _line_jobs)."""
    ep = endpoint_of(ENDPOINT)
    out = []
    for line in parse_openai(text.encode(), ENDPOINT).lines:
        job, refused = line_job(line, ep, batch_id, None, None, "batch", 1_000_000, lambda m: m)
        out.append(NewLine(line.line, line.custom_id, job, refused))
    return out


def _batch(batch_id: str) -> NewBatch:
    return NewBatch(batch_id, "openai", ENDPOINT, "24h", time.time() + 86400, name="bench")


async def in_pieces(path: Path, lines: list[NewLine], infos: list[NodeInfo]) -> tuple[list[float], float]:
    """The pieces' create on a fresh store: (each write's time, ms; its whole time, s)."""
    store = Store(path)
    await store.open()
    holds: list[float] = []
    try:
        started = time.perf_counter()
        t = time.perf_counter()
        await store.begin_batch(_batch("batch_bench"), len(lines), len(lines), "bench")
        holds.append(time.perf_counter() - t)
        for piece in pieces(lines):
            t = time.perf_counter()
            await store.add_batch_lines("batch_bench", "bench", piece, infos, "bench")
            holds.append(time.perf_counter() - t)
        t = time.perf_counter()
        await store.open_batch("batch_bench", "bench", [])
        holds.append(time.perf_counter() - t)
        whole = time.perf_counter() - started
    finally:
        await store.close()
    return [h * 1000 for h in holds], whole


async def in_one(path: Path, lines: list[NewLine], infos: list[NodeInfo]) -> float:
    """The same lines in one transaction (every batch's create before issue 43): its hold, ms."""
    store = Store(path)
    await store.open()
    try:
        t = time.perf_counter()
        await store.create_batch(_batch("batch_bench"), lines, infos, "bench")
        return (time.perf_counter() - t) * 1000
    finally:
        await store.close()


class Probe:
    """`/health` every 50 ms and a submit every 200 ms, one connection each: (when, ms, status)."""

    def __init__(self, router: Router):
        self.router = router
        self.seen: dict[str, list[tuple[float, float, int]]] = {"health": [], "submit": []}
        self.stop = asyncio.Event()

    async def _loop(self, every_s: float, method: str, path: str, body: dict | None, into: str) -> None:
        conn = await self.router.connect()
        try:
            raw = conn.encode(method, path, body)
            while not self.stop.is_set():
                t = time.perf_counter()
                status, reply = await conn.send(raw)
                if status not in (200, 201, 503):
                    raise RuntimeError(f"{method} {path}: {status} {reply[:300]!r}")
                self.seen[into].append((t, (time.perf_counter() - t) * 1000, status))
                await asyncio.sleep(max(every_s - (time.perf_counter() - t), 0))
        finally:
            await conn.close()

    async def run(self) -> None:
        body = {"kind": "task", "prompt": "summarise the export job's retries", "node": "n2"}
        await asyncio.gather(
            self._loop(0.05, "GET", "/health", None, "health"), self._loop(0.2, "POST", "/api/jobs", body, "submit")
        )

    def between(self, what: str, start: float, end: float) -> list[tuple[float, float, int]]:
        return [s for s in self.seen[what] if start <= s[0] <= end]


async def through_router(bench: Bench, path: Path, text: str) -> dict[str, float]:
    """POST /api/batches of `text` beside the probe's /health and submits."""
    router = await bench.start_router(path, max_prompt_bytes=len(text), front={"max_batch_lines": LINES})
    probe = Probe(router)
    probing = asyncio.create_task(probe.run())
    try:
        await asyncio.sleep(1)  # the probe's first answers: its connections warm
        conn = await router.connect()
        t = time.perf_counter()
        status, raw = await conn.send(conn.encode("POST", "/api/batches", {"input": text, "name": "bench"}))
        took = time.perf_counter() - t
        await conn.close()
        if status != 201 or json.loads(raw)["batch"]["total"] != LINES:
            raise RuntimeError(f"POST /api/batches: {status} {raw[:300]!r}")
        health, submits = probe.between("health", t, t + took), probe.between("submit", t, t + took)
    finally:
        probe.stop.set()
        await asyncio.gather(probing, return_exceptions=True)
        await router.stop()
    ms = [h[1] for h in health] or [float("nan")]
    return {
        "create_s": took,
        "health_p99": percentile(ms, 99),
        "health_max": max(ms),
        "submit_max": max([s[1] for s in submits] or [float("nan")]),
        "reds": sum(1 for h in health if h[2] != 200),
    }


async def bigbatch_section(bench: Bench) -> None:
    infos = [NodeInfo(n, rank, ("task",), m, True) for rank, (n, m) in enumerate(NODES.items(), 1)]
    text = batch_text(LINES)
    m = {
        "hold": bench.metric(
            "bigbatch_hold",
            f"a {LINES:,}-line batch's create in pieces (500 lines): its longest hold of the writer",
            "ms",
            "ms",
            "<= 100",
        ),
        "piece": bench.metric("bigbatch_piece", "  each of its writes", "ms", "ms"),
        "writes": bench.metric("bigbatch_writes", "  its writes (begin, the pieces, the open)", "n", "count"),
        "store_s": bench.metric("bigbatch_store_s", "  its whole time on the store, s", "s", "count"),
        "one": bench.metric("bigbatch_hold_one", "  the same lines in one transaction (before): its hold", "ms", "ms"),
        "create_s": bench.metric(
            "bigbatch_create_s", f"POST /api/batches of {LINES:,} lines, answered once whole, s", "s", "count"
        ),
        "health_p99": bench.metric(
            "bigbatch_health_p99", "  /health every 50 ms while it is created, p99", "ms", "ms", "< 500"
        ),
        "health_max": bench.metric("bigbatch_health_max", "  /health while it is created, the longest", "ms", "ms"),
        "submit_max": bench.metric("bigbatch_submit_max", "  a submit every 200 ms meanwhile, the longest", "ms", "ms"),
        "reds": bench.metric("bigbatch_health_red", "  /health answers that were 503 meanwhile", "n", "count", "0"),
    }
    for repeat in range(bench.repeats):
        bench.say(f"bigbatch: repeat {repeat + 1} of {bench.repeats}")
        lines = new_lines(text, "batch_bench")
        holds, whole = await in_pieces(bench.workdir / f"bigbatch-{repeat}.db", lines, infos)
        m["hold"].add_run(max(holds))
        m["piece"].add_run(holds)
        m["writes"].add_run(len(holds))
        m["store_s"].add_run(whole)
        m["one"].add_run(await in_one(bench.workdir / f"bigbatch-one-{repeat}.db", lines, infos))
        got = await through_router(bench, bench.workdir / f"bigbatch-router-{repeat}.db", text)
        for key in ("create_s", "health_p99", "health_max", "submit_max", "reds"):
            m[key].add_run(got[key])
        for name in (f"bigbatch-{repeat}.db", f"bigbatch-one-{repeat}.db", f"bigbatch-router-{repeat}.db"):
            for suffix in ("", "-wal", "-shm"):
                Path(str(bench.workdir / name) + suffix).unlink(missing_ok=True)
