"""Stopping the real router is a drain: on the first SIGINT/SIGTERM nothing new starts, the
running jobs finish (their output whole) and waiting ones stay queued for the next start. A
second Ctrl-C, or a SIGTERM's shutdown_grace running out, stops at once and fails the running
jobs, saying so."""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp
import pytest
from conftest import eventually, free_port, node_table

MODEL = "qwen3-coder:30b"
REPLY = " ".join(f"word{i}" for i in range(30))


async def test_ctrl_c_lets_the_running_job_finish_and_keeps_the_waiting_one_queued(fakes, daemon_factory):
    # unload "never": the job, its reply streamed, stays running until the test lets its model go.
    fake = await fakes(MODEL, reply=REPLY, token_delay_s=0.03, unload="never")
    d = await daemon_factory([node_table("n", fake, 1, ["task"], MODEL)], unload_timeout="60s", stale_after="120s")
    [first] = await d.submit("task", "first", node="n")
    [second] = await d.submit("task", "second", node="n")
    await eventually(lambda: fake.chunk_sent.is_set(), 20, what="the first job's reply to begin")

    d.proc.send_signal(signal.SIGINT)
    await eventually(
        lambda: "press Ctrl-C again to stop now" in d.log.read_text(), 20, what="the router to say it waits"
    )
    log = d.log.read_text()
    assert "waiting for 1 running job(s) to finish" in log
    assert f"{first['id']} on n ({MODEL}), running " in log
    health = await d.get("/health")
    assert health["draining"]["running"] == [{"job": first["id"], "node": "n"}]
    assert d.proc.returncode is None  # still up, the job still running

    async def reply_whole():
        return (await d.job(first["id"]))["work_done_at"]

    await eventually(reply_whole, 20, what="the reply to be whole")
    fake.loaded.clear()  # the model leaves VRAM: the job finishes, and the router stops
    assert await asyncio.wait_for(d.proc.wait(), 30) == 0
    assert "the running jobs have finished" in d.log.read_text()
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["first"]  # the second never left

    fake.script.unload = "immediate"
    await d.start()
    done = await d.job(first["id"])
    assert done["state"] == "done", done
    assert done["output"].split() == REPLY.split()
    assert "router restarted while running" not in [e["reason"] for e in done["events"]]
    await d.wait_state(second["id"], "done", timeout=20)  # waited in its queue, ran after the restart
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["first", "second"]


async def test_a_second_ctrl_c_stops_at_once_and_fails_the_running_job_saying_so(fakes, daemon_factory):
    fake = await fakes(MODEL, tokens=20, stall_after=3)  # streams three words, then never ends
    d = await daemon_factory([node_table("n", fake, 1, ["task"], MODEL)], stale_after="120s")
    [job] = await d.submit("task", "endless", node="n")
    await eventually(lambda: fake.chunk_sent.is_set(), 20, what="the job's reply to begin")

    d.proc.send_signal(signal.SIGINT)
    await eventually(
        lambda: "press Ctrl-C again to stop now" in d.log.read_text(), 20, what="the router to say it waits"
    )
    assert d.proc.returncode is None
    d.proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(d.proc.wait(), 30) == 0
    assert f"stopping now: 1 job(s) will fail (a second Ctrl-C): {job['id']} on n" in d.log.read_text()

    await d.start()
    failed = await d.job(job["id"])
    assert failed["state"] == "failed", failed
    assert "stopped before this job finished (a second Ctrl-C)" in failed["error"]
    assert "router restarted while running" not in failed["error"]
    assert failed["output"]  # what it streamed before the stop is kept


async def test_sigterm_waits_shutdown_grace_then_fails_the_running_job(fakes, daemon_factory):
    fake = await fakes(MODEL, tokens=20, stall_after=3)
    d = await daemon_factory([node_table("n", fake, 1, ["task"], MODEL)], stale_after="120s", shutdown_grace="1s")
    [job] = await d.submit("task", "endless", node="n")
    await eventually(lambda: fake.chunk_sent.is_set(), 20, what="the job's reply to begin")

    d.proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(d.proc.wait(), 30) == 0  # no second signal: the grace ends it
    log = d.log.read_text()
    assert "stopping now in 1s if they still run (shutdown_grace)" in log
    assert "stopping now: 1 job(s) will fail (SIGTERM's shutdown_grace of 1s ran out)" in log

    await d.start()
    failed = await d.job(job["id"])
    assert failed["state"] == "failed", failed
    assert "shutdown_grace of 1s ran out" in failed["error"]


async def test_demo_ctrl_c_twice_prints_no_traceback(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    err = tmp_path / "err.txt"
    with open(err, "wb") as err_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuq.cli",
            "serve",
            "--demo",
            "--listen",
            f"127.0.0.1:{port}",
            "--database",
            str(tmp_path / "demo.db"),
            cwd=str(tmp_path),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err_file,
        )
    try:
        async with aiohttp.ClientSession() as session:

            async def answers():
                try:
                    async with session.get(url + "/health") as resp:
                        return resp.status in (200, 503)
                except aiohttp.ClientError:
                    return False

            await eventually(answers, 30, 0.05, "the demo router to answer")
            # A thinking model, and a prompt the demo answers at length (24 words): some 3 s of streaming.
            async with session.post(
                url + "/api/jobs",
                json={"kind": "task", "prompt": "write a long story about queues 22", "node": "demo-2", "think": True},
            ) as resp:
                assert resp.status == 201
                [job] = (await resp.json())["jobs"]

            async def streaming():
                async with session.get(f"{url}/api/jobs/{job['id']}") as resp:
                    job_now = await resp.json()
                    return job_now.get("thinking") or job_now.get("output")

            await eventually(streaming, 30, what="the demo job to stream")
        proc.send_signal(signal.SIGINT)
        await eventually(
            lambda: "press Ctrl-C again to stop now" in err.read_text(), 20, what="the demo to say it waits"
        )
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = err.read_text()
    assert "stopping now: 1 job(s) will fail (a second Ctrl-C)" in text
    assert "Traceback" not in text, text


async def test_a_reload_while_draining_starts_nothing(fakes, daemon_factory):
    """A refused reload (it would remove a node where jobs wait) puts the node back to work; while
    the router drains, its waiting job must still not start."""
    from test_reload import edit_config

    fake = await fakes(MODEL, reply=REPLY, token_delay_s=0.03, unload="never")
    other = await fakes(MODEL)
    d = await daemon_factory(
        [node_table("n", fake, 1, ["task"], MODEL), node_table("m", other, 2, ["task"], MODEL)],
        unload_timeout="60s",
        stale_after="120s",
    )
    [first] = await d.submit("task", "first", node="n")
    [second] = await d.submit("task", "second", node="n")
    await eventually(lambda: fake.chunk_sent.is_set(), 20, what="the first job's reply to begin")
    d.proc.send_signal(signal.SIGINT)
    await eventually(
        lambda: "press Ctrl-C again to stop now" in d.log.read_text(), 20, what="the router to say it waits"
    )

    edit_config(d, lambda data: data.update(node=[n for n in data["node"] if n["name"] != "n"]))
    res = await d.cli("reload")
    assert res.code == 1 and res.err.startswith("error 409 not reloaded, nothing changed"), res

    async def reply_whole():
        return (await d.job(first["id"]))["work_done_at"]

    await eventually(reply_whole, 20, what="the reply to be whole")
    fake.loaded.clear()  # the first job finishes, and the router stops: the second never starts
    assert await asyncio.wait_for(d.proc.wait(), 30) == 0
    assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["first"]


async def test_a_front_door_call_during_the_drain_is_answered_at_once_with_retry_after(fakes, daemon_factory):
    """A client calling while the router drains would wait for the whole drain, then get 503:
    it gets that 503 now, with Retry-After, and nothing is stored for it (issue 36)."""
    import ollama
    import openai

    fake = await fakes(MODEL, tokens=20, stall_after=3)  # the running job never ends by itself
    front_port = free_port()
    d = await daemon_factory(
        [node_table("n", fake, 1, ["task"], MODEL)], stale_after="120s", ollama_listen=f"127.0.0.1:{front_port}"
    )
    door = f"http://127.0.0.1:{front_port}"
    [job] = await d.submit("task", "endless", node="n")
    await eventually(lambda: fake.chunk_sent.is_set(), 20, what="the job's reply to begin")
    d.proc.send_signal(signal.SIGINT)
    await eventually(
        lambda: "press Ctrl-C again to stop now" in d.log.read_text(), 20, what="the router to say it waits"
    )
    before = (await d.get("/api/jobs?limit=100"))["jobs"]

    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{door}/api/chat", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        ) as r:
            assert r.status == 503
            assert r.headers["Retry-After"] == "5"
            body = await r.json()
    assert body["error"].startswith("the gpuq router is stopping: it starts no new job while its 1 running job(s)")
    # The real SDKs hear it as a refusal to retry later, not a hang.
    ollama_client = ollama.AsyncClient(host=door)
    client = openai.AsyncOpenAI(base_url=door + "/v1", api_key="x", max_retries=0)
    try:
        with pytest.raises(ollama.ResponseError) as said:
            await ollama_client.generate(model=MODEL, prompt="hi")
        assert said.value.status_code == 503 and "stopping" in said.value.error
        with pytest.raises(openai.APIStatusError) as told:
            await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert told.value.status_code == 503 and told.value.response.headers["retry-after"] == "5"
    finally:
        await ollama_client.close()
        await client.close()
    assert d.proc.returncode is None  # answered while the drain still waits
    assert (await d.get("/api/jobs?limit=100"))["jobs"] == before  # nothing stored for them
    assert (await d.job(job["id"]))["state"] == "running"
    d.proc.send_signal(signal.SIGINT)
    assert await asyncio.wait_for(d.proc.wait(), 30) == 0
