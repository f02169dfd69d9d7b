"""The real daemon against fake Ollama nodes, driven through the real CLI and HTTP. The lab's
tests run once on each engine (a SQLite file, then PostgreSQL)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sqlite3
import sys

import pytest
from conftest import eventually, make_lab, node_table, shell

ID = r"\d{10}-[0-9a-f]{8}"


@pytest.fixture
def lab(lab_on_each_engine):
    return lab_on_each_engine


async def test_design_transcript(lab, tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text("# Plan\nAdd a retry budget to the export job.\n")

    res = await lab.cli("critique", str(plan))
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert lines[0] == "fan-out 2 critique nodes"
    children = [line for line in lines[1:] if not line.startswith("    ")]  # under each: findings, link
    for line in children:
        assert re.fullmatch(rf"node-[12] {ID} \S+ done \d+ findings? \d+s", line), line
    assert {line.split()[0] for line in children} == {"node-1", "node-2"}
    assert all(
        re.fullmatch(r"    (\[(low|medium|high)\] .+|http://\S+/jobs/\S+)", line)
        for line in lines[1:]
        if line not in children
    ), lines

    res = await lab.cli("task", "add a retry budget to the export job")
    assert res.code == 0, res.err
    first, preview, estimate = res.out.splitlines()
    m = re.fullmatch(rf"({ID}) -> node-1 \(first free node by rank\)", first)
    assert m, first
    task_id = m.group(1)
    assert preview == f"preview {lab.url}/jobs/{task_id}"
    # node-1 is free, and the critique that just ran there is the basis of the estimate.
    assert re.fullmatch(
        r"est\. start now, finish (now|in ~\d+ s)|started; est\. finish (now|in ~\d+ s)|already done", estimate
    ), estimate

    res = await lab.cli("critique", "--parent", task_id, "--node", "node-1")
    assert res.code != 0
    assert res.err.splitlines() == ["error 409 a critique never runs on its parent task's node", "not retried"]

    status, health = await lab.request("GET", "/health")
    assert status == 200 and health["ok"] is True and "queue_depth" in health


async def test_one_job_per_node_and_model_unloaded_after_each(lab):
    fake = lab.fakes["node-3"]
    fake.script.token_delay_s = 0.01
    ids = [j["id"] for j in [(await lab.submit("task", f"job {i}", node="node-3"))[0] for i in range(4)]]

    async def all_done():
        return all([(await lab.job(i))["state"] == "done" for i in ids])

    await eventually(all_done, 20, what="all four jobs done")
    assert fake.max_in_flight == 1  # the simulator never had two generations at once
    assert len(fake.chat_requests) == 4
    assert all(r["keep_alive"] == 0 for r in fake.chat_requests)
    assert fake.loaded == {}
    # They ran in submission order.
    started = [(await lab.job(i))["started_at"] for i in ids]
    assert started == sorted(started)


async def test_failure_is_not_retried_and_message_is_verbatim(lab):
    fake = lab.fakes["node-3"]
    fake.script.load_error = (500, "llama-server reported out-of-memory during startup: cudaMalloc failed")
    job = (await lab.submit("task", "too big", node="node-3"))[0]
    done = await lab.wait_state(job["id"], "failed")
    assert done["error"] == "llama-server reported out-of-memory during startup: cudaMalloc failed"
    assert len(fake.chat_requests) == 1
    fake.script.load_error = None
    nxt = (await lab.submit("task", "fits", node="node-3"))[0]
    await lab.wait_state(nxt["id"], "done")
    assert (await lab.job(job["id"]))["state"] == "failed"
    assert len(fake.chat_requests) == 2  # the failed job was never sent again


async def test_error_line_mid_stream_fails_job(lab):
    fake = lab.fakes["node-3"]
    fake.script.error_after = 3
    job = (await lab.submit("task", "boom", node="node-3"))[0]
    failed = await lab.wait_state(job["id"], "failed")
    assert failed["error"].startswith("an error was encountered while running the model")
    assert len(failed["output"].split()) == 3  # the partial output is kept


async def test_kill_and_restart_keeps_queue_and_fails_the_orphan(lab):
    fake = lab.fakes["node-3"]
    fake.script.stall_after = 2  # the head streams two tokens, then hangs
    head = (await lab.submit("task", "long", node="node-3"))[0]
    waiting = [(await lab.submit("task", f"w{i}", node="node-3"))[0]["id"] for i in range(3)]
    await lab.wait_state(head["id"], "running")
    await eventually(lambda: fake.chunk_sent.is_set(), what="the head to stream")
    await lab.kill(signal.SIGKILL)
    fake.script.stall_after = None
    await lab.start()
    orphan = await lab.job(head["id"])
    assert orphan["state"] == "failed"
    # failed at once, naming the router that ran it (on PostgreSQL too: this machine's dead router
    # loses its leases as the new one starts, not after the lease time); the wording: test_leases
    assert re.search(r"the router \S+ that ran this job (had )?stopped", orphan["error"]), orphan["error"]
    for job_id in waiting:
        await lab.wait_state(job_id, "done")
    order = [(await lab.job(i))["started_at"] for i in waiting]
    assert order == sorted(order)
    assert sum(1 for r in fake.chat_requests if r["messages"][0]["content"] == "long") == 1
    assert fake.loaded == {}


async def test_database_is_readable_in_its_shell(lab):
    """sqlite3 on the file, psql on PostgreSQL: the same tables and views answer."""
    job = (await lab.submit("task", "forensics"))[0]
    await lab.wait_state(job["id"], "done")
    states = [r[0] for r in shell(lab, "SELECT to_state FROM event WHERE job_id = ? ORDER BY id", job["id"])]
    assert states == ["queued", "running", "done"]
    assert shell(lab, "SELECT COUNT(*) FROM stale_heads") == [(0,)]


async def test_the_sqlite_file_is_wal(fakes, daemon_factory, tmp_path):
    lab = await make_lab(fakes, daemon_factory)
    job = (await lab.submit("task", "forensics"))[0]
    await lab.wait_state(job["id"], "done")
    db = sqlite3.connect(tmp_path / "gpuq.db")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


async def test_bad_config_exits_78_naming_the_key(fakes, daemon_factory):
    fake = await fakes()
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], start=False, stale_after="ten minutes")
    res = await d.cli("serve", "--config", str(d.config))
    assert res.code == 78  # EX_CONFIG: apart from a taken port's 2, so a service does not restart it
    assert "router.stale_after" in res.err


def held_port() -> socket.socket:
    """A port some other program listens on."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    return squatter


async def serve_on_a_taken_port(cwd, *args: str, env: dict | None = None) -> tuple[int, str, int]:
    """The real `gpuq serve` as a subprocess, the test holding its port: (exit code, stderr, port)."""
    with held_port() as squatter:
        port = squatter.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuq.cli",
            "serve",
            *args,
            "--listen",
            f"127.0.0.1:{port}",
            cwd=str(cwd),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        _, err = await asyncio.wait_for(proc.communicate(), 20)
    return proc.returncode, err.decode(), port


async def test_a_taken_port_says_how_to_listen_on_another_and_leaves_no_lock_file(fakes, daemon_factory, tmp_path):
    fake = await fakes()
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], start=False)
    code, err, port = await serve_on_a_taken_port(tmp_path, "--config", str(d.config))
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert f"cannot listen on 127.0.0.1:{port}: address already in use: another program has port {port}" in line
    free = re.search(r'set `listen = "127\.0\.0\.1:(\d+)"` under `\[router\]` in your gpuq\.toml', line)
    assert free and int(free[1]) != port, line
    assert f"serve --config {d.config} --listen 127.0.0.1:{free[1]}`" in line
    assert "make run" not in line  # not started by make
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpuq.toml"]  # no database, no lock file


async def test_make_runs_demo_on_a_taken_port_names_make_run_port(tmp_path):
    code, err, port = await serve_on_a_taken_port(tmp_path, "--demo", env={"GPUQ_MAKE_RUN": "1"})
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in line
    free = re.search(r"run `make run PORT=(\d+)`, or run `.*serve --demo --listen 127\.0\.0\.1:(\d+)`", line)
    assert free and free[1] == free[2] and int(free[1]) != port, line
    assert "gpuq.toml" not in line  # the demo has none
    assert list(tmp_path.iterdir()) == []  # not even gpuq-demo.db.lock


async def test_a_router_that_stops_removes_its_lock_file(fakes, daemon_factory, tmp_path):
    fake = await fakes()
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")])
    assert (tmp_path / "gpuq.db.lock").exists()
    await d.kill(signal.SIGTERM)
    assert d.proc.returncode == 0
    assert not (tmp_path / "gpuq.db.lock").exists()
    await d.start()  # and the next one starts as usual
    assert (tmp_path / "gpuq.db.lock").exists()
