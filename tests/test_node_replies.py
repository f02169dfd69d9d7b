"""A node that answers with valid JSON of the wrong shape (or a line too long to read) never
kills its worker or its health check: the real daemon against a fake Ollama that sends it.

A chat line of the wrong shape fails its job, naming the node and what was wrong, with the
output so far kept; the node's next job runs to done. A health answer of the wrong shape marks
the node down (or flagged), named on /health and by `gpuq nodes`, until it answers right."""

from __future__ import annotations

import json
import re

import pytest
from conftest import eventually, node_table

MODEL = "qwen3-coder:30b"
HUGE = json.dumps({"model": MODEL, "message": {"role": "assistant", "content": "x" * 200_000}, "done": False})


def line(**fields) -> str:
    return json.dumps({"model": MODEL, "created_at": "2026-11-29T08:00:00Z", "done": False, **fields})


# the raw chat line, the job's error verbatim
CHAT_LINES = {
    "a JSON array": ("[1,2]", "sick sent a chat line that is a JSON array, not an object: [1,2]"),
    "a JSON number": ("42", "sick sent a chat line that is a JSON number, not an object: 42"),
    "message a string": (line(message="str"), "sick sent a chat line whose 'message' is a JSON string, not an object"),
    "content a number": (
        line(message={"role": "assistant", "content": 5}),
        "sick sent a chat line whose 'message.content' is a JSON number, not a string",
    ),
    "a line too long": (HUGE, "sick sent a chat line longer than 131072 bytes, the most the router reads"),
}


async def sick_node(fakes, daemon_factory, **router):
    sick = await fakes(MODEL, tokens=5)
    d = await daemon_factory([node_table("sick", sick, 1, ["task"], MODEL)], **{"unload_timeout": "1s", **router})
    await eventually(lambda: node(d), what="the node to be up")
    return sick, d


async def node(d) -> dict | None:
    [n] = (await d.get("/api/nodes"))["nodes"]
    return n if n["up"] and not n["vram_stuck"] else None


async def health(d) -> tuple[int, dict]:
    return await d.request("GET", "/health")


@pytest.mark.parametrize("case", list(CHAT_LINES))
async def test_a_chat_line_of_the_wrong_shape_fails_its_job_and_the_next_runs(case, fakes, daemon_factory):
    raw, error = CHAT_LINES[case]
    sick, d = await sick_node(fakes, daemon_factory)
    sick.script.raw_after, sick.script.raw_lines = 2, [raw]
    [job] = await d.submit("task", f"gets {case}")

    failed = await d.wait_state(job["id"], "failed", timeout=20)
    assert failed["error"] == error
    assert len(failed["output"].split()) == 2  # the two good chunks are kept
    assert failed["events"][-1]["reason"] == error
    sick.script.raw_lines = None
    [nxt] = await d.submit("task", "runs after it")  # the node's worker lives on
    await d.wait_state(nxt["id"], "done", timeout=20)
    assert (await node(d)) is not None
    status, body = await health(d)
    assert status == 200 and body["ok"] is True, body


# the path, its raw body, the node's error verbatim
HEALTH_BODIES = {
    "/api/version without version": (
        "/api/version",
        '{"v": "0.33.0"}',
        'sick sent /api/version without a \'version\' string: {"v": "0.33.0"}',
    ),
    "/api/tags entry without name": (
        "/api/tags",
        '{"models": [{"model": "qwen3-coder:30b"}]}',
        'sick sent an /api/tags entry without a \'name\' string: {"model": "qwen3-coder:30b"}',
    ),
}


@pytest.mark.parametrize("case", list(HEALTH_BODIES))
async def test_a_health_answer_of_the_wrong_shape_marks_the_node_down_until_it_answers_right(
    case, fakes, daemon_factory
):
    path, raw, error = HEALTH_BODIES[case]
    sick, d = await sick_node(fakes, daemon_factory)
    sick.script.raw_bodies[path] = raw

    async def down():
        [n] = (await d.get("/api/nodes"))["nodes"]
        return n if not n["up"] else None

    state = await eventually(down, 10, what="the node to be seen down")
    assert state["last_error"] == error
    [job] = await d.submit("task", "waits for the node", node="sick")
    status, body = await health(d)
    assert status == 503 and body["ok"] is False
    assert [(n["name"], n["error"], n["waiting"]) for n in body["nodes_down"]] == [("sick", error, 1)]
    res = await d.cli("nodes")
    assert " down " in res.out and error in res.out
    assert sick.chat_requests == []  # nothing was sent to a node that answers wrong

    del sick.script.raw_bodies[path]  # the node answers right again
    await d.wait_state(job["id"], "done", timeout=20)
    assert (await node(d)) is not None
    status, body = await health(d)
    assert status == 200 and body["ok"] is True, body


async def test_ps_as_a_list_flags_the_node_naming_it_until_ps_answers_right(fakes, daemon_factory):
    sick, d = await sick_node(fakes, daemon_factory)
    sick.script.raw_bodies["/api/ps"] = "[]"
    [job] = await d.submit("task", "its unload cannot be confirmed")

    async def flagged():
        [n] = (await d.get("/api/nodes"))["nodes"]
        return n if n["vram_stuck"] else None

    state = await eventually(flagged, 15, what="the node to be flagged")
    error = state["vram_stuck"]
    assert re.fullmatch(
        rf"unload failed: {MODEL} did not leave VRAM within [\d.]+s \(unload_timeout 1s; sick sent "
        r"/api/ps as a JSON array, not an object\); node sick flagged",
        error,
    ), error
    done = await d.wait_state(job["id"], "done", timeout=20)  # its work is done; the failure is the node's
    assert error in [e["reason"] for e in done["events"]]
    [nxt] = await d.submit("task", "waits while the node is flagged")
    status, body = await health(d)
    assert status == 503 and [(n["name"], n["error"]) for n in body["nodes_down"]] == [("sick", error)]
    assert (await d.job(nxt["id"]))["state"] == "queued"

    del sick.script.raw_bodies["/api/ps"]
    await d.wait_state(nxt["id"], "done", timeout=20)
    assert (await node(d)) is not None
    status, body = await health(d)
    assert status == 200 and body["ok"] is True, body
