"""Stopping the real router (SIGTERM) never makes an orphan of a job that did not reach Ollama:
a job claimed as the router stops waits for the next start, at the head of its queue, and runs."""

from __future__ import annotations

import asyncio
import signal
import sqlite3

import aiohttp
from conftest import eventually, free_port, node_table

MODEL = "qwen3-coder:30b"


async def test_a_job_claimed_as_the_router_stops_waits_for_the_restart_then_runs(fakes, daemon_factory, tmp_path):
    # unload "never": the first job's model stays listed by /api/ps, so its finish (which claims
    # the next job in the same commit) waits until the test lets the model go.
    fake = await fakes(MODEL, tokens=3, unload="never")
    front = f"127.0.0.1:{free_port()}"
    d = await daemon_factory(
        [node_table("n", fake, 1, ["task"], MODEL)],
        ollama_listen=front,
        unload_timeout="60s",
        busy_timeout="60s",
        stale_after="120s",
        shutdown_grace="60s",
    )  # the drain waits for the first job
    [first] = await d.submit("task", "first", node="n")
    [second] = await d.submit("task", "second", node="n")

    async def unloading():
        return (await d.job(first["id"]))["work_done_at"] and fake.ps_calls

    await eventually(unloading, 20, what="the first job's reply to be whole and its unload checked")

    # A front-door call waits behind them. The stop (a drain: it waits for the first job) ends
    # with a write the test holds up with the database's lock: the shutdown waits there, its
    # worker still alive.
    async def third_call():
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://{front}/api/chat",
                json={"model": MODEL, "messages": [{"role": "user", "content": "third"}], "stream": False},
            ) as resp:
                return resp.status

    call = asyncio.create_task(third_call())

    async def two_waiting():
        return len((await d.get("/api/jobs?node=n&state=queued"))["jobs"]) == 2

    await eventually(two_waiting, 20, what="the front-door call's job to wait")
    db = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        d.proc.send_signal(signal.SIGTERM)
        await eventually(
            lambda: "stopping: no new job starts" in d.log.read_text(), what="the router to begin stopping"
        )
        polls = fake.ps_calls
        fake.loaded.clear()  # the model leaves VRAM: the first job's unload is confirmed, it finishes
        await eventually(lambda: fake.ps_calls > polls, what="the router to see the model gone")
    finally:
        db.execute("ROLLBACK")
        db.close()
    assert await asyncio.wait_for(d.proc.wait(), 30) == 0
    await asyncio.gather(call, return_exceptions=True)  # ended by the stop, its job cancelled
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["first"]  # the second never left

    fake.script.unload = "immediate"
    await d.start()
    done = await d.wait_state(second["id"], "done", timeout=20)
    assert "router restarted while running" not in [e["reason"] for e in done["events"]]
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["first", "second"]
