"""Two routers on one PostgreSQL database serve one queue (issue 27): a change made through one
reaches the other's pages and followers live (the job trigger's NOTIFY), a job one router ended
stops running on the other, and either answers for any job. Real routers (`gpuq serve`
subprocesses), fake Ollama nodes, a throwaway PostgreSQL cluster."""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import eventually, node_table

pytestmark = pytest.mark.postgres


async def two_routers(fakes, daemon_factory, pg_dsn, **router):
    fake = await fakes("qwen3-coder:30b")
    nodes = [node_table("node-1", fake, 1, ["task", "critique"], "qwen3-coder:30b")]
    a = await daemon_factory(nodes, database=pg_dsn, stall_timeout="60s", **router)
    b = await daemon_factory(nodes, name="b", database=pg_dsn, stall_timeout="60s", **router)
    return a, b, fake


async def change_events(daemon, seen: list, ready: asyncio.Event) -> None:
    """Follow the page's live feed (/api/events), noting each `change` event's data."""
    async with daemon.session.get(daemon.url + "/api/events") as resp:
        event = None
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
                if event == "hello":
                    ready.set()
            elif line.startswith("data: ") and event == "change":
                seen.append(json.loads(line[6:]))


async def test_a_submit_through_one_router_reaches_the_others_page_live(fakes, daemon_factory, pg_dsn):
    a, b, fake = await two_routers(fakes, daemon_factory, pg_dsn)
    fake.script.stall_after = 1  # the job stays running while the test looks
    seen: list = []
    ready = asyncio.Event()
    follower = asyncio.create_task(change_events(b, seen, ready))
    try:
        await asyncio.wait_for(ready.wait(), 10)
        [job] = await a.submit("task", "through a")
        await eventually(lambda: any(isinstance(d.get("elsewhere"), dict) and d["elsewhere"]["id"] == job["id"]
                                     for d in seen), 10, what="router b's page to hear of a's submit")
        assert (await b.job(job["id"]))["state"] in ("queued", "running")  # b answers for a's job
    finally:
        follower.cancel()


async def test_a_job_deleted_through_one_router_stops_running_on_the_other(fakes, daemon_factory, pg_dsn):
    a, b, fake = await two_routers(fakes, daemon_factory, pg_dsn)
    fake.script.token_delay_s = 0.1
    fake.script.tokens = 600  # a minute of tokens: still running when deleted
    # Submitted through one router (whose idle worker takes it at once), deleted through the other.
    for runs, deletes in ((a, b), (b, a)):
        [job] = await runs.submit("task", "long")
        await runs.wait_state(job["id"], "running", timeout=20)
        await eventually(lambda: fake.in_flight == 1, 20, what="the node to generate")
        async with deletes.session.delete(f"{deletes.url}/api/jobs/{job['id']}") as resp:
            assert resp.status == 200, await resp.text()
        assert (await runs.wait_state(job["id"], "cancelled"))["state"] == "cancelled"
        # the router that ran it let go of the node's request: the node generates no more
        await eventually(lambda: fake.in_flight == 0, 20, what="the node's generation to stop")
