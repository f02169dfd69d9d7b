"""One router per database: a second `gpuq serve` on the same database file, or on a port
already in use, exits 2 before it touches the database; a SIGKILLed router's lock never
blocks its restart."""

from __future__ import annotations

import signal
import socket
import sqlite3

from conftest import node_table


def job_row(db_path, job_id: str) -> tuple[str, str | None, list[str]]:
    """(state, error, every event's to_state) read straight from the file, read-only."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        state, error = db.execute("SELECT state, error FROM job WHERE id = ?", (job_id,)).fetchone()
        events = [r[0] for r in db.execute("SELECT to_state FROM event WHERE job_id = ? ORDER BY id", (job_id,))]
    finally:
        db.close()
    return state, error, events


async def test_second_router_on_the_same_database_exits_2_and_the_first_keeps_its_job(fakes, daemon_factory, tmp_path):
    fake = await fakes("m", token_delay_s=0.05, tokens=40)  # a two-second job
    nodes = [node_table("n1", fake, 1, ["task"], "m")]
    first = await daemon_factory(nodes)
    job = (await first.submit("task", "the first router's job"))[0]
    await first.wait_state(job["id"], "running")

    second = await daemon_factory(nodes, start=False, name="second")  # another port, the same gpuq.db
    res = await second.cli("serve", "--config", str(second.config), timeout=15)
    assert res.code == 2, res.err
    lines = res.err.strip().splitlines()
    assert len(lines) == 1, res.err
    assert str(tmp_path / "gpuq.db") in lines[0]
    assert f"pid {first.proc.pid}" in lines[0] and first.url.removeprefix("http://") in lines[0]

    done = await first.wait_state(job["id"], "done", timeout=20)
    assert done["error"] is None
    assert len(done["output"].split()) == 40  # every token, none lost to a second router
    assert job_row(tmp_path / "gpuq.db", job["id"]) == ("done", None, ["queued", "running", "done"])
    assert len(fake.chat_requests) == 1


async def test_a_sigkilled_routers_lock_does_not_block_the_restart(fakes, daemon_factory, tmp_path):
    fake = await fakes("m", stall_after=2)  # the job streams two tokens, then hangs
    nodes = [node_table("n1", fake, 1, ["task"], "m")]
    first = await daemon_factory(nodes)
    job = (await first.submit("task", "orphaned"))[0]
    await first.wait_state(job["id"], "running")
    await first.kill(signal.SIGKILL)

    second = await daemon_factory(nodes, name="second")  # starts at once on the same database
    orphan = await second.job(job["id"])
    assert orphan["state"] == "failed"
    assert orphan["error"].startswith("router restarted while running (the router ")  # named: test_leases


async def test_a_port_in_use_exits_2_and_leaves_the_database_untouched(fakes, daemon_factory, tmp_path):
    fake = await fakes("m", stall_after=2)
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")])
    job = (await d.submit("task", "orphaned"))[0]
    await d.wait_state(job["id"], "running")
    await d.kill(signal.SIGKILL)  # the job is an orphan in the file: the next router fails it

    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the killed router's TIME_WAITs
    squatter.bind(("127.0.0.1", int(d.url.rsplit(":", 1)[1])))
    squatter.listen()
    try:
        res = await d.cli("serve", "--config", str(d.config), timeout=15)
    finally:
        squatter.close()
    assert res.code == 2, res.err
    assert f"cannot listen on {d.url.removeprefix('http://')}" in res.err
    assert job_row(tmp_path / "gpuq.db", job["id"]) == ("running", None, ["queued", "running"])

    await d.start()  # the port is free again: this router recovers the orphan as usual
    orphan = await d.job(job["id"])
    assert orphan["state"] == "failed"
    assert orphan["error"].startswith("router restarted while running (the router ")  # named: test_leases
