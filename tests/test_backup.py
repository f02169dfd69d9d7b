"""`gpuq backup` and `gpuq restore` (issue 35) against the real daemon, a real SQLite file, fake
Ollama nodes and the real CLI: a backup taken while jobs are submitted and stream is consistent
and holds every job acknowledged before it; each refusal says why; a restore refuses while a
router runs, keeps the replaced database aside, says what the restored queue holds, and the next
router serves it (a job that was running in the backup fails on start, as after a crash); a
corrupt, foreign or newer file replaces nothing."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import signal
import sqlite3
import tomllib
from pathlib import Path

import pytest
import tomli_w
from conftest import eventually, node_table, run_cli

MODEL = "qwen3-coder:30b"
TOKENS = {"alice": "alice-token", "root": "root-token"}
USERS = [
    {"name": "alice", "token": TOKENS["alice"], "role": "member"},
    {"name": "root", "token": TOKENS["root"], "role": "admin"},
]
BACKED_UP = re.compile(r"^backed up to (\S+) \((\d+\.\d) MB in (\d+\.\d) s, integrity ok\)$")


async def one_node(fakes, daemon_factory, users: list[dict] | None = None, **script):
    """One node whose jobs stream long enough to be running at a backup (the first runs, the
    rest wait); `users` in gpuq.toml when given."""
    fake = await fakes(MODEL, **({"token_delay_s": 0.02, "tokens": 1000} | script))
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task", "critique"], MODEL)], start=False)
    if users:
        data = tomllib.loads(daemon.config.read_text())
        data["user"] = users
        daemon.config.write_text(tomli_w.dumps(data))
    await daemon.start()
    daemon.fake = fake
    daemon.db = daemon.config.parent / "gpuq.db"
    return daemon


def read(path: Path, sql: str, *params) -> list[tuple]:
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def test_a_backup_taken_while_jobs_are_submitted_and_run_is_consistent(fakes, daemon_factory, tmp_path):
    daemon = await one_node(fakes, daemon_factory)
    before = [(await daemon.submit("task", f"before {i}"))[0]["id"] for i in range(6)]
    await daemon.wait_state(before[0], "running")
    await eventually(lambda: daemon.fake.chat_requests, what="the first job to stream")
    during: list[str] = []
    stop = asyncio.Event()

    async def keep_submitting():
        while not stop.is_set():
            during.append((await daemon.submit("task", f"during {len(during)}"))[0]["id"])

    submitter = asyncio.create_task(keep_submitting())
    await eventually(lambda: len(during) >= 3, what="submits to flow")
    acknowledged = [*before, *during]  # every job answered 201 before the backup was asked for
    target = tmp_path / "backups" / "gpuq-backup.db"
    target.parent.mkdir()
    try:
        res = await daemon.cli("backup", str(target))
    finally:
        stop.set()
        await submitter
    assert res.code == 0, res.err
    match = BACKED_UP.match(res.out.strip())
    assert match and match[1] == str(target), res.out
    assert read(target, "PRAGMA integrity_check") == [("ok",)]
    ids = {r[0] for r in read(target, "SELECT id FROM job")}
    assert set(acknowledged) <= ids
    assert ids <= {*before, *during}  # nothing but jobs that were submitted
    states = dict(read(target, "SELECT id, state FROM job"))
    assert states[before[0]] == "running" and states[before[-1]] == "queued"
    assert read(target, "SELECT COUNT(*) FROM schema_migration")[0][0] > 0
    assert target.stat().st_mode & 0o777 == 0o600  # it holds people's prompts
    assert [p.name for p in target.parent.iterdir()] == [target.name]  # no temporary file left behind
    assert f"database backed up to {target} by " in daemon.log.read_text()
    # The router went on serving throughout: the job that ran during the backup is still running.
    assert (await daemon.job(before[0]))["state"] == "running"

    res = await daemon.cli("backup", str(target), "--force", "--json")
    assert res.code == 0, res.err
    answer = json.loads(res.out)
    assert answer["path"] == str(target) and answer["integrity"] == "ok"
    assert answer["bytes"] == target.stat().st_size and answer["seconds"] >= 0
    assert answer["database"] == str(daemon.db)


async def test_backup_refusals_each_say_why(fakes, daemon_factory, tmp_path):
    daemon = await one_node(fakes, daemon_factory, users=USERS, tokens=5, token_delay_s=0.0)
    root, alice = {"GPUQ_TOKEN": TOKENS["root"]}, {"GPUQ_TOKEN": TOKENS["alice"]}

    async def backup(*args: str, env=root):
        res = await run_cli("--router", daemon.url, "backup", *args, env=env)
        assert res.code == 1 and res.out == "", res
        return res.err.splitlines()[0]

    assert (await backup("relative.db")).startswith("error 400 the backup's path must be absolute")
    missing = tmp_path / "nowhere" / "b.db"
    assert await backup(str(missing)) == (
        f"error 422 the backup's directory {missing.parent} does not exist on the router's machine; nothing was written"
    )
    assert (await backup(str(daemon.db))).startswith(f"error 422 {daemon.db} is the database itself")
    assert (await backup(str(daemon.db) + "-wal")).startswith("error 422 ")
    assert (await backup(str(tmp_path))).startswith(f"error 422 {tmp_path} is a directory")
    existing = tmp_path / "existing.db"
    existing.write_text("keep me")
    assert (await backup(str(existing))) == (
        f'error 409 {existing} already exists; not replaced (send "force": true, or `gpuq backup --force`)'
    )
    assert existing.read_text() == "keep me"
    assert (await backup(str(tmp_path / "b.db"), env=alice)) == (
        "error 403 backing up the database is for an admin; alice is a member"
    )
    assert not (tmp_path / "b.db").exists()
    status, body = await daemon.request(
        "POST",
        "/api/backup",
        {"path": str(tmp_path / "b.db"), "when": 1},
        headers={"Authorization": "Bearer root-token"},
    )
    assert status == 400 and "unknown field 'when'" in body["error"]["message"]
    # With force, the existing file is replaced by a whole, checked copy.
    res = await run_cli("--router", daemon.url, "backup", str(existing), "--force", env=root)
    assert res.code == 0, res.err
    assert read(existing, "PRAGMA integrity_check") == [("ok",)]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


@pytest.mark.postgres
async def test_on_postgresql_a_backup_names_pg_dump(fakes, daemon_factory, pg_dsn, tmp_path):
    fake = await fakes(MODEL)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)], database=pg_dsn)
    res = await daemon.cli("backup", str(tmp_path / "b.db"))
    assert res.code == 1
    first = res.err.splitlines()[0]
    assert first.startswith("error 409 this router's database is on PostgreSQL, and gpuq does not reinvent pg_dump")
    assert "`pg_dump --format=custom --file=gpuq.dump 'postgresql://" in first
    assert not (tmp_path / "b.db").exists()


async def test_restore_refuses_while_the_router_runs_and_after_a_stop_the_next_router_serves_it(
    fakes, daemon_factory, tmp_path
):
    daemon = await one_node(fakes, daemon_factory)
    running = (await daemon.submit("task", "running at the backup"))[0]["id"]
    queued = [(await daemon.submit("task", f"queued at the backup {i}"))[0]["id"] for i in range(2)]
    await daemon.wait_state(running, "running")
    backup = tmp_path / "backup.db"
    status, made = await daemon.request("POST", "/api/backup", {"path": str(backup)})
    assert status == 200 and made["integrity"] == "ok", made
    after = (await daemon.submit("task", "after the backup"))[0]["id"]

    # While the router runs: refused, nothing touched.
    inode = daemon.db.stat().st_ino
    res = await run_cli("restore", str(backup), "--config", str(daemon.config))
    assert res.code == 1 and res.out == ""
    first = res.err.splitlines()[0]
    assert first.startswith(f"error 409 {daemon.db} is in use by another router (pid {daemon.proc.pid}, ")
    assert first.endswith("; stop it first; nothing was replaced")
    assert daemon.db.stat().st_ino == inode
    assert not list(tmp_path.glob("gpuq.db.replaced-*"))
    assert (await daemon.job(after))["state"] == "queued"

    await daemon.kill(signal.SIGTERM)  # a clean stop: the running job fails after shutdown_grace
    assert daemon.proc.returncode == 0
    res = await run_cli("restore", str(backup), "--config", str(daemon.config))
    assert res.code == 0, res.err
    said, kept = res.out.strip().splitlines()
    assert said == (f"restored {daemon.db} from {backup}: 2 queued, 1 running (fails on start, as after a crash)")
    [aside] = tmp_path.glob("gpuq.db.replaced-*")
    assert re.fullmatch(r"gpuq\.db\.replaced-\d{8}T\d{6}Z", aside.name)
    assert kept == f"the replaced database is kept as {aside}"
    # The replaced database is whole beside it (its WAL folded in), with the job after the backup.
    assert not Path(f"{aside}-wal").exists() and read(aside, "PRAGMA integrity_check") == [("ok",)]
    assert dict(read(aside, "SELECT id, state FROM job"))[after] == "queued"
    assert {r[0] for r in read(daemon.db, "SELECT id FROM job")} == {running, *queued}
    assert not (tmp_path / "gpuq.db.lock").exists() and not list(tmp_path.glob(".gpuq.db.restore-*"))

    # The next router serves the restored queue: the running job fails loudly, the rest run.
    daemon.fake.script.tokens, daemon.fake.script.token_delay_s = 5, 0.0
    await daemon.start()
    failed = await daemon.job(running)
    assert failed["state"] == "failed"
    assert failed["error"].startswith("router restarted while running"), failed["error"]
    for job_id in queued:
        await daemon.wait_state(job_id, "done", timeout=20)
    status, _ = await daemon.request("GET", f"/api/jobs/{after}")
    assert status == 404  # made after the backup: only in the replaced database


async def test_restore_refuses_a_corrupt_foreign_or_newer_file_and_replaces_nothing(fakes, daemon_factory, tmp_path):
    daemon = await one_node(fakes, daemon_factory, tokens=5, token_delay_s=0.0)
    job = (await daemon.submit("task", "kept"))[0]["id"]
    await daemon.wait_state(job, "done")
    good = tmp_path / "good.db"
    status, _ = await daemon.request("POST", "/api/backup", {"path": str(good)})
    assert status == 200
    await daemon.kill(signal.SIGTERM)
    before = digest(daemon.db)

    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, but long enough to be read as a header " * 20)
    foreign = tmp_path / "foreign.db"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    newer = tmp_path / "newer.db"
    newer.write_bytes(good.read_bytes())
    db = sqlite3.connect(newer)
    db.execute("INSERT INTO schema_migration VALUES (999, '999_future', '2030-01-01T00:00:00Z')")
    db.commit()
    db.close()
    corrupt = tmp_path / "corrupt.db"
    data = bytearray(good.read_bytes())
    page = read(good, "PRAGMA page_size")[0][0]
    pages = len(data) // page
    for n in range(1, pages):  # every page but the first (the header and the schema's root)
        data[n * page + 8 : n * page + 64] = b"\xff" * 56
    corrupt.write_bytes(bytes(data))

    cases = {
        text: "it does not open as a SQLite database",
        foreign: "it is a SQLite database, but not gpuq's",
        newer: "it was written by a newer gpuq (schema version 999;",
        corrupt: "",  # SQLite's own words: it fails the integrity check, or does not open
        tmp_path / "missing.db": "",
    }
    for path, why in cases.items():
        res = await run_cli("restore", str(path), "--database", str(daemon.db))
        assert res.code == 1 and res.out == "", res
        first = res.err.splitlines()[0]
        if path.name == "missing.db":
            assert first == f"error 404 the backup {path} does not exist; nothing was replaced"
        else:
            assert first.startswith(f"error 422 {path} cannot be restored: {why}"), first
        assert digest(daemon.db) == before
        assert not list(tmp_path.glob("gpuq.db.replaced-*")) and not list(tmp_path.glob(".gpuq.db.restore-*"))
        assert not (tmp_path / "gpuq.db.lock").exists()

    # The good one, named by $GPUQ_DATABASE (as `gpuq serve` takes it), restores.
    res = await run_cli("restore", str(good), env={"GPUQ_DATABASE": str(daemon.db)})
    assert res.code == 0, res.err
    assert res.out.startswith(f"restored {daemon.db} from {good}: 1 done\n")


def test_a_router_started_during_a_restore_is_told_a_restore_holds_the_database(tmp_path):
    """The lock's holder says what it is: a router refused mid-restore is not told of a router."""
    from gpuq.errors import DatabaseInUse
    from gpuq.ops.dblock import lock_database, unlock_database
    from gpuq.ops.restore import HOLDER

    db = tmp_path / "gpuq.db"
    held = lock_database(db, "", HOLDER)
    try:
        with pytest.raises(DatabaseInUse) as refused:
            lock_database(db, "127.0.0.1:8750")
        assert (
            f"is in use by `gpuq restore`, replacing the database, pid {os.getpid()}, since " in refused.value.message
        )
        assert "another router" not in refused.value.message
    finally:
        unlock_database(db, held)
