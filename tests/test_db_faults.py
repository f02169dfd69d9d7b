"""The database under a person's hands: the sqlite3 shell reading or holding the write lock,
and a database that cannot grow (full). The router waits up to its busy timeout, fails the
one request loudly, keeps serving reads, loses nothing, and recovers on its own. A database
deleted or replaced under it turns it red and every write is refused until it is restarted."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import time

import pytest
from conftest import eventually, node_table, write_config

LOCKED = "the database is locked by another process (database is locked); nothing was changed"
# The cap's refusal names the cap (a full disk's says "database or disk is full").
CAPPED = "the database cannot be written: it reached router.max_database_bytes (524.3 kB; "
CAPPED_FIX = "raise it (gpuq.toml, then a restart) or prune what the queue no longer needs; nothing was changed"


def counts(path) -> dict[str, int]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("job", "run", "event")}
    finally:
        db.close()


def integrity(path) -> str:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


async def two_nodes(fakes, daemon_factory, **router):
    f1 = await fakes("qwen3-coder:30b")
    f2 = await fakes("qwen3-coder:30b")
    d = await daemon_factory(
        [
            node_table("node-1", f1, 1, ["task"], "qwen3-coder:30b"),
            node_table("node-2", f2, 2, ["task"], "qwen3-coder:30b"),
        ],
        **router,
    )
    return f1, f2, d


async def test_a_long_read_in_the_sqlite_shell_never_blocks_the_router(fakes, daemon_factory, tmp_path):
    f1, f2, d = await two_nodes(fakes, daemon_factory, busy_timeout="0.5s")
    [first] = await d.submit("task", "before the shell")
    await d.wait_state(first["id"], "done")
    shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    shell.execute("BEGIN")
    assert shell.execute("SELECT COUNT(*) FROM job").fetchone()[0] == 1  # the snapshot is taken
    ids = [(await d.submit("task", f"while the shell reads {i}"))[0]["id"] for i in range(4)]
    for job_id in ids:
        await d.wait_state(job_id, "done", timeout=15)
    # The shell still sees its own consistent snapshot; the router wrote past it.
    assert shell.execute("SELECT COUNT(*) FROM job").fetchone()[0] == 1
    shell.execute("COMMIT")
    assert shell.execute("SELECT COUNT(*) FROM job WHERE state = 'done'").fetchone()[0] == 5
    shell.close()
    assert integrity(tmp_path / "gpuq.db") == "ok"


async def test_a_write_lock_in_the_sqlite_shell_fails_one_request_loudly_then_the_router_recovers(
    fakes, daemon_factory, tmp_path
):
    f1, f2, d = await two_nodes(fakes, daemon_factory, busy_timeout="0.5s")
    db_path = tmp_path / "gpuq.db"
    f1.script.token_delay_s = 0.05
    f1.script.tokens = 30
    [long] = await d.submit("task", "streams while the shell holds the lock", node="node-1")
    await d.wait_state(long["id"], "running")
    before = counts(db_path)

    shell = sqlite3.connect(db_path, isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")  # what `BEGIN IMMEDIATE;` typed in the sqlite3 shell does
    try:
        started = time.monotonic()
        status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": "refused"})
        waited = time.monotonic() - started
        assert status == 503 and body["error"]["message"] == LOCKED
        assert waited >= 0.45  # it waited for the busy timeout first
        res = await d.cli("task", "refused too")
        assert res.code == 1
        assert res.err.splitlines() == [f"error 503 {LOCKED}", "not retried"]
        # Reads go on: the job, the queue, health.
        assert (await d.job(long["id"]))["state"] == "running"
        assert (await d.get("/api/queue"))["nodes"][0]["running"]["id"] == long["id"]
        assert "queue_depth" in await d.get("/health")
        # Hold the lock past the end of the stream: the router cannot record the outcome yet.
        # The stream ends under the lock: the router cannot record it, and says so in its log.
        refused = f"job={long['id']} end of stream not recorded yet"
        await eventually(lambda: refused in d.log.read_text(), 20, 0.05, "the refused write to be logged")
        assert (await d.job(long["id"]))["state"] == "running"
    finally:
        shell.execute("ROLLBACK")
        shell.close()

    # The outcome was kept, not dropped: the job finishes with its whole output.
    done = await d.wait_state(long["id"], "done", timeout=15)
    assert len(done["output"].split()) == 30
    assert len(f1.chat_requests) == 1  # never re-run
    # The node is not wedged and submits work again.
    [after] = await d.submit("task", "after the lock", node="node-1")
    await d.wait_state(after["id"], "done", timeout=15)
    now = counts(db_path)
    assert now["job"] == before["job"] + 1  # the refused submits left nothing behind
    assert integrity(db_path) == "ok"


async def test_a_router_started_under_the_shells_write_lock_exits_2_naming_it(fakes, daemon_factory, tmp_path):
    f1, f2, d = await two_nodes(fakes, daemon_factory, busy_timeout="0.5s")
    [job] = await d.submit("task", "kept across the refused start")
    await d.wait_state(job["id"], "done")
    await d.kill(signal.SIGTERM)
    shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    try:
        res = await d.cli("serve", "--config", str(d.config), timeout=20)
    finally:
        shell.execute("ROLLBACK")
        shell.close()
    assert res.code == 2
    assert f"cannot start: {LOCKED}" in res.err
    await d.start()  # the lock is gone: it starts, and the job is still there
    assert (await d.job(job["id"]))["state"] == "done"


async def test_a_full_database_refuses_submits_loudly_keeps_serving_reads_and_loses_nothing(
    fakes, daemon_factory, tmp_path
):
    # A real full disk cannot be made on demand here (the tests run as root, which ignores
    # file permissions, and mounting a tiny filesystem needs privileges CI lacks). The router's
    # own size cap, `max_database_bytes` (SQLite's max_page_count), makes SQLite refuse to
    # grow the file with the same SQLITE_FULL error a full disk gives, through the same path.
    fake = await fakes("qwen3-coder:30b")
    port = fake.port
    await fake.stop()  # jobs wait, so only submits grow the database
    nodes = [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")]
    d = await daemon_factory(nodes, max_database_bytes=512 * 1024)  # an empty database is ~270 KB
    db_path = tmp_path / "gpuq.db"
    acked, refused = [], None
    for i in range(400):
        status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": f"{i:04d} " + "x" * 3000})
        if status != 201:
            refused = (status, body)
            break
        acked.append(body["jobs"][0]["id"])
    assert refused is not None, "the database never filled up"
    message = refused[1]["error"]["message"]
    assert refused[0] == 503 and message.startswith(CAPPED) and message.endswith(CAPPED_FIX), refused
    assert len(acked) >= 10
    big = tmp_path / "big.md"
    big.write_text("one more " + "x" * 3000)
    res = await d.cli("task", "--file", str(big))
    assert res.code == 1 and res.err.splitlines() == [f"error 503 {message}", "not retried"], res.err

    # Reads keep working and show every acknowledged job.
    listed = {j["id"] for j in (await d.get("/api/jobs?limit=1000"))["jobs"]}
    assert listed == set(acked)
    assert (await d.get("/api/queue"))["queue_depth"] == len(acked)
    assert (await d.job(acked[-1]))["state"] == "queued"
    assert counts(db_path)["job"] == len(acked)  # the refused submits left nothing behind

    # Space comes back (the cap is lifted) and the node returns: every job runs.
    await d.kill(signal.SIGTERM)
    write_config(d.config, nodes, int(d.url.rsplit(":", 1)[1]))
    await fake.start(port=port)
    await d.start()
    for job_id in acked:
        await d.wait_state(job_id, "done", timeout=30)
    assert len(fake.chat_requests) == len(acked)
    assert integrity(db_path) == "ok"


def _unlink_wal(db_path) -> None:
    (db_path.parent / (db_path.name + "-wal")).unlink()


def _unlink_db(db_path) -> None:
    db_path.unlink()


def _remove_directory(db_path) -> None:
    shutil.rmtree(db_path.parent)


def _replace_with_a_copy(db_path) -> None:
    """What restoring a backup with `mv` does: another file (a consistent copy) at the path."""
    copy = db_path.with_name("copy.db")
    src, dst = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True), sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    os.replace(copy, db_path)


@pytest.mark.parametrize(
    "damage, what",
    [
        (_unlink_wal, "the database's WAL file {db}-wal was deleted while the router ran"),
        (_unlink_db, "the database file {db} was deleted while the router ran"),
        (_remove_directory, "the database's directory {dir} was removed while the router ran"),
        (_replace_with_a_copy, "the database file {db} was replaced by another file while the router ran"),
    ],
)
async def test_a_database_deleted_or_replaced_under_the_router_turns_it_red_and_refuses_every_write(
    fakes, daemon_factory, tmp_path, damage, what
):
    fake = await fakes("qwen3-coder:30b")
    db_path = tmp_path / "db" / "gpuq.db"
    db_path.parent.mkdir()
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], database="db/gpuq.db")
    [before] = await d.submit("task", "acknowledged before the loss")
    await d.wait_state(before["id"], "done")
    status, health = await d.request("GET", "/health")
    assert status == 200 and health["ok"] is True and health.get("database_lost") is None

    damage(db_path)
    message = what.format(db=db_path, dir=db_path.parent) + "; restart the router (nothing is stored until then)"
    for i in range(5):  # every submit after the loss is refused, none acknowledged into the lost file
        status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": f"after the loss {i}"})
        assert (status, body) == (503, {"error": {"status": 503, "message": message}})
    res = await d.cli("task", "from the CLI after the loss")
    assert res.code == 1 and res.err.splitlines() == [f"error 503 {message}", "not retried"]

    async def red():
        status, health = await d.request("GET", "/health")
        return health if status == 503 else None

    health = await eventually(red, 5, what="/health to turn red")
    assert health["ok"] is False and health["database_lost"] == message
    assert message in d.log.read_text()  # said once in the log too
    # Restarted, the router runs on what is at the path now, and is green again.
    await d.kill(signal.SIGTERM)
    await d.start()
    status, health = await d.request("GET", "/health")
    assert status == 200 and health["database_lost"] is None
    # Nothing refused was committed anywhere: no refused job turns up after the restart. The
    # job acknowledged before is in a database that is still at its path (the WAL's frames are
    # checkpointed into it as the router stops; the replacement was a copy).
    listed = [j["prompt_excerpt"] for j in (await d.get("/api/jobs?limit=1000"))["jobs"]]
    assert listed == (["acknowledged before the loss"] if damage in (_unlink_wal, _replace_with_a_copy) else [])


async def test_submits_racing_the_loss_of_the_wal_are_either_acknowledged_and_kept_or_refused_and_absent(
    fakes, daemon_factory, tmp_path
):
    """Eight clients submit without pause while the WAL is unlinked: the check runs in the writer's
    thread right before each commit, so no batch is committed into the lost file after it is seen.
    Stopped with SIGTERM (what the 503 advises), the router checkpoints what it had into the
    database, still at its path: every job answered 201 is there after the restart, and none of
    those answered 503."""
    fake = await fakes("qwen3-coder:30b")
    await fake.stop()  # the jobs wait: only submits write
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")])
    db_path = tmp_path / "gpuq.db"
    acked: list[str] = []
    refused: list[str] = []
    stop = asyncio.Event()

    async def client(n: int) -> None:
        for i in range(10_000):
            if stop.is_set():
                return
            prompt = f"client {n} job {i}"
            status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": prompt})
            if status == 201:
                acked.append(body["jobs"][0]["id"])
            else:
                assert status == 503 and "was deleted while the router ran" in body["error"]["message"], body
                refused.append(prompt)

    clients = [asyncio.create_task(client(n)) for n in range(8)]
    try:
        await eventually(lambda: len(acked) >= 40, 15, 0.01, "submits to be acknowledged")
        _unlink_wal(db_path)
        await eventually(lambda: len(refused) >= 40, 15, 0.01, "submits to be refused")
    finally:
        stop.set()
        await asyncio.gather(*clients)
    await d.kill(signal.SIGTERM)
    await d.start()
    listed = (await d.get("/api/jobs?limit=10000"))["jobs"]
    assert {j["id"] for j in listed} == set(acked)
    assert not {j["prompt_excerpt"] for j in listed} & set(refused)
    assert integrity(db_path) == "ok"


async def test_a_write_the_schema_refuses_is_a_500_naming_the_rule_not_a_503(fakes, daemon_factory, tmp_path):
    """A constraint the router's write breaks is gpuq's bug: retrying cannot help, so it is a 500
    naming the rule, not the 503 "retry later" of a busy store. Here the shell corrupts node-1's
    kept count (node_load, migration 009) so that deleting its waiting job would count below zero."""
    f1, f2, d = await two_nodes(fakes, daemon_factory)
    f1.script.token_delay_s = 0.05
    f1.script.tokens = 200
    [head] = await d.submit("task", "holds the node", node="node-1")
    await d.wait_state(head["id"], "running")
    [waiting] = await d.submit("task", "waits behind it", node="node-1")
    shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    shell.execute("UPDATE node_load SET queued = 0 WHERE node = 'node-1'")
    shell.close()
    status, body = await d.request("DELETE", f"/api/jobs/{waiting['id']}")
    assert status == 500, body
    assert "node_load_queued_counted" in body["error"]["message"], body
    assert "a bug in gpuq" in body["error"]["message"], body
    assert (await d.job(waiting["id"]))["state"] == "queued"  # nothing was changed
    res = await d.cli("delete", waiting["id"])
    assert res.code == 1 and res.err.splitlines()[0].startswith("error 500 "), res.err
