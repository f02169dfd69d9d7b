"""A stuck queue can never hide: stale heads, truthful /health, node health, timeouts."""

from __future__ import annotations

import re

from conftest import eventually, node_table


async def one_node(fakes, daemon_factory, **router):
    fake = await fakes("qwen3-coder:30b")
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task", "critique"], "qwen3-coder:30b")], **router)
    return fake, daemon


def async_true(fetch, test):
    async def check():
        return test(await fetch())

    return check


async def health(daemon):
    return await daemon.request("GET", "/health")


async def test_the_49_minute_case_ollama_done_but_job_not_closed(fakes, daemon_factory, database):
    """On each engine (a SQLite file, then PostgreSQL)."""
    # Ollama finishes the stream but the model never leaves VRAM, so the router cannot close
    # the job: the head sits on finished work. /health must say so, naming the job.
    fake, d = await one_node(fakes, daemon_factory, stale_grace="0.3s", unload_timeout="60s", database=str(database))
    fake.script.unload = "never"
    [head] = await d.submit("task", "finishes, never closes")
    [nxt] = await d.submit("task", "waits behind it")

    async def stuck():
        status, body = await health(d)
        return body if status == 503 else None

    body = await eventually(stuck, 15, what="/health to report the stale head")
    assert body["ok"] is False and body["queue_depth"] == 1
    [stale] = body["stale"]
    assert stale["id"] == head["id"] and stale["node"] == "node-1"
    assert stale["reason"] == "ollama finished but the job was not closed"
    res = await d.cli("stale")
    assert res.code == 1 and head["id"] in res.out and f"gpuq delete {head['id']}" in res.out

    def stale_events(job):
        return [e for e in job["events"] if (e["reason"] or "").startswith("stale:")]

    await eventually(async_true(lambda: d.job(head["id"]), stale_events), 10, what="the stale event")

    res = await d.cli("delete", head["id"])
    assert res.code == 0, res.err
    assert res.out.strip() == f"{head['id']} cancelled on node-1 (was running)"
    # The router keeps asking the model to leave; the stuck runner is then killed by hand,
    # as in the incident, and the node moves on.
    fake.script.unload = "immediate"
    fake.loaded.clear()
    await d.wait_state(nxt["id"], "done", timeout=15)
    status, body = await health(d)
    assert status == 200 and body["ok"] is True and body["stale"] == []
    events = (await d.job(head["id"]))["events"]
    assert len(stale_events({"events": events})) == 1  # written once, not once per check
    assert events[-1]["to_state"] == "cancelled" and events[-1]["reason"] == "deleted by cli 127.0.0.1"


async def test_a_head_that_streams_nothing_goes_stale_and_delete_frees_the_node(fakes, daemon_factory, database):
    """On each engine (a SQLite file, then PostgreSQL)."""
    fake, d = await one_node(fakes, daemon_factory, stale_after="0.5s", stall_timeout="60s", database=str(database))
    fake.script.stall_after = 0
    [head] = await d.submit("task", "silent")
    [nxt] = await d.submit("task", "next")

    async def stale():
        status, body = await health(d)
        return status == 503 and body["stale"] and body["stale"][0]["reason"] == "no progress"

    await eventually(stale, 15, what="a no-progress stale head")
    fake.script.stall_after = None
    res = await d.cli("delete", head["id"])
    assert res.code == 0, res.err
    await eventually(lambda: fake.disconnects >= 1, what="Ollama to see the request closed")
    await d.wait_state(nxt["id"], "done")
    assert fake.loaded == {}
    assert (await health(d))[0] == 200


async def test_node_down_is_visible_its_jobs_wait_and_it_recovers(fakes, daemon_factory):
    f1 = await fakes("qwen3-coder:30b")
    f2 = await fakes("qwen3-coder:30b")
    d = await daemon_factory(
        [
            node_table("node-1", f1, 1, ["task"], "qwen3-coder:30b"),
            node_table("node-2", f2, 2, ["task"], "qwen3-coder:30b"),
        ]
    )
    port = f2.port
    await f2.stop()

    async def down():
        nodes = (await d.get("/api/nodes"))["nodes"]
        return not nodes[1]["up"] and nodes[1]["checked"]

    await eventually(down, 10, what="node-2 to be seen down")
    [job] = await d.submit("task", "for node-2", node="node-2")
    status, body = await health(d)
    assert status == 503 and body["ok"] is False
    assert [n["name"] for n in body["nodes_down"]] == ["node-2"] and body["nodes_down"][0]["waiting"] == 1
    res = await d.cli("nodes")
    line = next(line for line in res.out.splitlines() if line.startswith("node-2"))
    assert " down " in line and "cannot connect" in line
    assert (await d.job(job["id"]))["state"] == "queued"
    assert f2.requests == []
    # A new task avoids the down node while node-1 is free.
    [other] = await d.submit("task", "anywhere")
    assert other["node"] == "node-1"

    await f2.start(port=port)
    await d.wait_state(job["id"], "done", timeout=15)
    assert (await health(d))[0] == 200


async def test_stall_fails_the_job_loudly_and_unloads(fakes, daemon_factory):
    fake, d = await one_node(fakes, daemon_factory, stall_timeout="0.5s")
    fake.script.stall_after = 2
    [job] = await d.submit("task", "stalls")
    failed = await d.wait_state(job["id"], "failed")
    assert failed["error"] == "stalled: no new token from Ollama for 0.5s"
    assert len(failed["output"].split()) == 2
    await eventually(lambda: fake.loaded == {}, what="the model to be unloaded")
    assert len(fake.chat_requests) == 1


async def test_job_timeout_fails_the_job_saying_which_limit(fakes, daemon_factory):
    fake, d = await one_node(fakes, daemon_factory)
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 200
    res = await d.cli("task", "slow", "--timeout", "0.5")
    job_id = res.out.split()[0]
    failed = await d.wait_state(job_id, "failed")
    assert re.fullmatch(r"timeout fired: the job ran 0\.\ds, over its 0\.5s limit; request aborted", failed["error"])
    await eventually(lambda: fake.loaded == {}, what="the model to be unloaded")
    await eventually(lambda: fake.disconnects == 1, what="Ollama to see the request aborted")


async def test_max_runtime_fails_the_job(fakes, daemon_factory):
    fake, d = await one_node(fakes, daemon_factory, max_runtime="0.5s")
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 200
    [job] = await d.submit("task", "runs too long")
    failed = await d.wait_state(job["id"], "failed")
    assert failed["error"].startswith("max_runtime fired: the job ran")


async def test_model_not_installed_is_shown(fakes, daemon_factory):
    fake = await fakes("other:latest")
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")])

    async def flagged():
        return (await d.get("/api/nodes"))["nodes"][0]["model_installed"] is False

    await eventually(flagged, what="the missing model to be noticed")
    res = await d.cli("nodes")
    assert "model qwen3-coder:30b is not installed" in res.out
