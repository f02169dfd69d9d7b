"""Shared fixtures: fake Ollama nodes on loopback, the real daemon as a subprocess, the real
CLI as a subprocess, polling with a deadline (never a bare sleep) for synchronisation, and a
real PostgreSQL (`pg_dsn`, below)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import sys
import time
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pg
import pytest
import tomli_w

from gpuq.demo import FakeOllama, Script

ROOT = Path(__file__).resolve().parent.parent
LISTENING = "gpuq router listening on "  # the daemon's log line once its port is bound


# Below Linux's ephemeral range (32768-60999): a port the kernel hands out for port 0 is also
# what outgoing connections take, so on a busy machine one could take it before the router binds
# it. Here only another test's pick can, and picks are random over 12,000 ports, each once.
PORTS = range(20000, 32768)
_handed_out: set[int] = set()


def free_port() -> int:
    for _ in range(200):
        port = random.choice(PORTS)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # a range this full is odd; the kernel's choice then
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def eventually(
    check: Callable[[], Awaitable[Any] | Any], timeout: float = 10.0, interval: float = 0.02, what: str = "condition"
) -> Any:
    """Poll `check` until it returns something truthy, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")


# `python -c LIMITED_PYTHON SOFT HARD command...`: runs the command with that open-file limit (no
# preexec_fn, which is unsafe in a test process that has threads).
LIMITED_PYTHON = (
    "import os, resource, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "os.execvp(sys.argv[3], sys.argv[3:])"
)


@dataclass
class Result:
    code: int
    out: str
    err: str


class PortTakenMeanwhile(Exception):
    """The port free_port found was taken by another process before the router bound it."""


@dataclass
class Daemon:
    """The real router, started as `gpuq serve` in a subprocess."""

    config: Path
    url: str
    log: Path
    proc: asyncio.subprocess.Process | None = None
    session: aiohttp.ClientSession | None = None
    env: dict = field(default_factory=dict)
    command: tuple[str, ...] = (sys.executable, "-m", "gpuq.cli")  # or an installed `gpuq`
    file_limit: int | tuple[int, int] | None = None  # the router's RLIMIT_NOFILE (soft, hard), or both
    # The harness chose the port (free_port): when another process took it before the router
    # bound it (a busy machine's outgoing connections use the same range), start again on another.
    own_port: bool = False
    auth: dict = field(default_factory=dict)  # headers every request of the test sends (a user's token)

    def _listening_lines(self) -> int:
        return self.log.read_text(errors="replace").count(LISTENING) if self.log.exists() else 0

    async def start(self, timeout: float = 20.0) -> None:
        for _ in range(3):
            try:
                return await self._start(timeout)
            except PortTakenMeanwhile:
                self._move_to(free_port())
        await self._start(timeout)

    def _move_to(self, port: int) -> None:
        data = tomllib.loads(self.config.read_text())
        data["router"]["listen"] = f"127.0.0.1:{port}"
        data["router"]["public_url"] = self.url = f"http://127.0.0.1:{port}"
        self.config.write_text(tomli_w.dumps(data))

    async def _start(self, timeout: float) -> None:
        # Ours is up when it says it listens (another test's router may hold a free port we
        # picked and answer /health, while ours exits 2 naming the port).
        before = self._listening_lines()
        log = open(self.log, "ab")
        command = list(self.command)
        if self.file_limit:
            soft, hard = self.file_limit if isinstance(self.file_limit, tuple) else (self.file_limit,) * 2
            command = [sys.executable, "-c", LIMITED_PYTHON, str(soft), str(hard), *command]
        self.proc = await asyncio.create_subprocess_exec(
            *command,
            "serve",
            "--config",
            str(self.config),
            stdout=log,
            stderr=log,
            env={**os.environ, **self.env},
            cwd=str(self.config.parent),
        )
        log.close()
        listen = self.url.removeprefix("http://")
        written = self.log.stat().st_size if self.log.exists() else 0

        async def answers():
            if self.proc.returncode is not None:
                await self.proc.wait()
                told = self.log.read_bytes()[written:].decode(errors="replace")
                if self.own_port and f"cannot listen on {listen}: address already in use" in told:
                    raise PortTakenMeanwhile(listen)
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log.read_text()}")
            if self._listening_lines() <= before:
                return False
            try:
                async with self.session.get(self.url + "/health") as resp:
                    return resp.status in (200, 503)
            except aiohttp.ClientError:
                return False

        await eventually(answers, timeout, 0.05, "the daemon to answer /health")

    async def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc and self.proc.returncode is None:
            self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def request(
        self, method: str, path: str, body: Any = None, raw: bytes | None = None, headers: dict | None = None
    ) -> tuple[int, Any]:
        kwargs: dict = {"headers": {**self.auth, **(headers or {})}}
        if raw is not None:
            kwargs["data"] = raw
        elif body is not None:
            kwargs["json"] = body
        async with self.session.request(method, self.url + path, **kwargs) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text

    async def get(self, path: str) -> Any:
        status, body = await self.request("GET", path)
        assert status in (200, 503), (status, body)
        return body

    async def job(self, job_id: str) -> dict:
        return await self.get(f"/api/jobs/{job_id}")

    async def take_down(self, fake: FakeOllama, name: str) -> None:
        """Stop a node's Ollama and wait for the router to see it down: until then a job may be
        claimed onto it and put back (nothing reached Ollama), which a test of waiting jobs must
        not race."""
        await fake.stop()

        async def seen_down():
            return not next(n for n in (await self.get("/api/nodes"))["nodes"] if n["name"] == name)["up"]

        await eventually(seen_down, 15, what=f"{name} to be seen down")

    async def wait_state(self, job_id: str, *states: str, timeout: float = 10.0) -> dict:
        async def reached():
            job = await self.job(job_id)
            return job if job["state"] in states else None

        return await eventually(reached, timeout, what=f"job {job_id} to be {'/'.join(states)}")

    async def submit(self, kind: str = "task", prompt: str = "hello", **extra) -> list[dict]:
        status, body = await self.request("POST", "/api/jobs", {"kind": kind, "prompt": prompt, **extra})
        assert status == 201, (status, body)
        return body["jobs"]

    async def cli(self, *args: str, stdin: bytes | None = None, timeout: float = 30.0) -> Result:
        """Run the real `gpuq` CLI against this router, without blocking the test's loop."""
        env = dict(self.env)
        if self.auth.get("Authorization", "").startswith("Bearer "):  # the test's user, as the CLI takes it
            env.setdefault("GPUQ_TOKEN", self.auth["Authorization"].removeprefix("Bearer "))
        return await run_cli("--router", self.url, *args, stdin=stdin, timeout=timeout, env=env, command=self.command)


async def run_cli(
    *args: str,
    stdin: bytes | None = None,
    timeout: float = 30.0,
    env: dict | None = None,
    command: tuple[str, ...] = (sys.executable, "-m", "gpuq.cli"),
    cwd: Path | None = None,
) -> Result:
    """Run the real `gpuq` CLI as a subprocess (in `cwd`: where it looks for a router); one that
    hangs is killed and reported."""
    proc = await asyncio.create_subprocess_exec(
        *command,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()  # a CLI that hangs must not outlive its test
        await proc.wait()
        raise AssertionError(f"gpuq {' '.join(args)} did not finish within {timeout}s") from None
    return Result(proc.returncode, out.decode(), err.decode())


def node_table(name: str, fake: FakeOllama, rank: int, roles: list[str], model: str) -> dict:
    return {"name": name, "url": fake.url, "rank": rank, "roles": roles, "model": model}


def write_config(path: Path, nodes: list[dict], port: int, **router: Any) -> Path:
    """A gpuq.toml with short test timings; `router` keys override them (`front`: its [front] table)."""
    front = router.pop("front", None)
    data = {
        "router": {
            "listen": f"127.0.0.1:{port}",
            "public_url": f"http://127.0.0.1:{port}",
            "database": "gpuq.db",
            "health_interval": "0.2s",
            "stall_timeout": "5s",
            "unload_timeout": "2s",
            # a SIGTERM (the teardown's too) lets running jobs finish for 1s, then fails them
            "shutdown_grace": "1s",
            **router,
        },
        "node": nodes,
        **({"front": front} if front else {}),
    }
    path.write_text(tomli_w.dumps(data))
    return path


@pytest.fixture
async def fakes():
    """A factory of fake Ollama nodes on loopback; all are stopped at the end."""
    made: list[FakeOllama] = []

    async def make(*models: str, **script: Any) -> FakeOllama:
        fake = FakeOllama(models=set(models) or {"qwen3-coder:30b"}, script=Script(**script))
        await fake.start()
        made.append(fake)
        return fake

    yield make
    for fake in made:
        await fake.stop()


@pytest.fixture
async def daemon_factory(tmp_path):
    """Start real routers against a config written from `nodes`; all are killed at the end."""
    session = aiohttp.ClientSession()
    started: list[Daemon] = []

    async def make(
        nodes: list[dict],
        start: bool = True,
        env: dict | None = None,
        command: tuple[str, ...] | None = None,
        name: str = "gpuq",
        file_limit: int | tuple[int, int] | None = None,
        **router: Any,
    ) -> Daemon:
        """`name` gives a second router its own config and log (`<name>.toml`, `<name>.log`); the
        database stays tmp_path/gpuq.db unless `database=` says otherwise."""
        port = free_port()
        config = write_config(tmp_path / f"{name}.toml", nodes, port, **router)
        log = tmp_path / ("daemon.log" if name == "gpuq" else f"{name}.log")
        daemon = Daemon(
            config=config,
            url=f"http://127.0.0.1:{port}",
            log=log,
            session=session,
            env=env or {},
            file_limit=file_limit,
            own_port="listen" not in router,
        )
        if command:
            daemon.command = command
        started.append(daemon)
        if start:
            await daemon.start()
        return daemon

    yield make

    async def stop(d: Daemon) -> None:
        """SIGTERM, as the design's clean stop; a job still running after a moment gets the
        second SIGTERM, which stops at once (the test is over: its jobs need no shutdown_grace)."""
        if d.proc is None or d.proc.returncode is not None:
            return
        d.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(d.proc.wait()), 0.2)
        except TimeoutError:
            await d.kill(signal.SIGTERM)

    await asyncio.gather(*(stop(d) for d in started))
    await session.close()


async def make_lab(fakes, daemon_factory, **router: Any) -> Daemon:
    """The design's lab: node-1 (task, critique), node-2 (critique), node-3 (task), one fake
    each (as `daemon.fakes[name]`); `router` keys override the test config."""
    f1 = await fakes("qwen3-coder:30b")
    f2 = await fakes("deepseek-r1:32b")
    f3 = await fakes("llama3.2:latest")
    daemon = await daemon_factory(
        [
            node_table("node-1", f1, 1, ["task", "critique"], "qwen3-coder:30b"),
            node_table("node-2", f2, 2, ["critique"], "deepseek-r1:32b"),
            node_table("node-3", f3, 3, ["task"], "llama3.2:latest"),
        ],
        **router,
    )
    daemon.fakes = {"node-1": f1, "node-2": f2, "node-3": f3}
    return daemon


@pytest.fixture
async def lab(fakes, daemon_factory):
    return await make_lab(fakes, daemon_factory)


# -- PostgreSQL -------------------------------------------------------------------------------
# Where a Store lives, once on each engine: a SQLite file in the test's temp dir, then a fresh
# PostgreSQL database (pg_dsn). A test that takes `database` runs on both and must pass on both:
# the same verbs, the same rules, the same answers (issue 27).
@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database(request, tmp_path):
    if request.param == "sqlite":
        return tmp_path / "q.db"
    return request.getfixturevalue("pg_dsn")


@pytest.fixture
async def lab_on_each_engine(fakes, daemon_factory, database):
    """The design's lab (make_lab), its router on each engine in turn: a module that wants its
    daemon tests on both aliases its `lab` to this."""
    return await make_lab(fakes, daemon_factory, database=str(database))


def shell(daemon: Daemon, sql: str, *params: Any) -> list[tuple]:
    """What a person at the database's shell reads (sqlite3 on the file, psql on PostgreSQL),
    from a connection of its own: the router's database as its config names it."""
    database = tomllib.loads(daemon.config.read_text())["router"]["database"]
    if database.startswith("postgresql://"):
        import psycopg

        from gpuq.store.postgres import translate

        with psycopg.connect(database, autocommit=True) as db:
            return [tuple(r) for r in db.execute(translate(sql), params or None).fetchall()]
    db = sqlite3.connect(daemon.config.parent / database)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


# A test that needs PostgreSQL is marked and takes `pg_dsn`, a libpq URI
# ("postgresql://postgres@/test_...?host=%2Ftmp%2Fgpuq-pg-...&port=5432") of a fresh, empty
# database of its own, dropped after it; psycopg and asyncpg both connect with it:
#
#     @pytest.mark.postgres
#     async def test_something(pg_dsn):
#         async with await psycopg.AsyncConnection.connect(pg_dsn) as conn: ...
#
# One throwaway cluster per test process (tests/pg.py: initdb in a temp dir, no TCP, its
# socket in that dir, run as the `postgres` user when root), started by the first test that
# asks and stopped, its dir removed, at the end of the session. If PostgreSQL is missing or
# cannot start, every test that asks fails with the reason: nothing is skipped (`make test`
# installs it; `make postgres` alone does too).


@pytest.fixture(scope="session")
def pg_cluster():
    """The session's throwaway cluster (tests/pg.py's Cluster): `.dsn(dbname)`,
    `.create_database()`, `.drop_database(name)`, `.postmaster_pid()`, `.dir`."""
    cluster = pg.Cluster()
    try:
        cluster.start()
    except pg.NoPostgres as e:
        pytest.fail(f"PostgreSQL could not be started: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


_TO_DROP: list[tuple[pg.Cluster, str]] = []  # this test's databases, dropped once it is torn down


@pytest.fixture(autouse=True)
def _databases_dropped_last():
    """Autouse, so set up first and torn down last: a test's databases are dropped after its
    routers have stopped (daemon_factory), not under them, where a router's shutdown waits out
    its pool's 5 s for a database that no longer exists."""
    yield
    while _TO_DROP:
        cluster, name = _TO_DROP.pop()
        cluster.drop_database(name)


@pytest.fixture
def pg_dsn(request, pg_cluster):
    """A libpq URI of a fresh, empty database for this test alone (dropped after it, once the
    test's every other fixture is torn down)."""
    if request.node.get_closest_marker("postgres") is None:
        pytest.fail("a test that uses pg_dsn is marked @pytest.mark.postgres", pytrace=False)
    name = pg_cluster.create_database()
    yield pg_cluster.dsn(name)
    _TO_DROP.append((pg_cluster, name))
