"""A backup of a 1 GB database while the router answers (issue 35): the router's `/health` and a
submit are timed throughout (every 50 ms and every 200 ms, one connection each), before and
during the backup, and the WAL's size is watched. Two ways to copy a live SQLite database are
measured on the same database and the same load:

- `VACUUM INTO` (what gpuq does: `POST /api/backup`, in the router's own thread), one read
  transaction, compact copy;
- the online backup API, `sqlite3.Connection.backup(target, pages=N)` in steps with a pause
  between them (the way that would let the writer in), from a process of its own: it starts
  again whenever another connection writes between two steps, which the submits do; it is given
  as long as VACUUM INTO took plus a minute, and its restarts are counted.

`backup_section` is the section `backup` of `python -m bench.run`; alone:
`.venv/bin/python -m bench.run --only backup [--quick]`."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
import time
from pathlib import Path

from .core import NODES, SETTINGS, Bench
from .growth import seed
from .procs import Router

TARGET_BYTES = 1 << 30  # a 1 GB database
PROMPT_BYTES = 1 << 20  # each seeded job's prompt: the largest a router takes is 1 MB
HEALTH_EVERY_S = 0.05
SUBMIT_EVERY_S = 0.2
STEP_PAGES = 1024  # the stepped backup API: 4 MiB a step, then a pause
STEP_PAUSE_S = 0.005


def big_prompts(path: Path, jobs: int) -> None:
    """Give the seeded history's prompts 1 MB each (random text: nothing compresses it)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA synchronous = OFF")  # seeding only
        db.execute("BEGIN")
        ids = [r[0] for r in db.execute("SELECT id FROM job ORDER BY id LIMIT ?", (jobs,))]
        for job_id in ids:
            db.execute("UPDATE job SET prompt = ? WHERE id = ?", (os.urandom(PROMPT_BYTES // 2).hex(), job_id))
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


class Probe:
    """`/health` every HEALTH_EVERY_S and a submit every SUBMIT_EVERY_S, each on its own
    connection, each latency kept with the moment it was taken; the WAL's largest size."""

    def __init__(self, router: Router, database: Path):
        self.router = router
        self.wal = Path(str(database) + "-wal")
        self.health: list[tuple[float, float]] = []
        self.submit: list[tuple[float, float]] = []
        self.wal_max = 0
        self.stop = asyncio.Event()

    async def _loop(self, every_s: float, method: str, path: str, body, into: list) -> None:
        conn = await self.router.connect()
        try:
            raw = conn.encode(method, path, body)
            while not self.stop.is_set():
                t = time.perf_counter()
                status, reply = await conn.send(raw)
                if status not in (200, 201, 503):
                    raise RuntimeError(f"{method} {path}: {status} {reply[:300]!r}")
                into.append((t, (time.perf_counter() - t) * 1000))
                try:
                    self.wal_max = max(self.wal_max, self.wal.stat().st_size)
                except FileNotFoundError:
                    pass
                await asyncio.sleep(max(every_s - (time.perf_counter() - t), 0))
        finally:
            await conn.close()

    async def run(self) -> None:
        body = {"kind": "task", "prompt": "summarise the export job's retries", "node": "n2"}
        await asyncio.gather(
            self._loop(HEALTH_EVERY_S, "GET", "/health", None, self.health),
            self._loop(SUBMIT_EVERY_S, "POST", "/api/jobs", body, self.submit),
        )

    def between(self, start: float, end: float) -> dict[str, list[float]]:
        return {
            "health": [ms for t, ms in self.health if start <= t <= end],
            "submit": [ms for t, ms in self.submit if start <= t <= end],
        }


STEPPED = """
import json, sqlite3, sys, time
src = sqlite3.connect(sys.argv[1], isolation_level=None)
dst = sqlite3.connect(sys.argv[2], isolation_level=None)
deadline = time.monotonic() + float(sys.argv[3])
pages, pause = int(sys.argv[4]), float(sys.argv[5])
seen = {"restarts": 0, "last": None, "done": False}
class Out(Exception): pass
def progress(status, remaining, total):
    if seen["last"] is not None and remaining > seen["last"]:
        seen["restarts"] += 1
    seen["last"] = remaining
    if time.monotonic() > deadline:
        raise Out()
    time.sleep(pause)
t = time.perf_counter()
try:
    src.backup(dst, pages=pages, progress=progress)
    seen["done"] = True
except Out:
    pass
seen["seconds"] = time.perf_counter() - t
print(json.dumps(seen))
"""


async def stepped_backup(database: Path, target: Path, limit_s: float) -> dict:
    """The backup API in steps, from a process of its own, for at most `limit_s`."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STEPPED,
        str(database),
        str(target),
        str(limit_s),
        str(STEP_PAGES),
        str(STEP_PAUSE_S),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    return json.loads(out)


async def backup_section(bench: Bench) -> None:
    size = TARGET_BYTES // 8 if bench.quick else TARGET_BYTES
    jobs = size // PROMPT_BYTES
    database = bench.workdir / "backup-bench.db"
    bench.say(f"backup: seeding a {size >> 20} MB database ({jobs} jobs with 1 MB prompts)")
    nodes = list(NODES.items())
    await seed(database, jobs, 0, nodes, time.time(), SETTINGS)
    await asyncio.to_thread(big_prompts, database, jobs)
    db_mb = database.stat().st_size / 1e6
    router = await bench.start_router(database)
    probe = Probe(router, database)
    probing = asyncio.create_task(probe.run())
    try:
        await asyncio.sleep(3)  # the load alone first: the baseline
        base_end = time.perf_counter()
        baseline = probe.between(0, base_end)
        conn = await router.connect()
        target = bench.workdir / "backup-copy.db"
        t = time.perf_counter()
        status, raw = await conn.send(conn.encode("POST", "/api/backup", {"path": str(target), "force": True}))
        took = time.perf_counter() - t
        await conn.close()
        if status != 200:
            raise RuntimeError(f"POST /api/backup: {status} {raw[:300]!r}")
        during = probe.between(t, t + took)
        phases = json.loads(raw)["phases"]
        ends = [t, t + phases["copied"], t + phases["checked"], t + phases["synced"]]
        by_phase = {name: probe.between(a, b) for name, a, b in zip(("copy", "check", "sync"), ends, ends[1:])}
        wal_vacuum = probe.wal_max
        probe.wal_max = 0
        copy_mb = target.stat().st_size / 1e6
        target.unlink()
        # The backup API, stepped, under the same load, given VACUUM INTO's time and a minute.
        s = time.perf_counter()
        stepped = await stepped_backup(database, bench.workdir / "backup-stepped.db", took + 60)
        stepped_during = probe.between(s, time.perf_counter())
        (bench.workdir / "backup-stepped.db").unlink(missing_ok=True)
    finally:
        probe.stop.set()
        await asyncio.gather(probing, return_exceptions=True)
        await router.stop()
    for suffix in ("", "-wal", "-shm"):
        Path(str(database) + suffix).unlink(missing_ok=True)

    def worst(samples: list[float]) -> float:
        return max(samples) if samples else float("nan")

    label = f"{db_mb:,.0f} MB"
    bench.metric(
        "backup_s", f"backup of a {label} database, router answering (VACUUM INTO), s", "s", "count", "<= 60"
    ).add_run(took)
    bench.metric("backup_copy_mb", "its copy (compact, integrity checked)", "MB", "mb").add_run(copy_mb)
    start = 0.0
    for name, what in (
        ("copy", "copied (VACUUM INTO)"),
        ("check", "checked (integrity_check)"),
        ("sync", "fsynced, renamed"),
    ):
        end = phases[{"copy": "copied", "check": "checked", "sync": "synced"}[name]]
        bench.metric(f"backup_{name}_s", f"  of which {what}, s", "s", "count").add_run(end - start)
        start = end
        for probe_of, label in (("health", "/health"), ("submit", "submit")):
            bench.metric(f"backup_{name}_{probe_of}_max", f"  {label} while {what}, the longest", "ms", "ms").add_run(
                worst(by_phase[name][probe_of])
            )
    bench.metric("backup_wal_mb", "the WAL's largest size during it", "MB", "mb").add_run(wal_vacuum / 1e6)
    for what, name in (("health", "/health"), ("submit", "submit")):
        bench.metric(f"backup_{what}_base", f"{name} before the backup", "ms", "ms").add_run(baseline[what])
        bench.metric(f"backup_{what}", f"{name} during the backup", "ms", "ms").add_run(during[what])
        bench.metric(f"backup_{what}_max", f"{name} during the backup, the longest", "ms", "ms", "< 1000").add_run(
            worst(during[what])
        )
        bench.metric(
            f"backup_stepped_{what}_max", f"{name} during the stepped backup API, the longest", "ms", "ms"
        ).add_run(worst(stepped_during[what]))
    bench.metric(
        "backup_stepped_s",
        f"stepped backup API ({STEP_PAGES} pages a step), s: {'finished' if stepped['done'] else 'NOT finished'}"
        f" ({stepped['restarts']} restarts)",
        "s",
        "count",
    ).add_run(stepped["seconds"])
