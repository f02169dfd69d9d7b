"""`GET /api/usage` over a year of history (issue 45, item 3; target: under 200 ms): JOBS jobs
(default 100,000) spread evenly over the past 365 days, five people, two nodes, two models, both
lanes, each job with one run (its tokens, its load time, its wait), seeded by direct SQL into a
database the migrations made. Two databases side by side:

- `kept`: retention off, every job and run still stored;
- `swept`: retention's default delete after 90 days done: the older runs are only in usage_run
  (migration 027), as retention's delete leaves them.

Then the real router (`gpuq serve`, its nodes down: nothing runs) on each, and each query timed
through HTTP, the two routers in turns (SAMPLES each, p50 and max): the page's four (by node by
the hour over 7 days, by user and by model by the day over a year, by lane by the hour over 30
days) and the CLI's default (by user, 7 days). The answers of both databases are checked equal.

Alone: `.venv/bin/python -m bench.usage [JOBS]`."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpuq.jobs import POSITION_GAP, iso
from gpuq.store import Store, sqlite, usage

from .core import NODES, SETTINGS
from .procs import Router, free_port, node_table

DAY_S = 86400.0
PEOPLE = ("ana", "bo", "chen", "dara", "eli")
CLIENTS = ("gpuq-cli/1.0", "continue/1.2", "python-httpx/0.28")
KEPT_DAYS = 90  # retention's default delete of done jobs
SAMPLES = 15
QUERIES = (
    "by=node&since=7d&step=1h",
    "by=user&since=365d&step=1d",
    "by=model&since=365d&step=1d",
    "by=lane&since=30d&step=1h",
    "by=user&since=7d&step=1h",
)
JOB = "id, kind, state, node, model, prompt, position, placement, run_id, created_at, finished_at, owner, client, lane"
RUN = (
    "id, job_id, node, model, state, started_at, progress_at, work_done_at, finished_at, done_reason,"
    " eval_count, prompt_eval_count, load_duration_ns, eval_duration_ns"
)


def marks(columns: str) -> str:
    return ", ".join("?" * len(columns.split(",")))


def history(jobs: int, now: float) -> list[dict]:
    """`jobs` jobs over the past year, oldest first, each with its one run's figures."""
    rng = random.Random(jobs)
    start = now - 365 * DAY_S
    step = (365 * DAY_S - 3600) / jobs
    made = []
    for i in range(jobs):
        node, model = list(NODES.items())[i % len(NODES)]
        created = start + i * step
        wait = rng.expovariate(1 / 20)
        began = created + wait
        ran = rng.uniform(5, 300)
        made.append(
            {
                "i": i,
                "id": f"{int(created)}-{i:08x}",
                "node": node,
                "model": model,
                "owner": PEOPLE[rng.randrange(len(PEOPLE))],
                "client": CLIENTS[rng.randrange(len(CLIENTS))],
                "lane": "interactive" if rng.random() < 0.6 else "batch",
                "created": created,
                "began": began,
                "ended": began + ran,
                "wait": wait,
                "load": rng.choice((0.0, 0.0, 0.0, rng.uniform(2, 30))),
                "tokens_in": rng.randrange(50, 8000),
                "tokens_out": rng.randrange(10, 2000),
            }
        )
    return made


def job_row(j: dict) -> tuple:
    return (
        j["id"], "task", "done", j["node"], j["model"], "review the export job", (j["i"] + 1) * POSITION_GAP,
        "asked", j["i"] + 1, iso(j["created"]), iso(j["ended"]), j["owner"], j["client"], j["lane"],
    )  # fmt: skip


def run_row(j: dict) -> tuple:
    ended = iso(j["ended"])
    return (
        j["i"] + 1, j["id"], j["node"], j["model"], "done", iso(j["began"]), ended, ended, ended, "stop",
        j["tokens_out"], j["tokens_in"], int(j["load"] * 1e9), int((j["ended"] - j["began"]) * 1e9),
    )  # fmt: skip


async def seed(path: Path, made: list[dict], now: float, swept: bool) -> None:
    """The migrated database, then the rows: every job stored; swept, the older ones then kept in
    usage_run and deleted as retention's delete does (store/usage.py keep, then the rows go)."""
    store = Store(path)
    await store.open()
    await store.configure(SETTINGS, [])
    await store.close()
    cut = now - KEPT_DAYS * DAY_S
    gone = [j["id"] for j in made if swept and j["ended"] < cut]
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN")
        db.executemany(f"INSERT INTO job ({JOB}) VALUES ({marks(JOB)})", [job_row(j) for j in made])
        db.executemany(f"INSERT INTO run ({RUN}) VALUES ({marks(RUN)})", [run_row(j) for j in made])
        for at in range(0, len(gone), 500):  # retention's batches
            ids = gone[at : at + 500]
            usage.keep(db, sqlite, ids, ",".join("?" * len(ids)))
            db.execute(f"DELETE FROM run WHERE job_id IN ({','.join('?' * len(ids))})", ids)
            db.execute(f"DELETE FROM job WHERE id IN ({','.join('?' * len(ids))})", ids)
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()


async def timed(conn, path: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    status, raw = await conn.send(conn.encode("GET", path))
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {raw[:300]!r}")
    return (time.perf_counter() - t) * 1000, raw


def rounded(value: object) -> object:
    """A float to the millisecond: sums of the same seconds in another order differ in their last bits."""
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v) for v in value]
    return value


def same(a: bytes, b: bytes) -> bool:
    """Both answers alike but for their `until` (each router's own clock)."""
    x, y = json.loads(a), json.loads(b)
    x.pop("until"), y.pop("until")
    return rounded(x) == rounded(y)


async def measure(jobs: int) -> None:
    now = time.time()
    made = history(jobs, now)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        nodes = [
            node_table(n, f"http://127.0.0.1:{free_port()}", rank, m) for rank, (n, m) in enumerate(NODES.items(), 1)
        ]
        routers = {}
        for name in ("kept", "swept"):
            t = time.perf_counter()
            await seed(work / f"{name}.db", made, now, swept=name == "swept")
            print(f"{name}: {jobs:,} jobs seeded in {time.perf_counter() - t:.1f}s", file=sys.stderr)
            routers[name] = await Router(work, nodes, work / f"{name}.db").start()
        try:
            conns = {name: await r.connect() for name, r in routers.items()}
            print(f"{'GET /api/usage?':34} {'kept p50':>9} {'max':>7} {'swept p50':>10} {'max':>7}  KB")
            for query in QUERIES:
                path = f"/api/usage?{query}"
                ms: dict[str, list[float]] = {name: [] for name in routers}
                answers: dict[str, bytes] = {}
                for _ in range(SAMPLES):  # the two routers in turns: they share the machine's noise
                    for name, conn in conns.items():
                        took, answers[name] = await timed(conn, path)
                        ms[name].append(took)
                if not same(answers["kept"], answers["swept"]):
                    raise RuntimeError(f"{query}: the swept database answers otherwise than the kept one")
                k, s = ms["kept"], ms["swept"]
                print(
                    f"{query:34} {statistics.median(k):9.1f} {max(k):7.1f} {statistics.median(s):10.1f} {max(s):7.1f}"
                    f"  {len(answers['kept']) / 1000:.0f}"
                )
            for conn in conns.values():
                await conn.close()
        finally:
            for r in routers.values():
                await r.stop()


if __name__ == "__main__":
    asyncio.run(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))
