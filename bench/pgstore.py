"""`--only pgstore`: gpuq's own store on PostgreSQL beside SQLite, in the same run (issue 27).

A throwaway cluster (tests/pg.py's Cluster, durable: fsync on, synchronous_commit on, checked
before measuring; its data dir in /tmp, the same disk here) and, for each engine, the same
measurement taken alternately inside every repeat, so both share the machine's noise:

1. durable submit: `POST /api/jobs` from 32 keep-alive clients against a real router (`gpuq
   serve`) on each engine, each node busy with a held job (as the `submit` section);
2. Store round trip: `Store.submit`, then `Store.finish(..., claim_node=...)` of the running job,
   which claims the next, one job at a time (peers.StoreWorker, as the `peers` section);
3. first-token overhead: an idle node (quiet for QUIET_S), submit -> `GET /api/jobs/{id}/stream`
   -> first `{"text"}` line, minus the same chat request straight to the fake, in pairs;
4. claim latency at 100 and 100,000 jobs of history (growth.py's rows, seeded by SQL on each
   engine), `Store.claim` with its durable commit, the four stores taking turns sample by sample;
5. failover: two routers on one PostgreSQL database with a short lease (LEASE_S), one node; the
   router holding the node is SIGKILLed while the node runs a job (the fake holds its reply),
   another job queued behind it; measured from the kill to that next job's chat request reaching
   the node (the fake logs arrival times, on the same CLOCK_MONOTONIC). The other router takes
   the node once the dead router's lease expired (its last renewal + LEASE_S, renewed every
   LEASE_S / 3) at its own next renewal: between 2/3 and 4/3 of the lease after the kill. A new
   router replaces the dead one for the next repeat, whose kill falls on the survivor.

The fakes' nodes are separate per router (s1/s2 for SQLite, p1/p2 for PostgreSQL, f1 for the
failover pair) in one fakes process."""

from __future__ import annotations

import asyncio
import random
import re
import statistics
import time
from datetime import datetime
from typing import TYPE_CHECKING

import aiohttp
import psycopg

from gpuq.store import NodeInfo, Store
from tests.pg import Cluster

from . import growth, peers
from .core import SETTINGS
from .procs import QUIET_S, Fakes, Router, clear_queues, first_stream_line, node_table

if TYPE_CHECKING:
    from .core import Bench
    from .stats import Metric

MODELS = ("qwen3-coder:30b", "llama3.2:latest")
ENGINES = {"sqlite": "SQLite", "pg": "PostgreSQL"}
NODES = {"sqlite": ("s1", "s2"), "pg": ("p1", "p2")}
FAILOVER_NODE = "f1"
LEASE_S = 2.0
CLIENTS = 32
HISTORY = (100, 100_000)
WAITING = 1000


class Pair:
    """Two routers' worth of state for the failover rows: the routers up, the node they share."""

    def __init__(self, bench: Bench, fakes: Fakes, dsn: str):
        self.bench, self.fakes, self.dsn = bench, fakes, dsn
        self.routers: list[Router] = []
        self.node = [node_table(FAILOVER_NODE, fakes.urls[FAILOVER_NODE], 1, MODELS[0], roles=("task",))]

    async def add(self) -> Router:
        router = await Router(self.bench.workdir, self.node, self.dsn, lease=f"{LEASE_S:g}s").start()  # type: ignore[arg-type]
        self.routers.append(router)
        return router

    async def holder(self, limit_s: float = 30.0) -> Router:
        """The router holding the node's lease (any router answers /health with every holder)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            ids = {}
            for router in self.routers:
                ids[(await get(router, "/health"))["router"]["id"]] = router
            holders = (await get(self.routers[0], "/health"))["holders"]
            held = holders.get(FAILOVER_NODE)
            if held and held["router"] in ids:
                return ids[held["router"]]
            await asyncio.sleep(0.05)
        raise RuntimeError(f"no router took node {FAILOVER_NODE} within {limit_s}s")

    async def stop(self) -> None:
        for router in self.routers:
            await router.stop()


async def get(router: Router, path: str) -> dict:
    conn = await router.connect()
    try:
        status, body = await conn.request("GET", path)
        assert status in (200, 503), (path, status, body)
        return body
    finally:
        await conn.close()


async def submit(router: Router, node: str, prompt: str) -> str:
    conn = await router.connect()
    try:
        status, body = await conn.request("POST", "/api/jobs", {"kind": "task", "prompt": prompt, "node": node})
        assert status == 201, (status, body)
        return body["jobs"][0]["id"]
    finally:
        await conn.close()


async def wait_state(router: Router, job_id: str, states: tuple[str, ...], limit_s: float) -> dict:
    conn = await router.connect()
    try:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            status, body = await conn.request("GET", f"/api/jobs/{job_id}")
            if status == 200 and body["state"] in states:
                return body
            await asyncio.sleep(0.02)
        raise RuntimeError(f"job {job_id} not {'/'.join(states)} within {limit_s}s: {body}")
    finally:
        await conn.close()


async def wait_idle(router: Router, nodes, limit_s: float) -> None:
    conn = await router.connect()
    try:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            _, body = await conn.request("GET", "/api/queue?limit=0")
            if all(n["queued_count"] == 0 and n["running"] is None for n in body["nodes"] if n["name"] in nodes):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"nodes {nodes} did not drain within {limit_s}s")
    finally:
        await conn.close()


# -- 2: the Store's round trip ---------------------------------------------------------------------


async def open_store(where) -> Store:
    store = Store(where)
    await store.open()
    try:
        await store.configure(peers.STORE_SETTINGS, [])
    except BaseException:
        await store.close()
        raise
    return store


async def round_trips(store: Store, node: str, count: int, limit_s: float) -> float:
    worker = peers.StoreWorker(store, node, [NodeInfo(node, 1, ("task", "critique"), "m1", True)])
    await worker.start()
    start = time.perf_counter()
    done = 0
    while done < count and time.perf_counter() - start < limit_s:
        await worker.cycle()
        done += 1
    elapsed = time.perf_counter() - start
    await store.finish(worker.running["id"], worker.running["run_id"], "done", None, "out")
    return done / elapsed


# -- the section -----------------------------------------------------------------------------------


async def pgstore_section(bench: Bench) -> None:
    cluster = await asyncio.to_thread(Cluster(durable=True).start)
    fakes: Fakes | None = None
    routers: dict[str, Router] = {}
    stores: list[Store] = []
    pair: Pair | None = None
    try:

        def fresh() -> str:
            return cluster.dsn(cluster.create_database())

        dsn = await asyncio.to_thread(fresh)
        with psycopg.connect(dsn, autocommit=True) as conn:
            settings = {
                k: conn.execute(f"SHOW {k}").fetchone()[0] for k in ("fsync", "synchronous_commit", "server_version")
            }
        assert settings["fsync"] == "on" and settings["synchronous_commit"] == "on", settings
        bench.say(
            f"pgstore: PostgreSQL {settings['server_version']}, fsync {settings['fsync']},"
            f" synchronous_commit {settings['synchronous_commit']}, in {cluster.dir}"
        )
        spec = {n: MODELS[i] for names in NODES.values() for i, n in enumerate(names)}
        spec[FAILOVER_NODE] = MODELS[0]
        fakes = await Fakes(spec, bench.workdir / "pgstore-fakes.log").start()

        def nodes_of(engine: str) -> list[dict]:
            return [node_table(n, fakes.urls[n], rank, MODELS[rank - 1]) for rank, n in enumerate(NODES[engine], 1)]

        routers["sqlite"] = await Router(bench.workdir, nodes_of("sqlite"), bench.workdir / "pgstore-router.db").start()
        routers["pg"] = await Router(bench.workdir, nodes_of("pg"), dsn).start()  # type: ignore[arg-type]

        await submit_rows(bench, fakes, routers)
        await round_trip_rows(bench, fresh, stores)
        await first_token_rows(bench, fakes, routers)
        for router in routers.values():
            await router.stop()
        routers.clear()
        await claim_rows(bench, fresh)
        pair = Pair(bench, fakes, await asyncio.to_thread(fresh))
        await failover_rows(bench, fakes, pair)
    finally:
        if pair is not None:
            await pair.stop()
        for router in routers.values():
            await router.stop()
        for store in stores:
            await store.close()
        if fakes is not None:
            await fakes.stop()
        await asyncio.to_thread(cluster.stop)


def engine_rows(
    bench: Bench, key: str, label: str, unit: str, kind: str, ratio: str, better: str, target: str = ""
) -> tuple[dict, Metric]:
    rows = {
        e: bench.metric(f"pgs_{key}_{e}", label.format(engine=name), unit, kind, target if e == "pg" else "")
        for e, name in ENGINES.items()
    }
    vs = bench.metric(f"pgs_{key}_ratio", ratio, "ratio", "ratio", better=better)
    return rows, vs


async def submit_rows(bench: Bench, fakes: Fakes, routers: dict[str, Router]) -> None:
    rows, vs = engine_rows(
        bench,
        "submit32",
        f"{{engine}}: durable submit POST /api/jobs, {CLIENTS} clients, nodes busy with a held job",
        "jobs/s",
        "rate",
        f"  submit, {CLIENTS} clients: PostgreSQL / SQLite (same run)",
        "higher",
    )
    total = 1600 if bench.quick else 3200
    for rep in range(bench.repeats):
        got = {}
        order = list(ENGINES) if rep % 2 == 0 else list(reversed(ENGINES))
        for engine in order:
            router = routers[engine]
            for name in NODES[engine]:
                await fakes.call("hold", name)
            try:
                got[engine] = await bench.submit_burst(router, CLIENTS, total, 15.0)
                await clear_queues(router, NODES[engine])
            finally:
                for name in NODES[engine]:
                    await fakes.call("release", name)
            await wait_idle(router, NODES[engine], 30)
            rows[engine].add_run(got[engine])
        vs.add_run(got["pg"] / got["sqlite"])
        bench.say(
            f"pgstore submit run {rep + 1}/{bench.repeats}: "
            + ", ".join(f"{ENGINES[e]} {got[e]:,.0f}/s" for e in ENGINES)
        )


async def round_trip_rows(bench: Bench, fresh, stores: list[Store]) -> None:
    rows, vs = engine_rows(
        bench,
        "rt",
        "{engine}: gpuq Store submit->claim->finish, one at a time (the finish claims the next)",
        "round trips/s",
        "rate",
        "  Store round trip: PostgreSQL / SQLite (same run)",
        "higher",
    )
    sqlite_store = await open_store(peers._fresh(bench.workdir / "pgstore-rt.db"))
    stores.append(sqlite_store)
    pg_store = await open_store(await asyncio.to_thread(fresh))
    stores.append(pg_store)
    by = {"sqlite": sqlite_store, "pg": pg_store}
    count = 150 if bench.quick else 600
    for rep in range(bench.repeats):
        got = {}
        for engine in ENGINES if rep % 2 == 0 else reversed(list(ENGINES)):
            got[engine] = await round_trips(by[engine], "n1", count, 5.0)
            rows[engine].add_run(got[engine])
        vs.add_run(got["pg"] / got["sqlite"])
        bench.say(
            f"pgstore round trip run {rep + 1}/{bench.repeats}: "
            + ", ".join(f"{ENGINES[e]} {got[e]:,.0f}/s" for e in ENGINES)
        )


async def first_token_rows(bench: Bench, fakes: Fakes, routers: dict[str, Router]) -> None:
    rows, vs = engine_rows(
        bench,
        "ttft",
        "{engine}: first-token overhead, idle node (submit -> /stream, minus direct, paired)",
        "ms",
        "ms",
        "  first-token overhead: PostgreSQL - SQLite, medians of the same run (ms)",
        "lower",
    )
    vs.unit, vs.kind = "ms", "ms"
    pairs = 8 if bench.quick else 20
    node = {e: NODES[e][1] for e in ENGINES}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def straight(engine: str) -> float:
            body = {
                "model": MODELS[1],
                "messages": [{"role": "user", "content": "hello"}],
                "stream": True,
                "keep_alive": 0,
            }
            t0 = time.monotonic()
            async with session.post(fakes.urls[node[engine]] + "/api/chat", json=body) as resp:
                await first_stream_line(resp, "message")
                t = time.monotonic() - t0
                await resp.read()
            return t * 1000

        async def via_gpuq(engine: str) -> float:
            router = routers[engine]
            t0 = time.monotonic()
            async with session.post(
                router.url + "/api/jobs", json={"kind": "task", "prompt": "hello", "node": node[engine]}
            ) as resp:
                assert resp.status == 201, await resp.text()
                job_id = (await resp.json())["jobs"][0]["id"]
            async with session.get(router.url + f"/api/jobs/{job_id}/stream") as resp:
                await first_stream_line(resp, "text")
                t = time.monotonic() - t0
                async for _ in resp.content:
                    pass
            return t * 1000

        for engine in ENGINES:  # warm both paths' connections
            await straight(engine)
            await via_gpuq(engine)
        for rep in range(bench.repeats):
            got: dict[str, list[float]] = {e: [] for e in ENGINES}
            for i in range(pairs):
                for engine in ENGINES if i % 2 == 0 else reversed(list(ENGINES)):
                    await wait_idle(routers[engine], (node[engine],), 30)
                    await asyncio.sleep(QUIET_S)  # an idle node, as when a person submits to a quiet lab
                    d = await straight(engine)
                    got[engine].append(await via_gpuq(engine) - d)
            for engine in ENGINES:
                rows[engine].add_run(got[engine])
            vs.add_run(statistics.median(got["pg"]) - statistics.median(got["sqlite"]))
            bench.say(
                f"pgstore first token run {rep + 1}/{bench.repeats}: overhead p50 "
                + ", ".join(f"{ENGINES[e]} {statistics.median(got[e]):.2f} ms" for e in ENGINES)
            )


async def claim_rows(bench: Bench, fresh) -> None:
    rows = {
        (e, size): bench.metric(
            f"pgs_claim_{e}_{size}",
            f"{name}: claim (Store.claim, durable) @ {size:,} history, {WAITING:,} waiting",
            "ms",
            "ms",
        )
        for e, name in ENGINES.items()
        for size in HISTORY
    }
    growth_vs = {
        e: bench.metric(
            f"pgs_claim_growth_{e}",
            f"  {name}: claim @ {HISTORY[-1]:,} / @ {HISTORY[0]:,} history (same run)",
            "ratio",
            "ratio",
            better="lower",
        )
        for e, name in ENGINES.items()
    }
    vs = bench.metric(
        "pgs_claim_ratio",
        f"  claim @ {HISTORY[-1]:,} history: PostgreSQL / SQLite (same run)",
        "ratio",
        "ratio",
        better="lower",
    )
    nodes = [("n1", MODELS[0]), ("n2", MODELS[1])]
    now = time.time()
    where = {}
    for size in HISTORY:
        t0 = time.perf_counter()
        made = await asyncio.to_thread(growth.rows, size, WAITING, nodes, now)  # the same rows for both
        t1 = time.perf_counter()
        where["sqlite", size], where["pg", size] = await asyncio.gather(  # side by side: the two take turns
            growth.seed(bench.workdir / f"pgstore-history-{size}.db", size, WAITING, nodes, now, SETTINGS, made),
            growth.seed_postgres(await asyncio.to_thread(fresh), size, WAITING, nodes, now, SETTINGS, made),
        )
        bench.say(
            f"pgstore: seeded {size:,} jobs of history + {WAITING:,} waiting: rows {t1 - t0:.1f}s, both"
            f" databases {time.perf_counter() - t1:.1f}s"
        )
    samples = 15 if bench.quick else 30
    for rep in range(bench.repeats):
        stores = {k: Store(w) for k, w in where.items()}
        for store in stores.values():
            await store.open()
        try:
            runs: dict[tuple[str, int], list[float]] = {k: [] for k in stores}
            for i in range(samples):
                node = nodes[i % 2][0]
                for k, store in stores.items():
                    t = time.perf_counter()
                    job = await store.claim(node)
                    runs[k].append((time.perf_counter() - t) * 1000)
                    await store.finish(job["id"], job["run_id"], "done", None, "out")
        finally:
            for store in stores.values():
                await store.close()
        for k, values in runs.items():
            rows[k].add_run(values)
        med = {k: statistics.median(v) for k, v in runs.items()}
        for e in ENGINES:
            growth_vs[e].add_run(med[e, HISTORY[-1]] / med[e, HISTORY[0]])
        vs.add_run(med["pg", HISTORY[-1]] / med["sqlite", HISTORY[-1]])
        bench.say(
            f"pgstore claim run {rep + 1}/{bench.repeats}: p50 "
            + ", ".join(f"{ENGINES[e]} @ {s:,} {med[e, s]:.2f} ms" for e in ENGINES for s in HISTORY)
        )


async def failover_rows(bench: Bench, fakes: Fakes, pair: Pair) -> None:
    target_s = LEASE_S + LEASE_S / 3
    row = bench.metric(
        "pgs_failover",
        f"failover: holder SIGKILLed mid-job -> the other router's next job reaches"
        f" the node (lease {LEASE_S:g}s, renewed every {LEASE_S / 3:.2f}s)",
        "ms",
        "ms",
        f"<= {target_s * 1000:,.0f} ms",
    )
    expiry = bench.metric(
        "pgs_failover_expiry",
        "  segment: kill -> the dead router's lease expired (its last renewal"
        f" + {LEASE_S:g}s; the time the orphan's error names)",
        "ms",
        "ms",
    )
    taken = bench.metric(
        "pgs_failover_taken",
        "  segment: lease expired -> next job's request at the node (the"
        " survivor's renewal tick, the takeover, the orphan failed, the claim, the request)",
        "ms",
        "ms",
    )
    orphan = bench.metric(
        "pgs_failover_orphan", "  the running job failed by the taker, naming the dead router", "jobs", "count"
    )
    repeats = 3 if bench.quick else max(bench.repeats, 7)
    await pair.add()
    await pair.add()
    rng = random.Random(27)
    node = FAILOVER_NODE
    for rep in range(repeats):
        holder = await pair.holder()
        dead_id = (await get(holder, "/health"))["router"]["id"]
        other = next(r for r in pair.routers if r is not holder)
        await fakes.call("reset", node)
        await fakes.call("hold", node)
        running = await submit(other, node, f"running when its router dies {rep}")
        deadline = time.monotonic() + 30
        while (await fakes.call("status", node))["waiting"] < 1:  # its request is at the node
            if time.monotonic() > deadline:
                raise RuntimeError("the running job's request never reached the node")
            await asyncio.sleep(0.01)
        following = await submit(other, node, f"next after the failover {rep}")
        # Anywhere in the lease's renewal period: the failover's time depends on where the kill falls.
        await asyncio.sleep(rng.uniform(0, LEASE_S / 3))
        killed_at, killed_wall = time.monotonic(), time.time()
        holder.proc.kill()
        await holder.proc.wait()
        await fakes.call("release", node)  # the held request's handler ends; the next one is not held
        pair.routers.remove(holder)
        arrived = None
        deadline = time.monotonic() + 10 * LEASE_S + 30
        while arrived is None and time.monotonic() < deadline:
            chats = [e for e in await fakes.log(node) if e[3] and e[1] > killed_at]
            if chats:
                arrived = min(e[1] for e in chats)
            else:
                await asyncio.sleep(0.01)
        if arrived is None:
            raise RuntimeError(f"no job reached node {node} after its router was killed")
        ms = (arrived - killed_at) * 1000
        row.add_run(ms)
        done = await wait_state(other, following, ("done",), 30)
        failed = await wait_state(other, running, ("failed",), 30)
        named = dead_id in (failed.get("error") or "")
        orphan.add_run(1.0 if named else 0.0)
        if not named:
            raise RuntimeError(f"the orphan's error does not name the dead router {dead_id}: {failed.get('error')}")
        found = re.search(r"expired at (\S+?)\)", failed["error"])
        if found:
            expired = datetime.fromisoformat(found.group(1).replace("Z", "+00:00")).timestamp()
            expiry.add_run((expired - killed_wall) * 1000)
            taken.add_run(ms - (expired - killed_wall) * 1000)
        bench.say(
            f"pgstore failover {rep + 1}/{repeats}: {ms:,.0f} ms from the kill to the next job's request"
            f" (target {target_s * 1000:,.0f}); the orphan: {failed['error']!r}; next job {done['state']}"
        )
        await pair.add()  # the next repeat kills the survivor, which holds the node now
