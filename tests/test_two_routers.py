"""Two routers on one PostgreSQL database serve one queue (issue 27): a change made through one
reaches the other's pages and followers live (the job trigger's NOTIFY), a job one router ended
stops running on the other, and either answers for any job. Real routers (`gpuq serve`
subprocesses), fake Ollama nodes, a throwaway PostgreSQL cluster."""

from __future__ import annotations

import asyncio
import json

import ollama
import pytest
from conftest import eventually, free_port, node_table

pytestmark = pytest.mark.postgres


@pytest.fixture
async def clients():
    """ollama.AsyncClient(host=...) for the test, each closed after it (its sockets with it)."""
    made: list[ollama.AsyncClient] = []

    def make(host: str) -> ollama.AsyncClient:
        made.append(ollama.AsyncClient(host=host))
        return made[-1]

    yield make
    for client in made:
        await client.close()


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
        await eventually(
            lambda: any(isinstance(d.get("elsewhere"), dict) and d["elsewhere"]["id"] == job["id"] for d in seen),
            10,
            what="router b's page to hear of a's submit",
        )
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


async def test_a_front_door_call_runs_on_the_router_that_drives_a_node_and_the_other_names_it(
    fakes, daemon_factory, pg_dsn, clients
):
    """The client waits on the router it called, so its call runs on a node that router drives;
    a router that drives no task node refuses at once (503), naming the router that does."""
    fake = await fakes("qwen3-coder:30b")
    nodes = [node_table("node-1", fake, 1, ["task", "critique"], "qwen3-coder:30b")]
    doors = {}
    routers = []
    for name in ("gpuq", "b"):  # the first takes the node's lease; the second finds it held
        doors[name] = f"127.0.0.1:{free_port()}"
        routers.append(await daemon_factory(nodes, name=name, database=pg_dsn, ollama_listen=doors[name]))
        await eventually(lambda: routers[-1].get("/health"), 10, what="the router's health")
    a, b = routers
    await eventually(lambda: _holds(a, "node-1"), 15, what="router a to drive node-1")
    answer = await clients(f"http://{doors['gpuq']}").chat(
        model="qwen3-coder:30b", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.message.content
    with pytest.raises(ollama.ResponseError) as refused:
        await clients(f"http://{doors['b']}").chat(
            model="qwen3-coder:30b", messages=[{"role": "user", "content": "hi"}]
        )
    assert refused.value.status_code == 503
    assert "drives no task node" in refused.value.error and a.url in refused.value.error
    assert len(fake.chat_requests) == 1  # the refused call never reached the node


async def a_call_waiting_behind_a_task(a, fake, client) -> tuple[dict, asyncio.Task, str]:
    """node-1 (router a's) busy with a task that stays running, and a front-door call through a's
    door waiting behind it: the task, the call's task, the call's job id."""
    fake.script.stall_after = 1
    [busy] = await a.submit("task", "keeps node-1 busy", node="node-1")
    await a.wait_state(busy["id"], "running", timeout=20)
    call = asyncio.create_task(client.chat(model="qwen3-coder:30b", messages=[{"role": "user", "content": "hi"}]))

    async def waiting_call():
        queue = await a.get("/api/queue")
        queued = next(n for n in queue["nodes"] if n["name"] == "node-1")["queued"]
        return queued[0]["id"] if queued else None

    return busy, call, await eventually(waiting_call, 15, what="the call to wait on node-1")


async def _holds(router, node: str) -> bool:
    health = await router.get("/health")
    return node in (health.get("router") or {}).get("nodes", [])


async def test_a_front_door_call_does_not_move_to_another_routers_node(fakes, daemon_factory, pg_dsn, clients):
    """Each router drives its own nodes (its gpuq.toml lists them). A call waiting on router a's
    node cannot be moved (through b) to b's node: its client waits on a, and nobody would read its
    answer on b. 409 naming why; the call stays where it was and answers its client."""
    f1, f2 = await fakes("qwen3-coder:30b"), await fakes("qwen3-coder:30b")
    one = node_table("node-1", f1, 1, ["task"], "qwen3-coder:30b")
    two = node_table("node-2", f2, 2, ["task"], "qwen3-coder:30b")
    door = f"127.0.0.1:{free_port()}"
    # (interactive_preempts off: the call waits behind the task rather than interrupting it)
    a = await daemon_factory(
        [one], database=pg_dsn, ollama_listen=door, stall_timeout="60s", interactive_preempts=False
    )
    b = await daemon_factory([two], name="b", database=pg_dsn, stall_timeout="60s", interactive_preempts=False)
    await eventually(lambda: _holds(a, "node-1"), 15, what="router a to drive node-1")
    await eventually(lambda: _holds(b, "node-2"), 15, what="router b to drive node-2")
    busy, call, call_id = await a_call_waiting_behind_a_task(a, f1, clients(f"http://{door}"))
    async with b.session.post(f"{b.url}/api/jobs/{call_id}/move", json={"node": "node-2"}) as resp:
        assert resp.status == 409, await resp.text()
        assert "a call moves only among its router's nodes" in (await resp.json())["error"]["message"]
    assert (await a.job(call_id))["node"] == "node-1"
    f1.script.stall_after = None
    async with a.session.delete(f"{a.url}/api/jobs/{busy['id']}") as resp:
        assert resp.status == 200
    answer = await asyncio.wait_for(call, 20)
    assert answer.message.content and f2.chat_requests == []


async def test_a_router_starting_leaves_the_other_routers_waiting_calls_alone(fakes, daemon_factory, pg_dsn, clients):
    """A router that starts cancels the calls whose client went with a dead router (those waiting
    on the nodes it takes), never a live router's: that call still runs and answers its client."""
    fake = await fakes("qwen3-coder:30b")
    one = node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")
    door = f"127.0.0.1:{free_port()}"
    # (interactive_preempts off: the call waits behind the task rather than interrupting it)
    a = await daemon_factory(
        [one], database=pg_dsn, ollama_listen=door, stall_timeout="60s", interactive_preempts=False
    )
    await eventually(lambda: _holds(a, "node-1"), 15, what="router a to drive node-1")
    busy, call, call_id = await a_call_waiting_behind_a_task(a, fake, clients(f"http://{door}"))
    b = await daemon_factory([one], name="b", database=pg_dsn, interactive_preempts=False)
    await eventually(lambda: b.get("/health"), 10, what="router b to answer")
    assert (await b.job(call_id))["state"] == "queued"
    fake.script.stall_after = None
    async with a.session.delete(f"{a.url}/api/jobs/{busy['id']}") as resp:
        assert resp.status == 200
    answer = await asyncio.wait_for(call, 20)
    assert answer.message.content
    await b.wait_state(call_id, "done")  # (after its model left VRAM)


async def test_a_job_running_on_one_router_streams_live_through_the_other(fakes, daemon_factory, pg_dsn):
    """A follower of /api/jobs/{id}/stream on the router that does not run the job gets its text
    while it runs (what the running router stores, about each second), then the done line."""
    a, b, fake = await two_routers(fakes, daemon_factory, pg_dsn)
    fake.script.token_delay_s, fake.script.tokens = 0.2, 300  # a minute of words: still running
    [job] = await a.submit("task", "followed from b")
    await a.wait_state(job["id"], "running", timeout=20)
    texts: list[str] = []
    async with b.session.get(f"{b.url}/api/jobs/{job['id']}/stream") as resp:

        async def some_text():
            while True:
                line = json.loads(await resp.content.readline())
                if "text" in line:
                    texts.append(line["text"])
                    if len("".join(texts).split()) >= 8:
                        return True
                assert "done" not in line, line

        await asyncio.wait_for(some_text(), 20)
        assert (await a.job(job["id"]))["state"] == "running"  # live, not at the end
        async with a.session.delete(f"{a.url}/api/jobs/{job['id']}") as deleted:
            assert deleted.status == 200
        rest = [json.loads(raw) async for raw in resp.content]
    assert rest[-1]["done"] and rest[-1]["job"]["state"] == "cancelled"
    assert (await a.job(job["id"]))["output"].startswith("".join(texts))


async def test_a_database_restart_is_survived(fakes, daemon_factory, pg_dsn, pg_cluster):
    """PostgreSQL restarts under a running router (an upgrade, the database machine rebooting):
    calls meanwhile get 503s that say so (nothing half-stored), and once it is back the router
    reconnects by itself: submits are taken, jobs run, /health is ok again, nothing restarted."""
    fake = await fakes("qwen3-coder:30b")
    a = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], database=pg_dsn)
    [before] = await a.submit("task", "before")
    await a.wait_state(before["id"], "done", timeout=20)
    pg_cluster.restart()

    async def taken():
        async with a.session.post(a.url + "/api/jobs", json={"kind": "task", "prompt": "after"}) as resp:
            if resp.status == 503:
                assert "nothing was changed" in (await resp.json())["error"]["message"]
                return None
            assert resp.status == 201, await resp.text()
            return (await resp.json())["jobs"][0]

    after = await eventually(taken, 30, 0.2, "a submit to be taken after the restart")
    await a.wait_state(after["id"], "done", timeout=30)

    async def healthy():
        async with a.session.get(a.url + "/health") as resp:
            return resp.status == 200 and (await resp.json())["ok"]

    await eventually(healthy, 30, 0.2, "/health to be ok again")
    assert a.proc.returncode is None
    jobs = (await a.get("/api/jobs?limit=10"))["jobs"]
    assert {j["id"] for j in jobs} == {before["id"], after["id"]}  # nothing lost, nothing doubled
