"""GET /api/history, /api/activity and /api/alerts through the real daemon: what they answer,
and a clear 400 naming the parameter for each bad one."""

from __future__ import annotations

import time

import pytest

from gpuq.jobs import iso


@pytest.mark.parametrize(
    "query,message",
    [
        ("state=queued", "unknown state 'queued' (finished jobs are done, failed or cancelled)"),
        ("kind=essay", "unknown kind 'essay' (expected 'task', 'critique', 'embed')"),
        ("node=no/such", "'no/such' is not a node name"),
        ("limit=0", "query parameter 'limit' must be a whole number from 1 to 500, got '0'"),
        ("offset=-1", "query parameter 'offset' must be a whole number from 0 to 10000000, got '-1'"),
        ("q=" + "x" * 201, "query parameter 'q' is 201 characters long; at most 200"),
    ],
)
async def test_bad_history_queries_are_refused_naming_the_parameter(lab, query, message):
    status, body = await lab.request("GET", f"/api/history?{query}")
    assert (status, body) == (400, {"error": {"status": 400, "message": message}})


async def test_bad_activity_and_alert_queries_are_refused(lab):
    status, body = await lab.request("GET", "/api/activity?since=yesterday")
    assert status == 400 and "query parameter 'since' must be a UTC time" in body["error"]["message"]
    status, body = await lab.request("GET", "/api/alerts?limit=x")
    assert status == 400 and "'limit'" in body["error"]["message"]


async def test_history_pages_filters_and_counts(lab):
    ids = []
    for i in range(5):
        [job] = await lab.submit("task", f"history {i} 100%_sure", node="node-3")
        ids.append(job["id"])
        await lab.wait_state(job["id"], "done")
    [other] = await lab.submit("task", "plain", node="node-1")
    await lab.wait_state(other["id"], "done")

    first = await lab.get("/api/history?limit=2")
    assert first["total"] == 6 and [j["id"] for j in first["jobs"]] == [other["id"], ids[4]]
    second = await lab.get("/api/history?limit=2&offset=2")
    assert [j["id"] for j in second["jobs"]] == [ids[3], ids[2]]
    job = first["jobs"][1]
    assert job["prompt_excerpt"] == "history 4 100%_sure" and job["prompt_bytes"] == 19
    assert "prompt" not in job and "eta_start" not in job
    by_node = await lab.get("/api/history?node=node-1")
    assert [j["id"] for j in by_node["jobs"]] == [other["id"]]
    # % and _ are matched as themselves, not as LIKE's wildcards.
    assert (await lab.get("/api/history?q=0%25_s"))["total"] == 5
    assert (await lab.get("/api/history?q=0%25xs"))["total"] == 0
    assert (await lab.get(f"/api/history?q={ids[0][-8:]}"))["total"] == 1

    activity = await lab.get(f"/api/activity?since={iso(time.time() - 3600)}")
    assert activity["finished"] == {"done": 6, "failed": 0, "cancelled": 0}
    nodes = {n["name"]: n for n in activity["nodes"]}
    assert nodes["node-3"]["jobs_per_hour"] == 5 and nodes["node-3"]["busy"]
    assert nodes["node-2"] == {"name": "node-2", "busy": [], "busy_s": 0.0, "jobs_per_hour": 0}
    later = await lab.get(f"/api/activity?since={iso(time.time() + 60)}")
    assert later["finished"] == {"done": 0, "failed": 0, "cancelled": 0}
