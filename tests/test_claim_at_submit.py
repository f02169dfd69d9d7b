"""A job submitted to an idle node is claimed in its submit's own commit and handed to the
node's waiting worker (the real router, fake Ollama nodes): it runs once, with the rows and
events a worker's own claim writes; a busy node still queues; the guard still refuses; a stop
right after such a submit puts the job back at the head of its queue."""

from __future__ import annotations

import asyncio
import sqlite3

from aiohttp.test_utils import TestClient, TestServer
from conftest import Daemon, eventually, node_table

from gpuq.api.app import create_app
from gpuq.api.state import DISPATCHER, STORE
from gpuq.config import NodeConfig, Settings
from gpuq.node.worker import NOT_SENT

MODEL = "qwen3-coder:30b"


async def submit_to_idle(d: Daemon, prompt: str, **extra) -> dict:
    """Submit until the node's worker waited idle when the submit came (its answer says running);
    a job that came while the worker was between jobs is let run, and the next one tried (each
    try with a prompt of its own). The job comes back with its `prompt`."""
    tries = 0

    async def claimed():
        nonlocal tries
        tries += 1
        text = prompt if tries == 1 else f"{prompt} (try {tries})"
        [job] = await d.submit("task", text, **extra)
        if job["state"] == "running":
            return dict(job, prompt=text)
        await d.wait_state(job["id"], "done")
        return None

    return await eventually(claimed, what="a submit that finds the node's worker idle")


def shape(events: list[dict]) -> list[tuple]:
    return [(e["from_state"], e["to_state"], e["actor"], e["reason"]) for e in events]


async def test_a_job_submitted_to_an_idle_node_runs_once_with_a_claimed_jobs_rows_and_events(fakes, daemon_factory):
    fake = await fakes(MODEL, tokens=40, token_delay_s=0.01)
    d = await daemon_factory([node_table("n", fake, 1, ["task"], MODEL)])
    first = await submit_to_idle(d, "claimed in its submit", node="n")
    assert first["position"] is None
    # The node is busy now: the next submit waits in the queue, claimed by the first one's finish.
    [second] = await d.submit("task", "claimed by the worker", node="n")
    assert (second["state"], second["position"]) == ("queued", 1)

    done = [await d.wait_state(job["id"], "done") for job in (first, second)]
    prompts = [r["messages"][0]["content"] for r in fake.chat_requests]
    assert prompts.count(first["prompt"]) == 1 and prompts.count("claimed by the worker") == 1
    placed = ("placed on n (asked)",)
    for job in done:
        assert shape(job["events"]) == [
            (None, "queued", "api 127.0.0.1", *placed),
            ("queued", "running", "router", "claimed by n"),
            ("running", "done", "router", None),
        ]
        [run] = job["runs"]
        assert (run["node"], run["state"], run["error"]) == ("n", "done", None)
        assert len(job["output"].split()) == 40
    # Claimed in the submit's own commit: placed and claimed at the same instant, one transaction.
    assert done[0]["events"][0]["at"] == done[0]["events"][1]["at"]
    assert done[1]["events"][0]["at"] < done[1]["events"][1]["at"]
    # The router's log says each job went running once, with its model: the first by its submit
    # (the worker does not say it again before the request), the second by the worker's claim.
    lines = d.log.read_text().splitlines()
    for job in done:
        running = [line for line in lines if f"job={job['id']} " in line and "state=running" in line]
        assert len(running) == 1 and f"model={MODEL}" in running[0], running


async def test_the_guard_refuses_a_critique_on_its_parents_idle_node(fakes, daemon_factory):
    fa, fb = await fakes(MODEL), await fakes(MODEL)
    d = await daemon_factory(
        [node_table("a", fa, 1, ["task", "critique"], MODEL), node_table("b", fb, 2, ["critique"], MODEL)]
    )
    task = await submit_to_idle(d, "the parent", node="a")
    await d.wait_state(task["id"], "done")
    jobs, sent = (await d.get("/api/jobs"))["jobs"], len(fa.chat_requests)
    status, body = await d.request("POST", "/api/jobs", {"kind": "critique", "parent": task["id"], "node": "a"})
    assert status == 409 and body["error"]["message"] == "a critique never runs on its parent task's node"
    assert (await d.get("/api/jobs"))["jobs"] == jobs and len(fa.chat_requests) == sent  # nothing stored or run

    # Not asked for the parent's node: placed on b, claimed there at once, reviewing the result.
    status, body = await d.request("POST", "/api/jobs", {"kind": "critique", "parent": task["id"]})
    [review] = body["jobs"]
    assert status == 201 and (review["node"], review["state"]) == ("b", "running")
    done = await d.wait_state(review["id"], "done")
    assert shape(done["events"])[1] == ("queued", "running", "router", "claimed by b")
    assert "the parent" in fb.chat_requests[0]["messages"][-1]["content"]


async def test_a_router_stopped_right_after_such_a_submit_puts_the_job_back_and_runs_it_after_the_restart(
    fakes, tmp_path
):
    """In-process, to time the stop exactly: the submit's commit (which claims the job for the
    idle worker) lands after the router was told to stop, as SIGTERM does it (quiesce, then the
    runner's cleanup): the job never reached Ollama, so it goes back to the head of its queue."""
    fake = await fakes(MODEL, tokens=3)
    settings = Settings(
        database=tmp_path / "gpuq.db",
        health_interval_s=0.2,
        busy_timeout_s=60,
        nodes=(NodeConfig("n", fake.url, 1, ("task",), MODEL),),
    )
    client = TestClient(TestServer(create_app(settings), host="127.0.0.1"))
    await client.start_server()
    app = client.server.app
    store, worker = app[STORE], app[DISPATCHER].workers["n"]
    submitted = asyncio.Event()
    real_submit = store.submit

    async def noted_submit(*args, **kwargs):  # its write is queued by the time this awaits
        submitted.set()
        return await real_submit(*args, **kwargs)

    store.submit = noted_submit
    db = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    try:
        await eventually(lambda: app[DISPATCHER].nodes["n"].up and worker.idle, what="the worker to wait idle")
        db.execute("BEGIN IMMEDIATE")  # the submit's commit waits for this lock
        answer = asyncio.create_task(client.post("/api/jobs", json={"kind": "task", "prompt": "p", "node": "n"}))
        await asyncio.wait_for(submitted.wait(), 10)
        app[DISPATCHER].quiesce()  # what SIGTERM does first
    finally:
        db.execute("ROLLBACK")
        db.close()
    resp = await answer
    assert resp.status == 201
    [job] = (await resp.json())["jobs"]
    assert job["state"] == "running"  # claimed in the submit's commit, for the idle worker
    await client.close()  # the rest of the stop: the runner's cleanup stops the dispatcher
    assert fake.chat_requests == []  # never sent

    restarted = TestClient(TestServer(create_app(settings), host="127.0.0.1"))
    await restarted.start_server()
    try:

        async def done():
            resp = await restarted.get(f"/api/jobs/{job['id']}")
            body = await resp.json()
            return body if body["state"] == "done" else None

        detail = await eventually(done, what="the job to run after the restart")
    finally:
        await restarted.close()
    assert shape(detail["events"]) == [
        (None, "queued", "api 127.0.0.1", "placed on n (asked)"),
        ("queued", "running", "router", "claimed by n"),
        ("running", "queued", "router", NOT_SENT),
        ("queued", "running", "router", "claimed by n"),
        ("running", "done", "router", None),
    ]
    assert detail["events"][0]["at"] == detail["events"][1]["at"]  # the first claim was the submit's
    assert [(r["state"], r["error"]) for r in detail["runs"]] == [("cancelled", NOT_SENT), ("done", None)]
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["p"]  # once
