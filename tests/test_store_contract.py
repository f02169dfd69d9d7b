"""The store's contract (issue 34): every public verb and read of `Store`, on each engine in turn
(the `database` fixture: a SQLite file, then a fresh PostgreSQL database of the session's
cluster), asserting what a user of the queue would notice: states, positions, counts, the
answers' shapes, the refusals' statuses and words. One suite, both backends, as River and huey
each run one driver suite against every backend.

Each test is tagged with the names it holds to the contract (`@covers`), and
test_every_public_name_of_the_store_has_its_contract fails when a public method or property of
Store has no test here: a new verb or read comes with its contract, on both engines."""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gpuq.config import NodeConfig
from gpuq.errors import GUARD_MESSAGE, Conflict, GpuqError, GuardMiss, GuardRefused, NotFound, StoreUnavailable
from gpuq.jobs import Interrupted, NodeCounts, compact_json, iso
from gpuq.store import NewJob, NodeInfo, Store
from gpuq.store.batches import NewBatch, NewLine, lines_seen
from gpuq.store.core import Verb
from gpuq.store.leases import Router
from gpuq.store.retention import Cutoffs

NODES = [
    NodeInfo("a", 1, ("task", "critique"), "ma", True),
    NodeInfo("b", 2, ("task", "critique"), "mb", True),
    NodeInfo("c", 3, ("critique",), "mc", True),
]
CONFIGURED = [NodeConfig(n.name, f"http://{n.name}:11434", n.rank, n.roles, n.model) for n in NODES]
SETTINGS = {"stale_after_s": 600.0, "stale_grace_s": 30.0, "max_runtime_s": 3600.0}
T0 = 1_800_000_000.0


class Clock:
    """The store's clock: each reading a distinct, later moment (1 ms on); `advance` jumps."""

    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        self.now += 0.001
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


COVERED: dict[str, list[str]] = {}  # public name of Store: the tests that hold it to the contract


def covers(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def tag(test: Callable[..., Any]) -> Callable[..., Any]:
        for name in names:
            COVERED.setdefault(name, []).append(test.__name__)
        return test

    return tag


@pytest.fixture
async def store(database):
    s = Store(database, clock=Clock())
    await s.open()
    await s.configure(SETTINGS, CONFIGURED)
    yield s
    await s.close()


def on_postgres(store: Store) -> bool:
    return store.dsn is not None


async def submit(store: Store, node: str | None = "a", prompt: str = "p", **fields: Any) -> str:
    [job] = await store.submit(NewJob("task", prompt, node=node, **fields), NODES, "api")
    return job["id"]


async def order(store: Store, node: str) -> list[str]:
    _, queued, _ = await store.queue(node, 1000)
    return [j["id"] for j in queued]


async def state(store: Store, job_id: str) -> str:
    return (await store.job(job_id))["state"]


# -- opening, closing, health -----------------------------------------------------------------


@covers("open", "close", "where", "alone", "lost", "trouble")
async def test_a_store_opens_names_its_database_and_keeps_its_jobs_across_a_reopen(database):
    s = Store(database, clock=Clock())
    await s.open()
    try:
        if isinstance(database, Path):
            assert (s.where, s.alone) == (str(database), True)  # SQLite: one router per file
        else:
            assert s.where.startswith("postgresql://") and s.alone is False  # other routers may live
        assert s.lost is None and s.trouble() is None
        job_id = await submit(s)
    finally:
        await s.close()
    with pytest.raises(StoreUnavailable, match="not open"):
        await s.claim("a")
    again = Store(database, clock=Clock())
    await again.open()  # the migrations are applied already: nothing re-applied, nothing lost
    try:
        assert await order(again, "a") == [job_id]
    finally:
        await again.close()


# -- submitting and the queue's reads ----------------------------------------------------------


@covers(
    "submit",
    "queue",
    "queue_position",
    "jobs",
    "active_by_node",
    "next_ready",
    "next_ready_model",
    "queue_plans",
    "lanes_in_play",
)
async def test_submitted_jobs_wait_in_order_and_every_read_of_the_queue_agrees(store):
    created = [await store.submit(NewJob("task", f"p{i}", node="a"), NODES, "api") for i in range(3)]
    assert [(j["state"], j["node"], j["model"], j["position"]) for [j] in created] == [
        ("queued", "a", "ma", 1),
        ("queued", "a", "ma", 2),
        ("queued", "a", "ma", 3),
    ]
    ids = [j["id"] for [j] in created]
    running, queued, count = await store.queue("a", 10)
    assert (running, [j["id"] for j in queued], count) == (None, ids, 3)
    assert [j["id"] for j in (await store.queue("a", 1, offset=1))[1]] == [ids[1]]
    assert await store.queue_position(await store.job(ids[2])) == 3
    assert [j["id"] for j in await store.jobs(node="a", state="queued")] == ids[::-1]  # newest first
    assert [j["id"] for j in await store.jobs(limit=1)] == [ids[2]]
    assert await store.jobs(node="b") == []
    assert (await store.active_by_node())["a"] == NodeCounts(0, 3)
    assert dict(await store.next_ready("a") or {}) == {"id": ids[0], "model": "ma"}
    assert await store.next_ready_model("a") == "ma"
    assert await store.next_ready("b") is None and await store.next_ready_model("b") is None

    # Unplaced, a task goes to the first free task node; an interactive one is in play.
    [free] = await store.submit(NewJob("task", "hurry", lane="interactive"), NODES, "api")
    assert (free["node"], free["reason"], free["lane"]) == ("b", "first free node by rank", "interactive")
    assert [(r["node"], r["state"], r["lane"]) for r in await store.lanes_in_play(ids[0])] == [
        ("b", "queued", "interactive")
    ]
    assert await store.lanes_in_play(free["id"]) == []

    plans = await store.queue_plans(["a", "b"], depth=2)
    assert [(p["node"], p["id"], p["state"]) for p in plans] == [
        ("a", ids[0], "queued"),
        ("a", ids[1], "queued"),
        ("b", free["id"], "queued"),
    ]
    assert await store.queue_plans([], depth=2) == []


@covers("set_max_running", "at_max_running")
async def test_max_running_holds_a_users_next_job_and_the_store_says_whose_limit_holds(store):
    store.set_max_running({"ann": 1, "bob": 2})
    first = await submit(store, "a", owner="ann")
    held = await submit(store, "b", owner="ann")
    other = await submit(store, "b", owner="cy")
    assert (await store.claim("a"))["id"] == first
    assert (await store.claim("b"))["id"] == other  # ann runs her one: her job waits, cy's runs
    assert await store.at_max_running(["ann", "bob", "cy", None, "ann"]) == {"ann": 1}
    assert await store.at_max_running(iter(["bob"])) == {} and await store.at_max_running([]) == {}
    store.set_max_running({"ann": 2})  # a reload raises it: in force from the next claim on
    assert await store.at_max_running(["ann"]) == {}
    await store.finish(other, (await store.job(other))["run_id"], "done", None, claim_node="b")
    assert await state(store, held) == "running"
    assert await store.at_max_running(["ann"]) == {"ann": 2}


@covers("submit")
async def test_a_critique_fans_out_never_to_its_parents_node_and_the_guard_refuses_it_there(store):
    parent = await submit(store, "a")
    before = len(await store.jobs())
    with pytest.raises(GuardRefused) as refused:
        await store.submit(NewJob("critique", "review", parent=parent, node="a"), NODES, "api")
    assert (refused.value.status, refused.value.message) == (409, GUARD_MESSAGE)
    assert len(await store.jobs()) == before  # nothing stored
    fan = await store.submit(NewJob("critique", None, parent=parent), NODES, "api")
    assert sorted((c["node"], c["waiting_for"], c["state"]) for c in fan) == [
        ("b", parent, "queued"),
        ("c", parent, "queued"),
    ]
    with pytest.raises(GpuqError) as unknown:
        await store.submit(NewJob("critique", None, parent="1800000000-00000000"), NODES, "api")
    assert unknown.value.status == 422


# -- a job's life: claim, progress, finish; its reads ------------------------------------------


@covers("claim", "heartbeat", "work_done", "finish", "save_output", "job", "job_detail", "runs", "run_texts")
async def test_a_job_is_claimed_streams_and_finishes_and_its_page_reads_all_of_it(store):
    first, second = await submit(store, "a", "one"), await submit(store, "a", "two")
    claimed = await store.claim("a")
    assert claimed is not None and (claimed["id"], claimed["state"]) == (first, "running")
    run = claimed["run_id"]
    assert await store.claim("a") is None  # one running job per node
    assert (await store.active_by_node())["a"] == NodeCounts(1, 1)
    await store.heartbeat(run, "Hel")
    await store.heartbeat(run, "lo", thinking="hm")
    await store.work_done(
        run,
        "!",
        {
            "eval_count": 7,
            "prompt_eval_count": 3,
            "done_reason": "stop",
            "total_duration": 5_000,
            "eval_duration": 4_000,
        },
    )
    after = await store.finish(first, run, "done", None, claim_node="a")  # and claims the next
    assert after is not None and (after["id"], after["state"]) == (second, "running")
    with pytest.raises(GuardMiss) as miss:  # a finish from a run that is no longer running
        await store.finish(first, run, "failed", "late")
    assert miss.value.status == 409

    job = await store.job(first)
    assert (job["state"], job["eval_count"], job["done_reason"], job["prompt_excerpt"]) == ("done", 7, "stop", "one")
    detail = await store.job_detail(first)
    assert (detail["prompt"], detail["output"], detail["thinking"]) == ("one", "Hello!", "hm")
    assert [e["to_state"] for e in detail["events"]] == ["queued", "running", "done"]
    assert [(r["id"], r["state"], r["output"]) for r in detail["runs"]] == [(run, "done", "Hello!")]
    assert "queue_position" not in detail
    assert [(r["id"], r["output"], r["thinking"]) for r in await store.runs(first)] == [(run, "Hello!", "hm")]
    assert await store.run_texts([run]) == {run: {"output": "Hello!", "thinking": "hm"}}
    assert (await store.job_detail(await submit(store, "a")))["queue_position"] == 1
    with pytest.raises(NotFound):
        await store.job("1800000000-00000000")

    # An interrupted run's last output is kept, whatever state it ended in.
    await store.delete(second, "api")
    await store.save_output(after["run_id"], "late words")
    assert ((await store.job_detail(second))["state"], (await store.job_detail(second))["output"]) == (
        "cancelled",
        "late words",
    )


@covers("job_detail")
async def test_a_critique_reviews_its_parents_result_and_the_parent_counts_its_findings(store):
    parent = await submit(store, "a", "the task")
    [crit, _] = sorted(
        await store.submit(NewJob("critique", None, parent=parent), NODES, "api"), key=lambda c: c["node"]
    )
    assert await store.next_ready("b") is None  # held for its parent's result
    assert (await store.job(crit["id"]))["waiting_for"] == parent
    run = (await store.claim("a"))["run_id"]
    await store.finish(parent, run, "done", None, output="the answer")
    claimed = await store.claim("b")
    assert claimed["id"] == crit["id"] and "the task" in claimed["prompt"] and "the answer" in claimed["prompt"]
    await store.finish(
        crit["id"],
        claimed["run_id"],
        "done",
        None,
        findings=[{"severity": "low"}, {"severity": "high"}, {"severity": "medium"}],
    )
    children = {c["id"]: c for c in (await store.job_detail(parent))["children"]}
    assert (children[crit["id"]]["finding_count"], children[crit["id"]]["top_severity"]) == (3, "high")
    assert [c["finding_count"] for i, c in children.items() if i != crit["id"]] == [None]


# -- the user's queue control (every case of each: tests/test_store_queue.py, on both engines too) --


def front_request(body: dict) -> str:
    return compact_json({"path": "/api/chat", "user_agent": "ui/1", "body": body})


def raw_sql(store: Store, sql: str) -> None:
    """A statement on the database as an operator (or retention) would run it, outside the store."""
    if on_postgres(store):
        with psycopg.connect(store.dsn, autocommit=True) as conn:
            conn.execute(sql)
    else:
        db = sqlite3.connect(store.where, isolation_level=None)
        try:
            db.execute("PRAGMA foreign_keys = ON")
            db.execute(sql)
        finally:
            db.close()


@covers("whole_request", "drop_unreferenced_parts")
async def test_a_requests_large_parts_are_stored_once_and_read_back_whole(store):
    # base64 of an image; a long string with a NUL in it (PostgreSQL's TEXT takes none: a part is
    # kept as its JSON text, where it is \u0000)
    photo, other = "iVBOR" + "A" * (100 << 10), "/9j/" + "B" * (80 << 10) + "\x00é"
    small = "QUJD"  # under the threshold: kept in its request
    turns = []
    for i, images in enumerate(([photo], [photo, small], [photo, other])):
        body = {"model": "ma", "messages": [{"role": "user", "content": f"turn {i}", "images": images}]}
        turns.append(body)
        await submit(store, "a", f"turn {i}", endpoint="/api/chat", request=front_request(body))
    ids = [j["id"] for j in reversed(await store.jobs(limit=10))]
    # Each job's request reads back whole, as its client sent it: its detail and its claim.
    for job_id, body in zip(ids, turns, strict=True):
        assert await store.whole_request(job_id) == front_request(body)  # the very text submitted
        assert json.loads((await store.job_detail(job_id))["request"])["body"] == body
    claimed = await store.claim("a")
    assert claimed is not None and json.loads(claimed["request"])["body"] == turns[0]
    # The photo is stored once for its three jobs, the other image once; the small one stays inline.
    parts = await store.read("SELECT sha256, bytes FROM request_part ORDER BY bytes")
    assert [p["bytes"] for p in parts] == [len(other) + 8, len(photo) + 2]  # as JSON text: quoted, escaped
    assert (await store.read("SELECT COUNT(*) AS n FROM job_part"))[0]["n"] == 4
    stored = await store.read("SELECT SUM(LENGTH(request)) AS n FROM job")
    assert stored[0]["n"] < 2000  # the requests hold marks, not images
    assert await store.drop_unreferenced_parts() == {"parts": 0, "bytes": 0}  # every part is referred to
    with pytest.raises(NotFound):
        await store.whole_request("1800000000-00000000")
    assert await store.whole_request(await submit(store, "a")) is None  # not a front-door call

    # Retention empties the third job's request: its other image goes, the photo stays (two refer to it).
    raw_sql(store, f"UPDATE job SET endpoint = NULL, request = NULL WHERE id = '{ids[2]}'")
    assert await store.drop_unreferenced_parts() == {"parts": 1, "bytes": len(other) + 8}
    assert json.loads(await store.whole_request(ids[1]))["body"] == turns[1]
    raw_sql(store, f"UPDATE job SET endpoint = NULL, request = NULL WHERE id IN ('{ids[0]}', '{ids[1]}')")
    assert await store.drop_unreferenced_parts() == {"parts": 1, "bytes": len(photo) + 2}
    assert await store.read("SELECT sha256 FROM request_part") == []


@covers("move", "preempt", "delete", "clear", "retry")
async def test_a_user_moves_preempts_deletes_clears_and_retries(store):
    ids = [await submit(store, "a", f"p{i}") for i in range(3)]
    moved = await store.move(ids[2], NODES, "api", position=1)
    assert moved["position"] == 1 and await order(store, "a") == [ids[2], ids[0], ids[1]]
    assert (await store.move(ids[2], NODES, "api", after=ids[1]))["position"] == 3
    assert (await store.move(ids[2], NODES, "api", before=ids[0]))["position"] == 1
    across = await store.move(ids[1], NODES, "api", node="b")
    assert (across["node"], (await store.job(ids[1]))["placement"]) == ("b", "moved")
    assert await order(store, "b") == [ids[1]]

    head = await store.claim("a")  # ids[2] runs
    job, interrupted = await store.preempt(ids[0], "api")
    assert (job["id"], job["position"]) == (ids[0], 1)
    assert interrupted == Interrupted(ids[2], "a", head["run_id"])
    assert await order(store, "a") == [ids[0], ids[2]]  # the interrupted one goes back behind it

    deleted, none = await store.delete(ids[0], "api")
    assert (deleted["state"], none, await state(store, ids[0])) == ("cancelled", None, "cancelled")
    for verb in (store.delete, store.preempt):  # a cancelled job is neither deleted nor preempts again
        with pytest.raises(Conflict) as refused:
            await verb(ids[0], "api")
        assert refused.value.status == 409 and "cancelled" in refused.value.message
    running = await store.claim("a")
    assert running["id"] == ids[2]
    cleared, interrupted = await store.clear("b", "api")
    assert (cleared, interrupted, await state(store, ids[1])) == ([ids[1]], None, "cancelled")
    cleared, interrupted = await store.clear("a", "api", running=True)
    assert cleared == [ids[2]] and interrupted == Interrupted(ids[2], "a", running["run_id"])

    retried = await store.retry(ids[0], "api")
    assert (retried["state"], await order(store, "a")) == ("queued", [ids[0]])
    with pytest.raises(Conflict) as again:
        await store.retry(ids[0], "api")
    assert again.value.status == 409 and "only failed or cancelled jobs can be retried" in again.value.message


# -- a worker's and a router's recovery ------------------------------------------------------


@covers("put_back", "requeue_unsent", "fail_orphans", "cancel_clientless", "remove_nodes")
async def test_claims_are_undone_orphans_fail_and_leaving_nodes_take_their_jobs_along(store):
    on_a, on_b = await submit(store, "a"), await submit(store, "b")
    run_a = (await store.claim("a"))["run_id"]
    await store.claim("b")
    assert await store.put_back(on_a, run_a, "the node refused the connection") is True
    assert await state(store, on_a) == "queued" and await order(store, "a") == [on_a]
    assert [r["state"] for r in await store.runs(on_a)] == ["cancelled"]
    assert await store.put_back(on_a, run_a, "again") is False  # that run had already ended

    run_a2 = (await store.claim("a"))["run_id"]
    unsent = await store.requeue_unsent({"a": run_a2, "b": None}, "router stopping")
    assert [r["id"] for r in unsent] == [on_b] and await order(store, "b") == [on_b]
    assert await state(store, on_a) == "running"  # its request had reached Ollama

    failed = await store.fail_orphans()
    assert [(r["id"], r["node"]) for r in failed] == [(on_a, "a")]
    job = await store.job(on_a)
    assert (job["state"], job["error"]) == ("failed", "router restarted while running")

    call = await submit(store, "b", endpoint="/api/chat", request="{}")
    cancelled = await store.cancel_clientless(["b"])
    assert [r["id"] for r in cancelled] == [call] and await state(store, call) == "cancelled"
    assert await state(store, on_b) == "queued" and await store.cancel_clientless([]) == []

    def refuse(waiting: dict[str, list[str]], running: dict[str, str]) -> str | None:
        return f"jobs wait on {sorted(waiting)}" if waiting else None

    with pytest.raises(Conflict, match=r"jobs wait on \['b'\]"):
        await store.remove_nodes(["b"], False, "node b removed", refuse)
    assert await state(store, on_b) == "queued"
    removed = await store.remove_nodes(["b"], True, "node b removed", refuse)
    assert [r["id"] for r in removed] == [on_b]
    job = await store.job(on_b)
    assert (job["state"], job["error"]) == ("failed", "node b removed")
    assert await store.remove_nodes([], True, "none", refuse) == []


# -- the router's own records ------------------------------------------------------------------


@covers("configure", "set_node_health", "record_reload", "note", "read")
async def test_the_router_records_its_nodes_their_health_its_reloads_and_notes(store):
    nodes = await store.read("SELECT name, url, rank, roles, model FROM node ORDER BY name")
    assert [(n["name"], n["url"], n["rank"], n["roles"], n["model"]) for n in nodes] == [
        (c.name, c.url, c.rank, ",".join(c.roles), c.model) for c in CONFIGURED
    ]
    await store.configure({"stale_after_s": 60.0}, [NodeConfig("a", "http://elsewhere:11434", 1, ("task",), "ma")])
    [a] = await store.read("SELECT url, roles FROM node WHERE name = :name", {"name": "a"})
    assert (a["url"], a["roles"]) == ("http://elsewhere:11434", "task")
    [stale] = await store.read("SELECT value FROM router_setting WHERE key = ?", ("stale_after_s",))
    assert float(stale["value"]) == 60.0

    await store.set_node_health("a", False, "connection refused")
    [a] = await store.read("SELECT up, last_error FROM node WHERE name = ?", ("a",))
    assert (a["up"], a["last_error"]) == (0, "connection refused")

    await store.record_reload("cli", "/etc/gpuq.toml", {"added": ["d"]}, None)
    await store.record_reload("api", "/etc/gpuq.toml", None, "bad key")
    reloads = await store.read("SELECT actor, ok, changes, error FROM config_reload ORDER BY id")
    assert [(r["actor"], r["ok"], r["error"]) for r in reloads] == [("cli", 1, None), ("api", 0, "bad key")]
    assert "added" in reloads[0]["changes"] and reloads[1]["changes"] is None

    job_id = await submit(store, "a")
    await store.note(job_id, "unload failed: timeout")
    assert (await store.job_detail(job_id))["events"][-1]["reason"] == "unload failed: timeout"
    with pytest.raises(GpuqError) as broken:  # the engine's error, mapped: 503, nothing changed
        await store.read("SELECT nothing FROM no_such_table")
    assert broken.value.status == 503


@covers("record_asked_unload", "asked_unloads")
async def test_a_nodes_last_asked_unload_is_kept_on_its_row(store):
    assert await store.asked_unloads() == {}
    first = {
        "model": "m:latest",
        "by": "ollama 127.0.0.1",
        "at": "2026-12-03T10:00:00Z",
        "took_s": 0.4,
        "verified": True,
    }
    await store.record_asked_unload("a", first)
    second = dict(first, model="n:latest", verified=False)
    await store.record_asked_unload("a", second)  # the last one replaces the one before
    await store.record_asked_unload("b", first)
    assert await store.asked_unloads() == {"a": second, "b": first}
    # a reload's configure keeps it
    await store.configure({}, [NodeConfig("a", "http://elsewhere:11434", 1, ("task",), "ma")])
    assert (await store.asked_unloads())["a"] == second


@covers("stale_heads", "note_stale")
async def test_a_head_with_no_progress_goes_stale_once(store):
    job_id = await submit(store, "a")
    await store.claim("a")
    now = store.clock()
    assert await store.stale_heads(now + 10) == []
    [head] = await store.stale_heads(now + 700)  # past stale_after_s (600)
    assert (head["id"], head["node"]) == (job_id, "a") and head["reason"]
    assert [h["id"] for h in await store.note_stale(now + 700)] == [job_id]
    assert await store.note_stale(now + 710) == []  # one event, not one per check
    assert (await store.job_detail(job_id))["events"][-1]["reason"].startswith("stale: ")


# -- history and utilisation --------------------------------------------------------------------


@covers("history", "finished_since", "runs_since", "finished_totals", "recent_durations")
async def test_finished_jobs_are_counted_searched_and_timed_alike(store):
    clock = store.clock
    assert isinstance(clock, Clock)
    start = clock()
    done = await submit(store, "a", "Hello World", owner="ann")
    run = (await store.claim("a"))["run_id"]
    await store.work_done(run, "hi", {"eval_count": 5})
    clock.advance(10)
    await store.finish(done, run, "done", None)
    failed = await submit(store, "a", "100% sure")
    await store.finish(failed, (await store.claim("a"))["run_id"], "failed", "boom")
    await submit(store, "a", "still going")
    await store.claim("a")

    rows, total = await store.history(None, None, None, None, 10, 0)
    assert ([r["id"] for r in rows], total) == ([failed, done], 2)  # newest first
    assert [r["id"] for r in (await store.history("done", None, None, None, 10, 0))[0]] == [done]
    assert [r["id"] for r in (await store.history(None, "a", "task", "hello WORLD", 10, 0))[0]] == [done]
    assert [r["id"] for r in (await store.history(None, None, None, "100%", 10, 0))[0]] == [failed]
    assert (await store.history(None, None, None, "0%s", 10, 0))[1] == 0  # % is a character, not a wildcard
    assert [r["id"] for r in (await store.history(None, None, None, None, 10, 0, owner="ann"))[0]] == [done]
    assert [r["id"] for r in (await store.history(None, None, None, None, 1, 1))[0]] == [done]
    # A member of a private router searches the prompts and errors of their own jobs only; ids
    # and models of all ([router] private).
    assert (await store.history(None, None, None, "hello", 10, 0, text_owner="bea"))[1] == 0
    assert (await store.history(None, None, None, "boom", 10, 0, text_owner="bea"))[1] == 0
    assert [r["id"] for r in (await store.history(None, None, None, "hello", 10, 0, text_owner="ann"))[0]] == [done]
    assert [r["id"] for r in (await store.history(None, None, None, failed, 10, 0, text_owner="bea"))[0]] == [failed]
    assert (await store.history(None, None, None, "ma", 10, 0, text_owner="bea"))[1] == 2  # the model's name

    assert await store.finished_since(start) == {"done": 1, "failed": 1}
    assert await store.finished_since(clock() + 60) == {}
    assert sorted(r["state"] for r in await store.runs_since(start)) == ["done", "failed", "running"]
    assert [r["state"] for r in await store.runs_since(clock() + 60)] == ["running"]

    totals = {r["state"]: r for r in await store.finished_totals(0, (5.0, 20.0), (1.0,))}
    assert set(totals) == {"done", "failed"}
    ann = totals["done"]
    assert (ann["node"], ann["kind"], ann["model"], ann["owner"], ann["n"], ann["tokens"]) == (
        "a",
        "task",
        "ma",
        "ann",
        1,
        5,
    )
    assert (ann["d_n"], ann["d_le_0"], ann["d_le_1"]) == (1, 0, 1) and 10 <= ann["d_sum"] < 11
    assert (totals["failed"]["owner"], totals["failed"]["n"]) == ("", 1)
    assert await store.finished_totals(max(r["last_event"] for r in totals.values()), (5.0,), ()) == []

    durations = await store.recent_durations({("a", "ma")}, {"a"})
    assert sorted((r["node"], r["model"] or "", round(r["seconds"])) for r in durations) == [
        ("a", "", 10),
        ("a", "ma", 10),
    ]


@covers("speeds")
async def test_a_nodes_speed_is_summed_over_its_last_done_runs_of_the_model(store):
    """Ollama's counters of the last `last` done runs: an older run, a failed one, another
    node's and a run without durations (an embedding) do not count for the rates."""

    async def run(node: str, stats: dict[str, int], end: str = "done") -> None:
        job = await submit(store, node)
        run_id = (await store.claim(node))["run_id"]
        await store.work_done(run_id, "x", stats)
        store.clock.advance(5)
        await store.finish(job, run_id, end, None if end == "done" else "boom")

    old = {"prompt_eval_count": 1, "prompt_eval_duration": 10**9, "eval_count": 1, "eval_duration": 10**9}
    await run("a", dict(old, load_duration=9 * 10**9))  # the oldest: past `last`
    await run("a", {"prompt_eval_count": 100, "prompt_eval_duration": 10**8, "eval_count": 30,
                    "eval_duration": 10**9, "load_duration": 3 * 10**9})  # fmt: skip
    await run("a", {"prompt_eval_count": 300, "prompt_eval_duration": 3 * 10**8, "eval_count": 10,
                    "eval_duration": 10**9, "load_duration": 10**6})  # fmt: skip
    await run("a", {"prompt_eval_count": 7, "load_duration": 10**6})  # an embedding: no durations
    await run("a", dict(old, load_duration=8 * 10**9), end="failed")
    await run("b", dict(old, load_duration=10**6))

    rows = await store.speeds({("a", "ma"), ("b", "mb"), ("c", "mc")}, last=3)
    by_node = {r["node"]: r for r in rows}
    assert set(by_node) == {"a", "b"}  # c: no done run, no row
    a = {k: int(v) for k, v in by_node["a"].items() if k not in ("node", "model", "last_used")}
    assert a == {
        "runs": 3,
        "prompt_tokens": 400,  # 1000 tokens/s
        "prompt_ns": 4 * 10**8,
        "output_tokens": 40,  # 20 tokens/s
        "output_ns": 2 * 10**9,
        "load_ns": 3 * 10**9,  # the longest: a cold load
    }
    assert by_node["a"]["last_used"] < by_node["b"]["last_used"]


# -- alerts ---------------------------------------------------------------------------------------


@covers("fire_alert", "resolve_alert", "owe_open_alerts", "record_delivery", "open_alerts", "alerts_owed", "alerts")
async def test_an_alert_fires_is_owed_delivered_and_resolved(store):
    fired = await store.fire_alert(
        {
            "alert": "node_down",
            "node": "a",
            "job": None,
            "since": iso(T0),
            "message": "node a is down",
            "fix": "gpuq nodes",
        },
        deliver=False,
    )
    assert (fired["alert"], fired["node"], fired["resolved_at"], fired["deliver"]) == ("node_down", "a", None, 0)
    assert [r["id"] for r in await store.open_alerts()] == [fired["id"]]
    assert await store.alerts_owed() == []  # seen while no alert_url was set
    assert await store.owe_open_alerts() == 1
    [owed] = await store.alerts_owed()
    assert (owed["id"], owed["attempts"]) == (fired["id"], 0)
    await store.record_delivery(fired["id"], "firing", 1, False, 500, "server error")
    assert [r["attempts"] for r in await store.alerts_owed()] == [1]
    await store.record_delivery(fired["id"], "firing", 2, True, 200, None)
    assert await store.alerts_owed() == []
    await store.resolve_alert(fired["id"], "node a is up")
    assert await store.open_alerts() == []
    [owed] = await store.alerts_owed()  # the resolved notice is owed now
    assert (owed["resolution"], owed["attempts"]) == ("node a is up", 0)
    [latest] = await store.alerts(10)
    assert [(d["status"], d["ok"], d["http_status"]) for d in latest["deliveries"]] == [
        ("firing", 0, 500),
        ("firing", 1, 200),
    ]


# -- leases: exactly one router drives a node (every case: tests/test_leases.py) ----------------


@covers("take_nodes", "renew_nodes", "release_nodes", "end_dead_routers", "routers", "still_held")
async def test_a_router_holds_its_nodes_until_it_releases_them_or_its_process_is_gone(store):
    host = socket.gethostname()
    one = Router.new("127.0.0.1:1", None, T0)
    two = Router(f"{host}:2:bbbb", "127.0.0.1:2", None, 2, host, T0)  # pid 2: gone, as the test says
    taken = await store.take_nodes(one, ["a", "b"], 60.0)
    assert (taken.held, taken.failed) == (["a", "b"], [])
    assert (await store.take_nodes(two, ["a", "b", "c"], 60.0)).held == ["c"]  # a and b are held, alive
    alive = await store.routers(60.0)
    assert {r["id"]: sorted(r["nodes"]) for r in alive["routers"]} == {one.id: ["a", "b"], two.id: ["c"]}
    assert {n: h["router"] for n, h in alive["holders"].items() if h} == {"a": one.id, "b": one.id, "c": two.id}
    assert await store.renew_nodes(one, ["a", "b"], 60.0) == ["a", "b"]
    assert await store.still_held(one, ["a", "b", "c"]) == ["a", "b"]  # a read: c is two's

    # `two` ran on this host and its process is gone: its leases end now, its node is free at once.
    assert await store.end_dead_routers(one, lambda pid: pid != two.pid) == ["c"]
    assert (await store.take_nodes(one, ["c"], 60.0)).held == ["c"]
    assert await store.release_nodes(one) == ["a", "b", "c"]  # a clean stop
    assert [r["id"] for r in (await store.routers(60.0))["routers"]] == []
    assert (await store.take_nodes(two, ["a"], 60.0)).held == ["a"]


@covers("record_node_models", "nodes_driven_elsewhere")
async def test_the_nodes_other_routers_drive_are_read_with_their_health_and_models(store):
    """A batch's lines may go to a node another live router drives: its row says its health and
    the models its Ollama lists (recorded by that router's monitor); this router's own, a free
    lease's and a released one's are not others'."""
    one, two = Router.new("127.0.0.1:1", None, T0), Router.new("127.0.0.1:2", None, T0)
    assert (await store.take_nodes(one, ["a"], 60.0)).held == ["a"]
    assert (await store.take_nodes(two, ["b", "c"], 60.0)).held == ["b", "c"]
    await store.set_node_health("b", True, None)
    await store.record_node_models("b", ["mb:latest", "qwen3:8b"])
    await store.record_node_models("b", ["qwen3:8b", "mb:latest", "llama3.2:latest"])  # the latest list wins
    b, c = await store.nodes_driven_elsewhere(one.id)
    assert b == NodeInfo(
        "b", 2, ("task", "critique"), "mb", True, frozenset({"mb:latest", "qwen3:8b", "llama3.2:latest"})
    )
    assert c == NodeInfo("c", 3, ("critique",), "mc", False, None)  # not heard from: down, models unknown
    assert [n.name for n in await store.nodes_driven_elsewhere(two.id)] == ["a"]
    await store.release_nodes(two)  # a clean stop: its nodes are nobody's until taken
    assert await store.nodes_driven_elsewhere(one.id) == []
    # a reload's configure keeps the models
    await store.configure({}, [NodeConfig("b", "http://elsewhere:11434", 2, ("task",), "mb")])
    assert (await store.take_nodes(two, ["b"], 60.0)).held == ["b"]
    [b] = await store.nodes_driven_elsewhere(one.id)
    assert b.roles == ("task",) and b.models == frozenset({"mb:latest", "qwen3:8b", "llama3.2:latest"})


# -- other routers' changes ------------------------------------------------------------------


@covers("watch")
async def test_another_routers_change_is_watched_and_this_routers_own_is_not(store, database):
    changes: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    if not on_postgres(store):  # one router per file: nothing to watch, it returns at once
        assert await asyncio.wait_for(store.watch(changes.put_nowait), 5) is None
        assert changes.empty()
        return
    watching = asyncio.ensure_future(store.watch(changes.put_nowait, poll_s=60))
    other = Store(database, clock=Clock())
    await other.open()
    try:
        assert await asyncio.wait_for(changes.get(), 30) is None  # at connect: "look at everything"
        mine = await submit(store, "a")
        theirs = await submit(other, "b")
        seen = await asyncio.wait_for(changes.get(), 30)  # the first notice told is theirs, not mine
        assert seen == {"id": theirs, "node": "b", "state": "queued"} and mine != theirs
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
        await other.close()


@covers("backup")
async def test_a_backup_is_a_checked_copy_on_sqlite_and_names_pg_dump_on_postgres(store, tmp_path):
    job_id = await submit(store, prompt="kept in the backup")
    target = tmp_path / "backups" / "gpuq-backup.db"
    target.parent.mkdir()
    if on_postgres(store):
        with pytest.raises(Conflict, match="pg_dump"):
            await store.backup(str(target))
        assert not target.exists()
        return
    answer = await store.backup(str(target))
    assert answer["integrity"] == "ok" and answer["bytes"] == target.stat().st_size > 0
    copy = Store(target, clock=Clock())
    await copy.open()
    try:
        assert (await copy.job(job_id))["state"] == "queued"
    finally:
        await copy.close()
    with pytest.raises(Conflict, match="exists"):
        await store.backup(str(target))  # an existing file is replaced only when asked
    assert (await store.backup(str(target), force=True))["integrity"] == "ok"
    assert sorted(p.name for p in target.parent.iterdir()) == ["gpuq-backup.db"]  # no temp file left


@covers("remove_backup_partials")
async def test_what_killed_backups_left_is_removed_and_nothing_else(store, tmp_path):
    """A killed backup's temporary copy and its journal go; the backups, a file of another name,
    and (on PostgreSQL, where the router makes no copies) everything stay."""
    folder = tmp_path / "backups"
    folder.mkdir()
    left = [folder / ".gpuq-backup.db.0a1b2c3d.partial", folder / ".gpuq-backup.db.0a1b2c3d.partial-journal"]
    kept = [folder / "gpuq-backup.db", folder / ".notes.partial", folder / ".gpuq-backup.db.xyz.partial"]
    for path in left + kept:
        path.write_bytes(b"x")
    removed = await store.remove_backup_partials([folder, folder, tmp_path / "missing"])
    if on_postgres(store):
        assert removed == [] and all(p.exists() for p in left + kept)
        return
    assert left[0] in removed and set(removed) <= set(left)  # (SQLite's look at the copy may take its journal)
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in kept)


# -- retention: the record kept, the bulk shed, then the rows (gpuq/store/retention.py) ---------

DAY = 86400.0


async def finished(store: Store, node: str, prompt: str, state: str = "done", **fields: Any) -> str:
    """A job run on `node` to its end (`state` done or failed), its text in chunks."""
    job_id = await submit(store, node, prompt, **fields)
    claimed = await store.claim(node)
    assert claimed is not None and claimed["id"] == job_id
    await store.heartbeat(claimed["run_id"], "an ", thinking="hmm")
    await store.finish(job_id, claimed["run_id"], state, None if state == "done" else "broke", output="answer")
    return job_id


@covers("retention_due", "retention_plan", "whole_jobs", "prune", "delete_ended", "give_back_space")
async def test_retention_prunes_the_bulk_of_ended_jobs_then_deletes_their_rows_and_never_an_active_one(store):
    clock = store.clock
    assert isinstance(clock, Clock)
    done = await finished(store, "a", "kept prompt")
    failed = await finished(store, "b", "a failure", state="failed")
    long_prompt = "a call: " + "ü" * 400  # characters, not bytes, are kept (2 bytes each here)
    call = await finished(store, "b", long_prompt, endpoint="/api/chat", request='{"path": "/api/chat", "body": {}}')
    cancelled = await submit(store, "a", "never ran")
    await store.delete(cancelled, "api")
    parent = await finished(store, "a", "the task under review")
    critiques = await store.submit(NewJob("critique", None, parent=parent), NODES, "api")  # they wait on b, c
    waiting = await submit(store, "a", "still waiting")

    clock.advance(2 * DAY)  # a cancelled job's bulk goes first (an editor's abandoned calls)
    assert await store.retention_due("prune", Cutoffs.at(clock.now, 30 * DAY, 90 * DAY, 365 * DAY, DAY), 100) == [
        cancelled
    ]
    clock.advance(38 * DAY)
    cut = Cutoffs.at(clock.now, 30 * DAY, 90 * DAY, 365 * DAY, 30 * DAY)
    due = [done, call, cancelled]  # the failed one is kept longer; the parent while its critiques wait
    assert await store.retention_due("prune", cut, 100) == due
    assert await store.retention_due("prune", cut, 2) == due[:2]
    assert await store.retention_due("delete", cut, 100) == []
    plan = await store.retention_plan(cut)
    assert plan["prune"]["jobs"] == 3 and plan["prune"]["chunks"] >= 2
    cut_bytes = len(long_prompt[300:].encode())  # a long prompt past its first 300 characters
    assert plan["prune"]["bytes"] >= len("an answer") * 2 + len('{"path": "/api/chat", "body": {}}') + cut_bytes
    assert plan["delete"] == {"jobs": 0, "runs": 0, "events": 0, "bytes": 0}

    [whole] = await store.whole_jobs([done])
    assert (whole["prompt"], whole["output"], whole["runs"][0]["thinking"]) == ("kept prompt", "an answer", "hmm")
    assert [e["to_state"] for e in whole["events"]] == ["queued", "running", "done"]
    assert (await store.whole_jobs([call]))[0]["request"] == {"path": "/api/chat", "body": {}}

    pruned = await store.prune(due, cut)
    assert pruned.pop("held_ms") >= 0 and pruned == {"jobs": 3, "chunks": 4}
    assert (await store.prune(due, cut))["jobs"] == 0  # pruned once
    detail = await store.job_detail(done)
    assert detail["pruned_at"] == iso(clock.now)[:10] + detail["pruned_at"][10:] and detail["prompt"] == "kept prompt"
    assert (detail["output"], detail["thinking"], detail["runs"][0]["output"]) == ("", None, "")
    assert [e["to_state"] for e in detail["events"]] == ["queued", "running", "done"]  # the record stays
    call_detail = await store.job_detail(call)
    assert call_detail["request"] is None and call_detail["prompt"] == long_prompt[:300]
    assert call_detail["prompt_bytes"] == len(long_prompt[:300].encode())  # the listing's size follows
    with pytest.raises(Conflict, match=r"cannot be retried: output pruned on \d{4}-\d\d-\d\d \(retention\)"):
        await store.retry(cancelled, "api")
    assert await state(store, waiting) == "queued" and (await store.job_detail(parent))["output"] == "an answer"
    assert await store.give_back_space() >= 0

    clock.advance(400 * DAY)
    cut = Cutoffs.at(clock.now, 30 * DAY, 90 * DAY, 365 * DAY, 30 * DAY)
    for c in critiques:
        await store.delete(c["id"], "api")  # they end now: the parent may be pruned, not deleted yet
    assert await store.retention_due("delete", cut, 100) == [done, failed, call, cancelled]
    plan = await store.retention_plan(cut)
    assert plan["delete"]["jobs"] == 4 and plan["delete"]["events"] == 3 + 3 + 3 + 2
    deleted = await store.delete_ended([done, failed, call, cancelled, waiting], cut)
    assert deleted.pop("held_ms") >= 0 and deleted == {"jobs": 4, "runs": 3, "events": 11}
    for gone in (done, failed, call, cancelled):
        with pytest.raises(NotFound):
            await store.job(gone)
    assert await store.retention_due("prune", cut, 100) == [parent]
    assert await state(store, waiting) == "queued" and await store.whole_jobs([]) == []
    if on_postgres(store):
        assert await store.give_back_space() == 0  # autovacuum's work there


@covers("take_service")
async def test_one_router_holds_the_retention_sweeps_lease_until_it_stops(store):
    one, two = (Router.new("127.0.0.1:8750", None, T0) for _ in range(2))
    assert await store.take_service(one, "retention", 60.0) is True
    assert await store.take_service(two, "retention", 60.0) is False  # held, alive
    assert await store.take_service(one, "retention", 60.0) is True  # renewed
    await store.release_nodes(one)  # a clean stop frees it
    assert await store.take_service(two, "retention", 60.0) is True


@covers("record_backup", "backups", "last_backups", "rotatable_backups", "backups_removed")
async def test_backups_are_recorded_made_or_failed_and_rotation_marks_the_ones_it_deleted(store, tmp_path):
    if not on_postgres(store):  # a backup asked for and made is on the record by itself
        made = await store.backup(str(tmp_path / "by-hand.db"))
        [row] = await store.backups()
        assert (row["path"], row["ok"], row["scheduled"], row["bytes"]) == (made["path"], 1, 0, made["bytes"])
        await store.backups_removed([row["id"]])  # not a scheduled one: rotation would never pick it
    started = store.clock()
    first = await store.record_backup("/b/gpuq-1.db", True, started, {"bytes": 10, "seconds": 0.5}, None)
    failed = await store.record_backup("/b/gpuq-2.db", True, started, None, "disk full")
    second = await store.record_backup("/b/gpuq-3.db", True, started, {"bytes": 30, "seconds": 0.7}, None)
    assert (failed["ok"], failed["error"], failed["bytes"]) == (0, "disk full", None)
    assert first["started_at"] < first["finished_at"] and first["seconds"] == 0.5
    last = await store.last_backups()
    assert last["last_success"]["id"] == last["scheduled_success"]["id"] == second["id"]
    assert last["scheduled_failure"]["id"] == failed["id"]
    assert [r["id"] for r in await store.backups(scheduled=True)] == [second["id"], failed["id"], first["id"]]
    assert [r["id"] for r in await store.rotatable_backups()] == [first["id"], second["id"]]
    await store.backups_removed([first["id"]])
    assert [r["id"] for r in await store.rotatable_backups()] == [second["id"]]
    assert (await store.backups(scheduled=True, limit=1))[0]["removed_at"] is None


@covers("record_sweep", "last_sweeps")
async def test_retention_sweeps_are_recorded_done_or_failed_with_what_they_did(store, monkeypatch):
    from gpuq.store import records

    assert await store.last_sweeps() == {"last": None, "last_success": None}
    started = store.clock()
    did = {"pruned": {"jobs": 3, "chunks": 40}, "longest_hold_ms": 1.5}
    done = await store.record_sweep("router-a", False, started, did, None)
    store.clock.advance(5)  # type: ignore[attr-defined]
    failed = await store.record_sweep(None, True, store.clock(), {"pruned": {"jobs": 0}}, "the archive is full")
    assert (done["ok"], done["router"], done["asked"], done["error"]) == (1, "router-a", 0, None)
    assert done["started_at"] <= done["finished_at"] and json.loads(done["swept"]) == did
    assert (failed["ok"], failed["asked"], failed["error"]) == (0, 1, "the archive is full")
    last = await store.last_sweeps()
    assert last["last"]["id"] == failed["id"] and last["last_success"]["id"] == done["id"]
    # The record keeps the newest rows (and the newest success however old).
    monkeypatch.setattr(records, "SWEEPS_KEPT", 2)
    for _ in range(3):
        await store.record_sweep("router-a", False, store.clock(), {}, "still failing")
    last = await store.last_sweeps()
    assert last["last_success"]["id"] == done["id"] and last["last"]["error"] == "still failing"


@covers("record_storage_sample", "storage_samples", "storage_now", "relations", "born")
async def test_the_database_is_measured_sampled_and_its_tables_sized(store):
    assert (await store.born()).endswith("Z")  # the first migration's time
    now = await store.storage_now()
    if on_postgres(store):
        assert now["database_bytes"] == now["file_bytes"] > 0 and now["page_size"] is None
    else:  # its pages, what max_database_bytes counts; the file and its WAL on disk apart
        assert now["database_bytes"] % now["page_size"] == 0 and now["database_bytes"] > 0
        assert now["file_bytes"] + now["wal_bytes"] > 0
    assert (now["free_bytes"] is None) == on_postgres(store)
    assert await store.record_storage_sample(1000, 5000, min_gap_s=3600)
    assert not await store.record_storage_sample(2000, 5000, min_gap_s=3600)  # one within the hour: skipped
    store.clock.advance(3601)  # type: ignore[attr-defined]
    assert await store.record_storage_sample(3000, None, min_gap_s=3600)
    samples = await store.storage_samples(T0 - 1)
    assert [(r["database_bytes"], r["free_bytes"]) for r in samples] == [(1000, 5000), (3000, None)]
    store.clock.advance(91 * 86400)  # type: ignore[attr-defined]
    assert await store.record_storage_sample(4000, None, min_gap_s=3600)
    assert [r["database_bytes"] for r in await store.storage_samples(T0 - 1)] == [4000]  # a season kept
    await submit(store, prompt="x" * 20000)
    sized = await store.relations()
    assert sized["method"] == ("postgres" if on_postgres(store) else "dbstat")
    by_name = {r["name"]: r for r in sized["relations"]}
    assert by_name["job"]["kind"] == "table" and by_name["job"]["bytes"] > 0
    assert by_name["job_queue"] == {**by_name["job_queue"], "kind": "index", "table": "job"}
    sizes = [r["bytes"] for r in sized["relations"]]
    assert sizes == sorted(sizes, reverse=True)
    assert (sized["empty_bytes"] is None) == on_postgres(store)  # PostgreSQL's VACUUM reuses its own
    assert (sized["reclaimable_bytes"] is None) == on_postgres(store)


@covers("compact")
async def test_a_sqlite_file_is_compacted_of_the_space_pruned_rows_left_empty(store):
    ids = [await submit(store, prompt=f"{i} " + "x" * 3000) for i in range(60)]
    for job_id in ids:
        await store.delete(job_id, "api")  # cancelled: ended
    store.clock.advance(40 * DAY)  # type: ignore[attr-defined]
    cut = Cutoffs.at(store.clock(), 30 * DAY, 90 * DAY, None, 30 * DAY)
    assert (await store.prune(ids, cut))["jobs"] == 60  # each prompt cut to 300 characters
    empty = (await store.relations())["empty_bytes"]
    compacted = await store.compact()
    if on_postgres(store):
        assert compacted is None and (await store.relations())["empty_bytes"] is None
        return
    assert compacted is not None and compacted["seconds"] >= 0
    assert compacted["after"] < compacted["before"] - 100_000  # 60 x 2.7 KB cut; the rows are whole
    assert (await store.relations())["empty_bytes"] < empty - 100_000
    assert [await state(store, j) for j in ids] == ["cancelled"] * 60
    assert len((await store.job_detail(ids[0]))["prompt"]) == 300


# -- batches (gpuq/store/batches.py) ------------------------------------------------------------

KNOWN = [
    NodeInfo("a", 1, ("task", "critique"), "ma:1b", True, frozenset({"ma:1b", "shared:7b"})),
    NodeInfo("b", 2, ("task", "critique"), "mb:1b", True, frozenset({"mb:1b", "shared:7b"})),
    NodeInfo("c", 3, ("critique",), "mc:1b", True, frozenset({"mc:1b"})),
]


def batch_of(batch_id: str, owner: str | None = "alice", errors: list | None = None) -> NewBatch:
    return NewBatch(
        batch_id, "openai", "/v1/chat/completions", "24h", T0 + 86400, owner, "sweep", "file-in", {"k": "v"}, errors
    )


def line_of(n: int, model: str = "shared:7b", owner: str | None = "alice") -> NewLine:
    request = '{"path": "/v1/chat/completions", "body": {}, "batch": "b"}'
    job = NewJob("task", f"line {n}", model=model, endpoint="/v1/chat/completions", request=request, owner=owner)
    return NewLine(n, f"id-{n}", job)


def render_counts(lines: list[dict]) -> tuple[bytes | None, bytes | None]:
    done = [line for line in lines if line["state"] == "done"]
    other = [line for line in lines if line["state"] != "done"]
    return (
        b"".join(f"{line['custom_id']} {line['response']}\n".encode() for line in done) or None,
        b"".join(f"{line['custom_id']} {line['state']}\n".encode() for line in other) or None,
    )


async def finalize(store, batch_id: str) -> dict | None:
    """As the batch service finalizes: the lines read, rendered, and the end written if they
    are as read."""
    lines = await store.batch_results(batch_id)
    return await store.finalize_batch(batch_id, *render_counts(lines), lines_seen(lines))


@covers("add_file", "file", "files", "file_content", "delete_file")
async def test_files_keep_their_content_list_newest_first_and_are_only_their_owners(store):
    a = await store.add_file("file-a", "batch", "a.jsonl", b"\x00binary\xff", "alice")
    assert (a["bytes"], a["filename"]) == (8, "a.jsonl")
    await store.add_file("file-b", "batch", "b.jsonl", b"{}", "bob")
    assert await store.file_content("file-a") == b"\x00binary\xff"  # as uploaded, byte for byte
    assert (await store.file("file-a", "alice"))["owner"] == "alice"
    with pytest.raises(NotFound):
        await store.file("file-a", "bob")
    with pytest.raises(NotFound):
        await store.file_content("file-a", "bob")
    assert [f["id"] for f in await store.files()] == ["file-b", "file-a"]
    assert [f["id"] for f in await store.files(ascending=True)] == ["file-a", "file-b"]
    assert [f["id"] for f in await store.files(owner="alice")] == ["file-a"]
    assert [f["id"] for f in await store.files(after="file-b")] == ["file-a"]
    with pytest.raises(NotFound):
        await store.delete_file("file-a", only_owner="bob")
    await store.delete_file("file-a", only_owner="alice")
    assert [f["id"] for f in await store.files()] == ["file-b"]


@covers(
    "create_batch",
    "batch",
    "batches",
    "batch_lines",
    "open_batch_lines",
    "batch_totals",
    "open_batches_by_node",
    "batches_of_jobs",
)
async def test_a_batch_queues_every_line_in_one_commit_placed_by_model_and_keeps_refusals(store):
    refused = NewLine(3, "id-3", None, {"status": 400, "code": None, "message": "bad body"})
    lines = [line_of(1), line_of(2, model="mb:1b"), refused, line_of(4, model="nowhere")]
    row = await store.create_batch(batch_of("batch_1"), lines, KNOWN, "api")
    assert row["status"] == "in_progress" and row["total"] == 4 and row["metadata"] == {"k": "v"}
    assert row["counts"] == {
        "queued": 2,
        "running": 0,
        "done": 0,
        "failed": 0,
        "cancelled": 0,
        "expired": 0,
        "refused": 2,
    }
    got = await store.batch_lines("batch_1")
    assert [(g["line"], g["custom_id"], g["state"]) for g in got] == [
        (1, "id-1", "queued"),
        (2, "id-2", "queued"),
        (3, "id-3", None),
        (4, "id-4", None),
    ]
    assert got[1]["node"] == "b"  # placed by its model
    assert '"model_not_found"' in got[3]["refused"] and "nowhere" in got[3]["refused"]
    jobs = {g["job_id"]: "batch_1" for g in got if g["job_id"]}
    assert await store.open_batch_lines() == jobs
    assert await store.open_batches_by_node() == {"batch_1": {"a": {"queued": 1}, "b": {"queued": 1}}}
    first = got[0]["job_id"]
    other = await submit(store)
    assert await store.batches_of_jobs([first, other]) == {
        first: {"id": "batch_1", "name": "sweep", "custom_id": "id-1"}
    }
    assert await store.batches_of_jobs([]) == {}
    await store.create_batch(
        batch_of("batch_2", owner="bob", errors=[{"code": "invalid_json_line", "line": 1}]), [], KNOWN, "api"
    )
    failed = await store.batch("batch_2")
    assert failed["status"] == "failed" and failed["errors"] == [{"code": "invalid_json_line", "line": 1}]
    with pytest.raises(NotFound):
        await store.batch("batch_2", only_owner="alice")
    assert [b["id"] for b in await store.batches()] == ["batch_2", "batch_1"]
    assert [b["id"] for b in await store.batches(owner="alice")] == ["batch_1"]
    assert [b["id"] for b in await store.batches(after="batch_2")] == ["batch_1"]
    assert [b["id"] for b in await store.batches(open_only=True)] == ["batch_1"]
    by_status, by_state = await store.batch_totals()
    assert by_status == {"in_progress": 1, "failed": 1} and by_state == {"queued": 2, "refused": 2}


@covers("create_batch")
async def test_a_batch_past_max_waiting_is_refused_whole(store):
    await submit(store, owner="alice")
    with pytest.raises(GpuqError) as exc:
        await store.create_batch(batch_of("batch_q"), [line_of(1), line_of(2)], KNOWN, "api", max_waiting=2)
    assert exc.value.status == 429 and "max_waiting is 2" in exc.value.message
    with pytest.raises(NotFound):
        await store.batch("batch_q")  # nothing stored
    assert len(await store.jobs(state="queued")) == 1


@covers("begin_batch", "add_batch_lines", "open_batch", "unfinished_batches", "retry_batch", "cancel_batch", "preempt")
async def test_a_large_batch_made_in_pieces_is_hidden_until_it_is_opened_whole(store):
    """A large batch's create, piece by piece (batch_create.py): its lines are queued as they
    come but no claim takes one, and the batch is `validating`, until the short commit that
    opens it whole; only its creator adds to it or opens it."""
    begun = await store.begin_batch(batch_of("batch_p"), 4, 3, "router-1")
    assert (begun["status"], begun["total"], begun["creator"]) == ("validating", 4, "router-1")
    [unfinished] = await store.unfinished_batches()
    assert (unfinished["id"], unfinished["creator"], unfinished["total"]) == ("batch_p", "router-1", 4)
    placed = await store.add_batch_lines("batch_p", "router-1", [line_of(1, model="ma:1b"), line_of(2)], KNOWN, "api")
    assert "a" in placed
    assert await store.claim("a") is None and await store.next_ready("a") is None  # hidden: never claimed
    hidden = (await store.batch_lines("batch_p"))[0]["job_id"]
    with pytest.raises(Conflict, match="a line of a batch still being created"):
        await store.preempt(hidden, "api")
    assert (await store.batch("batch_p"))["counts"]["queued"] == 2
    assert await store.batches(open_only=True) == []  # no expiry, no finalize looks at it
    with pytest.raises(Conflict, match="no longer being created by this router"):
        await store.add_batch_lines("batch_p", "router-2", [line_of(3)], KNOWN, "api")
    with pytest.raises(Conflict, match="has 2 of its 4 lines stored"):
        await store.open_batch("batch_p", "router-1", KNOWN)
    with pytest.raises(Conflict, match="still being created"):
        await store.retry_batch("batch_p", "api")
    with pytest.raises(Conflict, match="only a batch in progress can be cancelled"):
        await store.cancel_batch("batch_p", "api")
    refused = NewLine(3, "id-3", None, {"status": 400, "code": None, "message": "bad body"})
    await store.add_batch_lines("batch_p", "router-1", [refused, line_of(4)], KNOWN, "api")
    opened = await store.open_batch("batch_p", "router-1", [])
    assert (opened["status"], opened["creator"]) == ("in_progress", None) and opened["in_progress_at"]
    assert (opened["counts"]["queued"], opened["counts"]["refused"]) == (3, 1)
    assert await store.unfinished_batches() == []
    head = await store.claim("a")  # live: its lines run
    assert head is not None and head["prompt"] == "line 1"
    assert [b["id"] for b in await store.batches(open_only=True)] == ["batch_p"]


@covers("begin_batch", "drop_batch_piece")
async def test_a_create_that_never_finished_is_dropped_a_piece_at_a_time_with_its_jobs(store):
    """What a create left half-made (its router killed, or its create failed) goes whole: the
    lines, their jobs and their events, then the batch; only that creator's create is dropped."""
    await store.begin_batch(batch_of("batch_d"), 3, 3, "router-1")
    await store.add_batch_lines("batch_d", "router-1", [line_of(1), line_of(2), line_of(3)], KNOWN, "api")
    assert await store.drop_batch_piece("batch_d", "router-2") is None  # not its create
    assert len(await store.jobs(state="queued")) == 3
    assert await store.drop_batch_piece("batch_d", "router-1", 2) == 2
    assert [line["line"] for line in await store.batch_lines("batch_d")] == [3]
    assert await store.drop_batch_piece("batch_d", "router-1", 2) == 1
    assert await store.drop_batch_piece("batch_d", "router-1", 2) is None  # its last piece: the batch
    with pytest.raises(NotFound):
        await store.batch("batch_d")
    assert await store.jobs() == [] and await store.unfinished_batches() == []
    await submit(store, owner="alice")
    with pytest.raises(GpuqError) as exc:  # max_waiting counts the whole batch at its beginning
        await store.begin_batch(batch_of("batch_q"), 2, 2, "router-1", max_waiting=2)
    assert exc.value.status == 429
    with pytest.raises(NotFound):
        await store.batch("batch_q")  # nothing stored


@covers("finalize_batch")
async def test_two_routers_finalizing_one_batch_at_once_write_its_output_once(store, database):
    """Both routers see the batch's last line end (each router's finalizer, each poll): their
    finalizes are two writes on one database, and only the first writes the files."""
    await store.create_batch(batch_of("batch_2r"), [line_of(1), line_of(2)], KNOWN, "api")
    for node in ("a", "b"):
        claimed = await store.claim(node)
        assert claimed is not None
        await store.keep_batch_response(claimed["id"], '{"reply": 1}')
        await store.finish(claimed["id"], claimed["run_id"], "done", None, "text")
    other = Store(database, clock=Clock())  # the second router's store
    await other.open()
    try:
        ended = await asyncio.gather(*(finalize(s, "batch_2r") for s in (store, other, store, other)))
    finally:
        await other.close()
    [done] = [e for e in ended if e is not None]
    assert done["status"] == "completed" and done["output_file_id"] is not None
    files = await store.read("SELECT id FROM batch_file WHERE purpose = 'batch_output'")
    assert [f["id"] for f in files] == [done["output_file_id"]]
    assert (await store.batch("batch_2r"))["output_file_id"] == done["output_file_id"]


@covers("begin_file", "add_file_chunk", "end_file", "file_chunk", "drop_upload")
async def test_an_upload_is_stored_chunk_by_chunk_shown_only_once_whole_and_dropped_whole(store):
    """An upload's row is shown by no read until it ends; its chunks read back one by one, in
    order; one dropped (refused, cut) leaves nothing; a file deleted takes its chunks with it."""
    await store.begin_file("file-up", "batch", "up.jsonl", "alice")
    for seq, data in enumerate((b"first \x00", b"second\xff", b"third")):
        await store.add_file_chunk("file-up", seq, data)
    with pytest.raises(NotFound):
        await store.file("file-up")
    assert await store.files() == []
    row = await store.end_file("file-up", 20)
    assert (row["id"], row["bytes"], row["owner"]) == ("file-up", 20, "alice")
    assert [await store.file_chunk("file-up", seq) for seq in range(4)] == [
        b"first \x00",
        b"second\xff",
        b"third",
        None,
    ]
    assert await store.file_content("file-up") == b"first \x00second\xffthird"
    await store.begin_file("file-cut", "batch", "cut.jsonl", "alice")
    await store.add_file_chunk("file-cut", 0, b"half")
    await store.drop_upload("file-cut")
    await store.drop_upload("file-up")  # (a whole file is not an upload: it stays)
    assert await store.read("SELECT file_id FROM batch_file_chunk WHERE file_id = 'file-cut'") == []
    assert [f["id"] for f in await store.files()] == ["file-up"]
    await store.delete_file("file-up")
    assert await store.read("SELECT file_id FROM batch_file_chunk") == []
    # An upload its router never ended (stopped half-way) goes once it is older than its bound.
    await store.begin_file("file-left", "batch", "left.jsonl", "alice", 600.0)
    await store.add_file_chunk("file-left", 0, b"left behind")
    store.clock.advance(599)
    await store.begin_file("file-next", "batch", "next.jsonl", "alice", 600.0)
    assert len(await store.read("SELECT file_id FROM batch_file_chunk WHERE file_id = 'file-left'")) == 1
    store.clock.advance(2)
    await store.begin_file("file-later", "batch", "later.jsonl", "alice", 600.0)
    assert await store.read("SELECT file_id FROM batch_file_chunk WHERE file_id = 'file-left'") == []
    assert [r["id"] for r in await store.read("SELECT id FROM batch_file ORDER BY id")] == ["file-later", "file-next"]


@covers("add_file", "file_chunk")
async def test_a_file_kept_whole_is_kept_as_chunks_of_at_most_a_mebibyte(store):
    content = bytes(range(256)) * (5 * 4096 + 7)  # 5 MiB and a bit
    await store.add_file("file-big", "batch_output", "big.jsonl", content, None)
    chunks = await store.read(
        "SELECT seq, LENGTH(bytes) AS n FROM batch_file_chunk WHERE file_id = ? ORDER BY seq", ("file-big",)
    )
    assert [c["n"] for c in chunks] == [1 << 20] * 5 + [7 * 256]
    assert await store.file_content("file-big") == content


@covers("batch_results_page")
async def test_a_batchs_results_are_read_a_page_at_a_time_in_line_order(store):
    await store.create_batch(batch_of("batch_p"), [line_of(n) for n in range(1, 6)], KNOWN, "api")
    pages, after = [], 0
    while found := await store.batch_results_page("batch_p", after, 2):
        pages.append([r["line"] for r in found])
        after = found[-1]["line"]
    assert pages == [[1, 2], [3, 4], [5]]
    assert [r["custom_id"] for r in await store.batch_results_page("batch_p", 3, 10)] == ["id-4", "id-5"]


@covers("finalize_batch")
async def test_a_batch_whose_lines_changed_since_they_were_read_is_not_ended_with_that_output(store):
    """The output is rendered off the writer from the lines as read; a line retried and ended
    again meanwhile ends at another time, and the stale output is not written: the next look
    renders the lines as they are now."""
    await store.create_batch(batch_of("batch_s"), [line_of(1)], KNOWN, "api")
    claimed = await store.claim("a")
    assert claimed is not None
    await store.finish(claimed["id"], claimed["run_id"], "failed", "the node broke")
    stale = await store.batch_results("batch_s")
    await store.retry_batch("batch_s", "api")
    again = await store.claim("a")
    assert again is not None and again["id"] == claimed["id"]
    await store.keep_batch_response(again["id"], '{"reply": 2}')
    store.clock.advance(1)
    await store.finish(again["id"], again["run_id"], "done", None, "text")
    assert await store.finalize_batch("batch_s", *render_counts(stale), lines_seen(stale)) is None
    assert (await store.batch("batch_s"))["status"] == "in_progress"
    ended = await finalize(store, "batch_s")
    assert ended is not None and ended["status"] == "completed" and ended["error_file_id"] is None
    assert await store.file_content(ended["output_file_id"]) == b'id-1 {"reply": 2}\n'


@covers("keep_batch_response", "finalize_batch", "batch_results", "cancel_batch", "retry_batch")
async def test_a_batch_ends_once_its_lines_have_its_output_written_and_retries_its_failed_lines(store):
    await store.create_batch(batch_of("batch_1"), [line_of(1), line_of(2), line_of(3)], KNOWN, "api")
    assert await finalize(store, "batch_1") is None  # its lines wait
    ids = [g["job_id"] for g in await store.batch_lines("batch_1")]
    first = await store.claim("a")
    assert first is not None and first["id"] == ids[0]
    assert await store.keep_batch_response(ids[0], '{"reply": 1}') is True
    assert await store.keep_batch_response("no-such-job", "{}") is False
    await store.finish(ids[0], first["run_id"], "done", None, "text")
    second = await store.claim("b")
    assert second is not None and second["id"] == ids[1]
    batch, cancelled = await store.cancel_batch("batch_1", "api")
    assert batch["status"] == "cancelling" and cancelled == 1  # the waiting one; the running one runs on
    assert (await store.batch("batch_1"))["counts"]["cancelled"] == 1
    assert await finalize(store, "batch_1") is None  # one still runs
    await store.finish(ids[1], second["run_id"], "failed", "the node broke")
    ended = await finalize(store, "batch_1")
    assert ended is not None and ended["status"] == "cancelled" and ended["cancelled_at"] is not None
    assert await store.file_content(ended["output_file_id"]) == b'id-1 {"reply": 1}\n'
    assert await store.file_content(ended["error_file_id"]) == b"id-2 failed\nid-3 cancelled\n"
    assert [r["response"] for r in await store.batch_results("batch_1")] == ['{"reply": 1}', None, None]
    with pytest.raises(Conflict):
        await store.cancel_batch("batch_1", "api")
    with pytest.raises(NotFound):
        await store.retry_batch("batch_1", "api", only_owner="bob")
    batch, retried = await store.retry_batch("batch_1", "api", max_waiting={"alice": 5})
    assert retried == ids[1:] and batch["status"] == "in_progress" and batch["output_file_id"] is None
    assert batch["counts"]["queued"] == 2 and batch["counts"]["done"] == 1
    with pytest.raises(NotFound):
        await store.file(ended["output_file_id"])  # the old output went; the next end writes it anew
    with pytest.raises(Conflict, match="no failed or cancelled lines"):
        await store.retry_batch("batch_1", "api")


@covers("expire_batches")
async def test_a_batch_past_its_window_has_its_waiting_lines_expired_and_ends_expired(store):
    await store.create_batch(batch_of("batch_e"), [line_of(1), line_of(2), line_of(3)], KNOWN, "api")
    await store.create_batch(batch_of("batch_f", owner="bob"), [line_of(1, owner="bob")], KNOWN, "api")
    ids = [g["job_id"] for g in await store.batch_lines("batch_e")]
    first = await store.claim("a")
    assert first is not None and first["id"] == ids[0]
    assert await store.expire_batches("sweeper") == []  # not due yet
    clock = store.clock
    assert isinstance(clock, Clock)
    clock.advance(86400)
    expired = dict(await store.expire_batches("sweeper"))
    assert expired["batch_e"] == 2 and expired["batch_f"] == 1  # the waiting ones; the running one runs on
    counts = (await store.batch("batch_e"))["counts"]
    assert (counts["expired"], counts["cancelled"], counts["running"]) == (2, 0, 1)
    assert await store.expire_batches("sweeper") == []  # nothing waits any more
    assert await finalize(store, "batch_e") is None  # one still runs
    await store.finish(ids[0], first["run_id"], "done", None, "text")
    ended = await finalize(store, "batch_e")
    assert ended is not None and ended["status"] == "expired" and ended["finalizing_at"] is not None
    assert ended["completed_at"] is None and ended["counts"]["expired"] == 2
    assert await store.file_content(ended["error_file_id"]) == b"id-2 cancelled\nid-3 cancelled\n"
    # A retry gives it a new window from now: it does not expire again at once.
    batch, retried = await store.retry_batch("batch_e", "api", window_s=3600)
    assert retried == ids[1:] and batch["status"] == "in_progress" and batch["expires_at"] > ended["expires_at"]
    assert await store.expire_batches("sweeper") == []


@covers("delete_batch")
async def test_an_ended_batch_is_deleted_with_its_written_files_and_its_jobs_stay(store):
    await store.create_batch(batch_of("batch_d"), [line_of(1), line_of(2)], KNOWN, "api")
    with pytest.raises(Conflict, match="cancel it first"):
        await store.delete_batch("batch_d")
    ids = [g["job_id"] for g in await store.batch_lines("batch_d")]
    await store.cancel_batch("batch_d", "api")
    ended = await finalize(store, "batch_d")
    assert ended is not None and ended["error_file_id"] is not None
    with pytest.raises(NotFound):
        await store.delete_batch("batch_d", only_owner="bob")
    assert (await store.delete_batch("batch_d", only_owner="alice"))["id"] == "batch_d"
    with pytest.raises(NotFound):
        await store.batch("batch_d")
    with pytest.raises(NotFound):
        await store.file(ended["error_file_id"])
    assert await store.batch_lines("batch_d") == []
    assert [(await store.job(i))["state"] for i in ids] == ["cancelled", "cancelled"]


@covers("retention_batches_due", "whole_batches", "prune_batches", "delete_batches", "batch_of_file")
async def test_retention_prunes_an_ended_batchs_files_then_deletes_it_and_then_its_jobs(store):
    clock = store.clock
    assert isinstance(clock, Clock)
    await store.add_file("file-in", "batch", "in.jsonl", b'{"custom_id": "id-1"}\n', "alice")
    await store.create_batch(batch_of("batch_r"), [line_of(1), line_of(2)], KNOWN, "api")
    await store.create_batch(batch_of("batch_open"), [line_of(3)], KNOWN, "api")
    ids = [g["job_id"] for g in await store.batch_lines("batch_r")]
    for node in ("a", "b"):
        claimed = await store.claim(node)
        assert claimed is not None and claimed["id"] in ids
        await store.keep_batch_response(claimed["id"], '{"reply": "kept"}')
        await store.finish(claimed["id"], claimed["run_id"], "done", None, "text")
    await store.delete((await store.batch_lines("batch_open"))[0]["job_id"], "api")  # its line ended, it is open
    ended = await finalize(store, "batch_r")
    assert ended is not None and ended["output_file_id"] is not None
    cut = Cutoffs.at(clock.now, 30 * DAY, 90 * DAY, 365 * DAY, 30 * DAY)
    assert await store.retention_batches_due("prune", cut, 100) == []

    clock.advance(40 * DAY)
    cut = Cutoffs.at(clock.now, 30 * DAY, 90 * DAY, 365 * DAY, 30 * DAY)
    assert await store.retention_batches_due("prune", cut, 100) == ["batch_r"]  # the open one is never due
    sweeps = (await store.retention_plan(cut))["sweeps"]
    assert sweeps["prune"]["batches"] == 1 and sweeps["prune"]["files"] == 2 and sweeps["prune"]["bytes"] > 0
    assert sweeps["delete"] == {"batches": 0, "lines": 0}
    [whole] = await store.whole_batches(["batch_r"])
    assert [line["response"] for line in whole["lines"]] == ['{"reply": "kept"}'] * 2
    assert {f["id"] for f in whole["files"]} == {"file-in", ended["output_file_id"]}
    assert whole["metadata"] == {"k": "v"} and await store.whole_batches([]) == []
    pruned = await store.prune_batches(["batch_r", "batch_open"], cut)
    assert pruned.pop("held_ms") >= 0 and pruned == {"batches": 1, "files": 2}
    assert (await store.prune_batches(["batch_r"], cut))["batches"] == 0  # pruned once
    batch = await store.batch("batch_r")
    assert batch["pruned_at"] is not None and batch["counts"]["done"] == 2  # the record stays
    assert [r["response"] for r in await store.batch_results("batch_r")] == [None, None]
    for file_id in ("file-in", ended["output_file_id"]):
        with pytest.raises(NotFound):
            await store.file_content(file_id)
        assert await store.batch_of_file(file_id) == {"id": "batch_r", "pruned_at": batch["pruned_at"]}
    assert await store.batch_of_file("file-none") is None
    assert (
        await store.retention_due("delete", Cutoffs.at(clock.now + 400 * DAY, None, None, 365 * DAY, None), 100) == []
    )

    clock.advance(400 * DAY)
    cut = Cutoffs.at(clock.now, 30 * DAY, 90 * DAY, 365 * DAY, 30 * DAY)
    assert ids[0] not in await store.retention_due("delete", cut, 100)  # its batch goes first
    assert await store.retention_batches_due("delete", cut, 100) == ["batch_r"]
    sweeps = (await store.retention_plan(cut))["sweeps"]
    assert sweeps["delete"] == {"batches": 1, "lines": 2} and sweeps["prune"]["batches"] == 0
    deleted = await store.delete_batches(["batch_r", "batch_open"], cut)
    assert deleted.pop("held_ms") >= 0 and deleted == {"batches": 1, "lines": 2, "files": 0}
    with pytest.raises(NotFound):
        await store.batch("batch_r")
    assert set(ids) <= set(await store.retention_due("delete", cut, 100))  # now its jobs may go
    assert (await store.delete_ended(ids, cut))["jobs"] == 2


# -- the contract covers the whole store ------------------------------------------------------


def public_names() -> set[str]:
    """Store's public methods (its verbs declared with core.write too) and properties, its own
    and those of its bases (one per aggregate: gpuq/store/facade.py)."""
    return {
        name
        for cls in Store.__mro__
        if cls is not object
        for name, member in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, (property, Verb)))
    }


def test_every_public_name_of_the_store_has_its_contract():
    missing = public_names() - set(COVERED)
    assert not missing, (
        f"Store's {sorted(missing)} have no contract test: add one to tests/test_store_contract.py"
        " (on both engines, through the `store` fixture) and tag it with @covers"
    )
    gone = set(COVERED) - public_names()
    assert not gone, f"@covers names {sorted(gone)}, which Store no longer has"


@covers("model_use")
async def test_a_models_use_counts_the_jobs_whose_runs_ended_since(store):
    clock = store.clock
    old = await submit(store, "a")
    await store.finish(old, (await store.claim("a"))["run_id"], "done", None)
    clock.advance(100)
    since = clock()
    retried = await submit(store, "a")
    await store.finish(retried, (await store.claim("a"))["run_id"], "failed", "boom")
    done = await submit(store, "a")
    await store.finish(done, (await store.claim("a"))["run_id"], "done", None)
    await submit(store, "b")
    await store.claim("b")  # still running: not counted yet
    [use] = await store.model_use(since)
    assert (use["node"], use["model"], use["jobs"]) == ("a", "ma", 2)
    assert iso(since) < use["last_used"] <= iso(clock())  # the done run, the last to end
    assert await store.model_use(clock() + 1) == []


# -- usage over time (gpuq/store/usage.py) -----------------------------------------------------


async def ran(store: Store, node: str, owner: str, wait_s: float, run_s: float, tokens: tuple[int, int]) -> str:
    """A job of `owner`'s on `node` that waited `wait_s`, then ran `run_s` (its model loading 2 s)."""
    clock = store.clock
    assert isinstance(clock, Clock)
    job_id = await submit(store, node, "p", owner=owner, client="cli")
    clock.advance(wait_s)
    claimed = await store.claim(node)
    assert claimed is not None and claimed["id"] == job_id
    clock.advance(run_s)
    stats = {"prompt_eval_count": tokens[0], "eval_count": tokens[1], "load_duration": 2_000_000_000}
    await store.work_done(claimed["run_id"], "answer", stats)
    await store.finish(job_id, claimed["run_id"], "done", None)
    return job_id


def figures(row: dict[str, Any]) -> tuple[Any, ...]:
    waits = (row["wait_p50_s"], row["wait_p95_s"])
    rounded = tuple(None if w is None else round(w) for w in waits)
    return (
        row["key"],
        row["jobs"],
        round(row["busy_s"]),
        round(row["load_s"]),
        row["tokens_in"],
        row["tokens_out"],
        *rounded,
    )


@covers("usage")
async def test_usage_sums_runs_by_user_and_node_per_step_and_outlives_retentions_delete(store):
    clock = store.clock
    assert isinstance(clock, Clock)
    start = clock.now
    jobs = [await ran(store, "a", "alice", 10, 100, (5, 7)), await ran(store, "b", "bob", 40, 50, (1, 2))]
    clock.advance(3600 - (clock.now - start))  # the next hour
    jobs.append(await ran(store, "a", "alice", 30, 200, (10, 20)))
    jobs.append(await ran(store, "a", "alice", 50, 10, (1, 1)))
    until = clock.now + 1

    by_user = await store.usage("user", start, until, 3600)
    assert [figures(r) for r in by_user] == [("alice", 3, 310, 6, 16, 28, 30, 50), ("bob", 1, 50, 2, 1, 2, 40, 40)]
    alice = by_user[0]["series"]
    assert [(p["step"], p["at"], p["jobs"], round(p["busy_s"])) for p in alice] == [
        (0, iso(start), 1, 100),
        (1, iso(start + 3600), 2, 210),
    ]
    assert [(round(p["wait_p50_s"]), round(p["wait_p95_s"])) for p in alice] == [(10, 10), (30, 50)]
    assert [figures(r)[:3] for r in await store.usage("node", start, until, 3600)] == [("a", 3, 310), ("b", 1, 50)]
    assert [figures(r) for r in await store.usage("user", start, until, 3600, owner="bob")] == [
        ("bob", 1, 50, 2, 1, 2, 40, 40)
    ]
    assert await store.usage("user", start, until, 3600, owner="") == []  # a nameless member: no one's
    assert await store.usage("model", until, until + 3600, 3600) == []  # nothing ran then

    clock.advance(400 * DAY)  # retention deletes every job: their usage stays as it was
    cut = Cutoffs.at(clock.now, 30 * DAY, 90 * DAY, 365 * DAY, 30 * DAY)
    assert (await store.delete_ended(jobs, cut))["jobs"] == 4
    assert await store.usage("user", start, until, 3600) == by_user
