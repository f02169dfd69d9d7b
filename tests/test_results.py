"""Critique and task results end to end: lines as each child finishes, structured findings,
streamed output."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys

from conftest import eventually

ID = r"\d{10}-[0-9a-f]{8}"


async def test_critique_lines_appear_as_each_child_finishes(lab, tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text("a plan")
    # node-2 is slow; node-1 answers at once. Its reply (reasoning, then findings JSON streamed
    # token by token, as Ollama's) is some 30 to 120 chunks: a few seconds at this pace.
    lab.fakes["node-2"].script.token_delay_s = 0.1
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuq.cli",
        "--router",
        lab.url,
        "critique",
        str(plan),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    assert (await asyncio.wait_for(proc.stdout.readline(), 20)).decode() == "fan-out 2 critique nodes\n"
    first = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
    assert first.startswith("node-1 ")
    slow_id = (await lab.get("/api/jobs?node=node-2"))["jobs"][0]["id"]
    assert (await lab.job(slow_id))["state"] in ("queued", "running")  # printed before node-2 finished
    # Under each child's line: its findings (severity and title, one line each), its preview link.
    rest = (await asyncio.wait_for(proc.stdout.read(), 30)).decode().splitlines()
    assert await proc.wait() == 0
    second_at = next(i for i, line in enumerate(rest) if line.startswith("node-2 "))
    second = rest[second_at]
    assert second.startswith(f"node-2 {slow_id} deepseek-r1:32b done ")
    for line, under in ((first, rest[:second_at]), (second, rest[second_at + 1 :])):
        node, job_id, model, state, count = line.split()[:5]
        job = await lab.job(job_id)
        assert state == "done" and int(count) == len(job["findings"]) and job["node"] == node
        assert all(set(f) == {"title", "detail", "severity", "where"} for f in job["findings"])
        assert under == [f"    [{f['severity']}] {f['title']}" for f in job["findings"]] + [f"    {job['preview_url']}"]


async def test_the_critique_request_uses_structured_output_and_the_template(lab, tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text("PLAN BODY")
    res = await lab.cli("critique", str(plan))
    assert res.code == 0, res.err
    [req] = lab.fakes["node-2"].chat_requests
    assert req["format"]["properties"]["findings"]["type"] == "array"
    content = req["messages"][0]["content"]
    assert "PLAN BODY" in content and "reviewer" in content


async def test_a_reply_that_is_not_findings_fails_loudly_and_keeps_the_raw_reply(lab, tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text("a plan")
    lab.fakes["node-2"].script.invalid_json = True
    res = await lab.cli("critique", str(plan))
    assert res.code == 1
    bad = next(line for line in res.out.splitlines() if line.startswith("node-2"))
    assert re.fullmatch(
        rf"node-2 {ID} deepseek-r1:32b failed \d+s: the model's reply does not match the "
        r"findings schema: the reply is not JSON .*",
        bad,
    ), bad
    job = await lab.job(bad.split()[1])
    assert job["output"].startswith("Sure! Here are my findings")
    assert job.get("findings") is None


async def test_critique_of_a_parent_reviews_its_prompt_and_result_never_on_its_node(lab):
    res = await lab.cli("task", "write the export retry", "--node", "node-1")
    task_id = res.out.split()[0]
    done = await lab.wait_state(task_id, "done")
    res = await lab.cli("critique", "--parent", task_id, "--json")
    assert res.code == 0, res.err
    results = json.loads(res.out)["jobs"]
    assert [r["node"] for r in results] == ["node-2"]  # node-1, the parent's node, is excluded
    [req] = lab.fakes["node-2"].chat_requests
    content = req["messages"][0]["content"]
    assert "write the export retry" in content and done["output"] in content
    shown = await lab.cli("show", results[0]["id"])
    assert f"parent: {task_id}" in shown.out
    assert f"-- findings ({len(results[0]['findings'])}) --" in shown.out


async def test_no_wait_prints_the_submit_lines(lab, tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text("x")
    res = await lab.cli("critique", str(plan), "--no-wait")
    lines = res.out.splitlines()
    assert lines[0] == "fan-out 2 critique nodes"
    assert [line.split()[0] for line in lines[1:]] == ["node-1", "node-2"]
    # (running: an idle node's job is claimed in its submit's own commit)
    assert all(re.fullmatch(rf"node-\d {ID} \S+ (queued|running)", line) for line in lines[1:])


async def test_task_wait_streams_tokens_in_order_then_the_final_state(lab):
    fake = lab.fakes["node-1"]
    fake.script.reply = "one two three four five six seven eight"
    fake.script.token_delay_s = 0.02
    res = await lab.cli("task", "count", "--wait")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert lines[2].startswith(("est. start", "started; est. finish", "already done")), lines[2]
    assert lines[3] == "one two three four five six seven eight"
    assert re.fullmatch(r"done 8 tokens \d+s [\d.]+ tok/s", lines[4]), lines[4]


async def test_stream_endpoint_follows_a_running_job(lab):
    fake = lab.fakes["node-3"]
    fake.script.reply = " ".join(f"w{i}" for i in range(30))
    fake.script.token_delay_s = 0.02
    [job] = await lab.submit("task", "stream me", node="node-3")
    pieces, final = [], None
    async with lab.session.get(f"{lab.url}/api/jobs/{job['id']}/stream") as resp:
        assert resp.headers["Content-Type"].startswith("application/x-ndjson")
        async for raw in resp.content:
            line = json.loads(raw)
            if "text" in line:
                pieces.append(line["text"])
            if line.get("done"):
                final = line["job"]
    assert "".join(pieces) == fake.script.reply
    assert final["state"] == "done" and final["output"] == fake.script.reply


async def test_wait_on_a_failed_job_exits_non_zero(lab):
    lab.fakes["node-3"].script.error_after = 1
    [job] = await lab.submit("task", "breaks", node="node-3")
    res = await lab.cli("wait", job["id"])
    assert res.code == 1
    assert "failed" in res.out and "an error was encountered while running the model" in res.out


async def test_show_a_task(lab):
    [job] = await lab.submit("task", "show me", node="node-3")
    await lab.wait_state(job["id"], "done")
    res = await lab.cli("show", job["id"])
    assert res.code == 0
    assert res.out.startswith(f"{job['id']}  task  done  on node-3  model llama3.2:latest")
    assert "-- prompt --\nshow me" in res.out and "-- output --" in res.out
    assert "queued -> running by router" in res.out


async def test_a_running_job_reports_its_tokens_so_far(lab):
    fake = lab.fakes["node-3"]
    fake.script.stall_after = 5
    [job] = await lab.submit("task", "five then silence", node="node-3")

    async def five():
        live = await lab.job(job["id"])
        return live if live.get("tokens_so_far") == 5 else None

    live = await eventually(five, what="five tokens counted")
    assert len(live["output"].split()) == 5  # from memory, ahead of the ~1 s heartbeat
    queue = await lab.get("/api/queue")
    running = next(n["running"] for n in queue["nodes"] if n["name"] == "node-3")
    assert running["id"] == job["id"] and running["tokens_so_far"] == 5
    await lab.request("DELETE", f"/api/jobs/{job['id']}")


async def test_ctrl_c_stops_following_but_the_job_goes_on(lab):
    fake = lab.fakes["node-3"]
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 200  # 10 s: still running when Ctrl-C lands, on a busy machine too
    [job] = await lab.submit("task", "long enough to interrupt", node="node-3")
    # The CLI as a terminal starts it: Ctrl-C's default handling. A child inherits an ignored
    # or blocked SIGINT, and the test worker's may have been changed by a test before this one
    # (two full runs saw the CLI finish the job and exit 0 after Ctrl-C; alone it never did).
    inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    as_at_a_terminal = (
        "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler);"
        " signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); sys.argv[0] = 'gpuq';"
        " runpy.run_module('gpuq.cli', run_name='__main__')"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        as_at_a_terminal,
        "--router",
        lab.url,
        "wait",
        job["id"],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    assert await asyncio.wait_for(proc.stdout.read(5), 20)  # the output is flowing
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 130, (proc.returncode, err.decode()[-500:], "the worker's SIGINT:", inherited)
    assert f"stopped following {job['id']}; it goes on" in err.decode()
    assert (await lab.job(job["id"]))["state"] == "running"
    done = await lab.wait_state(job["id"], "done", timeout=40)
    assert len(done["output"].split()) == 200
