"""Lanes, fair share and quotas (issue 26): where a new job enters its node's queue, which job a
node claims, and what a submit beyond a user's limit answers. The rules as pure functions, then
the real daemon with fake Ollama nodes, a real Ollama client and users' tokens."""

from __future__ import annotations

import asyncio
import json
import tomllib

import ollama
import openai
import pytest
import tomli_w
from conftest import eventually, free_port, node_table
from test_front import CHAT_MODEL, front, start_front_lab  # noqa: F401 (a fixture)

from gpuq.errors import QUOTA_RETRY_AFTER_S
from gpuq.jobs import Lane
from gpuq.placement import MAX_PREEMPTIONS, NodeView, entry, place_task, preempts
from gpuq.store import NewJob, NodeInfo, Store

I, B = Lane.INTERACTIVE, Lane.BATCH  # noqa: E741 (one letter each keeps the lane tables below readable)


# -- the rules ----------------------------------------------------------------------------------


def test_an_interactive_job_enters_after_the_last_waiting_interactive_job():
    assert entry([], I, None, False).index == 0
    assert entry([(B, "a")] * 5, I, None, False).index == 0
    assert "ahead of 5 waiting batch jobs" in entry([(B, "a")] * 5, I, None, False).reason
    # A person moved a batch job ahead of an interactive one: that order stands.
    assert entry([(I, "a"), (B, "a"), (I, "b"), (B, "c")], I, "d", False).index == 3
    assert entry([(I, "a"), (I, "b")], I, "c", False).reason is None  # the tail: nothing to say


def test_fair_share_interleaves_users_round_robin_by_submit_order():
    waiting: list[tuple[str, str | None]] = []
    for owner in ["alice"] * 4 + ["bob"] * 4 + ["carol"] * 2:
        at = entry(waiting, B, owner, True)
        waiting.insert(at.index, (B, owner))
    assert [o for _, o in waiting] == ["alice", "bob", "carol", "alice", "bob", "carol", "alice", "bob", "alice", "bob"]
    at = entry([(B, "alice"), (B, "alice"), (B, "bob")], B, "carol", True)
    assert at.index == 1 and at.reason == "entered at position 2: fair share with alice, bob"
    # Never ahead of a waiting interactive job, and without fair share: the tail.
    assert entry([(B, "alice"), (B, "alice"), (I, "alice")], B, "bob", True).index == 3
    assert entry([(B, "alice"), (B, "alice")], B, "bob", False).index == 2


def test_an_interactive_job_goes_where_it_starts_soonest():
    def view(name, rank, running, queued, interactive):
        return NodeView(name, rank, ("task",), True, running, queued, None, interactive)

    nodes = [view("n1", 1, True, 9, 0), view("n2", 2, True, 1, 1), view("n3", 3, False, 0, 0)]
    assert place_task(nodes, lane=I).node == "n3"  # a free node first
    nodes[2] = view("n3", 3, True, 0, 0)
    assert place_task(nodes, lane=B).node == "n3"  # batch: the shortest queue
    assert place_task(nodes[:2], lane=B).node == "n2"
    assert place_task(nodes[:2], lane=I).node == "n1"  # interactive: the shortest interactive backlog


def test_only_an_interactive_job_preempts_and_only_a_running_batch_job_with_the_setting_on():
    assert preempts(I, B, True)
    assert not preempts(I, B, False)  # set off: a running job is never interrupted
    assert not preempts(I, I, True)  # never an interactive job
    assert not preempts(I, None, True)  # the node runs nothing
    assert not preempts(B, B, True)  # a batch job waits its turn
    assert preempts(I, B, True, MAX_PREEMPTIONS - 1)
    assert not preempts(I, B, True, MAX_PREEMPTIONS)  # interrupted enough: it runs to its end
    assert not preempts(I, B, True, 0, work_done=True)  # its answer is whole: it only waits for its unload


# -- the daemon ---------------------------------------------------------------------------------

TOKENS = {
    "admin": "admin-token-000000000000000000000000",
    "alice": "alice-token-000000000000000000000000",
    "bob": "bob-token-00000000000000000000000000",
    "carol": "carol-token-00000000000000000000000",
}


def bearer(user: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


async def with_users(daemon, users: list[dict]):
    """Add [[user]] tables to the daemon's gpuq.toml, then start it."""
    data = tomllib.loads(daemon.config.read_text())
    daemon.config.write_text(tomli_w.dumps({**data, "user": users}))
    if any(u["name"] == "admin" for u in users):  # the test's own reads, as the lab's admin
        daemon.auth = bearer("admin")
    await daemon.start()
    return daemon


async def submit_as(daemon, user: str, prompt: str, **extra) -> tuple[int, dict]:
    return await daemon.request("POST", "/api/jobs", {"kind": "task", "prompt": prompt, **extra}, headers=bearer(user))


async def queued(daemon, node: str) -> list[dict]:
    status, body = await daemon.request("GET", "/api/queue", headers=bearer("admin"))
    assert status == 200, body
    return next(n for n in body["nodes"] if n["name"] == node)["queued"]


async def test_with_preempts_off_a_call_behind_five_batch_jobs_runs_next(fakes, daemon_factory):
    front = await start_front_lab(fakes, daemon_factory, interactive_preempts=False)
    try:
        await _runs_next_behind_five(front)
    finally:
        await front.close()


async def _runs_next_behind_five(front) -> None:
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.1, 400  # busy while the test looks
    busy = (await front.daemon.submit("task", "the long one", node="node-1"))[0]["id"]
    await front.daemon.wait_state(busy, "running")
    batch = [(await front.daemon.submit("task", f"batch {i}", node="node-1"))[0]["id"] for i in range(5)]

    client = front.ollama()
    call = asyncio.ensure_future(client.chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "quick one"}]))
    waiting = await eventually(lambda: _grown(front.daemon, "node-1", 6), 15, what="the call to wait on node-1")
    assert [j["id"] for j in waiting][1:] == batch  # it waits first, the batch jobs behind it
    assert waiting[0]["lane"] == "interactive" and waiting[0]["endpoint"] == "/api/chat"
    assert all(j["lane"] == "batch" for j in waiting[1:])
    assert not call.done()  # it never interrupts the running job

    fake.script.token_delay_s, fake.script.tokens = 0.0, 5
    reply = await asyncio.wait_for(call, 60)
    assert reply.message.content
    # When the call had its answer, the five batch jobs still waited: it ran next.
    jobs = [await front.daemon.job(j) for j in batch]
    assert all(j["state"] == "queued" or j["started_at"] > waiting[0]["created_at"] for j in jobs)
    started = await eventually(
        lambda: _started(front.daemon, [waiting[0]["id"], *batch]), 30, what="every job to have started"
    )
    assert started[0] == min(started), started  # the call's run started before any batch job's
    events = (await front.daemon.job(waiting[0]["id"]))["events"]
    assert "interactive: entered at position 1, ahead of 5 waiting batch jobs" in events[0]["reason"]


async def _grown(daemon, node: str, n: int) -> list[dict] | None:
    waiting = await daemon.get("/api/queue")
    jobs = next(x for x in waiting["nodes"] if x["name"] == node)["queued"]
    return jobs if len(jobs) >= n else None


async def _started(daemon, ids: list[str]) -> list[str] | None:
    jobs = [await daemon.job(j) for j in ids]
    return [j["started_at"] for j in jobs] if all(j["started_at"] for j in jobs) else None


async def one_node_with_users(fakes, daemon_factory, users: list[dict], nodes: int = 1):
    made = []
    for i in range(nodes):
        fake = await fakes("qwen3-coder:30b", token_delay_s=0.1, tokens=2000)  # each job runs long
        made.append(node_table(f"node-{i + 1}", fake, i + 1, ["task"], "qwen3-coder:30b"))
    daemon = await daemon_factory(made, start=False, stall_timeout="120s")
    return await with_users(daemon, [{"name": "admin", "token": TOKENS["admin"], "role": "admin"}, *users])


async def test_two_users_sweeps_of_twenty_interleave(fakes, daemon_factory):
    daemon = await one_node_with_users(
        fakes, daemon_factory, [{"name": "alice", "token": TOKENS["alice"]}, {"name": "bob", "token": TOKENS["bob"]}]
    )
    for user in ("alice", "bob"):
        for i in range(20):
            status, body = await submit_as(daemon, user, f"{user} sweep {i}")
            assert status == 201, body
    waiting = await queued(daemon, "node-1")
    owners = [j["owner"] for j in waiting]
    # alice's first runs; of the 39 waiting, the two users alternate until alice's run out.
    assert owners == ["alice", "bob"] * 19 + ["bob"], owners
    prompts = [j["prompt_excerpt"] for j in waiting if j["owner"] == "bob"]
    assert prompts == [f"bob sweep {i}" for i in range(20)]  # each user's own order kept
    bob_first = waiting[1]
    detail = await daemon.request("GET", f"/api/jobs/{bob_first['id']}", headers=bearer("admin"))
    assert "entered at position 2: fair share with alice" in detail[1]["events"][0]["reason"]


async def test_a_submit_beyond_max_waiting_is_429_and_nothing_stored_is_lost(fakes, daemon_factory):
    daemon = await one_node_with_users(
        fakes,
        daemon_factory,
        [{"name": "alice", "token": TOKENS["alice"], "max_waiting": 3}, {"name": "bob", "token": TOKENS["bob"]}],
    )
    status, body = await submit_as(daemon, "bob", "bob's long one")
    assert status == 201, body
    await daemon.wait_state(body["jobs"][0]["id"], "running")
    ids = []
    for i in range(3):
        status, body = await submit_as(daemon, "alice", f"alice {i}")
        assert status == 201, body
        ids.append(body["jobs"][0]["id"])
    async with daemon.session.post(
        daemon.url + "/api/jobs", json={"kind": "task", "prompt": "alice 3"}, headers=bearer("alice")
    ) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == str(QUOTA_RETRY_AFTER_S)  # no past run: no estimate
        message = (await resp.json())["error"]["message"]
    assert "user 'alice' has 3 jobs waiting, and max_waiting is 3" in message
    assert "expected to start" not in message
    waiting = await queued(daemon, "node-1")
    assert [j["id"] for j in waiting] == ids  # the three kept, in order; the fourth never stored
    status, body = await daemon.request("GET", "/api/jobs?limit=100", headers=bearer("admin"))
    assert "alice 3" not in [j["prompt_excerpt"] for j in body["jobs"]]
    status, body = await submit_as(daemon, "bob", "bob is not limited")
    assert status == 201, body


async def test_max_running_holds_a_users_second_job_while_another_users_runs(fakes, daemon_factory):
    daemon = await one_node_with_users(
        fakes,
        daemon_factory,
        [{"name": "alice", "token": TOKENS["alice"], "max_running": 1}, {"name": "bob", "token": TOKENS["bob"]}],
        nodes=2,
    )
    status, body = await submit_as(daemon, "alice", "alice first", node="node-1")
    first = body["jobs"][0]["id"]
    await daemon.wait_state(first, "running")
    status, body = await submit_as(daemon, "alice", "alice second", node="node-2")
    second = body["jobs"][0]["id"]
    status, body = await submit_as(daemon, "bob", "bob's", node="node-2")
    bobs = body["jobs"][0]["id"]
    await daemon.wait_state(bobs, "running", timeout=15)  # node-2 was free: bob's job ran, not alice's
    held = await daemon.job(second)
    assert held["state"] == "queued"
    why = "user 'alice' runs 1 job already, their max_running: it starts once one ends"
    assert held["held_by_quota"].startswith(why) and held["eta_reason"] == held["held_by_quota"]
    assert held["eta_start"] is None
    [waiting] = await queued(daemon, "node-2")
    assert waiting["id"] == second and waiting["held_by_quota"].startswith(why)


async def test_a_user_limited_to_batch_asking_for_interactive_is_403(fakes, daemon_factory):
    daemon = await one_node_with_users(
        fakes,
        daemon_factory,
        [{"name": "alice", "token": TOKENS["alice"], "lanes": ["batch"]}, {"name": "bob", "token": TOKENS["bob"]}],
    )
    status, body = await submit_as(daemon, "alice", "urgent, says alice", priority="interactive")
    assert status == 403
    assert body["error"]["message"].startswith("user 'alice' may submit only to the batch lane")
    status, body = await submit_as(daemon, "alice", "fine", priority="batch")
    assert status == 201 and body["jobs"][0]["lane"] == "batch"
    status, body = await submit_as(daemon, "bob", "bob's urgent one", priority="interactive")
    assert status == 201 and body["jobs"][0]["lane"] == "interactive"


async def test_the_cli_asks_for_the_interactive_lane(fakes, daemon_factory):
    daemon = await one_node_with_users(fakes, daemon_factory, [{"name": "alice", "token": TOKENS["alice"]}])
    status, body = await submit_as(daemon, "alice", "the long one")
    long_one = body["jobs"][0]["id"]
    await daemon.wait_state(long_one, "running")
    batch = [(await submit_as(daemon, "alice", f"batch {i}"))[1]["jobs"][0]["id"] for i in range(2)]
    res = await daemon.cli("task", "--priority", "interactive", "--json", "a person waits for this")
    assert res.code == 0, res.err
    job = json.loads(res.out)
    assert job["lane"] == "interactive" and job["position"] == 1
    # By default it interrupts the running batch job, which goes back first in the queue.
    await daemon.wait_state(job["id"], "running")
    assert [j["id"] for j in await queued(daemon, "node-1")] == [long_one, *batch]
    res = await daemon.cli("task", "--priority", "urgent", "no such lane")
    assert res.code != 0 and "'urgent' is not one of 'interactive', 'batch'" in res.err


async def test_a_retried_interactive_job_enters_its_lane_again(tmp_path):
    store = Store(tmp_path / "q.db")
    await store.open()
    try:
        nodes = [NodeInfo("a", 1, ("task",), "m", True)]
        first = (await store.submit(NewJob("task", "runs", node="a"), nodes, "api"))[0]["id"]
        await store.claim("a")
        urgent = (await store.submit(NewJob("task", "urgent", node="a", lane=I), nodes, "api"))[0]["id"]
        await store.delete(urgent, "api")
        batch = [(await store.submit(NewJob("task", f"b{i}", node="a"), nodes, "api"))[0]["id"] for i in range(3)]
        await store.retry(urgent, "api")
        rows = await store.read("SELECT id FROM job WHERE node = 'a' AND state = 'queued' ORDER BY position, id")
        assert [r["id"] for r in rows] == [urgent, *batch]
        assert first not in [r["id"] for r in rows]
    finally:
        await store.close()


async def test_a_batch_only_users_front_door_call_waits_in_batch_and_their_quota_holds_there(fakes, daemon_factory):
    """No Ollama client can ask for a lane: a batch-only user's call waits in the batch lane
    (refusing it would break every client), and max_waiting answers the front door too (429)."""
    fake = await fakes("qwen3-coder:30b", token_delay_s=0.1, tokens=2000)
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")],
        start=False,
        stall_timeout="120s",
        ollama_listen=f"127.0.0.1:{port}",
    )
    await with_users(
        daemon,
        [
            {"name": "admin", "token": TOKENS["admin"], "role": "admin"},
            {"name": "alice", "token": TOKENS["alice"], "lanes": ["batch"], "max_waiting": 2},
        ],
    )
    status, body = await submit_as(daemon, "admin", "the long one")
    await daemon.wait_state(body["jobs"][0]["id"], "running")
    status, body = await submit_as(daemon, "alice", "alice's batch step")
    assert status == 201, body

    alice = ollama.AsyncClient(host=f"http://127.0.0.1:{port}", headers=bearer("alice"))
    call = asyncio.ensure_future(alice.chat(model="qwen3-coder:30b", messages=[{"role": "user", "content": "hi"}]))
    try:
        waiting = await eventually(lambda: _grown(daemon, "node-1", 2), 15, what="alice's call to wait")
        assert [(j["owner"], j["lane"], j.get("endpoint")) for j in waiting] == [
            ("alice", "batch", None),
            ("alice", "batch", "/api/chat"),
        ]  # behind her batch step, not ahead
        with pytest.raises(ollama.ResponseError) as exc:  # a third waiting job of hers
            await alice.chat(model="qwen3-coder:30b", messages=[{"role": "user", "content": "and this?"}])
        assert exc.value.status_code == 429
        assert "user 'alice' has 2 jobs waiting, and max_waiting is 2" in exc.value.error
        assert len(await queued(daemon, "node-1")) == 2  # nothing stored for the refused call
    finally:
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await alice._client.aclose()  # the library's own httpx client: what the test opened


async def test_over_max_waiting_retry_after_is_when_her_first_waiting_job_should_start(fakes, daemon_factory):
    """Retry-After is no fixed guess once the node's past runs tell: it is when the first of her
    waiting jobs is expected to start (the estimates the page shows), on /api/jobs and on the
    front door (the OpenAI and Anthropic SDKs wait that long before they ask again)."""
    fake = await fakes("qwen3-coder:30b", token_delay_s=0.1, tokens=10)  # a run: about 1 s
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")],
        start=False,
        stall_timeout="120s",
        ollama_listen=f"127.0.0.1:{port}",
    )
    await with_users(
        daemon,
        [
            {"name": "admin", "token": TOKENS["admin"], "role": "admin"},
            {"name": "alice", "token": TOKENS["alice"], "max_waiting": 2},
        ],
    )
    for i in range(2):  # the node's past: two runs of the model
        status, body = await submit_as(daemon, "admin", f"past {i}")
        await daemon.wait_state(body["jobs"][0]["id"], "done", timeout=20)
    fake.script.tokens = 2000  # from now on each job runs long
    status, body = await submit_as(daemon, "admin", "the running one")
    await daemon.wait_state(body["jobs"][0]["id"], "running")
    for prompt in ("admin's next", "alice 0", "alice 1"):  # hers start after two runs of about 1 s
        status, body = await submit_as(daemon, "admin" if prompt.startswith("admin") else "alice", prompt)
        assert status == 201, body
    detail = await daemon.job(body["jobs"][0]["id"])
    async with daemon.session.post(
        daemon.url + "/api/jobs", json={"kind": "task", "prompt": "alice 2"}, headers=bearer("alice")
    ) as resp:
        assert resp.status == 429
        wait = int(resp.headers["Retry-After"])
        message = (await resp.json())["error"]["message"]
    assert 1 <= wait <= 10, (wait, detail["eta_start"])  # two runs of about 1 s ahead of hers, not 30 s
    assert f"the first of them is expected to start in about {wait} s" in message

    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=TOKENS["alice"], max_retries=0)
    try:
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model="qwen3-coder:30b", messages=[{"role": "user", "content": "hi"}])
    finally:
        await client.close()
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 10
    assert refused.value.response.headers["x-should-retry"] == "true"
    assert "expected to start in about" in refused.value.message
    assert [j["prompt_excerpt"] for j in await queued(daemon, "node-1")] == ["admin's next", "alice 0", "alice 1"]


async def test_a_retry_counts_against_max_waiting_as_a_submit_does(fakes, daemon_factory):
    """Deleting her waiting jobs and retrying them must not give a user more than her limit."""
    daemon = await one_node_with_users(
        fakes,
        daemon_factory,
        [{"name": "alice", "token": TOKENS["alice"], "max_waiting": 2}, {"name": "bob", "token": TOKENS["bob"]}],
    )
    status, body = await submit_as(daemon, "bob", "bob's long one")
    await daemon.wait_state(body["jobs"][0]["id"], "running")
    first = [(await submit_as(daemon, "alice", f"alice {i}"))[1]["jobs"][0]["id"] for i in range(2)]
    for job in first:
        assert (await daemon.request("DELETE", f"/api/jobs/{job}", headers=bearer("alice")))[0] == 200
    again = [(await submit_as(daemon, "alice", f"alice again {i}"))[1]["jobs"][0]["id"] for i in range(2)]
    status, body = await daemon.request("POST", f"/api/jobs/{first[0]}/retry", headers=bearer("alice"))
    assert status == 429, body
    assert "user 'alice' has 2 jobs waiting, and max_waiting is 2" in body["error"]["message"]
    assert [j["id"] for j in await queued(daemon, "node-1")] == again  # the deleted one stays cancelled
    assert (await daemon.job(first[0]))["state"] == "cancelled"


# -- [router] interactive_preempts ---------------------------------------------------------------


async def _streamed(daemon, job_id: str, words: int) -> dict:
    async def enough():
        job = await daemon.job(job_id)
        return job if job["state"] == "running" and len(job["output"].split()) >= words else None

    return await eventually(enough, 20, what=f"job {job_id} to stream {words} words")


async def test_by_default_an_interactive_call_preempts_a_running_batch_job_which_runs_again_after(
    fakes, daemon_factory
):
    lab = await start_front_lab(fakes, daemon_factory)  # [router] interactive_preempts left out: on
    try:
        fake = lab.fakes["node-1"]
        fake.script.token_delay_s, fake.script.tokens = 0.2, 40  # 8 s: busy while the call arrives
        batch = (await lab.daemon.submit("task", "the long sweep step", node="node-1"))[0]["id"]
        await _streamed(lab.daemon, batch, 3)

        client = lab.ollama()
        call = asyncio.ensure_future(client.chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "quick one"}]))
        job = await lab.job_with("quick one", "running", "done")  # it starts at once, not after the batch job
        interrupted = await lab.daemon.job(batch)
        assert interrupted["state"] == "queued" and interrupted["preempted_runs"] == 1
        why = f"preempted for interactive call {job['id']} (router.interactive_preempts)"
        [event] = [e for e in interrupted["events"] if (e["from_state"], e["to_state"]) == ("running", "queued")]
        assert event["reason"] == why and event["actor"] == "router"
        fake.script.token_delay_s = 0.01
        reply = await asyncio.wait_for(call, 60)
        assert reply.message.content  # the call answers in full

        done = await lab.daemon.wait_state(batch, "done", timeout=60)  # then the batch job runs again, from its start
        first, second = done["runs"]
        assert (first["state"], first["error"], second["state"]) == ("preempted", why, "done")
        partial, full = first["output"].split(), second["output"].split()
        assert 3 <= len(partial) < len(full) == 40 and full[: len(partial)] == partial  # its partial output kept
        assert done["started_at"] > (await lab.daemon.job(job["id"]))["started_at"]
        assert fake.disconnects == 1  # its Ollama request was aborted
        assert [r["messages"][-1]["content"] for r in fake.chat_requests] == [
            "the long sweep step",
            "quick one",
            "the long sweep step",
        ]
    finally:
        await lab.close()


async def test_a_batch_job_interrupted_twice_runs_to_its_end_while_the_next_call_waits(fakes, daemon_factory):
    """What a stream of calls may throw away is bounded: the batch job is interrupted
    MAX_PREEMPTIONS times, then runs to its end while the next call waits for it."""
    lab = await start_front_lab(fakes, daemon_factory)
    try:
        fake, d = lab.fakes["node-1"], lab.daemon
        fake.script.token_delay_s, fake.script.tokens = 0.2, 400  # a long batch job, as slow as the test needs
        batch = (await d.submit("task", "the long sweep step", node="node-1"))[0]["id"]
        for i in range(MAX_PREEMPTIONS):
            await _streamed(d, batch, 3)
            call = asyncio.ensure_future(
                lab.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": f"call {i}"}])
            )
            await lab.job_with(f"call {i}", "running", "done")  # it interrupted the batch job
            fake.script.token_delay_s = 0.001  # the call answers quickly...
            assert (await asyncio.wait_for(call, 60)).message.content
            fake.script.token_delay_s = 0.2  # ...and the batch job runs long again
            assert (await d.job(batch))["preempted_runs"] == i + 1
        await _streamed(d, batch, 3)
        last = asyncio.ensure_future(
            lab.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "the third call"}])
        )
        [waiting] = await eventually(lambda: _grown(d, "node-1", 1), 15, what="the third call to wait on node-1")
        await _streamed(d, batch, 8)  # the batch job streams on with the call waiting
        assert not last.done() and (await d.job(batch))["preempted_runs"] == MAX_PREEMPTIONS
        fake.script.token_delay_s = 0.001
        assert (await asyncio.wait_for(last, 60)).message.content
        done = await d.wait_state(batch, "done", timeout=60)
        assert [r["state"] for r in done["runs"]] == ["preempted"] * MAX_PREEMPTIONS + ["done"]
        assert (await d.job(waiting["id"]))["started_at"] >= done["finished_at"]
    finally:
        await lab.close()


async def test_with_the_setting_off_a_call_waits_for_the_running_batch_job(fakes, daemon_factory):
    front = await start_front_lab(fakes, daemon_factory, interactive_preempts=False)
    try:
        await _waits_for_the_batch_job(front)
    finally:
        await front.close()


async def _waits_for_the_batch_job(front) -> None:
    fake = front.fakes["node-1"]
    fake.script.token_delay_s, fake.script.tokens = 0.1, 400
    batch = (await front.daemon.submit("task", "the long sweep step", node="node-1"))[0]["id"]
    await _streamed(front.daemon, batch, 3)
    call = asyncio.ensure_future(front.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}]))
    await eventually(lambda: _grown(front.daemon, "node-1", 1), 15, what="the call to wait on node-1")
    await _streamed(front.daemon, batch, 8)  # the batch job kept streaming with the call waiting
    job = await front.daemon.job(batch)
    assert job["preempted_runs"] == 0 and not call.done()
    fake.script.token_delay_s, fake.script.tokens = 0.0, 5
    assert (await asyncio.wait_for(call, 60)).message.content
    assert (await front.daemon.wait_state(batch, "done", timeout=60))["preempted_runs"] == 0


async def test_an_interactive_job_never_preempts_another_interactive_one(fakes, daemon_factory):
    lab = await start_front_lab(fakes, daemon_factory, interactive_preempts=True)
    try:
        fake = lab.fakes["node-1"]
        fake.script.token_delay_s, fake.script.tokens = 0.1, 400
        first = (await lab.daemon.submit("task", "a person waits", node="node-1", priority="interactive"))[0]
        assert first["lane"] == "interactive"
        await _streamed(lab.daemon, first["id"], 3)
        call = asyncio.ensure_future(lab.ollama().chat(model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}]))
        [waiting] = await eventually(lambda: _grown(lab.daemon, "node-1", 1), 15, what="the call to wait on node-1")
        assert waiting["lane"] == "interactive"
        await _streamed(lab.daemon, first["id"], 8)  # the first kept streaming with the call waiting
        assert (await lab.daemon.job(first["id"]))["preempted_runs"] == 0 and not call.done()
        fake.script.token_delay_s, fake.script.tokens = 0.0, 5
        assert (await asyncio.wait_for(call, 60)).message.content
        assert (await lab.daemon.wait_state(first["id"], "done", timeout=60))["preempted_runs"] == 0
    finally:
        await lab.close()


async def test_under_when_idle_a_preempted_jobs_model_stays_loaded_for_the_interactive_job(fakes, daemon_factory):
    """The call's wait is not a reload of the model the batch job had loaded."""
    fake = await fakes("qwen3:latest", token_delay_s=0.1, tokens=40)
    daemon = await daemon_factory(
        [dict(node_table("n", fake, 1, ["task"], "qwen3:latest"), unload="when-idle")], interactive_preempts=True
    )
    batch = (await daemon.submit("task", "the sweep step"))[0]["id"]
    await _streamed(daemon, batch, 3)
    fake.script.token_delay_s = 0.01
    urgent = (await daemon.submit("task", "a person waits", priority="interactive"))[0]["id"]
    await daemon.wait_state(urgent, "done", timeout=30)
    done = await daemon.wait_state(batch, "done", timeout=30)
    assert [r["state"] for r in done["runs"]] == ["preempted", "done"]
    await eventually(lambda: fake.loaded == {}, 10, what="the model to leave VRAM once the node is idle")
    requests = ["gen:" + r["messages"][-1]["content"] if r.get("messages") else "unload" for r in fake.requests]
    assert requests == ["gen:the sweep step", "gen:a person waits", "gen:the sweep step", "unload"]


async def _two_busy_nodes(fakes, daemon_factory, lane_on_n1: str):
    """n1 runs a job of llama3.2 in `lane_on_n1`, n2 a batch job of qwen3 (both stream slowly);
    both nodes have both models."""
    n1 = await fakes("qwen3:latest", "llama3.2:latest", token_delay_s=0.1, tokens=400)
    n2 = await fakes("qwen3:latest", "llama3.2:latest", token_delay_s=0.1, tokens=400)
    daemon = await daemon_factory(
        [
            dict(node_table(name, fake, rank, ["task"], "qwen3:latest"), unload="when-idle")
            for rank, (name, fake) in enumerate((("n1", n1), ("n2", n2)), 1)
        ],
        interactive_preempts=True,
    )
    first = (await daemon.submit("task", "a long reply", node="n1", model="llama3.2", priority=lane_on_n1))[0]
    batch = (await daemon.submit("task", "the sweep step", node="n2"))[0]
    await _streamed(daemon, first["id"], 2)
    await _streamed(daemon, batch["id"], 2)
    n2.script.tokens = 20  # the next request's reply is short; the running one keeps its pace (40 s)
    return daemon, n2, first, batch


@pytest.mark.parametrize("lane_on_n1", ["interactive", "batch"])
async def test_an_interactive_job_moves_to_the_node_whose_batch_job_runs_its_model_and_preempts_it_there(
    fakes, daemon_factory, lane_on_n1
):
    """Placed on n1 (by rank: both nodes are busy), where it would wait for another person's job
    (never interrupted) or interrupt a batch job of another model (its unload, then the job's
    own load): it moves to n2, whose running batch job has its model loaded, and preempts that."""
    daemon, n2, first, batch = await _two_busy_nodes(fakes, daemon_factory, lane_on_n1)
    urgent = (await daemon.submit("task", "a person waits", priority="interactive"))[0]
    assert (urgent["node"], urgent["position"]) == ("n2", 1)  # the answer says where it runs
    done = await daemon.wait_state(urgent["id"], "done", timeout=30)
    assert done["node"] == "n2"
    moved = [e["reason"] for e in done["events"] if (e["reason"] or "").startswith("moved")]
    assert moved == ["moved to n2 at position 1"]  # placed on n1 (shortest interactive backlog, rank)
    n1_job = await daemon.job(first["id"])
    assert n1_job["state"] == "running" and n1_job["preempted_runs"] == 0  # n1's job was left alone
    assert (await daemon.job(batch["id"]))["preempted_runs"] == 1
    assert [r["messages"][-1]["content"] for r in n2.chat_requests][:2] == ["the sweep step", "a person waits"]


async def test_two_calls_at_once_never_leave_one_at_the_tail_of_another_nodes_batch_queue(fakes, daemon_factory):
    """Two interactive jobs placed on n1 and n2 (each running someone's interactive job) both see
    n3's running batch job as the place to preempt. The move and the preempt are one transaction,
    checked there: one moves and preempts; the other, finding an interactive job there first,
    stays where it was placed (it was moved to n3's tail, behind every waiting batch job)."""
    n1, n2, n3 = [await fakes("qwen3:latest", "llama3.2:latest", token_delay_s=0.1, tokens=400) for _ in range(3)]
    daemon = await daemon_factory(
        [
            dict(node_table(name, fake, rank, ["task"], "qwen3:latest"), unload="when-idle")
            for rank, (name, fake) in enumerate((("n1", n1), ("n2", n2), ("n3", n3)), 1)
        ],
        interactive_preempts=True,
    )
    people = [
        (await daemon.submit("task", f"{n} person", node=n, model="llama3.2", priority="interactive"))[0]
        for n in ("n1", "n2")
    ]
    sweep = (await daemon.submit("task", "sweep running", node="n3"))[0]
    for job in (*people, sweep):
        await _streamed(daemon, job["id"], 2)
    for i in range(3):
        await daemon.submit("task", f"sweep queued {i}", node="n3")
    answers = [
        a[0]
        for a in await asyncio.gather(
            *(daemon.submit("task", f"{who} waits", priority="interactive") for who in ("J", "K"))
        )
    ]
    assert [a["node"] for a in answers].count("n3") == 1, answers  # one preempts n3's sweep, one stays
    status, body = await daemon.request("GET", "/api/queue")
    n3_queue = next(n for n in body["nodes"] if n["name"] == "n3")["queued"]
    # No call waits behind the sweep: the one that moved is running, or at the head until n3's
    # worker has claimed it (the sweep's abort takes a moment).
    [moved] = [a["id"] for a in answers if a["node"] == "n3"]
    assert all(q["lane"] == "batch" for q in n3_queue if q["id"] != moved), n3_queue
    assert moved not in [q["id"] for q in n3_queue[1:]], n3_queue
    for a in answers:
        job = await daemon.job(a["id"])
        assert job["node"] == a["node"]  # where the answer said
        if job["node"] == "n3":
            assert job["state"] == "running" or job["queue_position"] == 1
