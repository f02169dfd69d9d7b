"""Private prompts ([router] private, Slurm's PrivateData=jobs) against the real daemon: two
members and an admin. Every route either door serves is in ROUTES, built against the apps'
own routers (a route added without a line here fails the first test), and each is asked by
alice (a member) about bob's jobs: a placeholder (where, when, whose, how far; no text), a 403
naming the owner, or an answer that holds no job's text; bob and the admin read bob's jobs whole.
The page's live events carry bob's tokens to alice without their text."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from conftest import eventually, free_port, node_table
from test_lanes import TOKENS, bearer, with_users

from gpuq.api.app import create_app
from gpuq.api.state import BATCHES, BUS, DISPATCHER, STORE
from gpuq.batches import front_door_routes
from gpuq.config import NodeConfig, Settings
from gpuq.front.listener import create_front_app
from gpuq.front.relay import Relay

MODEL = "qwen3-coder:30b"
SECRET = "zebra"  # in every prompt of bob's, and in none of alice's


def served_routes(app) -> set[tuple[str, str]]:
    """(method, path) of every route an app serves; a GET's automatic HEAD goes with its GET."""
    found = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("formatter") or info.get("path") or info.get("prefix")
        if route.method != "HEAD":
            found.add((route.method, path))
    return found


def apps_routes(tmp_path: Path) -> tuple[set, set]:
    settings = Settings(
        database=tmp_path / "routes.db", nodes=(NodeConfig("n1", "http://127.0.0.1:9", 1, ("task",), MODEL),)
    )
    app = create_app(settings)
    front = create_front_app(settings, app[STORE], app[DISPATCHER], app[BUS], Relay(), front_door_routes(app[BATCHES]))
    return served_routes(app), served_routes(front)


@pytest.fixture
async def private_lab(fakes, daemon_factory):
    """node-1 (task) and node-2 (critique); users root (admin), alice and bob (members), the
    router private, the front door on. bob's: one done (in history, with its output), one
    running (streaming a token every 50 ms), one waiting; alice's: one waiting behind it."""
    f1 = await fakes(MODEL, tokens=30)
    f2 = await fakes(MODEL)
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", f1, 1, ["task"], MODEL), node_table("node-2", f2, 2, ["critique"], MODEL)],
        start=False,
        private=True,
        stall_timeout="120s",
        ollama_listen=f"127.0.0.1:{port}",
    )
    await with_users(
        daemon,
        [
            {"name": "admin", "token": TOKENS["admin"], "role": "admin"},
            {"name": "alice", "token": TOKENS["alice"], "role": "member"},
            {"name": "bob", "token": TOKENS["bob"], "role": "member"},
        ],
    )
    daemon.front = f"http://127.0.0.1:{port}"
    ids = {"done": await submit_as(daemon, "bob", f"bob's finished {SECRET} question")}
    await daemon.wait_state(ids["done"], "done")
    f1.script.token_delay_s, f1.script.tokens = 0.05, 100_000
    ids["running"] = await submit_as(daemon, "bob", f"bob's running {SECRET} sweep")
    await daemon.wait_state(ids["running"], "running")
    ids["waiting"] = await submit_as(daemon, "bob", f"bob's waiting {SECRET} step")
    ids["alices"] = await submit_as(daemon, "alice", "alice's own question")
    daemon.ids = ids
    daemon.output = (await as_user(daemon, "admin", "GET", f"/api/jobs/{ids['done']}"))[1]["output"]
    assert len(daemon.output) > 60  # long enough that a piece of it found elsewhere is no chance
    return daemon


async def submit_as(daemon, user: str, prompt: str, **extra) -> str:
    status, body = await daemon.request(
        "POST", "/api/jobs", {"kind": "task", "prompt": prompt, "node": "node-1", **extra}, headers=bearer(user)
    )
    assert status == 201, body
    return body["jobs"][0]["id"]


async def as_user(daemon, user: str, method: str, path: str, body=None) -> tuple[int, object]:
    return await daemon.request(method, path, body, headers=bearer(user))


def text_of(body) -> str:
    return body if isinstance(body, str) else json.dumps(body)


def holds_nothing_of_bobs(daemon, body) -> None:
    text = text_of(body)
    assert SECRET not in text, text[:2000]
    assert daemon.output[:60] not in text, text[:2000]


def is_placeholder(job: dict, owner: str = "bob") -> None:
    assert job.get("private") is True and job["owner"] == owner, job
    for key in ("prompt_excerpt", "prompt", "output", "thinking", "error"):
        assert job.get(key) is None, (key, job)
    for key in ("findings", "request", "runs", "events", "children", "think", "options"):
        assert key not in job, (key, job)


# -- the routes, each with what alice (a member) meets there about bob's jobs --------------------

Check = Callable[[object], Awaitable[None]]


async def job_detail(d) -> None:
    ids = d.ids
    status, job = await as_user(d, "alice", "GET", f"/api/jobs/{ids['running']}")
    assert status == 200, job
    is_placeholder(job)
    assert (job["state"], job["node"], job["kind"], job["lane"]) == ("running", "node-1", "task", "batch")
    assert job["started_at"] and job["tokens_so_far"] >= 0 and job["prompt_bytes"] > 0
    status, job = await as_user(d, "alice", "GET", f"/api/jobs/{ids['waiting']}")
    is_placeholder(job)
    assert job["queue_position"] == 1 and job["state"] == "queued"
    status, job = await as_user(d, "alice", "GET", f"/api/jobs/{ids['done']}")
    is_placeholder(job)
    assert job["state"] == "done" and job["eval_count"] == 30 and job["finished_at"]
    holds_nothing_of_bobs(d, job)
    status, own = await as_user(d, "alice", "GET", f"/api/jobs/{ids['alices']}")
    assert own["prompt"] == "alice's own question" and "private" not in own
    for user in ("bob", "admin"):  # the owner and an admin: whole
        status, job = await as_user(d, user, "GET", f"/api/jobs/{ids['done']}")
        assert job["prompt"] == f"bob's finished {SECRET} question" and job["output"] == d.output, user
        assert job["events"] and job["runs"] and "private" not in job


async def job_stream(d) -> None:
    for job_id in (d.ids["running"], d.ids["done"]):
        async with d.session.get(f"{d.url}/api/jobs/{job_id}/stream", headers=bearer("alice")) as resp:
            assert resp.status == 403, (resp.status, await asyncio.wait_for(resp.content.readline(), 10))
            body = await resp.json()
        message = body["error"]["message"]
        assert f"job {job_id} belongs to bob" in message and "private" in message and "you are alice" in message
    for user in ("bob", "admin"):  # its first line: the output so far
        headers = bearer(user)
        async with d.session.get(f"{d.url}/api/jobs/{d.ids['running']}/stream", headers=headers) as resp:
            assert resp.status == 200
            first = json.loads(await asyncio.wait_for(resp.content.readline(), 10))
            assert first["catch_up"] is True and first["text"], first


async def job_list(d) -> None:
    status, body = await as_user(d, "alice", "GET", "/api/jobs?limit=50")
    assert status == 200, body
    jobs = {j["id"]: j for j in body["jobs"]}
    for key in ("done", "running", "waiting"):
        is_placeholder(jobs[d.ids[key]])
    assert jobs[d.ids["alices"]]["prompt_excerpt"] == "alice's own question"
    holds_nothing_of_bobs(d, body)
    status, body = await as_user(d, "bob", "GET", "/api/jobs?limit=50")
    assert SECRET in text_of(body) and "private" in {k for j in body["jobs"] for k in j}  # alice's, to him


async def history(d) -> None:
    status, body = await as_user(d, "alice", "GET", "/api/history")
    assert status == 200, body
    [done] = [j for j in body["jobs"] if j["id"] == d.ids["done"]]
    is_placeholder(done)
    holds_nothing_of_bobs(d, body)
    # A text search reads her own prompts and errors only: no job of bob's found by its words...
    status, body = await as_user(d, "alice", "GET", f"/api/history?q={SECRET}")
    assert (status, body["total"], body["jobs"]) == (200, 0, []), body
    # ...but by its id, as every listing shows ids.
    status, body = await as_user(d, "alice", "GET", f"/api/history?q={d.ids['done']}")
    assert body["total"] == 1 and body["jobs"][0]["private"] is True
    for user in ("bob", "admin"):
        status, body = await as_user(d, user, "GET", f"/api/history?q={SECRET}")
        assert d.ids["done"] in [j["id"] for j in body["jobs"] if j["prompt_excerpt"].startswith("bob's")], user
    # bob's batch line that ended: a placeholder with no batch (its name, its custom id) to alice...
    line = await ended_line(d)
    status, body = await as_user(d, "alice", "GET", "/api/history")
    [seen] = [j for j in body["jobs"] if j["id"] == line]
    is_placeholder(seen)
    assert "batch" not in seen, seen
    holds_nothing_of_bobs(d, body)
    d.auth = bearer("alice")  # ...and in `gpuq history --json`, which prints the API's jobs
    try:
        res = await d.cli("history", "--json", "--limit", "100")
    finally:
        d.auth = {}
    assert res.code == 0 and line in res.out, res
    holds_nothing_of_bobs(d, res.out)
    for user in ("bob", "admin"):  # whole to bob and the admin
        status, body = await as_user(d, user, "GET", "/api/history")
        [own] = [j for j in body["jobs"] if j["id"] == line]
        assert (own["batch"]["name"], own["batch"]["custom_id"]) == (f"bob-{SECRET}-ended", f"{SECRET}-e1"), user


async def ended_line(d) -> str:
    """The job of bob's cancelled batch's line (in history)."""
    status, body = await as_user(d, "bob", "GET", f"/api/batches/{await bobs_ended_batch(d)}")
    [line] = body["batch"]["jobs"]
    assert line["state"] == "cancelled", line
    return line["job_id"]


async def queue(d) -> None:
    status, body = await as_user(d, "alice", "GET", "/api/queue")
    assert status == 200, body
    [node] = [n for n in body["nodes"] if n["name"] == "node-1"]
    is_placeholder(node["running"])
    assert node["running"]["id"] == d.ids["running"] and node["running"]["tokens_so_far"] >= 0
    queued = {j["id"]: j for j in node["queued"]}
    is_placeholder(queued[d.ids["waiting"]])
    assert queued[d.ids["alices"]]["prompt_excerpt"] == "alice's own question"
    lines = [j for j in node["queued"] if j["owner"] == "bob" and j["id"] != d.ids["waiting"]]
    assert len(lines) == 3, node["queued"]  # bob's batches' lines (gpuq batch, OpenAI's, Anthropic's)
    for j in lines:
        is_placeholder(j)
        assert "batch" not in j, j
    holds_nothing_of_bobs(d, body)
    status, body = await as_user(d, "alice", "GET", "/api/queue?node=node-1&offset=1&limit=5")
    assert d.ids["waiting"] not in [j["id"] for j in body["nodes"][0]["queued"]]
    holds_nothing_of_bobs(d, body)
    status, body = await as_user(d, "bob", "GET", "/api/queue")
    [node] = [n for n in body["nodes"] if n["name"] == "node-1"]
    assert {f"{SECRET}-q1", f"{SECRET}-o1"} <= {j["batch"]["custom_id"] for j in node["queued"] if "batch" in j}
    status, body = await as_user(d, "admin", "GET", "/api/queue")
    assert SECRET in text_of(body)


async def events(d) -> None:
    """The page's live events: bob's running job's tokens reach alice as counts, no text."""
    assert await token_events(d, "alice", 5) == [""] * 5
    for user in ("bob", "admin"):
        pieces = await token_events(d, user, 5)
        assert all(pieces), (user, pieces)


async def token_events(d, user: str, n: int) -> list[str]:
    """The text of the first `n` token events of bob's running job that `user`'s event stream sends."""
    pieces: list[str] = []
    timeout = aiohttp.ClientTimeout(total=20)
    async with d.session.get(f"{d.url}/api/events", headers=bearer(user), timeout=timeout) as resp:
        assert resp.status == 200
        topic = None
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                topic = line.removeprefix("event: ")
            elif line.startswith("data: ") and topic == "tokens":
                data = json.loads(line.removeprefix("data: "))
                if data["id"] == d.ids["running"]:
                    pieces.append(data.get("text", data.get("thinking")))
                    if len(pieces) == n:
                        return pieces
    raise AssertionError(f"{user}'s event stream ended after {pieces}")


async def submit(d) -> None:
    """A critique's prompt is its parent's prompt and output: of bob's job, refused to alice."""
    status, body = await as_user(d, "alice", "POST", "/api/jobs", {"kind": "critique", "parent": d.ids["done"]})
    assert status == 403, body
    assert f"job {d.ids['done']} belongs to bob" in body["error"]["message"], body
    holds_nothing_of_bobs(d, body)
    status, body = await as_user(d, "bob", "POST", "/api/jobs", {"kind": "critique", "parent": d.ids["done"]})
    assert status == 201 and body["jobs"][0]["owner"] == "bob", body  # his own: yes


def refused_on_bobs(action: str, method: str, body=None) -> Check:
    """Queue control: a member acts on their own jobs only (403 naming the owner), as before."""

    async def check(d) -> None:
        status, answer = await as_user(d, "alice", method, f"/api/jobs/{d.ids['waiting']}{action}", body)
        assert status == 403 and "belongs to bob" in answer["error"]["message"], answer
        holds_nothing_of_bobs(d, answer)

    return check


BATCH_NAME = f"bob-{SECRET}-sweep"  # bob's batches' names, metadata and custom ids all hold SECRET:
# every route's check (holds_nothing_of_bobs) looks for them too.


def chat_line(custom_id: str, text: str) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": text}]},
    }


async def bobs_batch(d) -> str:
    """A batch of bob's (made once per lab): one line asking about his secret."""
    if not hasattr(d, "batch"):
        line = chat_line(f"{SECRET}-q1", f"bob's batched {SECRET} line")
        status, body = await as_user(d, "bob", "POST", "/api/batches", {"input": json.dumps(line), "name": BATCH_NAME})
        assert status == 201, body
        d.batch = body["batch"]["id"]
    return d.batch


async def bobs_ended_batch(d) -> str:
    """A batch of bob's that he cancelled at once (made once per lab): its line is in history."""
    if not hasattr(d, "ended_batch"):
        line = chat_line(f"{SECRET}-e1", "bob's cancelled line")
        status, body = await as_user(
            d, "bob", "POST", "/api/batches", {"input": json.dumps(line), "name": f"bob-{SECRET}-ended"}
        )
        assert status == 201, body
        d.ended_batch = body["batch"]["id"]
        status, body = await as_user(d, "bob", "POST", f"/api/batches/{d.ended_batch}/cancel", {})
        assert status == 200, body
    return d.ended_batch


async def batch_list(d) -> None:
    """A member's list of batches is their own: bob's is not in alice's."""
    batch = await bobs_batch(d)
    status, body = await as_user(d, "alice", "GET", "/api/batches")
    assert status == 200 and batch not in text_of(body), body
    holds_nothing_of_bobs(d, body)
    # The batches in progress (the queue page's): bob's as placeholders, his progress only.
    status, body = await as_user(d, "alice", "GET", "/api/batches?open=1")
    bobs = [b for b in body["batches"] if b["owner"] == "bob"]
    assert status == 200 and len(bobs) == 3 and all(b["private"] for b in bobs), body
    assert all(b[key] is None for b in bobs for key in ("name", "metadata", "input_file_id")), bobs
    holds_nothing_of_bobs(d, body)
    for user in ("bob", "admin"):
        status, body = await as_user(d, user, "GET", "/api/batches?open=1")
        assert {f"{SECRET}-project", BATCH_NAME} <= {
            (b["metadata"] or {}).get("project") or b["name"] for b in body["batches"]
        }, (user, body)


def bobs_batch_unseen(method: str, action: str, body=None) -> Check:
    """Another member's batch is not found for alice (as OpenAI answers for another's), whatever she asks."""

    async def check(d) -> None:
        batch = await bobs_batch(d)
        status, answer = await as_user(d, "alice", method, f"/api/batches/{batch}{action}", body)
        assert status == 404, (status, answer)
        holds_nothing_of_bobs(d, answer)

    return check


async def batch_submit(d) -> None:
    """A member's batch is her own: alice's lines are hers, and bob does not see them."""
    line = {
        "custom_id": "a1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": []},
    }
    status, body = await as_user(d, "alice", "POST", "/api/batches", {"input": json.dumps(line)})
    assert status in (200, 201), body
    status, other = await as_user(d, "bob", "GET", f"/api/batches/{body['batch']['id']}")
    assert status == 404, other


async def on_front(d, user: str, method: str, path: str, body=None) -> tuple[int, str]:
    async with d.session.request(method, d.front + path, json=body, headers=bearer(user)) as resp:
        return resp.status, await resp.text()


async def bobs_front_batches(d) -> dict[str, str]:
    """bob's OpenAI batch from an uploaded file (metadata, custom id and file name holding his
    secret) and an Anthropic message batch of his, made once."""
    if not hasattr(d, "front_batches"):
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field(
            "file", json.dumps(chat_line(f"{SECRET}-o1", f"bob's {SECRET}")), filename=f"{SECRET}-input.jsonl"
        )
        async with d.session.post(d.front + "/v1/files", data=form, headers=bearer("bob")) as resp:
            assert resp.status == 200, await resp.text()
            file_id = (await resp.json())["id"]
        asked = {
            "input_file_id": file_id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"project": f"{SECRET}-project"},
        }
        status, text = await on_front(d, "bob", "POST", "/v1/batches", asked)
        assert status == 200, text
        params = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": f"bob's {SECRET}"}]}
        status, made = await on_front(
            d, "bob", "POST", "/v1/messages/batches", {"requests": [{"custom_id": f"{SECRET}-m1", "params": params}]}
        )
        assert status == 200, made
        d.front_batches = {"batch": json.loads(text)["id"], "file": file_id, "message": json.loads(made)["id"]}
    return d.front_batches


def front_list_without_bobs(path: str, key: str) -> Check:
    """A member's list (files, batches) is her own: none of bob's ids, none of his text."""

    async def check(d) -> None:
        bobs = (await bobs_front_batches(d))[key]
        status, text = await on_front(d, "alice", "GET", path)
        assert status == 200 and bobs not in text, (status, text[:500])
        holds_nothing_of_bobs(d, text)

    return check


def front_bobs_unseen(method: str, template: str, key: str) -> Check:
    """bob's file or batch, asked by alice at the front door: 404, as the hosted APIs answer."""

    async def check(d) -> None:
        path = template.format(id=(await bobs_front_batches(d))[key])
        status, text = await on_front(d, "alice", method, path, {} if method == "POST" else None)
        assert status == 404, (path, status, text[:500])
        holds_nothing_of_bobs(d, text)

    return check


async def clear(d) -> None:
    status, body = await as_user(d, "alice", "POST", "/api/nodes/node-1/clear", {})
    assert status == 403 and "node-1 also has jobs of bob" in body["error"]["message"], body


def admins_only(method: str, path: str) -> Check:
    async def check(d) -> None:
        status, body = await as_user(d, "alice", method, path, {})
        assert status == 403 and "for an admin" in body["error"]["message"], body

    return check


def no_job_text(path: str, ok=(200,), door: str = "api") -> Check:
    """A route that answers no job's text: alice's answer holds none of bob's."""

    async def check(d) -> None:
        base = d.url if door == "api" else d.front
        async with d.session.get(base + path, headers=bearer("alice")) as resp:
            text = await resp.text()
            assert resp.status in ok, (path, resp.status, text[:500])
        holds_nothing_of_bobs(d, text)

    return check


async def metrics(d) -> None:
    """Owner labels, never a prompt: the admin's scrape holds bob's name and none of his text."""
    for user in ("alice", "admin"):
        status, text = await as_user(d, user, "GET", "/metrics")
        assert status == 200 and 'owner="bob"' in text
        holds_nothing_of_bobs(d, text)


async def a_call_of_her_own(d) -> None:
    """The front door's job-making routes (and /api/pull, which makes none) answer the caller's
    own call only: none takes a job's id (no stored responses, no previous_response_id; the
    first test fails a front-door route with an id in its path), so no other user's job is
    there to ask for. The job a call makes is its caller's, shown to others as any job is."""


async def model_card(d) -> None:
    async with d.session.post(d.front + "/api/show", json={"model": MODEL}, headers=bearer("alice")) as resp:
        assert resp.status == 200, resp.status
        holds_nothing_of_bobs(d, await resp.text())


async def usage(d) -> None:
    """A member's usage is her own runs: by person, no row of bob's; by node, none of his runs
    counted; no text of his anywhere. The admin's counts his."""
    mine = await as_user(d, "alice", "GET", "/api/usage?by=user&since=7d")
    everyone = await as_user(d, "admin", "GET", "/api/usage?by=user&since=7d")
    assert mine[0] == everyone[0] == 200, (mine, everyone)
    assert mine[1]["scope"] == "own" and {r["key"] for r in mine[1]["rows"]} <= {"alice"}, mine
    assert "bob" in {r["key"] for r in everyone[1]["rows"]}, everyone
    status, by_node = await as_user(d, "alice", "GET", "/api/usage?by=node&since=7d")
    assert status == 200 and sum(r["jobs"] for r in by_node["rows"]) == sum(r["jobs"] for r in mine[1]["rows"])
    holds_nothing_of_bobs(d, mine[1])
    holds_nothing_of_bobs(d, by_node)


API_ROUTES: dict[tuple[str, str], Check] = {
    ("GET", "/api/jobs/{id}"): job_detail,
    ("GET", "/api/jobs/{id}/stream"): job_stream,
    ("GET", "/api/jobs"): job_list,
    ("GET", "/api/history"): history,
    ("GET", "/api/queue"): queue,
    ("GET", "/api/events"): events,
    ("POST", "/api/jobs"): submit,
    ("DELETE", "/api/jobs/{id}"): refused_on_bobs("", "DELETE"),
    ("POST", "/api/jobs/{id}/move"): refused_on_bobs("/move", "POST", {"position": 1}),
    ("POST", "/api/jobs/{id}/preempt"): refused_on_bobs("/preempt", "POST", {}),
    ("POST", "/api/jobs/{id}/retry"): refused_on_bobs("/retry", "POST", {}),
    ("POST", "/api/nodes/{name}/clear"): clear,
    ("POST", "/api/reload"): admins_only("POST", "/api/reload"),
    ("POST", "/api/backup"): admins_only("POST", "/api/backup"),
    ("POST", "/api/prune"): admins_only("POST", "/api/prune"),
    ("GET", "/api/batches"): batch_list,
    ("POST", "/api/batches"): batch_submit,
    ("GET", "/api/batches/{id}"): bobs_batch_unseen("GET", ""),
    ("POST", "/api/batches/{id}/cancel"): bobs_batch_unseen("POST", "/cancel", {}),
    ("POST", "/api/batches/{id}/retry"): bobs_batch_unseen("POST", "/retry", {"failed": True}),
    ("GET", "/api/batches/{id}/results"): bobs_batch_unseen("GET", "/results"),
    ("GET", "/api/storage"): no_job_text("/api/storage"),
    ("GET", "/metrics"): metrics,
    ("GET", "/health"): no_job_text("/health", ok=(200, 503)),
    ("GET", "/api/nodes"): no_job_text("/api/nodes"),
    ("GET", "/api/models"): no_job_text("/api/models"),
    ("GET", "/api/usage"): usage,
    ("GET", "/api/stale"): no_job_text("/api/stale"),
    ("GET", "/api/activity"): no_job_text("/api/activity"),
    ("GET", "/api/alerts"): no_job_text("/api/alerts"),
    ("GET", "/api/whoami"): no_job_text("/api/whoami"),
    ("GET", "/"): no_job_text("/"),  # the pages are files; their data comes from the routes above
    ("GET", "/jobs/{id}"): no_job_text("/jobs/1760883402-9f3a7c21"),
    ("GET", "/history"): no_job_text("/history"),
    ("GET", "/usage"): no_job_text("/usage"),
    ("GET", "/static"): no_job_text("/static/job.js"),
}

FRONT_ROUTES: dict[tuple[str, str], Check] = {
    ("GET", "/"): no_job_text("/", door="front"),
    ("GET", "/api/version"): no_job_text("/api/version", door="front"),
    ("GET", "/api/status"): no_job_text("/api/status", door="front"),
    ("GET", "/v1/files"): front_list_without_bobs("/v1/files", "file"),
    ("GET", "/v1/files/{id}"): front_bobs_unseen("GET", "/v1/files/{id}", "file"),
    ("GET", "/v1/files/{id}/content"): front_bobs_unseen("GET", "/v1/files/{id}/content", "file"),
    ("DELETE", "/v1/files/{id}"): front_bobs_unseen("DELETE", "/v1/files/{id}", "file"),
    ("GET", "/v1/batches"): front_list_without_bobs("/v1/batches", "batch"),
    ("GET", "/v1/batches/{id}"): front_bobs_unseen("GET", "/v1/batches/{id}", "batch"),
    ("POST", "/v1/batches/{id}/cancel"): front_bobs_unseen("POST", "/v1/batches/{id}/cancel", "batch"),
    ("GET", "/v1/messages/batches"): front_list_without_bobs("/v1/messages/batches", "message"),
    ("GET", "/v1/messages/batches/{id}"): front_bobs_unseen("GET", "/v1/messages/batches/{id}", "message"),
    ("POST", "/v1/messages/batches/{id}/cancel"): front_bobs_unseen(
        "POST", "/v1/messages/batches/{id}/cancel", "message"
    ),
    ("GET", "/v1/messages/batches/{id}/results"): front_bobs_unseen(
        "GET", "/v1/messages/batches/{id}/results", "message"
    ),
    ("DELETE", "/v1/messages/batches/{id}"): front_bobs_unseen("DELETE", "/v1/messages/batches/{id}", "message"),
    ("GET", "/api/tags"): no_job_text("/api/tags", door="front"),
    ("GET", "/api/ps"): no_job_text("/api/ps", door="front"),
    ("GET", "/v1/models"): no_job_text("/v1/models", door="front"),
    ("GET", "/v1/models/{model}"): no_job_text(f"/v1/models/{MODEL}", door="front"),
    ("POST", "/api/show"): model_card,  # a model's card from a node
    ("POST", "/api/pull"): a_call_of_her_own,  # a model pulled onto the nodes
    ("*", "/api/push"): no_job_text("/api/push", ok=(404, 405, 501), door="front"),  # not served
}


def front_route(method: str, path: str) -> Check | None:
    """Every job-making route (endpoints.py) is the caller's own call; the not-served routes answer none."""
    if method == "POST" and (path.startswith("/api/") or path.startswith("/v1/")):
        return FRONT_ROUTES.get((method, path), a_call_of_her_own)
    if method == "*":
        return FRONT_ROUTES[("*", "/api/push")]
    return FRONT_ROUTES.get((method, path))


def test_every_route_of_both_doors_has_its_privacy_check(tmp_path):
    api, front = apps_routes(tmp_path)
    assert api == set(API_ROUTES), (
        f"routes without a privacy check: {api - set(API_ROUTES)}; gone: {set(API_ROUTES) - api}"
    )
    unchecked = {r for r in front if front_route(*r) is None}
    assert not unchecked, f"front-door routes without a privacy check: {unchecked}"
    # A front-door route that names something other than a model (or a not-served route's rest)
    # could name a job: it needs its own check in FRONT_ROUTES (the batches' and files' have theirs).
    by_id = {r for r in front if "{" in r[1] and not r[1].endswith(("{model}", "{rest}")) and r not in FRONT_ROUTES}
    assert not by_id, f"front-door routes that may read a job by id, without their own check: {by_id}"


async def test_a_member_sees_others_jobs_as_placeholders_on_every_route(private_lab):
    # bob's batches first (one ended, three in progress): their names, metadata and custom ids
    # hold his secret, so every route's check looks for them too.
    await bobs_ended_batch(private_lab)
    await bobs_batch(private_lab)
    await bobs_front_batches(private_lab)
    failures = []
    for (method, path), check in API_ROUTES.items():
        try:
            await check(private_lab)
        except Exception as exc:  # every route's failure, not the first's only
            failures.append(f"{method} {path}: {exc!r}"[:600])
    for (method, path), check in FRONT_ROUTES.items():
        try:
            await check(private_lab)
        except Exception as exc:
            failures.append(f"front door {method} {path}: {exc!r}"[:600])
    assert not failures, "\n".join(failures)


async def test_private_is_live_and_off_by_default(private_lab):
    """A reload turns it off (alice then reads bob's prompt) and on again, with no restart."""
    d = private_lab
    path = f"/api/jobs/{d.ids['waiting']}"
    assert (await as_user(d, "alice", "GET", path))[1]["private"] is True
    text = d.config.read_text()
    d.config.write_text(text.replace("private = true", "private = false"))
    status, body = await as_user(d, "admin", "POST", "/api/reload", {})
    assert status == 200 and "private: True -> False" in body["router"], body
    assert (await as_user(d, "alice", "GET", path))[1]["prompt"] == f"bob's waiting {SECRET} step"
    d.config.write_text(text)
    status, body = await as_user(d, "admin", "POST", "/api/reload", {})
    assert "private: False -> True" in body["router"], body

    async def private_again():
        return (await as_user(d, "alice", "GET", path))[1].get("private") is True

    await eventually(private_again, 5, what="the placeholder again")


async def test_the_cli_shows_a_placeholder_for_anothers_job(private_lab):
    d = private_lab
    d.auth = bearer("alice")
    shown = await d.cli("show", d.ids["done"])
    assert shown.code == 0, shown
    assert "owner: bob" in shown.out and "private: bob's job: its prompt, output, runs and events" in shown.out
    holds_nothing_of_bobs(d, shown.out)
    listed = await d.cli("queue")
    assert listed.code == 0 and "private: bob's job" in listed.out and "alice's own question" in listed.out, listed
    holds_nothing_of_bobs(d, listed.out)
    waited = await d.cli("wait", d.ids["running"])
    assert waited.code != 0 and "belongs to bob" in waited.err, waited


async def test_anothers_batch_shows_its_progress_never_its_name_or_custom_ids(private_lab):
    """On a private router the queue page's batches in progress show bob's to alice as a
    placeholder (its status, counts and owner; no name, metadata or files), and his ended line
    in her history carries no batch name or custom id; bob and the admin read them whole."""
    d = private_lab
    batch = await bobs_batch(d)
    status, body = await as_user(d, "alice", "GET", "/api/batches?open=1")
    [shown] = [b for b in body["batches"] if b["id"] == batch]
    assert (shown["private"], shown["owner"], shown["total"], shown["status"]) == (True, "bob", 1, "in_progress")
    assert all(shown[key] is None for key in ("name", "metadata", "input_file_id", "errors")), shown
    assert BATCH_NAME not in text_of(body)
    for user in ("bob", "admin"):
        status, body = await as_user(d, user, "GET", "/api/batches?open=1")
        assert [b["name"] for b in body["batches"] if b["id"] == batch] == [BATCH_NAME], user
    status, body = await as_user(d, "bob", "POST", f"/api/batches/{batch}/cancel", {})
    assert status == 200 and body["batch"]["counts"]["cancelled"] == 1, body
    status, body = await as_user(d, "bob", "GET", f"/api/batches/{batch}")
    [line] = body["batch"]["jobs"]
    status, body = await as_user(d, "alice", "GET", "/api/history")
    [seen] = [j for j in body["jobs"] if j["id"] == line["job_id"]]
    is_placeholder(seen)
    assert "batch" not in seen and f"{SECRET}-q1" not in text_of(body), seen
    status, body = await as_user(d, "bob", "GET", "/api/history")
    [own] = [j for j in body["jobs"] if j["id"] == line["job_id"]]
    assert own["batch"]["custom_id"] == f"{SECRET}-q1" and own["batch"]["id"] == batch, own


async def test_on_a_router_not_private_a_member_reads_every_batch_and_changes_her_own(fakes, daemon_factory):
    """Batches and their files follow the jobs' rule: with no [router] private, alice reads bob's
    batch, its name and his input file on both doors, as she reads his jobs; cancelling,
    retrying or deleting what is his is 403 naming him, and bob cancels it himself."""
    f1 = await fakes(MODEL)
    port = free_port()
    d = await daemon_factory(
        [node_table("node-1", f1, 1, ["task"], MODEL)], start=False, ollama_listen=f"127.0.0.1:{port}"
    )
    await with_users(
        d,
        [
            {"name": "admin", "token": TOKENS["admin"], "role": "admin"},
            {"name": "alice", "token": TOKENS["alice"], "role": "member"},
            {"name": "bob", "token": TOKENS["bob"], "role": "member"},
        ],
    )
    d.front = f"http://127.0.0.1:{port}"
    f1.script.token_delay_s, f1.script.tokens = 0.05, 100_000  # bob's line runs until he cancels it
    batch = await bobs_batch(d)
    status, seen = await as_user(d, "alice", "GET", f"/api/batches/{batch}")
    assert status == 200 and (seen["batch"]["name"], seen["batch"]["owner"]) == (BATCH_NAME, "bob"), seen
    assert seen["batch"]["jobs"][0]["custom_id"] == f"{SECRET}-q1"
    status, listed = await as_user(d, "alice", "GET", "/api/batches")
    assert batch in [b["id"] for b in listed["batches"]], listed
    file_id = seen["batch"]["input_file_id"]
    status, text = await on_front(d, "alice", "GET", f"/v1/files/{file_id}/content")
    assert status == 200 and SECRET in text, text
    status, text = await on_front(d, "alice", "GET", f"/v1/batches/{batch}")
    assert status == 200 and json.loads(text)["metadata"] == {"name": BATCH_NAME}, text
    for method, path, body in (
        ("POST", f"/api/batches/{batch}/cancel", {}),
        ("POST", f"/api/batches/{batch}/retry", {"failed": True}),
    ):
        status, refused = await as_user(d, "alice", method, path, body)
        assert (
            status == 403 and "belongs to bob; a member acts only on their own batches" in refused["error"]["message"]
        ), (path, refused)
    for method, path in (("POST", f"/v1/batches/{batch}/cancel"), ("DELETE", f"/v1/files/{file_id}")):
        status, text = await on_front(d, "alice", method, path, {} if method == "POST" else None)
        assert status == 403 and "belongs to bob" in text, (path, text)
    status, body = await as_user(d, "bob", "POST", f"/api/batches/{batch}/cancel", {})
    assert status == 200 and body["batch"]["status"] in ("cancelling", "cancelled"), body
