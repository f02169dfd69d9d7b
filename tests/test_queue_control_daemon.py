"""Queue control end to end: the real daemon, fake Ollama nodes and the real CLI. Preempt,
delete, move, clear and retry as a user does them, and many clients doing it at once; on each
engine (a SQLite file, then PostgreSQL)."""

from __future__ import annotations

import asyncio
import random

import pytest
from conftest import eventually, make_lab, shell

GUARD = "a critique never runs on its parent task's node"


@pytest.fixture
async def qlab(fakes, daemon_factory, database):
    """The design's lab -- node-1 (task, critique), node-2 (critique), node-3 (task) -- with a
    long stall timeout, so a job held open on purpose is never failed as stalled."""
    return await make_lab(fakes, daemon_factory, stall_timeout="120s", database=str(database))


async def task(lab, prompt: str, node: str = "node-3", **extra) -> str:
    return (await lab.submit("task", prompt, node=node, **extra))[0]["id"]


async def waiting(lab, node: str) -> list[str]:
    queue = await lab.get("/api/queue")
    return [j["id"] for j in next(n for n in queue["nodes"] if n["name"] == node)["queued"]]


async def streamed(lab, job_id: str, words: int) -> dict:
    """Wait until the running job has streamed at least `words` words."""

    async def enough():
        job = await lab.job(job_id)
        return job if job["state"] == "running" and len(job["output"].split()) >= words else None

    return await eventually(enough, 10, what=f"job {job_id} to stream {words} words")


async def test_preempt_interrupts_the_running_job_which_later_runs_again(qlab):
    fake = qlab.fakes["node-3"]
    fake.script.token_delay_s = 0.2  # slow while the test looks; sped up once it has looked
    fake.script.tokens = 30
    fake.models.add("other:7b")
    victim = await task(qlab, "the long one")
    await streamed(qlab, victim, 3)
    urgent = await task(qlab, "urgent", model="other:7b")
    later = await task(qlab, "later")
    assert await waiting(qlab, "node-3") == [urgent, later]

    res = await qlab.cli("preempt", urgent)
    assert res.code == 0, res.err
    assert res.out.splitlines() == [f"{urgent} -> node-3 position 1", f"{victim} preempted -> node-3 position 2"]
    # The fake saw the connection close and stopped generating; the model left VRAM before
    # the preempting job's model was loaded.
    await eventually(lambda: fake.disconnects == 1, what="the fake to see the client leave")
    await qlab.wait_state(urgent, "running")
    await eventually(lambda: "other:7b" in fake.loaded, what="the urgent job's model to load")
    assert "llama3.2:latest" not in fake.loaded
    res = await qlab.cli("queue")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert any(urgent in line and "running" in line for line in lines), res.out
    [mark] = [line for line in lines if victim in line]
    assert mark.split()[0] == "1" and mark.endswith("(preempted)"), mark
    assert await waiting(qlab, "node-3") == [victim, later]
    fake.script.token_delay_s = 0.01

    done = await qlab.wait_state(victim, "done", timeout=20)
    first, second = done["runs"]
    assert (first["state"], second["state"]) == ("preempted", "done")
    assert first["error"] == f"preempted by {urgent}"
    partial, full = first["output"].split(), second["output"].split()
    assert 3 <= len(partial) < len(full) == 30  # the partial output was kept
    assert full[: len(partial)] == partial
    assert done["preempted_runs"] == 1
    preempted = [e for e in done["events"] if (e["from_state"], e["to_state"]) == ("running", "queued")]
    assert len(preempted) == 1
    assert preempted[0]["actor"].startswith("cli ") and preempted[0]["reason"] == f"preempted by {urgent}"
    # The victim ran before the job that was waiting behind it, as its queue line promised.
    assert (await qlab.wait_state(later, "done", timeout=20))["started_at"] > done["started_at"]
    assert fake.disconnects == 1
    await eventually(lambda: fake.loaded == {}, what="the model to be unloaded")
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == [
        "the long one",
        "urgent",
        "the long one",
        "later",
    ]


async def test_preempt_refusals_on_the_cli(qlab):
    fake = qlab.fakes["node-3"]
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 400
    head = await task(qlab, "head")
    await qlab.wait_state(head, "running")
    res = await qlab.cli("preempt", head)
    assert res.code != 0
    assert res.err.splitlines() == [f"error 409 job {head} is running; only a queued job can preempt", "not retried"]
    res = await qlab.cli("preempt", "1700000000-00000000")
    assert res.code != 0
    assert res.err.splitlines() == ["error 404 no job with id '1700000000-00000000'", "not retried"]
    assert (await qlab.job(head))["state"] == "running"
    assert fake.disconnects == 0
    await qlab.cli("delete", head)


async def test_deleting_a_running_job_frees_the_node_at_once(qlab):
    fake = qlab.fakes["node-3"]
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 400  # 20 seconds a job, far longer than the wait below
    head = await task(qlab, "stuck head")
    nxt = await task(qlab, "next")
    await streamed(qlab, head, 2)

    res = await qlab.cli("delete", head)
    assert res.code == 0, res.err
    assert res.out.splitlines() == [f"{head} cancelled on node-3 (was running)"]
    await qlab.wait_state(nxt, "running", timeout=10)
    await eventually(lambda: fake.disconnects == 1, what="the fake to see the client leave")
    gone = await qlab.job(head)
    assert (gone["state"], gone["error"]) == ("cancelled", "deleted by cli 127.0.0.1")
    [run] = gone["runs"]
    assert run["state"] == "cancelled" and len(run["output"].split()) >= 2  # kept for forensics
    assert gone["events"][-1]["to_state"] == "cancelled" and gone["events"][-1]["actor"].startswith("cli ")
    shown = (await qlab.cli("show", head)).out.splitlines()
    assert any(line.startswith("cancelled: deleted by cli 127.0.0.1; ") for line in shown), shown
    assert not any(line.startswith("error") or " error: " in line for line in shown), shown
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["stuck head", "next"]

    res = await qlab.cli("delete", nxt)
    assert res.code == 0, res.err
    await eventually(lambda: fake.disconnects == 2 and fake.loaded == {}, what="the model to be unloaded")


async def test_delete_several_reports_each_and_fails_on_a_finished_one(qlab):
    await qlab.take_down(qlab.fakes["node-3"], "node-3")  # node-3 is down: its jobs wait
    a, b = await task(qlab, "a"), await task(qlab, "b")
    done = await task(qlab, "done", node="node-1")
    await qlab.wait_state(done, "done")
    res = await qlab.cli("delete", a, done, b)
    assert res.code == 1
    assert res.out.splitlines() == [f"{a} cancelled on node-3 (was queued)", f"{b} cancelled on node-3 (was queued)"]
    assert res.err.splitlines() == [
        f"error 409 job {done} is already done; only queued or running jobs can be deleted",
        "not retried",
    ]
    assert await waiting(qlab, "node-3") == []
    assert (await qlab.job(done))["state"] == "done"


async def test_moving_a_critique_onto_its_parents_node_is_409_and_changes_nothing(qlab):
    await qlab.take_down(qlab.fakes["node-2"], "node-2")  # node-2 is down, so its critiques stay queued
    parent = await task(qlab, "the plan", node="node-1")
    [crit] = await qlab.submit("critique", "review the plan", parent=parent)
    [other] = await qlab.submit("critique", "review another", node="node-2")
    assert crit["node"] == "node-2"
    assert await waiting(qlab, "node-2") == [crit["id"], other["id"]]
    before = await qlab.job(crit["id"])

    res = await qlab.cli("move", crit["id"], "--node", "node-1")
    assert res.code != 0
    assert res.err.splitlines() == [f"error 409 {GUARD}", "not retried"]
    status, body = await qlab.request("POST", f"/api/jobs/{crit['id']}/move", {"node": "node-1", "position": 1})
    assert (status, body) == (409, {"error": {"status": 409, "message": GUARD}})
    res = await qlab.cli("move", crit["id"], "--node", "node-3")
    assert res.code != 0
    assert res.err.splitlines() == [
        "error 409 node 'node-3' does not take critique jobs (its roles: task)",
        "not retried",
    ]

    after = await qlab.job(crit["id"])
    assert (after["node"], after["state"], after["queue_position"]) == ("node-2", "queued", 1)
    assert after["events"] == before["events"]  # no event: nothing happened
    assert await waiting(qlab, "node-2") == [crit["id"], other["id"]]
    assert await waiting(qlab, "node-1") == []


async def test_move_reorders_and_moves_between_nodes_on_the_cli(qlab):
    await qlab.take_down(qlab.fakes["node-3"], "node-3")
    await qlab.take_down(qlab.fakes["node-1"], "node-1")
    a, b, c = [await task(qlab, p) for p in ("a", "b", "c")]
    res = await qlab.cli("move", c, "--to", "1")
    assert (res.code, res.out) == (0, f"{c} -> node-3 position 1\n"), res.err
    res = await qlab.cli("move", c, "--after", b)
    assert (res.code, res.out) == (0, f"{c} -> node-3 position 3\n"), res.err
    res = await qlab.cli("move", b, "--before", a)
    assert (res.code, res.out) == (0, f"{b} -> node-3 position 1\n"), res.err
    assert await waiting(qlab, "node-3") == [b, a, c]
    res = await qlab.cli("move", a, "--node", "node-1")
    assert (res.code, res.out) == (0, f"{a} -> node-1 position 1\n"), res.err
    assert await waiting(qlab, "node-3") == [b, c]
    assert await waiting(qlab, "node-1") == [a]
    events = (await qlab.job(a))["events"]
    assert events[-1]["reason"] == "moved to node-1 at position 1" and events[-1]["actor"].startswith("cli ")

    res = await qlab.cli("move", b, "--to", "1", "--before", c)
    assert res.code != 0
    assert res.code == 2 and res.err.splitlines()[-1] == "Error: give only one of --to, --before and --after"
    res = await qlab.cli("move", b, "--before", a)  # a waits on another node now
    assert res.code != 0
    assert res.err.splitlines() == [f"error 409 job {a} is not waiting in node node-3's queue", "not retried"]
    assert await waiting(qlab, "node-3") == [b, c]


async def test_a_running_job_does_not_move(qlab):
    fake = qlab.fakes["node-3"]
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 400
    head = await task(qlab, "head")
    await qlab.wait_state(head, "running")
    res = await qlab.cli("move", head, "--node", "node-1")
    assert res.code != 0
    assert res.err.splitlines() == [f"error 409 job {head} is running; only queued jobs move", "not retried"]
    assert (await qlab.job(head))["node"] == "node-3"
    await qlab.cli("delete", head)


async def test_an_unknown_node_is_the_same_422_on_every_path(qlab):
    # Submit to it, move a waiting job to it, clear it (API and CLI): one status, one text, which
    # lists the nodes there are; nothing changes.
    fake = qlab.fakes["node-3"]
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 400
    head = await task(qlab, "head")
    queued = await task(qlab, "waits")
    await qlab.wait_state(head, "running")
    said = "unknown node 'node-9' (the nodes: node-1, node-2, node-3)"
    answers = [
        await qlab.request("POST", "/api/jobs", {"kind": "task", "prompt": "x", "node": "node-9"}),
        await qlab.request("POST", f"/api/jobs/{queued}/move", {"node": "node-9"}),
        await qlab.request("POST", "/api/nodes/node-9/clear", {}),
    ]
    assert [(status, body["error"]["message"]) for status, body in answers] == [(422, said)] * 3
    for args in (["task", "x", "--node", "node-9"], ["move", queued, "--node", "node-9"], ["clear", "node-9", "--yes"]):
        res = await qlab.cli(*args)
        assert (res.code, res.err.splitlines()) == (1, [f"error 422 {said}", "not retried"]), args
    res = await qlab.cli("clear", "node-9")  # asks first: the CLI's own check, in the same words
    assert res.code == 2 and said in res.err
    assert await waiting(qlab, "node-3") == [queued]
    await qlab.cli("delete", head, queued)


async def test_clear_asks_then_cancels_the_waiting_jobs_and_with_running_the_head(qlab):
    fake = qlab.fakes["node-3"]
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 400
    head = await task(qlab, "head")
    await qlab.wait_state(head, "running")
    rest = [await task(qlab, f"w{i}") for i in range(3)]
    elsewhere = await task(qlab, "elsewhere", node="node-1")

    res = await qlab.cli("clear", "node-3", stdin=b"n\n")  # the confirmation is refused
    assert res.code != 0 and f"Cancel {len(rest)} job{'s' if len(rest) != 1 else ''} on node-3?" in res.out
    assert await waiting(qlab, "node-3") == rest

    res = await qlab.cli("clear", "node-3", "--yes")
    assert res.code == 0, res.err
    assert res.out.splitlines() == ["3 jobs cancelled on node-3"] + [f"{j} cancelled" for j in rest]
    assert await waiting(qlab, "node-3") == []
    for j in rest:
        job = await qlab.job(j)
        assert (job["state"], job["error"]) == ("cancelled", "cleared by cli 127.0.0.1")
    assert (await qlab.job(head))["state"] == "running" and fake.disconnects == 0
    assert (await qlab.wait_state(elsewhere, "done"))["state"] == "done"

    res = await qlab.cli("clear", "node-3", "--running", "--yes")
    assert res.code == 0, res.err
    assert res.out.splitlines() == ["1 job cancelled on node-3", f"{head} cancelled"]
    assert (await qlab.job(head))["state"] == "cancelled"
    await eventually(lambda: fake.disconnects == 1 and fake.loaded == {}, what="the head to be aborted")


async def test_the_api_takes_json_booleans_and_integers_strictly(qlab):
    await qlab.take_down(qlab.fakes["node-3"], "node-3")
    a, b = await task(qlab, "a"), await task(qlab, "b")
    status, body = await qlab.request("POST", f"/api/jobs/{b}/move", {"position": True})
    assert (status, body["error"]["message"]) == (400, "field 'position' must be a whole number, got true")
    status, body = await qlab.request("POST", "/api/nodes/node-3/clear", {"running": "yes"})
    assert (status, body["error"]["message"]) == (400, "field 'running' must be a boolean, got \"yes\"")
    assert await waiting(qlab, "node-3") == [a, b]
    status, body = await qlab.request("POST", "/api/nodes/node-3/clear", {"running": True})
    assert (status, body) == (200, {"node": "node-3", "cancelled": [a, b]})
    events = (await qlab.job(a))["events"]
    assert (events[-1]["to_state"], events[-1]["actor"], events[-1]["reason"]) == (
        "cancelled",
        "api 127.0.0.1",
        "cleared by api 127.0.0.1",
    )


async def test_retry_only_on_explicit_request(qlab):
    fake = qlab.fakes["node-3"]
    fake.script.load_error = (500, "llama-server reported out-of-memory during startup")
    job = await task(qlab, "too big")
    await qlab.wait_state(job, "failed")
    fake.script.load_error = None
    other = await task(qlab, "fits")
    await qlab.wait_state(other, "done")
    assert (await qlab.job(job))["state"] == "failed"  # nothing retried it by itself

    res = await qlab.cli("retry", job)
    assert (res.code, res.out) == (0, f"{job} -> node-3 queued\n"), res.err
    again = await qlab.wait_state(job, "done")
    assert [r["state"] for r in again["runs"]] == ["failed", "done"]
    assert [e["to_state"] for e in again["events"]] == ["queued", "running", "failed", "queued", "running", "done"]
    assert again["events"][3]["actor"].startswith("cli ") and again["events"][3]["reason"] == "retry requested"
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["too big", "fits", "too big"]

    res = await qlab.cli("retry", job)
    assert res.code != 0
    assert res.err.splitlines() == [
        f"error 409 job {job} is done; only failed or cancelled jobs can be retried",
        "not retried",
    ]


# -- many clients at once ---------------------------------------------------------------------


async def test_many_clients_moving_and_deleting_while_jobs_finish(qlab, tmp_path):
    for name in ("node-1", "node-3"):
        qlab.fakes[name].script.token_delay_s = 0.01
        qlab.fakes[name].script.tokens = 6
    ids = [await task(qlab, f"job {i}", node=("node-1", "node-3")[i % 2]) for i in range(40)]
    peak = {"models": 0, "requests": 0}
    storming = True

    async def watch():  # what each fake holds, as often as the loop lets us look
        while storming:
            for fake in (qlab.fakes["node-1"], qlab.fakes["node-3"]):
                peak["models"] = max(peak["models"], len(fake.loaded))
                peak["requests"] = max(peak["requests"], sum(m.refcount for m in fake.loaded.values()))
            await asyncio.sleep(0.002)

    statuses: list[int] = []

    async def client(seed: int):
        rng = random.Random(seed)
        for _ in range(10):
            job = rng.choice(ids)
            if rng.random() < 0.2:
                status, body = await qlab.request("DELETE", f"/api/jobs/{job}")
            else:
                where = rng.choice(
                    [
                        {"position": rng.randint(1, 25)},
                        {"before": rng.choice(ids)},
                        {"after": rng.choice(ids)},
                        {"node": rng.choice(["node-1", "node-3"])},
                    ]
                )
                status, body = await qlab.request("POST", f"/api/jobs/{job}/move", where)
            statuses.append(status)
            assert status in (200, 400, 409), (status, body)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(client(seed) for seed in range(20)))
        # mid-stream: never two waiting jobs at one position of one queue
        rows = shell(qlab, "SELECT node, position FROM job WHERE state = 'queued'")
        assert len(rows) == len(set(rows))

        async def settled():
            jobs = [await qlab.job(i) for i in ids]
            return all(j["state"] in ("done", "cancelled") for j in jobs) and jobs

        jobs = await eventually(settled, 30, 0.1, "every job to finish or be cancelled")
    finally:
        storming = False
        await watcher
    assert statuses.count(200) >= 20  # the storm really moved and deleted jobs
    assert peak == {"models": 1, "requests": 1}  # never two jobs at once on one node

    events = shell(qlab, "SELECT job_id, from_state, to_state, actor FROM event ORDER BY id")
    runs = shell(qlab, "SELECT job_id, state FROM run ORDER BY id")
    assert {j["id"] for j in jobs} == set(ids)  # every job accounted for
    final = {j["id"]: j["state"] for j in jobs}
    replayed: dict[str, str | None] = {}
    outcomes: dict[str, int] = {}
    for job_id, from_state, to_state, actor in events:
        assert from_state == replayed.get(job_id), (job_id, from_state, to_state, actor)
        replayed[job_id] = to_state
        if to_state in ("done", "failed", "cancelled"):
            outcomes[job_id] = outcomes.get(job_id, 0) + 1
    assert replayed == final  # the event log replays to each job's final state
    assert outcomes == {i: 1 for i in ids}  # each outcome recorded exactly once
    assert all(state != "running" for _, state in runs)
    for job_id, state in final.items():  # a job done has a done last run
        if state == "done":
            assert [s for j, s in runs if j == job_id][-1] == "done"
    deleted = [j for j in jobs if j["state"] == "cancelled"]
    assert deleted and all(j["error"].startswith("deleted by ") for j in deleted)
    assert "finish refused" not in (tmp_path / "daemon.log").read_text()
    assert "Traceback" not in (tmp_path / "daemon.log").read_text()
