"""`python -m bench.run [--quick] [--only SECTION,...]`: every measurement of issue 8 in one
run, one table on stdout, JSON in bench/results.json. Loopback only; every loop is bounded
in count and in time. GPUQ_BENCH_QUICK=1 is the same as --quick."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp

from gpuq.store import NewJob, NodeInfo, Store

from . import front, growth, listings, peers, pgstore, postgres, replay, scale, written
from .fakes import MODEL_LEFT
from .procs import QUIET_S, Fakes, Router, clear_queues, first_stream_line, free_port, node_table, rss_mb
from .stats import Metric, fmt, table

BENCH_DIR = Path(__file__).resolve().parent
SECTIONS = ("physical", "peers", "submit", "turnaround", "first_token", "written", "growth", "listings", "unload_policy",
            "front", "warm", "postgres", "pgstore", "replay", "scale")
NODES = {"n1": "qwen3-coder:30b", "n2": "llama3.2:latest"}
CONCURRENT_WORKERS = 8
UNLOAD_S = 0.2  # how long a real Ollama lists a model in /api/ps after keep_alive: 0 (its runner exits)
SETTINGS = {"stale_after_s": 600.0, "stale_grace_s": 30.0, "max_runtime_s": 4 * 3600.0}


async def timed_ms(awaitable) -> float:
    t = time.perf_counter()
    await awaitable
    return (time.perf_counter() - t) * 1000


class Bench:
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

    # -- 1 and 2: the physical limit, the peers, the store's round trip -------------------------

    def commits_row(self, key: str, who: str) -> Metric:
        return self.metric(f"{key}_commits", f"  {who}: durable commits per round trip (counted in the WAL)",
                           "commits", "count")

    async def physical_and_peers(self) -> None:
        cache = disk_write_cache(self.workdir)
        raw = self.metric("raw_commits", "raw sqlite3 single-row commits (WAL, synchronous=FULL;"
                          f" disk write cache: {cache['write_cache']})", "commits/s", "rate")
        raw.note = f"device {cache['device']}, write_cache {cache['write_cache']}, fua {cache['fua']}"
        commit_ms = self.metric("commit_ms", "  one durable commit (1 / raw commits/s)", "ms", "ms")
        n_raw, n_rt = (400, 150) if self.quick else (2000, 600)
        for rep in range(self.repeats):
            # Interleaved within each repeat, so the ratios share the machine's noise.
            r = peers.raw_commits(self.workdir / "raw.db", n_raw, 5.0)
            raw.add_run(r)
            commit_ms.add_run(1000 / r)
            if self.wants("peers"):
                await self.one_at_a_time(r, n_rt)
                await self.hop_costs()
                await self.eight_workers(n_rt)
            self.say(f"physical/peers run {rep + 1}/{self.repeats}: raw {r:,.0f}/s" + (
                "; " + ", ".join(f"{k} {self.metrics[k].runs[-1][0]:,.0f}/s" for k in
                                 ("store_rt", "huey_rt", "pq_rt", "store_rt_c", "store_off_rt_c", "huey_rt_c", "pq_rt_c"))
                if self.wants("peers") else ""))
        if self.wants("peers"):
            self.name_commits()

    async def one_at_a_time(self, raw: float, count: int) -> None:
        """The round trip one job at a time, beside Huey's and persist-queue's, and where its
        time goes: the durable commits it counted at this run's raw commit time, and the rest."""
        labels = {"store": ("gpuq", "gpuq Store submit->claim->finish, one at a time ({store} commits: the submit;"
                                    " the finish, which claims the next)"),
                  "huey": ("Huey", "Huey SqliteStorage enqueue->dequeue, one at a time ({huey} commits)"),
                  "pq": ("persist-queue", "persist-queue SQLiteAckQueue put->get->ack, one at a time ({pq} commits)")}
        runs = {"huey": peers.huey_round_trips(self.workdir / "huey.db", count, 5.0),
                "pq": peers.persist_round_trips(self.workdir / "pq", count, 5.0),
                "store": await peers.store_round_trips(self.workdir / "store.db", count, 5.0)}
        for who in ("store", "huey", "pq"):
            short, label = labels[who]
            rate, commits = runs[who]
            self.metric(f"{who}_rt", label, "round trips/s", "rate").add_run(rate)
            self.commits_row(who, short).add_run(commits)
        (s, s_c), (h, h_c), (p, _) = runs["store"], runs["huey"], runs["pq"]
        self.metric("store_vs_huey", "gpuq Store round trip / Huey's, one at a time (same run)", "ratio", "ratio",
                    ">= 1.00x", better="higher").add_run(s / h)
        self.metric("store_vs_pq", "gpuq Store round trip / persist-queue's, one at a time (same run)", "ratio",
                    "ratio", better="higher").add_run(s / p)
        for key, who, rate, commits in (("store", "gpuq", s, s_c), ("huey", "Huey", h, h_c)):
            # How much of the disk's commit rate each turns into work; 1.00x = nothing but fsyncs.
            self.metric(f"{key}_commit_share", f"{who} round trips x its commits / raw commits/s (same run)",
                        "ratio", "ratio", better="higher").add_run(rate * commits / raw)
            total_ms, disk_ms = 1000 / rate, commits * 1000 / raw
            self.metric(f"{key}_rt_ms", f"  {who} round trip time, one at a time", "ms", "ms").add_run(total_ms)
            self.metric(f"{key}_rt_disk_ms", "    its commits x one durable commit (the disk's share)", "ms",
                        "ms").add_run(disk_ms)
            self.metric(f"{key}_rt_rest_ms", "    the rest: CPU, thread hops, SQL (time - the disk's share)",
                        "ms", "ms").add_run(total_ms - disk_ms)

    async def eight_workers(self, count: int) -> None:
        """8 workers at once: gpuq's group commit, gpuq with batching emulated off, and the peers'
        one commit per operation."""
        w = CONCURRENT_WORKERS
        runs = {
            "huey": peers.huey_concurrent(self.workdir / "huey-c.db", w, count, 5.0),
            "pq": peers.persist_concurrent(self.workdir / "pq-c", w, count, 5.0),
            "store": await peers.store_concurrent(self.workdir / "store-c.db", w, count, 5.0),
            "store_off": await peers.store_concurrent(self.workdir / "store-off.db", w, count, 5.0, batching=False),
        }
        labels = {
            "store": (f"gpuq Store, {w} workers (one per node), group commit ({{store_c}} commits per round trip)",
                      "gpuq, group commit"),
            "store_off": (f"gpuq Store, {w} workers, batching off: one write in flight at a time"
                          " ({store_off_c} commits per round trip)", "gpuq, batching off"),
            "huey": (f"Huey, {w} worker threads, a commit per operation ({{huey_c}} commits per round trip)",
                     "Huey"),
            "pq": (f"persist-queue, {w} worker threads, a commit per operation ({{pq_c}} commits per round trip)",
                   "persist-queue"),
        }
        for who in ("store", "store_off", "huey", "pq"):
            (label, short), (rate, commits) = labels[who], runs[who]
            self.metric(f"{who}_rt_c", label, "round trips/s", "rate").add_run(rate)
            self.commits_row(f"{who}_c", f"{short}, {w} workers").add_run(commits)
        s, off, h, p = (runs[k][0] for k in ("store", "store_off", "huey", "pq"))
        for key, label, value in (
                ("store_vs_huey_c", f"gpuq group commit / Huey's per-operation commit, {w} workers (same run)", s / h),
                ("store_off_vs_huey_c", f"gpuq batching off / Huey, {w} workers (same run)", off / h),
                ("store_vs_pq_c", f"gpuq group commit / persist-queue, {w} workers (same run)", s / p),
                ("store_vs_off_c", f"gpuq group commit / gpuq batching off, {w} workers (same run)", s / off)):
            self.metric(key, label, "ratio", "ratio", better="higher").add_run(value)

    async def hop_costs(self) -> None:
        """What one hop from the event loop to a thread and back costs here: an asyncio program
        on a blocking database driver pays one on every call, whatever the disk."""
        hop = self.metric("thread_hop", "  one thread hop: event loop -> a worker thread -> back (a no-op)", "ms", "ms")
        read = self.metric("store_read", "  Store.read('SELECT 1'): the reader connection's thread, there and back",
                           "ms", "ms")
        loop = asyncio.get_running_loop()
        samples = 100 if self.quick else 300
        with ThreadPoolExecutor(1) as pool:
            await loop.run_in_executor(pool, int)
            hop.add_run([await timed_ms(loop.run_in_executor(pool, int)) for _ in range(samples)])
        store = Store(self.workdir / "hops.db")
        await store.open()
        try:
            await store.read("SELECT 1")
            read.add_run([await timed_ms(store.read("SELECT 1")) for _ in range(samples)])
        finally:
            await store.close()

    def name_commits(self) -> None:
        """Put the counted commits (their median over the runs) into the labels that name them:
        `{store}` in a label is replaced by the median of the row `store_commits`."""
        for key, counted in list(self.metrics.items()):
            if key.endswith("_commits") and counted.pooled:
                value = fmt(statistics.median(counted.pooled), "count").removesuffix(".00")
                for m in self.metrics.values():
                    m.label = m.label.replace("{" + key.removesuffix("_commits") + "}", value)

    # -- the router under load ----------------------------------------------------------------

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
            raw = conn.encode("POST", "/api/jobs",
                              {"kind": "task", "prompt": "summarise the export job's retries"})
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

    async def clear(self, router: Router) -> None:
        await clear_queues(router, NODES)

    async def submit_section(self, router: Router) -> None:
        one = self.metric("submit_1", "durable submit POST /api/jobs, 1 client, nodes busy with a held job",
                          "jobs/s", "rate")
        many = self.metric("submit_32", "durable submit POST /api/jobs, 32 clients, nodes busy with a held job",
                           "jobs/s", "rate", ">= 2,000")
        scale = self.metric("submit_32_vs_1", "submit: 32 clients / 1 client (same run)", "ratio", "ratio",
                            better="higher")
        vs_raw = self.metric("submit_32_vs_raw", "submit, 32 clients / raw commits/s (same run)", "ratio",
                             "ratio", better="higher")
        working = self.metric("submit_32_working", f"durable submit, 32 clients, while {len(NODES)} nodes' workers"
                              " run jobs to completion", "jobs/s", "rate")
        finished = self.metric("submit_32_working_done", "  jobs the workers ran meanwhile (their last byte sent; 4-token"
                               " replies, instant unload)", "jobs/s", "rate")
        working_vs = self.metric("submit_32_working_vs_held", "submit, 32 clients: workers running / nodes held"
                                 " (same run)", "ratio", "ratio", better="higher")
        n1, n32 = (150, 1600) if self.quick else (300, 3200)
        for rep in range(self.repeats):
            # A real lab's jobs run for minutes: each node holds one running job during the burst.
            for name in NODES:
                await self.fakes.call("hold", name)
            try:
                r1 = await self.submit_burst(router, 1, n1, 10.0)
                await self.clear(router)
                r32 = await self.submit_burst(router, 32, n32, 15.0)
                await self.clear(router)
            finally:
                for name in NODES:
                    await self.fakes.call("release", name)
            raw = peers.raw_commits(self.workdir / "raw-submit.db", 600, 3.0)
            rw, done = await self.submit_while_working(router, n32)
            one.add_run(r1)
            many.add_run(r32)
            scale.add_run(r32 / r1)
            vs_raw.add_run(r32 / raw)
            working.add_run(rw)
            finished.add_run(done)
            working_vs.add_run(rw / r32)
            self.say(f"submit run {rep + 1}/{self.repeats}: 1 client {r1:,.0f}/s, 32 clients {r32:,.0f}/s,"
                     f" raw commits {raw:,.0f}/s; 32 clients while the workers run jobs {rw:,.0f}/s"
                     f" ({done:,.0f} jobs/s finished meanwhile)")

    async def submit_while_working(self, router: Router, total: int) -> tuple[float, float]:
        """32 clients submit while every node's worker claims, runs and finishes jobs (the fakes
        answer at once): the submits' commits share the writer with the workers' claims, outputs
        and finishes. Returns (submits/s, jobs finished per second during the burst)."""
        for name in NODES:
            await self.wait_idle(router, name, 30)
            await self.fakes.call("reset", name)
        t0 = time.monotonic()
        rate = await self.submit_burst(router, 32, total, 15.0)
        t1 = time.monotonic()
        await self.clear(router)
        ends = [e[2] for name in NODES for e in await self.fakes.log(name, since=t0) if e[3]]
        for name in NODES:
            await self.wait_idle(router, name, 30)
        finished = sum(t0 <= end <= t1 for end in ends)
        if not finished:
            raise RuntimeError("no job finished while the clients submitted: the workers did not run")
        return rate, finished / (t1 - t0)

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
        for i, (name, values) in enumerate(found.items()):
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

    async def turnaround_section(self, router: Router) -> None:
        """One node works through a queue; the gap from a job's last byte to the next job's request,
        with the simulator unloading at once, then as Ollama does (the model listed by /api/ps
        for UNLOAD_S after keep_alive: 0, while its runner exits)."""
        rows = (("gap", "turnaround gap: final Ollama byte -> next request (1 node, simulator unloads instantly)",
                 "p50 <= 5 ms", 40 if self.quick else 100, 0.0),
                ("gap_real", f"turnaround gap, realistic unload (the model listed by /api/ps for"
                             f" {UNLOAD_S * 1000:.0f} ms after keep_alive: 0)", "", 6 if self.quick else 15, UNLOAD_S))
        node = "n1"
        await self.wait_idle(router, node, 30)
        conn = await router.connect()
        try:
            for rep in range(self.repeats):
                for key, label, target, jobs, unload in rows:
                    metric = self.metric(key, label, "ms", "ms", target)  # before its segments' rows
                    await self.fakes.call("script", node, unload_delay=unload)
                    gaps = await self.gaps(router, conn, node, jobs, metric.key)
                    metric.add_run(gaps)
                    self.say(f"turnaround run {rep + 1}/{self.repeats}, unload {unload * 1000:.0f} ms:"
                             f" gap p50 {statistics.median(gaps):.2f} ms ({len(gaps)} gaps)")
        finally:
            await self.fakes.call("script", node, unload_delay=0)
            await conn.close()

    async def gaps(self, router: Router, conn, node: str, jobs: int, key: str) -> list[float]:
        """`jobs` jobs queued behind a held head, then released: each gap (ms), cut into segments."""
        await self.fakes.call("reset", node)
        await self.fakes.call("hold", node)
        await conn.request("POST", "/api/jobs", {"kind": "task", "prompt": "head", "node": node})
        for i in range(jobs):
            status, body = await conn.request("POST", "/api/jobs", {"kind": "task", "prompt": f"job {i}", "node": node})
            assert status == 201, body
        since = time.monotonic()
        await self.fakes.call("release", node)
        await self.wait_idle(router, node, 60)
        log = await self.fakes.log(node)
        gens = sorted((e for e in log if e[3] and e[2] >= since), key=lambda e: e[1])
        gaps, parts = [], {}
        for prev, nxt in zip(gens, gens[1:]):
            gaps.append((nxt[1] - prev[2]) * 1000)
            self.segments(key, [("final byte", prev[2]), *self.fake_points(log, prev[2], nxt[1]),
                                ("next request", nxt[1])], parts)
        if len(gaps) < jobs - 1:
            raise RuntimeError(f"only {len(gaps)} gaps recorded for {jobs} jobs")
        self.add_segments(key, parts)
        return gaps

    def disk_share_rows(self, key: str) -> None:
        """Rows that split a first-token overhead into the disk's share and the rest (created
        here so they sit under the overhead's row)."""
        self.metric(f"{key}_commits", "  durable commits before the chat request leaves (counted in the router's WAL)",
                    "commits", "count")
        self.metric(f"{key}_disk", "    those commits x one durable commit (raw sqlite3, same run): the disk's share",
                    "ms", "ms")
        self.metric(f"{key}_rest", "    the rest of the overhead (its p50 - the disk's share): CPU, thread hops,"
                    " loopback HTTP", "ms", "ms")

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

    async def first_token_section(self, router: Router) -> None:
        through = self.metric("ttft_gpuq", "first token through gpuq (submit -> /stream), idle node", "ms", "ms")
        direct = self.metric("ttft_direct", "first token straight from the fake Ollama", "ms", "ms")
        overhead = self.metric("ttft_overhead", "first-token overhead (gpuq - direct, paired)", "ms", "ms",
                               "p50 <= 2 ms")
        self.disk_share_rows("ttft")
        submit_metric = self.metric("ttft_submit", "  the submit's own round trip (POST -> 201, committed)",
                                    "ms", "ms")
        pairs = 10 if self.quick else 20
        node, model = "n2", NODES["n2"]
        await self.wait_idle(router, node, 30)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async def straight() -> float:
                body = {"model": model, "messages": [{"role": "user", "content": "hello"}],
                        "stream": True, "keep_alive": 0}
                t0 = time.monotonic()
                async with session.post(self.fakes.urls[node] + "/api/chat", json=body) as resp:
                    await first_stream_line(resp, "message")
                    t = time.monotonic() - t0
                    await resp.read()
                return t * 1000

            async def via_gpuq() -> tuple[float, list[tuple[str, float]]]:
                t0 = time.monotonic()
                async with session.post(router.url + "/api/jobs",
                                        json={"kind": "task", "prompt": "hello", "node": node}) as resp:
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
            for rep in range(self.repeats):
                g_run, d_run, o_run, parts, submit_rtt = [], [], [], {}, []
                await self.fakes.call("reset", node)
                for _ in range(pairs):
                    await self.wait_idle(router, node, 30)
                    # An idle node, as when a person submits to a quiet lab.
                    await asyncio.sleep(QUIET_S)
                    d = await straight()
                    g, points = await via_gpuq()
                    d_run.append(d)
                    g_run.append(g)
                    o_run.append(g - d)
                    log = await self.fakes.log(node)
                    t0, acked, t1 = (p[1] for p in points)
                    submit_rtt.append((acked - t0) * 1000)
                    chat = [e for e in log if e[3] and t0 <= e[1] <= t1]
                    if chat:
                        # The worker's path (the client's stream request runs beside it).
                        timeline = [("submit sent", t0), *self.fake_points(log, t0, chat[0][1]),
                                    ("chat request arrives", chat[0][1]), ("first token at client", t1)]
                        self.segments("ttft", timeline, parts)
                through.add_run(g_run)
                direct.add_run(d_run)
                overhead.add_run(o_run)
                submit_metric.add_run(submit_rtt)
                self.add_segments("ttft", parts)
                await self.wait_idle(router, node, 30)
                await asyncio.sleep(QUIET_S)  # idle, as in the pairs
                await self.disk_share("ttft", self.fakes, node, router.database, via_gpuq, o_run)
                self.say(f"first-token run {rep + 1}/{self.repeats}: gpuq {statistics.median(g_run):.2f} ms,"
                         f" direct {statistics.median(d_run):.2f} ms")

    # -- 5 and 6: growth and memory -------------------------------------------------------------

    async def growth_section(self) -> None:
        sizes = (100, 10_000, 100_000)
        waiting = 1000
        samples = 15 if self.quick else 30
        labels = {"claim": "claim (Store.claim)", "claim_sql": "claim, SQL only (synchronous=OFF)",
                  "stale": "staleness (Store.stale_heads)",
                  "submit": "submit (Store.submit, 1 job)", "health": "GET /health",
                  "queue": "GET /api/queue (1,000 waiting: output grows with waiting)",
                  "metrics": "GET /metrics (a steady scrape)",
                  "history": "GET /api/history (the newest 50 finished, and the count)",
                  "activity": "GET /api/activity (the day's counts, each node's last hour)"}
        per: dict[tuple[str, int], Metric] = {}
        for size in sizes:
            for key, label in labels.items():
                per[key, size] = self.metric(f"growth_{key}_{size}", f"{label} @ {size:,} history", "ms", "ms")
        first_scrape = {size: self.metric(f"growth_metrics_first_{size}",
                                          f"GET /metrics, first scrape after start (reads the history) @ {size:,}",
                                          "ms", "ms") for size in sizes}
        rss = {size: self.metric(f"rss_{size}", f"router RSS after the queries @ {size:,} history", "MB", "mb",
                                 "<= 100 MB" if size == 100_000 else "") for size in sizes}
        infos = [NodeInfo(n, rank, ("task", "critique"), m, True) for rank, (n, m) in enumerate(NODES.items(), 1)]
        paths = {}
        for size in sizes:
            t0 = time.perf_counter()
            paths[size] = await growth.seed(self.workdir / f"history-{size}.db", size, waiting,
                                            list(NODES.items()), time.time(), SETTINGS)
            self.say(f"growth: seeded {size:,} jobs of history + {waiting:,} waiting"
                     f" in {time.perf_counter() - t0:.1f}s")
        # The sizes take turns sample by sample (three stores open side by side), so the disk's
        # and the machine's changing load falls on every size alike and cannot pass for growth.
        for rep in range(self.repeats):
            stores = {size: Store(paths[size]) for size in sizes}
            for store in stores.values():
                await store.open()
            try:
                runs = {(k, size): [] for k in ("claim", "claim_sql", "stale", "submit") for size in sizes}
                # The claim with its fsync, then without it: the SQL work alone, where growth would show.
                for key, synchronous in (("claim", "FULL"), ("claim_sql", "OFF")):
                    for store in stores.values():
                        await store._writer.call(lambda db: db.execute(f"PRAGMA synchronous = {synchronous}"))
                    for i in range(samples):
                        node = "n1" if i % 2 == 0 else "n2"
                        for size, store in stores.items():
                            t = time.perf_counter()
                            job = await store.claim(node)
                            runs[key, size].append((time.perf_counter() - t) * 1000)
                            await store.finish(job["id"], job["run_id"], "done", None, "out")
                for store in stores.values():
                    await store._writer.call(lambda db: db.execute("PRAGMA synchronous = FULL"))
                heads = {size: [await store.claim(n) for n in NODES] for size, store in stores.items()}
                for _ in range(samples * 5):  # tens of microseconds each: more samples
                    for size, store in stores.items():
                        t = time.perf_counter()
                        await store.stale_heads()
                        runs["stale", size].append((time.perf_counter() - t) * 1000)
                for size, store in stores.items():
                    for h in heads[size]:
                        await store.finish(h["id"], h["run_id"], "done", None, "out")
                for _ in range(samples):
                    for size, store in stores.items():
                        t = time.perf_counter()
                        await store.submit(NewJob("task", "one more"), infos, "bench")
                        runs["submit", size].append((time.perf_counter() - t) * 1000)
            finally:
                for store in stores.values():
                    await store.close()
            for (key, size), values in runs.items():
                per[key, size].add_run(values)
        # One router per database, side by side, each node busy with a (held) running job.
        for name in NODES:
            await self.fakes.call("hold", name)
        routers: dict[int, Router] = {}
        conns = {}
        try:
            for size in sizes:
                routers[size] = await self.start_router(paths[size])
                conns[size] = await routers[size].connect()
                await conns[size].request("GET", "/api/queue")  # warm
                t = time.perf_counter()
                status, _ = await conns[size].request("GET", "/metrics")
                first_scrape[size].add_run([(time.perf_counter() - t) * 1000])
                assert status == 200, status
            for rep in range(self.repeats):
                health_ms = {size: [] for size in sizes}
                queue_ms = {size: [] for size in sizes}
                metrics_ms = {size: [] for size in sizes}
                page_ms = {key: {size: [] for size in sizes} for key in ("history", "activity")}
                for _ in range(samples):
                    for size, conn in conns.items():
                        t = time.perf_counter()
                        status, _ = await conn.request("GET", "/health")
                        health_ms[size].append((time.perf_counter() - t) * 1000)
                        assert status in (200, 503)
                        t = time.perf_counter()
                        status, body = await conn.request("GET", "/api/queue")
                        queue_ms[size].append((time.perf_counter() - t) * 1000)
                        assert status == 200 and body["queue_depth"] > waiting // 2, body["queue_depth"]
                        t = time.perf_counter()
                        status, _ = await conn.request("GET", "/metrics")
                        metrics_ms[size].append((time.perf_counter() - t) * 1000)
                        assert status == 200
                        for key, path in (("history", "/api/history"), ("activity", "/api/activity")):
                            t = time.perf_counter()
                            status, _ = await conn.request("GET", path)
                            page_ms[key][size].append((time.perf_counter() - t) * 1000)
                            assert status == 200, (path, status)
                for size in sizes:
                    for key in page_ms:
                        per[key, size].add_run(page_ms[key][size])
                    per["metrics", size].add_run(metrics_ms[size])
                    per["health", size].add_run(health_ms[size])
                    per["queue", size].add_run(queue_ms[size])
            for size in sizes:
                rss[size].add_run(rss_mb(routers[size].pid))
                rss[size].note = f"database file {paths[size].stat().st_size / 1e6:.0f} MB"
        finally:
            for conn in conns.values():
                await conn.close()
            for router in routers.values():
                await router.stop()
            for name in NODES:
                await self.fakes.call("release", name)
        for size in sizes:
            self.say(f"growth @ {size:,}: claim {statistics.median(per['claim', size].pooled):.2f} ms,"
                     f" stale {statistics.median(per['stale', size].pooled):.3f} ms,"
                     f" /health {statistics.median(per['health', size].pooled):.2f} ms,"
                     f" /api/queue {statistics.median(per['queue', size].pooled):.1f} ms,"
                     f" RSS {rss[size].pooled[0]:.1f} MB")
            for suffix in ("", "-wal", "-shm"):
                Path(str(paths[size]) + suffix).unlink(missing_ok=True)
        for key in ("claim", "claim_sql", "stale", "health", "queue", "submit", "metrics", "history", "activity"):
            ratio = self.metric(f"growth_{key}_ratio", f"{labels[key].split(' (')[0]}: 100,000 / 100 history",
                                "ratio", "ratio", "<= 2.00x" if key in ("claim", "stale", "health", "metrics") else "",
                                better="lower")
            low, high = per[key, 100], per[key, 100_000]
            for a, b in zip(low.per_run, high.per_run):
                ratio.add_run(b / a)

    # -- 7: listings over 300 jobs with 1 MB prompts (issue 11, item 8) -------------------------

    async def listings_section(self) -> None:
        jobs, mb = listings.JOBS, listings.PROMPT_BYTES / 1e6
        size = {path: self.metric(f"listing_kb_{i}", f"GET {path} response ({jobs} x {mb:g} MB prompts waiting)",
                                  "KB", "mb", "<= 300 KB") for i, path in enumerate(listings.LISTINGS)}
        alone = {path: self.metric(f"listing_ms_{i}", f"GET {path}, alone", "ms", "ms")
                 for i, path in enumerate(listings.LISTINGS)}
        health_idle = self.metric("listing_health_idle", "GET /health, no listing in flight", "ms", "ms")
        health_busy = self.metric("listing_health_busy", "GET /health while 2 clients fetch listings back to back",
                                  "ms", "ms", "p95 <= 50 ms")
        busy = self.metric("listing_busy_ms", "  a listing fetched by those 2 clients", "ms", "ms")
        rss = self.metric("listing_rss", "router RSS after the listings (VmRSS)", "MB", "mb", "<= 200 MB")
        hwm = self.metric("listing_hwm", "router peak RSS over the whole section (VmHWM)", "MB", "mb", "<= 200 MB")
        window = 3.0 if self.quick else 6.0
        # Both nodes are down (nothing listens on their ports): every job stays queued.
        nodes = [node_table(n, f"http://127.0.0.1:{free_port()}", rank, m)
                 for rank, (n, m) in enumerate(NODES.items(), 1)]
        router = await Router(self.workdir, nodes, self.workdir / "listings.db").start()
        try:
            t0 = time.perf_counter()
            await listings.fill(router, list(NODES))
            self.say(f"listings: {jobs} jobs of {mb:g} MB queued in {time.perf_counter() - t0:.1f}s")
            conn = await router.connect()
            try:
                for rep in range(self.repeats):
                    for path in listings.LISTINGS:
                        samples = []
                        for _ in range(3 if self.quick else 5):
                            n, ms = await listings.timed(conn, path)
                            samples.append(ms)
                        size[path].add_run(n / 1000)
                        alone[path].add_run(samples)
                    health_idle.add_run([(await listings.timed(conn, "/health"))[1] for _ in range(20)])
                    h, fetched = await listings.health_under_listings(router, 2, window, 400)
                    health_busy.add_run(h)
                    busy.add_run(fetched)
                    rss.add_run(rss_mb(router.pid))
                    self.say(f"listings run {rep + 1}/{self.repeats}: "
                             + ", ".join(f"{p} {size[p].runs[-1][0]:,.1f} KB" for p in listings.LISTINGS)
                             + f"; /health under load p50 {statistics.median(h):.2f} ms, max {max(h):.1f} ms"
                             f" ({len(fetched)} listings); RSS {rss.runs[-1][0]:.1f} MB")
            finally:
                await conn.close()
            hwm.add_run(rss_mb(router.pid, "VmHWM"))
            hwm.note = f"database file {(self.workdir / 'listings.db').stat().st_size / 1e6:.0f} MB"
        finally:
            await router.stop()
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.workdir / "listings.db") + suffix).unlink(missing_ok=True)

    # -- the whole run --------------------------------------------------------------------------

    async def unload_policy_section(self) -> None:
        """Jobs per minute on one node, back to back for one model, with a realistic cold load
        (2 s) and unload (0.2 s): unload after each job (the default) vs "when-idle"."""
        from gpuq.demo import FakeOllama, Script
        jobs = 6 if self.quick else 12
        rates = {policy: self.metric(f"unload_{policy}", f"jobs/min, one node, {jobs} back-to-back jobs,"
                                     f" 2 s cold load, unload = {policy}", "jobs/min", "rate")
                 for policy in ("after-each", "when-idle")}
        fake = FakeOllama(models={"qwen3-coder:30b"}, script=Script(
            tokens=40, token_delay_s=0.01, load_delay_s=2.0, unload="delay", unload_delay_s=0.2))
        await fake.start()
        try:
            for rep in range(max(self.repeats // 2, 1)):
                for policy, metric in rates.items():
                    node = dict(node_table("n1", fake.url, 1, "qwen3-coder:30b"), unload=policy)
                    router = await Router(self.workdir, [node], self.workdir / f"unload-{policy}-{rep}.db").start()
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
                self.say(f"unload policy run {rep + 1}: " + ", ".join(
                    f"{p} {m.runs[-1][0]:.1f} jobs/min" for p, m in rates.items()))
        finally:
            await fake.stop()

    async def run(self) -> None:
        if self.wants("physical") or self.wants("peers"):
            await self.physical_and_peers()
        if self.wants("unload_policy"):
            await self.unload_policy_section()
        if self.wants("front"):  # its own nodes and router
            await front.front_section(self)
        if self.wants("warm"):  # its own node and routers
            await front.warm_section(self)
        if self.wants("postgres"):  # its own throwaway PostgreSQL cluster
            await postgres.postgres_section(self)
        if self.wants("pgstore"):  # its own cluster, fakes and routers: gpuq on each engine
            await pgstore.pgstore_section(self)
        if self.wants("replay"):  # its own routers and simulated nodes, one per policy
            await replay.replay_section(self)
        if self.wants("scale"):  # its own routers, nodes and Chromium
            await scale.scale_section(self)
        needs_router = any(self.wants(s) for s in ("submit", "turnaround", "first_token", "written", "growth", "listings"))
        if not needs_router:
            return
        self.fakes = await Fakes(NODES, self.workdir / "fakes.log").start()
        try:
            if any(self.wants(s) for s in ("submit", "turnaround", "first_token")):
                router = await self.start_router(self.workdir / "router.db")
                try:
                    idle = self.metric("rss_idle", "router RSS, idle (fresh database)", "MB", "mb")
                    await asyncio.sleep(0.5)
                    idle.add_run(rss_mb(router.pid))
                    if self.wants("submit"):
                        await self.submit_section(router)
                    if self.wants("turnaround"):
                        await self.turnaround_section(router)
                    if self.wants("first_token"):
                        await self.first_token_section(router)
                finally:
                    await router.stop()
            if self.wants("written"):  # its own router and database
                await written.written_section(self)
            if self.wants("growth"):
                await self.growth_section()
            if self.wants("listings"):
                await self.listings_section()
        finally:
            await self.fakes.stop()

    def judge(self) -> None:
        m = self.metrics
        def med(key):
            return m[key].summary()["median"] if key in m and m[key].pooled else None
        checks = {
            "submit_32": lambda v: v >= 2000,
            "store_vs_huey": lambda v: v >= 1.0,
            "gap": lambda v: v <= 5.0,
            "ttft_overhead": lambda v: v <= 2.0,
            "front_ttft_overhead": lambda v: v <= 2.0,
            "front_rate_1_ratio": lambda v: v >= 0.95,
            "front_rate_20_ratio": lambda v: v >= 0.95,
            "front_cpu_20": lambda v: v <= 50.0,
            "growth_claim_ratio": lambda v: v <= 2.0,
            "growth_stale_ratio": lambda v: v <= 2.0,
            "growth_health_ratio": lambda v: v <= 2.0,
            "growth_metrics_ratio": lambda v: v <= 2.0,
            "rss_100000": lambda v: v <= 100.0,
            "listing_kb_0": lambda v: v <= 300.0,
            "listing_kb_1": lambda v: v <= 300.0,
            "listing_rss": lambda v: v <= 200.0,
            "listing_hwm": lambda v: v <= 200.0,
            "scale_page_10000": lambda v: v < 1000.0,
            "scale_claim_ratio": lambda v: v <= 2.0,
            **{k: (lambda v: v <= 1.0) for k in ("scale_q_ratio", "scale_qp_ratio", "scale_page_ratio",
                                                  "scale_events_cpu_ratio", "scale_front_rss_ratio",
                                                  "scale_front_fds_ratio")},
            "pgs_failover": lambda v: v <= (pgstore.LEASE_S + pgstore.LEASE_S / 3) * 1000,
        }
        if "listing_health_busy" in m and m["listing_health_busy"].pooled:  # its target is on p95
            m["listing_health_busy"].met = m["listing_health_busy"].summary()["p95"] <= 50.0
        for key, ok in checks.items():
            if med(key) is not None:
                m[key].met = bool(ok(med(key)))


    def targets(self) -> str:
        """Every target judged in this run, and for the ones about cost, where the time goes:
        the disk's share (durable commits counted, at this run's raw commit time) and the rest."""
        m = self.metrics

        def med(key: str) -> float:
            return m[key].summary()["median"]

        def share(key: str) -> str:
            return (f"{med(key + '_commits'):g} commits x one durable commit = {med(key + '_disk'):.2f} ms;"
                    f" the rest {med(key + '_rest'):.2f} ms")

        why = {
            "store_vs_huey": lambda: (
                f"per round trip gpuq {med('store_rt_ms'):.2f} ms = disk {med('store_rt_disk_ms'):.2f} + rest"
                f" {med('store_rt_rest_ms'):.2f}; Huey {med('huey_rt_ms'):.2f} = {med('huey_rt_disk_ms'):.2f} +"
                f" {med('huey_rt_rest_ms'):.2f}; a thread hop {med('thread_hop') * 1000:.0f} us"),
            "ttft_overhead": lambda: share("ttft"),
            "front_ttft_overhead": lambda: share("front_ttft"),
            "front_cpu_20": lambda: "a token step by step: bench/README, \"The relay, step by step\"",
            "scale_page_10000": lambda: "step by step: bench/README, \"The queue page's first render\"",
        }
        for key in m:  # the replayed day's rows, one per policy
            if key.startswith("replay_") and key.endswith("_wait_q"):
                why[key] = lambda: "the slowest calls step by step: bench/README, \"Interactive calls and the gaps\""
            elif key.startswith("replay_") and key.endswith("_busy"):
                k = key[:-len("_busy")]
                why[key] = lambda k=k: (f"idle with work in the node's own queue (between jobs) {med(k + '_idle_own'):.0%},"
                                        f" with work only on other nodes {med(k + '_idle_elsewhere'):.0%}")
        rows = ["| target | measured: median (range) | met | where the time goes |", "| --- | --- | --- | --- |"]
        for key, metric in m.items():
            if not metric.target or metric.met is None:
                continue
            s = metric.summary()
            measured = f"{fmt(s['median'], metric.kind)} ({fmt(s['min'], metric.kind)}-{fmt(s['max'], metric.kind)})"
            if metric.target.startswith("p95"):  # judged on its p95
                measured = f"p95 {fmt(s['p95'], metric.kind)}, median {measured}"
            try:
                detail = why[key]() if key in why else ""
            except KeyError:  # a row it needs was not measured in this run
                detail = ""
            unit = "" if metric.kind == "ratio" else f" {metric.unit}"
            rows.append(f"| {metric.label.strip()} {metric.target} | {measured}{unit} |"
                        f" {'yes' if metric.met else 'NO'} | {detail} |")
        return "\n".join(rows)

def disk_write_cache(path: Path) -> dict:
    """The write-cache mode of the block device holding `path`, from sysfs: "write back" (the
    disk acknowledges writes from a volatile cache, so each fsync also sends a cache flush) or
    "write through"; and whether it honours FUA writes. A virtual disk reports what the
    hypervisor exposes, not what its host does. "unknown" where sysfs cannot say (not Linux, an
    overlay or tmpfs without a block device)."""
    info = {"device": "unknown", "write_cache": "unknown", "fua": "unknown"}
    try:
        dev = os.stat(path).st_dev
        block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve(strict=True)
    except OSError:
        return info
    info["device"] = block.name
    for holder in (block, block.parent):  # a partition's queue is its disk's
        try:
            info["write_cache"] = (holder / "queue" / "write_cache").read_text().strip()
        except OSError:
            continue
        try:
            info["fua"] = (holder / "queue" / "fua").read_text().strip()
        except OSError:
            pass
        break
    return info


def machine() -> dict:
    mounts = {}
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fs = line.split()[:3]
            mounts[mnt] = f"{fs} ({dev})"
    except OSError:
        pass
    cpu = ""
    try:
        cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                    if l.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version, "platform": platform.platform(), "mounts": mounts}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="2 repeats instead of 7, fewer samples (about a minute)")
    parser.add_argument("--only", default="", help=f"comma-separated sections: {', '.join(SECTIONS)}")
    parser.add_argument("--seed", type=int, default=1, help="the replayed day's seed (section replay)")
    parser.add_argument("--out", default=str(BENCH_DIR / "results.json"), help="where to write the JSON")
    parser.add_argument("--dir", default=str(BENCH_DIR),
                        help="where the bench's databases live (must be the disk gpuq's database uses)")
    args = parser.parse_args()
    quick = args.quick or os.environ.get("GPUQ_BENCH_QUICK") == "1"
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = only - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    workdir = Path(tempfile.mkdtemp(prefix=".work-", dir=args.dir))
    bench = Bench(quick, only, workdir, args.seed)
    started = time.time()
    try:
        asyncio.run(bench.run())
    except BaseException:
        print(f"bench failed; its databases and logs are kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    bench.judge()
    metrics = list(bench.metrics.values())
    print(table(metrics))
    print("\nTargets, each against the same run's peers and disk:\n")
    print(bench.targets())
    fs = ""
    mounts = machine()["mounts"]
    best = max((m for m in mounts if str(Path(args.dir).resolve()).startswith(m)), key=len, default=None)
    if best:
        fs = mounts[best]
    cache = disk_write_cache(Path(args.dir))
    print(f"\n{len(metrics)} measures, {bench.repeats} repeats each, {time.time() - started:.0f}s;"
          f" databases on {fs or 'unknown filesystem'}, disk {cache['device']} write cache"
          f" {cache['write_cache']!r} (fua {cache['fua']}). The p95 column is the pessimistic end:"
          " the 5th percentile where higher is better (rates, most ratios), the 95th where lower is"
          " (latencies, sizes, ratios of growth); latencies: median/p95 over all samples, min-max of"
          " per-run medians.")
    out = {"meta": {**machine(), "quick": quick, "repeats": bench.repeats, "only": sorted(only),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
                    "seconds": round(time.time() - started, 1), "database_fs": fs, "disk": cache},
           "metrics": [m.as_json() for m in metrics]}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
