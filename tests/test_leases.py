"""Per-node leases (issue 27): exactly one router drives a node at a time.

The verbs (gpuq/store/leases.py) on a real SQLite file and on a real PostgreSQL (a raw psycopg
connection wrapped as the verbs' `db`: `?` placeholders, rows by position and by name), each call
in its own transaction as the writer runs it: take, renew, expire and take over, release, and that
a router never takes a node whose lease is alive. Then the real daemon: /health names the router
and the nodes it holds; a router SIGKILLed mid-job leaves its job to the next router, which fails
it naming the dead router; a clean stop releases its leases; a node another router takes is no
longer driven here (its job not relayed, nothing claimed) until it is free again."""

from __future__ import annotations

import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import eventually, node_table

from gpuq.jobs import iso
from gpuq.shipped import shipped_files
from gpuq.store import MIGRATIONS_DIR, leases, lifecycle, records
from gpuq.store import postgres as pg
from gpuq.store import sqlite as sqlite_engine
from gpuq.store.leases import Router

LEASE = 10.0
T0 = 1_800_000_000.0
A = Router("host-a:1:aaaa", "127.0.0.1:1", "http://127.0.0.1:1", 1, "host-a", T0)
B = Router("host-b:2:bbbb", "127.0.0.1:2", "http://127.0.0.1:2", 2, "host-b", T0)


# -- the two engines, as the writer gives a verb its connection ----------------------------------


class LiteDb:
    def __init__(self, path: Path):
        self.conn = sqlite3.connect(path, isolation_level=None)
        sqlite_engine.migrate(
            self.conn, shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations"), 0.0, path
        )
        self.conn.execute("PRAGMA foreign_keys = ON")
        self.conn.row_factory = sqlite3.Row

    def run(self, verb, *args, **kwargs):
        """`verb(db, ...)` in one write transaction, rolled back if it raises."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            result = verb(self.conn, *args, **kwargs)
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")
        return result

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        return [tuple(r) for r in self.conn.execute(sql, params).fetchall()]


class BothRow(tuple):
    """A row by position and by column name, as sqlite3.Row (dict(row) too)."""

    names: tuple[str, ...] = ()

    def __getitem__(self, key):
        return super().__getitem__(self.names.index(key) if isinstance(key, str) else key)

    def keys(self):
        return list(self.names)


class PgDb:
    """A psycopg connection as the verbs' `db` (the least the verbs here ask of it)."""

    def __init__(self, dsn: str):
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        pg.migrate(
            self.conn, shipped_files(pg.MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "PostgreSQL migrations"), 0.0, "test"
        )
        self.conn.row_factory = self._row

    @staticmethod
    def _row(cursor):
        names = tuple(c.name for c in cursor.description or ())
        kind = type("Row", (BothRow,), {"names": names})
        return lambda values: kind(values)

    def execute(self, sql: str, params=()):
        return self.conn.execute(sql.replace("?", "%s"), params)

    def run(self, verb, *args, **kwargs):
        with self.conn.transaction():
            return verb(self, *args, **kwargs)

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        return [tuple(r) for r in self.execute(sql, params).fetchall()]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db(request, tmp_path) -> Iterator[LiteDb | PgDb]:
    if request.param == "sqlite":
        made = LiteDb(tmp_path / "q.db")
    else:
        made = PgDb(request.getfixturevalue("pg_dsn"))
    for name in ("a", "b"):
        made.run(
            lambda d, n=name: d.execute(
                "INSERT INTO node (name, url, rank, roles, model) VALUES (?,?,?,?,?)",
                (n, f"http://{n}", 1, "task,critique", "m"),
            )
        )
    yield made
    made.conn.close()


def running_job(db, job_id: str, node: str, run_id: int) -> None:
    """A job claimed on `node` (its run stamped by the schema with the node's lease holder)."""

    def write(d):
        d.execute(
            "INSERT INTO job (id, kind, state, node, model, prompt, position, placement, created_at, run_id)"
            " VALUES (?, 'task', 'running', ?, 'm', 'p', 1024, 'asked', ?, ?)",
            (job_id, node, iso(T0), run_id),
        )
        d.execute(
            "INSERT INTO run (id, job_id, node, model, started_at, progress_at) VALUES (?, ?, ?, 'm', ?, ?)",
            (run_id, job_id, node, iso(T0), iso(T0)),
        )

    db.run(write)


def job_state(db, job_id: str) -> tuple:
    return db.rows(
        "SELECT j.state, j.error, r.state, r.router FROM job j JOIN run r ON r.id = j.run_id WHERE j.id = ?", (job_id,)
    )[0]


# -- the verbs -------------------------------------------------------------------------------------


def test_a_router_takes_free_nodes_and_another_never_takes_a_lease_that_is_alive(db):
    assert db.run(leases.take, A, ["a", "b"], LEASE, T0) == (["a", "b"], [])
    for at in (T0, T0 + 5, T0 + LEASE - 0.001):  # alive until its expiry, to the millisecond
        assert db.run(leases.take, B, ["a", "b"], LEASE, at) == ([], [])
    assert db.rows("SELECT node, router, expires_at FROM node_lease ORDER BY node") == [
        ("a", A.id, T0 + LEASE),
        ("b", A.id, T0 + LEASE),
    ]
    seen = db.run(leases.routers, T0 + 1, LEASE)
    assert [(r["id"], r["nodes"]) for r in seen["routers"]] == [(A.id, ["a", "b"]), (B.id, [])]
    assert {n: h["router"] for n, h in seen["holders"].items()} == {"a": A.id, "b": A.id}


def test_renewing_keeps_the_nodes_past_the_first_expiry_and_taking_them_again_renews(db):
    db.run(leases.take, A, ["a", "b"], LEASE, T0)
    assert db.run(leases.renew, A, ["a", "b"], LEASE, T0 + 5) == ["a", "b"]
    assert db.run(leases.take, B, ["a", "b"], LEASE, T0 + 12) == ([], [])  # past T0+10, before T0+15
    assert db.run(leases.take, A, ["b"], LEASE, T0 + 13) == (["b"], [])  # its own: renewed, kept
    assert db.rows("SELECT node, expires_at, taken_at FROM node_lease ORDER BY node") == [
        ("a", T0 + 15, T0),
        ("b", T0 + 23, T0),
    ]
    assert db.run(leases.renew, B, ["a", "b"], LEASE, T0 + 13) == []  # renews only its own


def test_an_expired_lease_is_taken_over_and_the_dead_routers_job_fails_naming_it(db):
    db.run(leases.take, A, ["a", "b"], LEASE, T0)
    running_job(db, "j1", "a", 1)
    assert job_state(db, "j1") == ("running", None, "running", A.id)  # the claim's run names its router
    held, failed = db.run(leases.take, B, ["a", "b"], LEASE, T0 + LEASE)  # A stopped renewing
    reason = f"the router {A.id} that ran this job stopped answering (its lease on a expired at {iso(T0 + LEASE)})"
    assert held == ["a", "b"]
    assert [(f["id"], f["node"], f["error"]) for f in failed] == [("j1", "a", reason)]
    assert job_state(db, "j1") == ("failed", reason, "failed", A.id)
    assert db.rows("SELECT from_state, to_state, actor, reason FROM event WHERE job_id = 'j1'") == [
        ("running", "failed", "router", reason)
    ]
    assert db.run(leases.renew, A, ["a", "b"], LEASE, T0 + LEASE + 1) == []  # A, back: lost both
    assert db.run(leases.take, A, ["a", "b"], LEASE, T0 + LEASE + 1) == ([], [])
    running_job(db, "j2", "b", 2)
    assert job_state(db, "j2")[3] == B.id


def test_a_released_node_is_taken_at_once_and_the_router_is_no_longer_alive(db):
    db.run(leases.take, A, ["a", "b"], LEASE, T0)
    assert db.run(leases.release, A, T0 + 1) == ["a", "b"]
    assert db.run(leases.take, B, ["a", "b"], LEASE, T0 + 1) == (["a", "b"], [])
    seen = db.run(leases.routers, T0 + 2, LEASE)
    assert [(r["id"], r["nodes"]) for r in seen["routers"]] == [(B.id, ["a", "b"])]


def test_a_router_alone_takes_every_node_and_fails_every_job_left_running(db):
    """SQLite's start-up: the lock file says every other router is dead, leases alive or not."""
    db.run(leases.take, A, ["a"], LEASE, T0)
    running_job(db, "j1", "a", 1)
    running_job(db, "old", "b", 2)  # a run from before leases: no router known
    held, failed = db.run(leases.take, B, ["a", "b"], LEASE, T0 + 1, alone=True)
    assert held == ["a", "b"]
    assert {f["id"]: f["error"] for f in failed} == {
        "j1": f"router restarted while running (the router {A.id} that ran this job had stopped)",
        "old": "router restarted while running",
    }
    assert db.rows("SELECT node, router FROM node_lease ORDER BY node") == [("a", B.id), ("b", B.id)]
    assert [r["id"] for r in db.run(leases.routers, T0 + 2, LEASE)["routers"]] == [B.id]  # A: found dead
    assert [job_state(db, j)[:3] for j in ("j1", "old")] == [
        ("failed", failed[0]["error"], "failed"),
        ("failed", "router restarted while running", "failed"),
    ]


def test_the_claim_stamps_its_run_with_the_router_holding_the_node(tmp_path):
    lite = LiteDb(tmp_path / "q.db")
    lite.run(records.configure, {}, [])
    lite.run(lambda d: d.execute("INSERT INTO node (name, url, rank, roles, model) VALUES ('a', 'u', 1, 'task', 'm')"))
    lite.run(
        lambda d: d.execute(
            "INSERT INTO job (id, kind, node, model, prompt, position, placement, created_at)"
            " VALUES ('j', 'task', 'a', 'm', 'p', 1024, 'asked', 'x')"
        )
    )
    lite.run(leases.take, A, ["a"], LEASE, T0)
    job = lite.run(lifecycle.claim, T0, {}, "a")
    assert lite.rows("SELECT router FROM run WHERE id = ?", (job["run_id"],)) == [(A.id,)]


# -- the router ------------------------------------------------------------------------------------


def lease_rows(database: Path) -> tuple[list[tuple], list[tuple]]:
    db = sqlite3.connect(database)
    try:
        return (
            db.execute("SELECT node, router FROM node_lease ORDER BY node").fetchall(),
            db.execute("SELECT id, stopped_at IS NOT NULL FROM router ORDER BY started_at").fetchall(),
        )
    finally:
        db.close()


async def test_health_names_this_router_and_the_nodes_it_holds(fakes, daemon_factory):
    f1, f2 = await fakes("m"), await fakes("m")
    d = await daemon_factory([node_table("n1", f1, 1, ["task"], "m"), node_table("n2", f2, 2, ["task"], "m")])
    health = await d.get("/health")
    me = health["router"]["id"]
    assert health["router"]["nodes"] == ["n1", "n2"]
    [router] = health["routers"]
    assert (router["id"], router["listen"], router["nodes"]) == (me, d.url.removeprefix("http://"), ["n1", "n2"])
    assert {n: h["router"] for n, h in health["holders"].items()} == {"n1": me, "n2": me}
    job = (await d.submit("task", "hi", node="n2"))[0]
    await d.wait_state(job["id"], "done")


async def test_a_router_killed_mid_job_leaves_it_to_the_next_which_fails_it_naming_the_dead_router(
    fakes, daemon_factory, tmp_path
):
    fake = await fakes("m", stall_after=2)  # the job streams two tokens, then hangs
    nodes = [node_table("n1", fake, 1, ["task"], "m")]
    first = await daemon_factory(nodes)
    dead = (await first.get("/health"))["router"]["id"]
    job = (await first.submit("task", "orphaned"))[0]
    await first.wait_state(job["id"], "running")
    await first.kill(signal.SIGKILL)
    assert lease_rows(tmp_path / "gpuq.db")[0] == [("n1", dead)]  # its lease is still there, unexpired

    fake.script.stall_after = None
    second = await daemon_factory(nodes, name="second")
    orphan = await second.job(job["id"])
    assert orphan["state"] == "failed"
    assert orphan["error"] == f"router restarted while running (the router {dead} that ran this job had stopped)"
    health = await second.get("/health")
    assert health["router"]["nodes"] == ["n1"] and health["router"]["id"] != dead
    assert [r["id"] for r in health["routers"]] == [health["router"]["id"]]
    after = (await second.submit("task", "next"))[0]
    await second.wait_state(after["id"], "done", timeout=20)


async def test_a_clean_stop_releases_the_leases_and_the_next_router_takes_them_at_once(fakes, daemon_factory, tmp_path):
    fake = await fakes("m")
    nodes = [node_table("n1", fake, 1, ["task"], "m")]
    first = await daemon_factory(nodes, lease="60s")  # unreleased, the lease would stand for a minute
    gone = (await first.get("/health"))["router"]["id"]
    await first.kill(signal.SIGTERM)
    assert lease_rows(tmp_path / "gpuq.db") == ([], [(gone, 1)])

    second = await daemon_factory(nodes, name="second", lease="60s")
    health = await second.get("/health")
    assert [(r["id"], r["nodes"]) for r in health["routers"]] == [(health["router"]["id"], ["n1"])]
    job = (await second.submit("task", "hi"))[0]
    await second.wait_state(job["id"], "done")


def write_to(database: Path, verb, *args, **kwargs):
    """A verb on the router's database from outside it (another router's write, as it lands)."""
    conn = sqlite3.connect(database, isolation_level=None, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("BEGIN IMMEDIATE")
        result = verb(conn, *args, **kwargs)
        conn.execute("COMMIT")
        return result
    finally:
        conn.close()


async def test_a_node_another_router_takes_is_no_longer_driven_here_until_it_is_free_again(
    fakes, daemon_factory, tmp_path
):
    fake = await fakes("m", stall_after=2)  # the job streams two tokens, then hangs
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], lease="3s")
    me = (await d.get("/health"))["router"]["id"]
    job = (await d.submit("task", "taken over"))[0]
    await d.wait_state(job["id"], "running")
    await eventually(fake.chunk_sent.is_set, what="the job to stream")
    fake.script.stall_after = None

    # Another router, whose clock says this router's lease ran out, takes the node.
    other = Router("elsewhere:9:cccc", "127.0.0.1:9", None, 9, "elsewhere", time.time())
    held, failed = write_to(tmp_path / "gpuq.db", leases.take, other, ["n1"], 3600.0, time.time() + 100)
    assert held == ["n1"]
    assert [f["id"] for f in failed] == [job["id"]]
    assert failed[0]["error"].startswith(f"the router {me} that ran this job stopped answering (its lease on n1")
    await eventually(lambda: fake.disconnects == 1, 15, what="this router to stop relaying the job")

    async def lost():
        health = await d.get("/health")
        return health if health["router"]["nodes"] == [] else None

    health = await lost() or await eventually(lost, 15, what="this router to see the node lost")
    assert health["holders"]["n1"]["router"] == other.id
    waiting = (await d.submit("task", "waits for the lease"))[0]

    def seen_at() -> float:
        db = sqlite3.connect(tmp_path / "gpuq.db")
        try:
            return db.execute("SELECT seen_at FROM router WHERE id = ?", (me,)).fetchone()[0]
        finally:
            db.close()

    for _ in range(2):  # two heartbeats of this router later, the job still waits: nothing claims it
        beat = seen_at()
        await eventually(lambda beat=beat: seen_at() > beat, 15, what="this router's next heartbeat")
    assert (await d.job(waiting["id"]))["state"] == "queued"
    assert (await d.job(job["id"]))["error"] == failed[0]["error"]  # failed by the taker, not again here

    write_to(tmp_path / "gpuq.db", leases.release, other, time.time())  # free again: taken, the job runs
    await d.wait_state(waiting["id"], "done", timeout=20)
    assert (await d.get("/health"))["router"]["nodes"] == ["n1"]


@pytest.mark.postgres
async def test_on_postgresql_leases_run_on_the_servers_clock_whatever_the_routers_clock_says(pg_dsn):
    """Routers on several machines disagree about the time; the lease's end is written with the
    database server's clock, so a router whose clock is an hour fast holds a node for the lease
    time, not an hour longer (and one an hour slow does not lose it at once)."""
    from gpuq.store import Store

    for skew in (3600.0, -3600.0):
        store = Store(pg_dsn, clock=lambda skew=skew: time.time() + skew)
        await store.open()
        try:
            router = Router.new("127.0.0.1:1", None, store.clock())
            taken = await store.take_nodes(router, ["node-1"], 10.0)
            assert taken.held == ["node-1"]
            [row] = await store.read(
                "SELECT expires_at, " + leases.DB_NOW_SQL[len("SELECT ") :] + " AS now"
                " FROM node_lease WHERE node = 'node-1'"
            )
            assert 9.0 <= float(row["expires_at"]) - float(row["now"]) <= 10.0
            assert await store.renew_nodes(router, ["node-1"], 10.0) == ["node-1"]
            health = await store.routers(10.0)
            assert [r["id"] for r in health["routers"]] == [router.id]  # alive by the server's clock
            await store.release_nodes(router)
        finally:
            await store.close()
