"""What every section of the bench shares: the run's state (`Bench`: its options, its metrics,
the fake nodes) and the router helpers several sections call. The sections import this module;
it imports none of them, so `bench.run` alone assembles them."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

from . import peers
from .fakes import MODEL_LEFT
from .procs import Fakes, Router, node_table
from .stats import Metric

NODES = {"n1": "qwen3-coder:30b", "n2": "llama3.2:latest"}
SETTINGS = {"stale_after_s": 600.0, "stale_grace_s": 30.0, "max_runtime_s": 4 * 3600.0}


class Bench:
    """One run: its options, its rows (`metric`), and the helpers more than one section uses
    (a router on the fake nodes, a submit burst, waiting for a node to drain, timelines cut at
    what the fake saw, a first-token overhead's disk share)."""

    def __init__(self, quick: bool, only: set[str], workdir: Path, seed: int = 1):
        self.quick = quick
        self.seed = seed  # the replayed day's (bench/trace.py)
        self.only = only
        self.workdir = workdir
        self.repeats = 2 if quick else 7
        self.metrics: dict[str, Metric] = {}
        self.fakes: Fakes | None = None

    def metric(self, key: str, label: str, unit: str, kind: str, target: str = "", better: str = "") -> Metric:
        if key not in self.metrics:
            self.metrics[key] = Metric(key, label, unit, kind, target=target, better=better)
        return self.metrics[key]

    def say(self, text: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def wants(self, section: str) -> bool:
        return not self.only or section in self.only

    async def start_router(self, database: Path, **router) -> Router:
        nodes = [node_table(n, self.fakes.urls[n], rank, m) for rank, (n, m) in enumerate(NODES.items(), 1)]
        return await Router(self.workdir, nodes, database, **router).start()

    async def submit_burst(self, router: Router, clients: int, total: int, limit_s: float) -> float:
        """`total` POST /api/jobs over `clients` keep-alive connections; jobs/s to the last 201."""
        conns = [await router.connect() for _ in range(clients)]
        issued = 0
        errors: list[str] = []

        async def client(conn) -> None:
            nonlocal issued
            raw = conn.encode("POST", "/api/jobs", {"kind": "task", "prompt": "summarise the export job's retries"})
            while issued < total and time.perf_counter() < deadline:
                issued += 1
                status, body = await conn.send(raw)
                if status != 201:
                    errors.append(f"{status} {body[:200]!r}")
                    return

        start = time.perf_counter()
        deadline = start + limit_s
        try:
            await asyncio.gather(*(client(c) for c in conns))
        finally:
            for c in conns:
                await c.close()
        elapsed = time.perf_counter() - start
        if errors:
            raise RuntimeError(f"submit refused during the bench: {errors[0]}")
        return issued / elapsed

    async def wait_idle(self, router: Router, node: str, limit_s: float) -> None:
        conn = await router.connect()
        try:
            deadline = time.monotonic() + limit_s
            while time.monotonic() < deadline:
                _, body = await conn.request("GET", "/api/queue?limit=0")
                mine = next(n for n in body["nodes"] if n["name"] == node)
                if mine["queued_count"] == 0 and mine["running"] is None:
                    return
                await asyncio.sleep(0.05)
            raise RuntimeError(f"node {node} did not drain within {limit_s}s")
        finally:
            await conn.close()

    def segments(self, prefix: str, points: list[tuple[str, float]], into: dict[str, list[float]]) -> None:
        """Split a timeline of (checkpoint, monotonic time) into its consecutive segments."""
        for (a, ta), (b, tb) in zip(points, points[1:]):
            into.setdefault(f"{a} -> {b}", []).append((tb - ta) * 1000)

    def add_segments(self, prefix: str, found: dict[str, list[float]]) -> None:
        for _i, (name, values) in enumerate(found.items()):
            key = f"{prefix}_seg_{name}"
            if key not in self.metrics:
                self.metric(key, f"  segment: {name}", "ms", "ms")
            self.metrics[key].add_run(values)

    @staticmethod
    def fake_points(log: list, start: float, stop: float) -> list[tuple[str, float]]:
        """The checkpoints the fake saw between two moments (both clocks are CLOCK_MONOTONIC)."""
        points = []
        within = sorted((e for e in log if not e[3] and start <= e[1] <= stop), key=lambda e: e[1])
        left = [e for e in within if e[0] == MODEL_LEFT]
        if left:  # a delayed unload: the runner exited here
            points.append(("model left /api/ps", left[0][1]))
        ps = [e for e in within if e[0] == "/api/ps"]
        if ps:  # the last check is the one that found the model gone
            points.append(("unload confirmed", ps[-1][2]))
        version = [e for e in within if e[0] == "/api/version"]
        tags = [e for e in within if e[0] == "/api/tags"]
        if version and tags:
            points += [("health check sent", version[-1][1]), ("health check answered", tags[-1][2])]
        return sorted(points, key=lambda p: p[1])

    def disk_share_rows(self, key: str) -> None:
        """Rows that split a first-token overhead into the disk's share and the rest (created
        here so they sit under the overhead's row)."""
        self.metric(
            f"{key}_commits",
            "  durable commits before the chat request leaves (counted in the router's WAL)",
            "commits",
            "count",
        )
        self.metric(
            f"{key}_disk",
            "    those commits x one durable commit (raw sqlite3, same run): the disk's share",
            "ms",
            "ms",
        )
        self.metric(
            f"{key}_rest",
            "    the rest of the overhead (its p50 - the disk's share): CPU, thread hops, loopback HTTP",
            "ms",
            "ms",
        )

    async def disk_share(self, key: str, fakes: Fakes, node: str, database: Path, call, overheads: list[float]) -> None:
        """Count the durable commits the router makes between a call's arrival and its chat
        request reaching the node (which holds the request meanwhile), and price them at this
        run's raw commit time."""
        await fakes.call("hold", node)
        peers.restart_wal(database)
        before = peers.wal_commits(database)
        task = asyncio.create_task(call())
        try:
            deadline = time.monotonic() + 10
            while (await fakes.call("status", node))["waiting"] < 1:
                if time.monotonic() > deadline or task.done():
                    raise RuntimeError(f"the call never reached node {node}")
                await asyncio.sleep(0.005)
            commits = peers.commits_per(database, 1, before)
        finally:
            await fakes.call("release", node)
            await task
        disk = commits * 1000 / peers.raw_commits(self.workdir / "raw-ttft.db", 300, 2.0)
        self.metrics[f"{key}_commits"].add_run(commits)
        self.metrics[f"{key}_disk"].add_run(disk)
        self.metrics[f"{key}_rest"].add_run(statistics.median(overheads) - disk)
