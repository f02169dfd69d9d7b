"""Section `year`: a compressed year of a five-person lab (issue 35, "Measured"). The year is
lived in-process, through gpuq's own Store with a driven clock (the Store's `clock`), twice side
by side from the same seed: once with the default retention (the real sweep, `Sweeper.run_once`,
at the end of every day, archiving to a directory of its own) and once with retention off (no
sweep: every job keeps everything). The clock runs over the year that ends now, so the real
router later sees its history as past. Then the real router (a subprocess) on the database at the
start of the year (a copy taken before day one) and on the database at the end, side by side in
turns: claim, submit, `/health` and the queue page's data; then `gpuq backup` through the router
at the end and `gpuq restore` of that backup into a new file, checked job by job.

A weekday (`DAY_FULL`, `DAY_QUICK`): an editor's autocomplete bursts (`/api/generate` calls with
the 8 KB of the file around the cursor an editor sends; in each burst of four, the person kept typing and three were
abandoned, one of them while it ran), chat (`/api/chat` conversations whose requests carry the
whole conversation so far; one in three is about a screenshot of its own, sent again with every
later turn, so that storing a request's parts once per content stores it once), the
nightly sweep (batch-lane tasks at 02:00) and critiques of some of its results. A weekend day has
only the nightly sweep and its critiques. Now and then (`DOWN_EVERY_DAYS`) node n2 is down for a working day: its
calls wait and run when it is back."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import random
import shutil
import sqlite3
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpuq.config import Settings
from gpuq.store import NewJob, NodeInfo, Store
from gpuq.upkeep.retention import Sweeper, Swept

from .core import NODES, SETTINGS, Bench
from .procs import Router, clear_queues

DAY_S = 86400.0
YEAR_DAYS = 365
DOWN_EVERY_DAYS = 23  # n2 is down from 09:00 to 17:00 on these days
CLAIM_ROUND = 5  # claims measured in a row on one router before the other's turn
CODER, CHAT = "n1", "n2"  # qwen3-coder takes the editor's calls, llama3.2 the chats


@dataclass(frozen=True)
class Day:
    """One weekday's work; a weekend day has only the nightly sweep and its critiques."""

    bursts: int  # autocomplete bursts of 4 calls, 3 of them abandoned
    chats: int  # conversations of `turns` turns
    turns: int
    sweep: int  # batch-lane tasks at 02:00
    critiques: int  # critiques of the sweep's results (each fans out to the other node)

    def jobs(self, weekday: bool) -> int:
        nightly = self.sweep + self.critiques
        return nightly + (self.bursts * 4 + self.chats * self.turns if weekday else 0)


DAY_FULL = Day(bursts=6, chats=3, turns=4, sweep=10, critiques=2)  # 48 jobs a weekday, 12 a weekend day
DAY_QUICK = Day(bursts=2, chats=1, turns=3, sweep=4, critiques=1)  # 16 jobs a weekday, 5 a weekend day

CONTEXT = "    def retry(self, budget):\n        for attempt in range(budget):\n            yield attempt\n"
ANSWER = "The export job retries without a cap when the budget is unset; cap it and log each retry. "
IMAGE_BYTES = 150_000  # a screenshot, as sent: base64 in the request's message
PREFIX_CHARS, SUFFIX_CHARS = 6000, 2000  # the code around the cursor an editor sends (as bench/storm.py)


def _text(rng: random.Random, size: int, base: str) -> str:
    """`size` characters of `base`'s words, shuffled: each job's text its own (as a lab's are),
    so that the archive's gzip cannot fold one job's text into the next one's."""
    words = (base * (size // len(base) + 1))[:size].split(" ")
    rng.shuffle(words)
    return " ".join(words)[:size]


class Lab:
    """Five people's year on one Store: the same seed gives the same year on every store."""

    def __init__(self, store: Store, clock: list[float], day: Day, seed: int, sweeper: Sweeper | None):
        self.store = store
        self.clock = clock  # [now]: shared with the store's clock
        self.day = day
        self.rng = random.Random(seed)
        self.sweeper = sweeper
        self.swept: list[Swept] = []
        self.up = {name: True for name in NODES}
        self.sweep_ids: list[str] = []

    def infos(self) -> list[NodeInfo]:
        return [
            NodeInfo(n, rank, ("task", "critique"), m, self.up[n], models=frozenset({m}))
            for rank, (n, m) in enumerate(NODES.items(), 1)
        ]

    async def submit(self, new: NewJob) -> list[dict]:
        return await self.store.submit(new, self.infos(), new.owner or "bench")

    async def work(self, node: str, seconds: float, output: str) -> None:
        """The node works through its queue, each job `seconds` long on the driven clock."""
        while self.up[node] and (job := await self.store.claim(node)) is not None:
            self.clock[0] += seconds
            await self.store.finish(job["id"], job["run_id"], "done", None, output=output)

    async def live(self, day: int, start: float) -> None:
        weekday = day % 7 < 5
        self.clock[0] = start + 2 * 3600
        await self.nightly()
        if weekday:
            down = day % DOWN_EVERY_DAYS == DOWN_EVERY_DAYS - 1
            if down:
                self.clock[0] = start + 9 * 3600
                self.up[CHAT] = False
                await self.store.set_node_health(CHAT, False, "connection refused")
            slots = ["burst"] * self.day.bursts + ["chat"] * self.day.chats
            self.rng.shuffle(slots)
            for i, what in enumerate(slots):  # through the working day, 09:00 to 17:00
                self.clock[0] = start + (9 + 8 * i / len(slots)) * 3600
                await (self.burst() if what == "burst" else self.chat())
            if down:
                self.clock[0] = start + 17 * 3600
                self.up[CHAT] = True
                await self.store.set_node_health(CHAT, True, None)
                await self.work(CHAT, 20, _text(self.rng, 1500, ANSWER))
        self.clock[0] = start + DAY_S - 60
        if self.sweeper is not None:
            self.swept.append(await self.sweeper.run_once())

    async def nightly(self) -> None:
        owner = self.rng.choice(("ana", "ben"))
        self.sweep_ids = []
        for _ in range(self.day.sweep):
            prompt = f"Review this module for retry bugs:\n{_text(self.rng, 800, CONTEXT)}"
            [job] = await self.submit(NewJob("task", prompt, owner=owner, client="nightly-sweep/1.0"))
            self.sweep_ids.append(job["id"])
        for node in NODES:
            await self.work(node, 90, _text(self.rng, 2500, ANSWER))
        for parent in self.sweep_ids[: self.day.critiques]:
            await self.submit(NewJob("critique", None, parent=parent, owner=owner, client="nightly-sweep/1.0"))
        for node in NODES:
            await self.work(node, 60, _text(self.rng, 800, ANSWER))

    async def burst(self) -> None:
        """Four completions as a person types: three abandoned (the first while it ran)."""
        ids = []
        for _ in range(4):
            body = {
                "model": NODES[CODER],
                "prompt": _text(self.rng, PREFIX_CHARS, CONTEXT),
                "suffix": _text(self.rng, SUFFIX_CHARS, CONTEXT),
                "options": {"num_predict": 64},
                "stream": True,
            }
            request = json.dumps({"path": "/api/generate", "user_agent": "continue/1.2", "body": body})
            [job] = await self.submit(
                NewJob(
                    "task",
                    body["prompt"][-200:],
                    model=NODES[CODER],
                    endpoint="/api/generate",
                    request=request,
                    owner=self.rng.choice(("cleo", "dev")),
                    client="continue/1.2",
                    lane="interactive",
                )
            )
            ids.append(job["id"])
        running = await self.store.claim(CODER)
        if running is not None:  # the first call runs; the person types on
            self.clock[0] += 0.3
            await self.store.heartbeat(running["run_id"], "    for attempt in")
        for job_id in ids[:3]:
            await self.store.delete(job_id, "cleo (ollama 127.0.0.1)", reason="the client went away")
        self.clock[0] += 0.5
        await self.work(CODER, 0.8, "range(budget):\n        yield attempt\n")

    async def chat(self) -> None:
        """A conversation: each turn's request carries every message so far (and the image)."""
        owner = self.rng.choice(("ana", "ben", "cleo", "dev", "eve"))
        messages: list[dict] = []
        # One in three conversations is about a screenshot of its own, sent again every turn.
        image = base64.b64encode(self.rng.randbytes(IMAGE_BYTES)).decode() if self.rng.random() < 1 / 3 else None
        for turn in range(self.day.turns):
            ask = {"role": "user", "content": _text(self.rng, 400, ANSWER)}
            if image and turn == 0:
                ask["images"] = [image]
            messages.append(ask)
            body = {"model": NODES[CHAT], "messages": messages, "stream": True}
            request = json.dumps({"path": "/api/chat", "user_agent": "open-webui", "body": body})
            await self.submit(
                NewJob(
                    "task",
                    ask["content"],
                    model=NODES[CHAT],
                    endpoint="/api/chat",
                    request=request,
                    owner=owner,
                    client="open-webui",
                    lane="interactive",
                )
            )
            answer = _text(self.rng, 1500, ANSWER)
            await self.work(CHAT, 20, answer)
            messages.append({"role": "assistant", "content": answer})
            self.clock[0] += 60


def _size_mb(path: Path) -> float:
    return sum(Path(str(path) + s).stat().st_size for s in ("", "-wal") if Path(str(path) + s).exists()) / 1e6


def compacted_mb(path: Path) -> float:
    """The database's size once compacted (VACUUM INTO, as `gpuq backup` copies it)."""
    copy = path.with_suffix(".compact.db")
    db = sqlite3.connect(path)
    try:
        db.execute("VACUUM INTO ?", (str(copy),))
    finally:
        db.close()
    size = copy.stat().st_size / 1e6
    copy.unlink()
    return size


def empty_in_pages_mb(path: Path) -> float:
    """Bytes left unused inside the database's pages (SQLite's dbstat): what pruning a row's
    bulk leaves in a page that held little else, which only a VACUUM takes back."""
    db = sqlite3.connect(path)
    try:
        return float(db.execute("SELECT SUM(unused) FROM dbstat").fetchone()[0] or 0) / 1e6
    finally:
        db.close()


def _checkpoint(path: Path) -> None:
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()


async def live_the_year(bench: Bench, on: Path, off: Path, start_copy: Path) -> tuple[Lab, dict[str, int]]:
    """The year on two stores in turns, day by day: `on` with the default retention, `off` without."""
    day = DAY_QUICK if bench.quick else DAY_FULL
    begin = (time.time() // DAY_S - YEAR_DAYS) * DAY_S  # midnight a year ago (UTC)
    stores, labs = [], []
    for path in (on, off):
        await (s := Store(path)).open()  # the schema
        await s.configure(SETTINGS, [])
        await s.close()
    shutil.copy(on, start_copy)  # the database at the start of the year
    for path, retention in ((on, True), (off, False)):
        clock = [begin]
        store = Store(path, clock=lambda clock=clock: clock[0])
        await store.open()
        stores.append(store)
        settings = Settings(retention_archive=bench.workdir / "year-archive")
        sweeper = Sweeper(store, lambda settings=settings: settings, lambda: None) if retention else None
        labs.append(Lab(store, clock, day, bench.seed, sweeper))
    t = time.perf_counter()
    try:
        for d in range(YEAR_DAYS):
            await asyncio.gather(*(lab.live(d, begin + d * DAY_S) for lab in labs))
            if d % 30 == 29:
                bench.say(
                    f"year: day {d + 1}, {_size_mb(on):.1f} MB with retention, {_size_mb(off):.1f} MB without"
                    f" ({time.perf_counter() - t:.0f}s)"
                )
    finally:
        for store in stores:
            await store.close()
    for path in (on, off):
        _checkpoint(path)
    weekdays = sum(1 for d in range(YEAR_DAYS) if d % 7 < 5)
    counts = {
        "weekday": day.jobs(True),
        "weekend": day.jobs(False),
        "jobs": weekdays * day.jobs(True) + (YEAR_DAYS - weekdays) * day.jobs(False),
        "seconds": int(time.perf_counter() - t),
    }
    return labs[0], counts


class Probe:
    """One router's side of the turns: a claim, submits, `/health` and the queue page's data."""

    def __init__(self, bench: Bench, router: Router):
        self.bench = bench
        self.router = router
        self.times: dict[str, list[float]] = {"claim": [], "submit": [], "health": [], "queue": []}
        self.rounds: list[list[float]] = []  # the claims, round by round

    async def claims(self, jobs: int) -> None:
        """A claim as the router makes it: a job's last byte at the node to the next job's
        request there (the finish and the next claim are one commit), `jobs` jobs queued behind
        a held head, then released."""
        fakes, node = self.bench.fakes, CODER
        conn = await self.router.connect()
        try:
            await fakes.call("reset", node)
            await fakes.call("hold", node)
            for i in range(jobs + 1):
                status, body = await conn.request(
                    "POST", "/api/jobs", {"kind": "task", "prompt": f"job {i}", "node": node}
                )
                assert status == 201, body
            since = time.monotonic()
            await fakes.call("release", node)
            await self.bench.wait_idle(self.router, node, 60)
        finally:
            await conn.close()
        gens = sorted((e for e in await fakes.log(node) if e[3] and e[2] >= since), key=lambda e: e[1])
        self.rounds.append([(b[1] - a[2]) * 1000 for a, b in zip(gens, gens[1:])])
        self.times["claim"] += self.rounds[-1]

    async def read(self, conn, i: int, what: str) -> None:
        """One sample: a submit to the held node (it queues), `/health` or `/api/queue`."""
        t = time.perf_counter()
        if what == "submit":
            status, body = await conn.request(
                "POST", "/api/jobs", {"kind": "task", "prompt": f"probe {i}", "node": CHAT}
            )
            assert status == 201, body
        else:
            status, body = await conn.request("GET", "/health" if what == "health" else "/api/queue")
            assert status in (200, 503), (status, body)
        self.times[what].append((time.perf_counter() - t) * 1000)


def paired_ratios(start: Probe, end: Probe, key: str) -> list[float]:
    """End / start, pair by pair as the routers took turns: each sample's (a claim: each
    round's median's), so a change in the machine's load falls on both sides of a pair."""
    if key == "claim":
        return [statistics.median(e) / statistics.median(s) for s, e in zip(start.rounds, end.rounds)]
    return [e / s for s, e in zip(start.times[key], end.times[key])]


async def reads_in_turns(probes: list[Probe], samples: int) -> None:
    """Submits, then `/health` and `/api/queue`, the routers taking turns sample by sample, so
    the machine's changing load falls on both alike."""
    conns = [await p.router.connect() for p in probes]
    try:
        for whats in (("submit",), ("health", "queue")):
            for i in range(samples):
                for what in whats:
                    for probe, conn in zip(probes, conns):
                        await probe.read(conn, i, what)
    finally:
        for conn in conns:
            await conn.close()


async def queued_order(router: Router) -> dict[str, list[str]]:
    """Each node's waiting jobs in order, as the router's queue shows them."""
    conn = await router.connect()
    try:
        status, body = await conn.request("GET", "/api/queue?limit=1000")
        assert status == 200, body
    finally:
        await conn.close()
    return {n["name"]: [j["id"] for j in n["queued"]] for n in body["nodes"]}


def job_ids(path: Path) -> list[str]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [r[0] for r in db.execute("SELECT id FROM job ORDER BY id")]
    finally:
        db.close()


async def cli(*args: str, env: dict[str, str] | None = None) -> tuple[float, str]:
    """`gpuq ARGS` as a person runs it: its time (s) and its output; a failure raises."""
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuq.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**{k: v for k, v in os.environ.items() if k != "GPUQ_TOKEN"}, **(env or {})},
    )
    out, _ = await proc.communicate()
    took = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"gpuq {' '.join(args)} exited {proc.returncode}: {out.decode()[-2000:]}")
    return took, out.decode()


async def backup_and_restore(bench: Bench, router: Router) -> dict[str, float | int]:
    """`gpuq backup` through the router at the end (jobs waiting behind held heads), then
    `gpuq restore` of it into a new file, opened with gpuq's Store: every job id and each node's
    queue order must be those of the router's database."""
    order = await queued_order(router)
    copy = bench.workdir / "year-backup.db"
    before = set(job_ids(router.database))  # the nodes are held: only the router's sweep could
    took, _ = await cli("backup", str(copy), env={"GPUQ_ROUTER": router.url})  # delete a job meanwhile
    ids = job_ids(router.database)
    restored = bench.workdir / "year-restored.db"
    t = time.perf_counter()
    await cli("restore", str(copy), "--database", str(restored))
    store = Store(restored)
    await store.open()
    try:
        got = {name: [j["id"] for j in (await store.queue(name, 1000))[1]] for name in NODES}
    finally:
        await store.close()
    restored_ids = job_ids(restored)
    round_trip = time.perf_counter() - t
    if not set(ids) <= set(restored_ids) <= before:  # the copy is of a moment between the two reads
        lost, extra = set(ids) - set(restored_ids), set(restored_ids) - before
        raise RuntimeError(f"the restored database differs: {len(lost)} jobs lost, {len(extra)} not in the source")
    if got != order:
        raise RuntimeError(f"the restored queue order differs: {got} != {order}")
    return {
        "backup_s": took,
        "restore_s": round_trip,
        "jobs": len(ids),
        "queued": sum(len(v) for v in order.values()),
        "backup_mb": copy.stat().st_size / 1e6,
    }


async def year_section(bench: Bench) -> None:
    on, off = bench.workdir / "year.db", bench.workdir / "year-off.db"
    start_copy = bench.workdir / "year-start.db"
    bench.say("year: living a compressed year on two stores (default retention, retention off)")
    lab, counts = await live_the_year(bench, on, off, start_copy)
    day = f"a weekday {counts['weekday']} jobs, a weekend day {counts['weekend']}; {counts['jobs']:,} jobs"
    bench.say(f"year: lived in {counts['seconds']}s ({day})")
    size_on, size_off = _size_mb(on), _size_mb(off)
    bench.metric("year_db_off_mb", f"database after the year, retention off ({day})", "MB", "mb").add_run(size_off)
    bench.metric("year_db_on_mb", "database after the year, default retention", "MB", "mb").add_run(size_on)
    bench.metric(
        "year_db_ratio",
        "database after the year: default retention / retention off",
        "x",
        "ratio",
        "<= 0.10",
        better="lower",
    ).add_run(size_on / size_off)
    bench.metric(
        "year_db_on_empty_mb", "  of which space left empty inside its pages (dbstat: pruned rows' pages)", "MB", "mb"
    ).add_run(empty_in_pages_mb(on))
    small_on, small_off = compacted_mb(on), compacted_mb(off)
    bench.metric("year_db_on_compact_mb", "  the same compacted (VACUUM INTO)", "MB", "mb").add_run(small_on)
    bench.metric(
        "year_db_compact_ratio",
        "database after the year, both compacted: default retention / off",
        "x",
        "ratio",
        better="lower",
    ).add_run(small_on / small_off)
    archive = sum(f.stat().st_size for f in (bench.workdir / "year-archive").glob("*")) / 1e6
    bench.metric("year_archive_mb", "  the archive written by the sweeps (gzip JSON Lines)", "MB", "mb").add_run(
        archive
    )
    bench.metric(
        "year_sweep_hold", f"the sweep's longest hold of the writer, {len(lab.swept)} daily sweeps", "ms", "ms", "<= 50"
    ).add_run(max(s.longest_hold_ms for s in lab.swept))
    worst = sorted(range(len(lab.swept)), key=lambda d: -lab.swept[d].longest_hold_ms)[:3]
    bench.say(
        "year: the longest holds: "
        + "; ".join(
            f"day {d + 1}: {lab.swept[d].longest_hold_ms:.1f} ms, {lab.swept[d].batches} batches,"
            f" pruned {lab.swept[d].pruned['jobs']} jobs, archived {lab.swept[d].archived['bytes'] / 1e6:.1f} MB"
            for d in worst
        )
    )
    bench.metric(
        "year_sweep_hold_daily", "  each daily sweep's longest hold of the writer (365 samples)", "ms", "ms"
    ).add_run([sw.longest_hold_ms for sw in lab.swept])
    bench.metric(
        "year_sweep_batch", "  the sweep's longest batch, its queueing and durable commit included", "ms", "ms"
    ).add_run(max(s.longest_batch_ms for s in lab.swept))
    bench.metric("year_sweep_s", "  the longest daily sweep, whole", "s", "count").add_run(
        max(s.seconds for s in lab.swept)
    )
    compactions = [s.compacted for s in lab.swept if s.compacted]
    bench.metric(
        "year_compactions", "the sweep's compactions of the file at idle ([retention] compact, VACUUM)", "", "count"
    ).add_run(len(compactions))
    bench.metric(
        "year_compaction_s",
        "  the longest one (it holds the writer; run only with no job waiting or running)",
        "s",
        "count",
    ).add_run(max((c["seconds"] for c in compactions), default=0.0))
    # The real router on the database at the start and at the end, side by side in turns.
    labels = {
        "claim": "claim (a job's last byte -> the next job's request at the node)",
        "submit": "submit (POST /api/jobs)",
        "health": "GET /health",
        "queue": "the queue page's data (GET /api/queue)",
    }
    rows = {
        (k, when): bench.metric(f"year_{k}_{when}", f"{v} at the year's {when}", "ms", "ms")
        for k, v in labels.items()
        for when in ("start", "end")
    }
    ratio = {
        k: bench.metric(
            f"year_{k}_ratio",
            f"{v.split(' (')[0]}: end / start, median of the pairs",
            "x",
            "ratio",
            "<= 1.50x",
            better="lower",
        )
        for k, v in labels.items()
    }
    routers = {"start": await bench.start_router(start_copy), "end": await bench.start_router(on)}
    try:
        samples = 30 if bench.quick else 60
        for rep in range(bench.repeats):
            probes = {when: Probe(bench, r) for when, r in routers.items()}
            turns = [probes[w] for w in (("start", "end") if rep % 2 == 0 else ("end", "start"))]
            for _ in range(samples // CLAIM_ROUND):  # short rounds, the routers in turns
                for probe in turns:
                    await probe.claims(CLAIM_ROUND)
            await bench.fakes.call("hold", CHAT)  # both routers' submits wait behind a held head
            try:
                await reads_in_turns(turns, samples)
                if rep == bench.repeats - 1:
                    restored = await backup_and_restore(bench, routers["end"])
                for r in routers.values():
                    await clear_queues(r, [CHAT])
            finally:
                await bench.fakes.call("release", CHAT)
            for r in routers.values():
                await bench.wait_idle(r, CHAT, 30)
            for key in labels:
                for when in ("start", "end"):
                    rows[key, when].add_run(probes[when].times[key])
                ratio[key].add_run(paired_ratios(probes["start"], probes["end"], key))
    finally:
        for r in routers.values():
            await r.stop()
    bench.metric(
        "year_backup_s",
        f"gpuq backup through the router at the year's end ({restored['backup_mb']:.1f} MB copy)",
        "s",
        "count",
    ).add_run(restored["backup_s"])
    bench.metric(
        "year_restore_s",
        f"gpuq restore into a new file, opened and checked: all {restored['jobs']:,} job ids and"
        f" the order of the {restored['queued']} waiting kept",
        "s",
        "count",
    ).add_run(restored["restore_s"])
    for path in (on, off, start_copy):
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
