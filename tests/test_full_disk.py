"""A full disk under every file the router writes (issue 43, items 1 and 6): the database and its
WAL (and the batch files it holds), the retention archive, the backups. As root (CI, and `make
test` here) each test mounts a small tmpfs of its own and fills it with a filler file, under the
real daemon; the router refuses clearly (the HTTP status, and a JSON error naming the full disk
and what could not be written), keeps what it had (every job counted, in the database or whole in
the archive), and once the filler is removed recovers by itself, with no restart. Where a tmpfs
cannot be mounted (not root), those tests are skipped and the ones below them meet ENOSPC at the
one seam the archive and the backups write through (gpuq/disk.py). And a router killed in the
middle of a backup leaves its partial copy behind only until its next start or its next backup
there."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gzip
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import tomllib
from pathlib import Path

import pytest
import tomli_w
from conftest import eventually, node_table, run_cli
from test_retention import sql

from gpuq import disk
from gpuq.upkeep import archive
from gpuq.upkeep.archived import index_of

MODEL = "qwen3-coder:30b"
DAY = 86400
FULL_DB = "the database cannot be written: database or disk is full; nothing was changed"


# -- a small disk of the test's own ---------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(name, size)`: a tmpfs of `size` mounted at tmp_path/name (skipped where it
    cannot be mounted); each unmounted at the end, lazily if a process still holds it."""
    mounted: list[Path] = []

    def mount(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root; the seam tests below cover ENOSPC here")
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)], capture_output=True
        )
        if done.returncode != 0:
            pytest.skip(f"a tmpfs cannot be mounted here: {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)


def fill(where: Path, leave: int = 0) -> Path:
    """A filler file that takes the disk's room, but `leave` bytes (or all of it)."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    block = b"\0" * 4096
    try:
        while free(where) > leave:
            try:
                os.write(fd, block[: max(min(len(block), free(where) - leave), 1)])
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    finally:
        os.close(fd)
    return filler


def free(where: Path) -> int:
    return shutil.disk_usage(where).free


# -- the router and its jobs ------------------------------------------------------------------


async def router(fakes, daemon_factory, tables: dict | None = None, **router_keys):
    fake = await fakes(MODEL, tokens=3, thinking_tokens=0)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)], start=False, **router_keys)
    data = tomllib.loads(daemon.config.read_text())
    data.update(tables or {})
    daemon.config.write_text(tomli_w.dumps(data))
    await daemon.start()
    daemon.fake = fake
    return daemon


def age(path: Path, days: float) -> None:
    """Every job ended (and was made) `days` ago, as a person at the sqlite3 shell could set it."""
    shift = f"-{days * DAY} seconds"
    sql(
        path,
        "UPDATE job SET finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', finished_at, ?),"
        " created_at = strftime('%Y-%m-%dT%H:%M:%fZ', created_at, ?)",
        shift,
        shift,
    )


async def cancelled_jobs(daemon, n: int, prompt_bytes: int) -> list[str]:
    """`n` jobs that waited behind a running one and were cleared: ended, each with a prompt of
    random text (which gzip cannot shrink much)."""
    daemon.fake.script.token_delay_s, daemon.fake.script.tokens = 0.5, 100
    [blocker] = await daemon.submit("task", "keeps the node busy")
    await daemon.wait_state(blocker["id"], "running")
    ids = [(await daemon.submit("task", secrets.token_hex(prompt_bytes // 2)))[0]["id"] for _ in range(n)]
    status, _ = await daemon.request("POST", "/api/nodes/node-1/clear", {})
    assert status == 200
    return ids


def zcat(directory: Path) -> list[dict]:
    """What `zcat jobs-*.jsonl.gz` reads: it fails on a damaged file."""
    out = []
    for path in sorted(directory.glob("jobs-*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            out += [json.loads(line) for line in f]
    return out


def stored(db: Path) -> set[str]:
    return {r[0] for r in sql(db, "SELECT id FROM job")}


async def last_sweep(daemon) -> dict | None:
    return (await daemon.get("/health"))["retention"]["last"]


DECEMBER = 1796083200  # 2026-12-01T00:00:00Z: a job id starts with the second it was made


def jid(n: int) -> str:
    return f"{DECEMBER + n}-0000000{n}"


def _job(n: int, text: str = "") -> dict:
    """A job's archived line, as a sweep writes it (the columns a search shows)."""
    return {
        "id": jid(n),
        "kind": "task",
        "state": "cancelled",
        "node": "node-1",
        "created_at": "2026-12-01T00:00:00.000000Z",
        "prompt": text or f"p{n}",
        "runs": [],
    }


# -- the archive ------------------------------------------------------------------------------


async def test_a_sweep_onto_a_full_archive_disk_loses_no_job_and_finishes_once_there_is_room(
    small_disk, fakes, daemon_factory, tmp_path
):
    """The issue's scenario: 150 jobs due for deletion, the archive on a 1 MB filesystem nearly
    full, a sweep every second. Today's code lost 74 of 150 (a short write taken for a whole one,
    then the jobs deleted) and left a file zcat could not read."""
    shelf = small_disk("archive", "1m")
    daemon = await router(fakes, daemon_factory)
    ids = await cancelled_jobs(daemon, 150, 3000)
    await daemon.kill(signal.SIGTERM)
    db = tmp_path / "gpuq.db"
    age(db, 10)
    data = tomllib.loads(daemon.config.read_text())
    data["retention"] = {"every": "1s", "delete_after": "1d", "batch": 10, "archive": str(shelf)}
    daemon.config.write_text(tomli_w.dumps(data))
    filler = fill(shelf, leave=96 * 1024)  # room for some batches, not all
    await daemon.start()

    async def failed():
        last = await last_sweep(daemon)
        return last if last and not last["ok"] else None

    last = await eventually(failed, 30, 0.1, "a sweep to fail on the full disk")
    assert "the disk is full" in last["error"] and str(shelf) in last["error"], last
    assert "nothing of this batch was pruned or deleted" in last["error"]
    status, body = await daemon.request("POST", "/api/prune", {})  # `gpuq prune`: refused, saying why
    assert status == 503 and "the disk is full" in body["error"]["message"], body
    assert str(shelf) in body["error"]["message"]

    # Every job is in exactly one place: the database, or whole in the archive (zcat reads it).
    archived = [line["id"] for line in zcat(shelf)]
    assert archived, "no batch fitted before the disk filled: nothing was tested"
    assert len(archived) == len(set(archived))
    left = stored(db) & set(ids)
    assert left, "every job fitted: the disk never filled"
    assert set(archived) | left == set(ids) and not set(archived) & left
    assert sorted(j["id"] for j in archive.search(shelf, "", limit=1000)) == sorted(archived)

    filler.unlink()  # room again: the next sweep finishes, no restart

    async def emptied():
        return not stored(db) & set(ids)

    await eventually(emptied, 60, 0.2, "the next sweeps to archive and delete the rest")
    found = archive.find(shelf, "", limit=1000)
    mine = [j for j in found.jobs if j["id"] in set(ids)]
    assert sorted(j["id"] for j in mine) == sorted(ids) and found.damaged == []
    assert all(j["archived_lines"] == 1 for j in mine)  # each once: none written twice, none half
    assert sorted(line["id"] for line in zcat(shelf) if line["id"] in set(ids)) == sorted(ids)
    assert not [p for p in shelf.iterdir() if archive.FILE.fullmatch(p.name) and p.name.count(".") > 2]

    async def told():
        last = await last_sweep(daemon)
        return last if last and last["ok"] else None

    await eventually(told, 10, 0.1, "/health to show a sweep that succeeded")


async def test_a_damaged_month_file_is_never_appended_to_and_search_reads_past_its_damage(tmp_path):
    """A month's file with a member cut short in its middle (a crash, a full disk under older
    code): today's code appended after it, so zcat and the search lost every later line (and the
    search failed on zlib.error); now the month goes on in a file of its own, and the search
    reads every whole member and names the damage."""

    def job(n: int) -> dict:
        return _job(n, f"job {n}")

    archive.append(tmp_path, [job(1)], "delete", 1_800_000_000.0)
    month = tmp_path / "jobs-2026-12.jsonl.gz"
    whole = month.stat().st_size
    with open(month, "ab") as f:
        f.write(gzip.compress(b'{"id": "lost"}\n' * 50)[:40])  # cut short
        f.write(gzip.compress((json.dumps(job(2)) + "\n").encode()))  # a whole member after the damage
    damaged = month.read_bytes()

    archive.append(tmp_path, [job(3)], "delete", 1_800_000_000.0)
    assert month.read_bytes() == damaged  # never appended to again
    second = tmp_path / "jobs-2026-12.2.jsonl.gz"
    with gzip.open(second, "rt") as f:  # zcat reads the month's next file whole
        assert [json.loads(line)["id"] for line in f] == [jid(3)]
    assert archive.files(tmp_path) == [month, second]

    found = archive.find(tmp_path, "JOB")
    assert [j["id"] for j in found.jobs] == [jid(3), jid(2), jid(1)]
    assert [(d.path, d.offset, d.length) for d in found.damaged] == [(month, whole, 40)]

    res = await run_cli("archive", "search", "job", "--dir", str(tmp_path))
    assert res.code == 0, res.err
    assert [line.split()[0] for line in res.out.splitlines()] == [jid(3), jid(2), jid(1)]
    # A deleted job's 404 finds it in the month's next file too (gpuq/upkeep/archived.py).
    assert index_of(tmp_path).find(jid(3)).file == second
    assert f"warning: damaged archive: {month}: 40 byte(s) at offset {whole} cannot be read" in res.err


async def test_bytes_that_are_not_gzip_in_a_month_file_are_named_and_read_past(tmp_path):
    """Garbage in the middle (a disk block gone bad): today's search failed on zlib.error."""
    job = _job(1, "first") | {"created_at": "2026-11-01T00:00:00.000000Z"}
    archive.append(tmp_path, [job], "delete", 1_800_000_000.0)
    month = tmp_path / "jobs-2026-11.jsonl.gz"
    whole = month.stat().st_size
    with open(month, "ab") as f:
        f.write(b"\x1f\x8b\x08" + b"\xff" * 997)  # a header, then no deflate stream
        f.write(gzip.compress(json.dumps(job | {"id": jid(2), "prompt": "second"}).encode() + b"\n"))
    res = await run_cli("archive", "search", "", "--dir", str(tmp_path), "--json")
    assert res.code == 0, res.err
    assert [json.loads(line)["id"] for line in res.out.splitlines()] == [jid(2), jid(1)]
    assert f"{month}: 1000 byte(s) at offset {whole} cannot be read (not a whole gzip member" in res.err


# -- the archive at the seam (no root needed) -------------------------------------------------


def test_a_short_write_then_a_full_disk_leaves_the_month_file_as_it_was(tmp_path, monkeypatch):
    archive.append(tmp_path, [_job(1)], "delete", 1_800_000_000.0)
    month = tmp_path / "jobs-2026-12.jsonl.gz"
    before = month.read_bytes()
    calls = []

    def filling(fd, data):  # as a disk that fills: part of the buffer, then ENOSPC
        calls.append(len(data))
        if len(calls) == 1:
            return os.write(fd, data[:100])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk, "write_some", filling)
    with pytest.raises(archive.Unwritable, match=r"jobs-2026-12\.jsonl\.gz cannot be written: the disk is full"):
        archive.append(tmp_path, [_job(2, secrets.token_hex(2000))], "delete", 1_800_000_000.0)
    assert len(calls) == 2  # the short count was not taken for the whole member
    assert month.read_bytes() == before
    monkeypatch.undo()
    archive.append(tmp_path, [_job(3)], "delete", 1_800_000_000.0)
    with gzip.open(month, "rt") as f:
        assert [json.loads(line)["id"] for line in f] == [jid(1), jid(3)]


def test_an_fsync_that_fails_leaves_no_new_file_and_the_jobs_stay(tmp_path, monkeypatch):
    def refused(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk, "fsync_fd", refused)
    with pytest.raises(archive.Unwritable, match="the disk is full"):
        archive.append(tmp_path, [_job(1)], "delete", 1_800_000_000.0)
    assert archive.files(tmp_path) == []  # the file it made is gone: nothing half-written


async def test_a_sweep_that_meets_a_full_disk_at_the_seam_keeps_its_jobs_in_the_database(tmp_path, monkeypatch):
    from gpuq.config import Settings
    from gpuq.errors import StoreUnavailable
    from gpuq.jobs import NewJob
    from gpuq.store import NodeInfo, Store
    from gpuq.upkeep.retention import Sweeper

    now = [1_800_000_000.0]
    store = Store(tmp_path / "q.db", clock=lambda: now[0])
    await store.open()
    try:
        node = [NodeInfo("a", 1, ("task",), "m", True, idle=False)]
        ids = [(await store.submit(NewJob("task", f"p{i}", node="a"), node, "api"))[0]["id"] for i in range(3)]
        for job_id in ids:
            await store.delete(job_id, "api")
        now[0] += 400 * DAY
        settings = Settings(retention_archive=tmp_path / "archive")
        sweeper = Sweeper(store, lambda: settings, lambda: None)

        def full(fd, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(disk, "write_some", full)
        with pytest.raises(StoreUnavailable, match=r"the disk is full.*its 3 jobs stay in the database"):
            await sweeper.run_once()
        assert [(await store.job(j))["state"] for j in ids] == ["cancelled"] * 3
        monkeypatch.undo()
        swept = await sweeper.run_once()
        assert swept.deleted["jobs"] == 3
        assert sorted(j["id"] for j in archive.search(tmp_path / "archive", "")) == sorted(ids)
    finally:
        await store.close()


# -- the database, its WAL and the batch files it holds ----------------------------------------


async def test_a_full_disk_under_the_database_refuses_writes_keeps_every_job_and_recovers_without_restart(
    small_disk, fakes, daemon_factory, tmp_path
):
    where = small_disk("db", "4m")
    daemon = await router(fakes, daemon_factory, database=str(where / "gpuq.db"))
    done = [(await daemon.submit("task", f"before {i}"))[0]["id"] for i in range(5)]
    for job_id in done:
        await daemon.wait_state(job_id, "done")
    filler = fill(where)
    acked: list[str] = []
    for i in range(500):  # the WAL and the file grow into what little is left, then refuse
        status, body = await daemon.request("POST", "/api/jobs", {"kind": "task", "prompt": f"{i} " + "x" * 4000})
        if status != 201:
            break
        acked.append(body["jobs"][0]["id"])
    assert (status, body) == (503, {"error": {"status": 503, "message": FULL_DB}})
    batch = tmp_path / "lines.jsonl"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    batch.write_text(json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}))
    res = await daemon.cli("batch", "submit", str(batch))  # a batch's file lives in the database
    assert res.code == 1 and res.err.startswith(f"error 503 {FULL_DB}"), res

    listed = {j["id"] for j in (await daemon.get("/api/jobs?limit=1000"))["jobs"]}  # reads go on
    assert listed == set(done) | set(acked)

    filler.unlink()  # room again: the same router takes writes, no restart

    async def accepted():
        status, body = await daemon.request("POST", "/api/jobs", {"kind": "task", "prompt": "after the room"})
        return body["jobs"][0]["id"] if status == 201 else None

    after = await eventually(accepted, 15, 0.1, "a submit to be taken again")
    await daemon.wait_state(after, "done", timeout=30)
    res = await daemon.cli("batch", "submit", str(batch))
    assert res.code == 0, res
    for job_id in acked:
        await daemon.wait_state(job_id, "done", timeout=30)
    await daemon.kill(signal.SIGTERM)
    assert sql(where / "gpuq.db", "PRAGMA integrity_check") == [("ok",)]
    assert stored(where / "gpuq.db") >= set(done) | set(acked) | {after}


async def test_a_router_started_on_a_full_disk_exits_2_naming_it_and_starts_once_there_is_room(
    small_disk, fakes, daemon_factory
):
    """Today's code died with a traceback writing its lock file, and left the empty file."""
    where = small_disk("db", "4m")
    daemon = await router(fakes, daemon_factory, database=str(where / "gpuq.db"))
    [job] = await daemon.submit("task", "kept across the refused start")
    await daemon.wait_state(job["id"], "done")
    await daemon.kill(signal.SIGTERM)
    filler = fill(where)
    res = await daemon.cli("serve", "--config", str(daemon.config), timeout=20)
    assert res.code == 2, res
    assert f"cannot write the lock file {where / 'gpuq.db.lock'}: the disk is full" in res.err, res.err
    assert "Traceback" not in res.err and not (where / "gpuq.db.lock").exists()
    filler.unlink()
    await daemon.start()
    assert (await daemon.job(job["id"]))["state"] == "done"


async def test_a_restore_onto_a_full_disk_replaces_nothing_and_says_why(small_disk, tmp_path):
    from gpuq.store import Store

    where = small_disk("db", "4m")
    for path in (tmp_path / "backup.db", where / "gpuq.db"):  # a gpuq database each
        store = Store(path)
        await store.open()
        await store.close()
    before = (where / "gpuq.db").read_bytes()
    filler = fill(where, leave=16 * 1024)  # room for the lock file, not for the copy
    args = ("restore", str(tmp_path / "backup.db"), "--database", str(where / "gpuq.db"))
    res = await run_cli(*args)
    assert res.code == 1, res
    said = f"error 503 {tmp_path / 'backup.db'} cannot be copied beside {where / 'gpuq.db'}: the disk is full"
    assert res.err.startswith(said) and "nothing was replaced" in res.err, res.err
    assert (where / "gpuq.db").read_bytes() == before
    assert sorted(p.name for p in where.iterdir()) == ["filler", "gpuq.db"]
    filler.unlink()
    res = await run_cli(*args)
    assert res.code == 0 and res.out.startswith(f"restored {where / 'gpuq.db'} from "), res


# -- the backups ------------------------------------------------------------------------------


def partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".partial" in p.name)


async def test_a_backup_onto_a_full_disk_is_refused_leaves_nothing_and_the_schedule_recovers(
    small_disk, fakes, daemon_factory, tmp_path
):
    where = small_disk("backups", "24m")
    daemon = await router(fakes, daemon_factory, {"backup": {"every": "2s", "keep": 1, "dir": str(where / "sched")}})
    for _ in range(40):  # a database of a few MB: more than the room left
        await daemon.submit("task", secrets.token_hex(30_000))
    filler = fill(where, leave=256 * 1024)
    target = where / "by-hand.db"
    status, body = await daemon.request("POST", "/api/backup", {"path": str(target)})
    assert status == 503, body
    message = body["error"]["message"]
    assert "database or disk is full" in message and f"nothing was written to {target}" in message
    assert not target.exists() and partials(where) == []

    async def failing():
        health = await daemon.get("/health")
        return health["backup"]["last_failure"]

    failure = await eventually(failing, 15, 0.1, "the scheduled backup to fail")
    assert "database or disk is full" in failure["error"], failure
    assert partials(where) == [] and partials(where / "sched") == []

    filler.unlink()  # room again: the schedule's next try succeeds by itself

    async def made():
        health = await daemon.get("/health")
        last = health["backup"]["last"]
        return last if last and last["scheduled"] and health["backup"]["last_failure"] is None else None

    last = await eventually(made, 15, 0.1, "a scheduled backup to succeed")
    assert Path(last["path"]).parent == where / "sched"
    status, body = await daemon.request("POST", "/api/backup", {"path": str(target)})
    assert status == 200 and body["integrity"] == "ok", body


def test_a_backup_whose_fsync_meets_a_full_disk_is_a_503_and_leaves_nothing(tmp_path, monkeypatch):
    """The seam's test of a backup (no root needed): the copy made, its fsync refused."""
    from gpuq.errors import StoreUnavailable
    from gpuq.store.backup import back_up

    db = tmp_path / "gpuq.db"
    sqlite3.connect(db).executescript("CREATE TABLE t (x); INSERT INTO t VALUES (1);").close()
    (tmp_path / "out").mkdir()

    def refused(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(disk, "fsync_fd", refused)
    target = tmp_path / "out" / "copy.db"
    with pytest.raises(StoreUnavailable, match=r"could not be written to .*copy\.db: the disk is full"):
        back_up(db, target, 1.0)
    assert list((tmp_path / "out").iterdir()) == []
    monkeypatch.undo()
    assert back_up(db, target, 1.0)["integrity"] == "ok"


async def test_backups_killed_mid_copy_leave_nothing_after_a_restart_or_the_next_backup(
    fakes, daemon_factory, tmp_path
):
    """Each SIGKILL during a backup left `.NAME.<hex>.partial` and its `-journal` for good (1.46 GB
    after five kills in the issue); now a start removes those in the backup folder, and a backup
    those in its own folder."""
    daemon = await router(fakes, daemon_factory, {"backup": {"every": "off"}})
    await daemon.kill(signal.SIGTERM)
    db = tmp_path / "gpuq.db"
    ballast = sqlite3.connect(db, isolation_level=None)  # a large database: its copy takes a while
    ballast.execute("CREATE TABLE ballast (b BLOB)")
    ballast.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1500)"
        " INSERT INTO ballast SELECT randomblob(65536) FROM n"
    )
    ballast.close()
    await daemon.start()

    async def killed_mid_copy(target: Path) -> list[str]:
        asking = daemon.session.post(daemon.url + "/api/backup", json={"path": str(target)})
        request = asyncio.ensure_future(asking)

        def copying():
            return [n for n in partials(target.parent) if n.endswith(".partial") and (target.parent / n).stat().st_size]

        try:
            await eventually(copying, 20, 0.002, "the backup's partial copy to grow")
            await daemon.kill(signal.SIGKILL)
        finally:
            with contextlib.suppress(Exception):
                (await request).close()
        return partials(target.parent)

    scheduled_dir = tmp_path / "gpuq-backups"  # the backup folder ([backup] dir's default)
    scheduled_dir.mkdir()
    left = await killed_mid_copy(scheduled_dir / "by-hand.db")
    assert left and all(n.startswith(".by-hand.db.") for n in left), left
    await daemon.start()
    await eventually(lambda: partials(scheduled_dir) == [], 10, 0.05, "the start to remove the partial copy")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    mine = elsewhere / ".keep.db.0123abcd.partial.txt"  # not the pattern: never touched
    mine.write_text("someone's own file")
    left = await killed_mid_copy(elsewhere / "first.db")
    assert left, "nothing was left to clean"
    await daemon.start()
    status, body = await daemon.request("POST", "/api/backup", {"path": str(elsewhere / "second.db")})
    assert status == 200, body
    assert partials(elsewhere) == [mine.name]  # the next backup there removed the killed one's
    assert sorted(p.name for p in elsewhere.iterdir()) == sorted([mine.name, "second.db"])
