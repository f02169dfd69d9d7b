"""The PostgreSQL harness itself (tests/pg.py, conftest's pg_cluster and pg_dsn): a real server
on a Unix socket only, a fresh database per test, LISTEN/NOTIFY between connections, run as
the `postgres` user when root, and nothing left behind, even when the process that started a
cluster is killed."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path

import pg
import psycopg
import pytest
from conftest import ROOT, eventually

pytestmark = pytest.mark.postgres


def socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:[") : -1])
    return found


def listening(table: str) -> set[str]:
    """Inodes of the sockets listening in /proc/net/<table> (tcp, tcp6: state 0A; unix: 01)."""
    lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
    if table == "unix":  # Num RefCount Protocol Flags Type St Inode Path
        return {f[6] for f in (line.split() for line in lines) if f[5] == "01"}
    return {f[9] for f in (line.split() for line in lines) if f[3] == "0A"}


def server_pids(cluster) -> list[int]:
    """The postmaster and its children (the backends, the background processes)."""
    top = cluster.postmaster_pid()
    pids = [top]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == top:
                pids.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_connects_over_the_unix_socket_to_a_fresh_empty_database(pg_dsn, pg_cluster):
    assert pg_dsn.startswith("postgresql://postgres@/test_")
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        row = await (
            await conn.execute(
                "SELECT current_database(), inet_server_addr(), current_setting('unix_socket_directories'),"
                " (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
                "  WHERE n.nspname = 'public')"
            )
        ).fetchone()
    name, addr, socket_dir, relations = row
    assert name.startswith("test_") and pg_dsn.split("/")[3].startswith(name)
    assert addr is None  # a Unix-socket connection has no server address
    assert socket_dir == pg_cluster.host
    assert relations == 0


def test_each_database_is_its_own(pg_dsn, pg_cluster):
    other = pg_cluster.create_database()
    try:
        assert pg_cluster.dsn(other) != pg_dsn
        with psycopg.connect(pg_dsn) as a, psycopg.connect(pg_cluster.dsn(other)) as b:
            a.execute("CREATE TABLE jobs (id int PRIMARY KEY)")
            a.execute("INSERT INTO jobs VALUES (1)")
            a.commit()
            assert b.execute("SELECT to_regclass('public.jobs')").fetchone() == (None,)
            assert (
                a.execute("SELECT current_database()").fetchone() != b.execute("SELECT current_database()").fetchone()
            )
    finally:
        pg_cluster.drop_database(other)


async def test_listen_notify_between_two_connections(pg_dsn):
    async with (
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener,
        await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as notifier,
    ):
        await listener.execute("LISTEN gpuq_jobs")
        got = []

        async def receive():
            async for note in listener.notifies(timeout=30, stop_after=2):
                got.append((note.channel, note.payload, note.pid))

        receiving = asyncio.create_task(receive())
        await notifier.execute("SELECT pg_notify('gpuq_jobs', '42')")
        async with notifier.transaction():  # delivered at commit, not before
            await notifier.execute("NOTIFY gpuq_jobs, '43'")
        await asyncio.wait_for(receiving, 60)
        assert got == [("gpuq_jobs", "42", notifier.info.backend_pid), ("gpuq_jobs", "43", notifier.info.backend_pid)]


def test_the_server_runs_as_postgres_when_root_and_listens_on_no_tcp(pg_dsn, pg_cluster):
    with psycopg.connect(pg_dsn) as conn:  # a backend of ours among the children
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        pids = server_pids(pg_cluster)
        assert conn.info.backend_pid in pids
        expected = pwd.getpwnam("postgres").pw_uid if os.geteuid() == 0 else os.geteuid()
        for pid in pids:
            uid = next(
                line.split()[1]
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("Uid:")
            )
            assert int(uid) == expected, (pid, uid)
        sockets = set().union(*(socket_inodes(pid) for pid in pids))
        assert not sockets & (listening("tcp") | listening("tcp6"))
        assert sockets & listening("unix")  # the one it does listen on


def test_a_cluster_that_cannot_start_says_why(monkeypatch):
    monkeypatch.setenv("GPUQ_PG_BINDIR", "/nonexistent")
    with pytest.raises(pg.NoPostgres, match="GPUQ_PG_BINDIR=/nonexistent holds no initdb"):
        pg.Cluster().start()


async def test_a_test_that_needs_postgres_fails_when_it_cannot_start_never_skips():
    """The whole path, as CI without PostgreSQL would see it: pytest reports an error naming why."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rA",
        "tests/test_pg_harness.py::test_each_database_is_its_own",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "GPUQ_PG_BINDIR": "/nonexistent"},
    )
    out = (await asyncio.wait_for(proc.communicate(), 120))[0].decode()
    assert proc.returncode == 1, out
    assert "1 error" in out and "skipped" not in out, out
    assert "PostgreSQL could not be started: GPUQ_PG_BINDIR=/nonexistent holds no initdb" in out, out


def test_stop_removes_everything():
    cluster = pg.Cluster().start()
    top, pids = cluster.dir, server_pids(cluster)
    cluster.stop()
    assert not top.exists()
    assert not any(alive(pid) for pid in pids)


STARTER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import pg
cluster = pg.Cluster().start()
print(cluster.dir, cluster.postmaster_pid(), flush=True)
time.sleep(600)
"""


async def test_a_killed_starter_leaves_nothing_running():
    proc = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(Path(__file__).parent)], stdout=subprocess.PIPE, text=True
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
        top, postmaster = line.split()
        assert Path(top).exists() and alive(int(postmaster))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    try:
        await eventually(
            lambda: not Path(top).exists() and not alive(int(postmaster)),
            60,
            what="the watchdog to stop the server and remove its dir",
        )
    finally:  # the test failed: do the watchdog's work, so nothing outlives the test anyway
        if alive(int(postmaster)):
            os.kill(int(postmaster), signal.SIGQUIT)  # PostgreSQL's immediate shutdown
        await eventually(lambda: not alive(int(postmaster)), 60, what="the postmaster to exit")
        subprocess.run(["rm", "-rf", top], check=True)
