"""What the CLI prints while it waits, and --json that a program can parse: with --json, stdout
is one JSON document (progress goes to stderr), with and without --wait."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys

ID = r"\d{10}-[0-9a-f]{8}"


async def test_task_wait_json_is_one_document_and_progress_goes_to_stderr(lab):
    lab.fakes["node-3"].script.reply = "the whole answer"
    res = await lab.cli("task", "hello", "--node", "node-3", "--wait", "--json")
    assert res.code == 0, res.err
    job = json.loads(res.out)  # the whole of stdout: no id line, preview or streamed text before it
    assert job["state"] == "done" and job["node"] == "node-3" and job["output"] == "the whole answer"
    said = res.err.splitlines()
    assert said[0].startswith(f"{job['id']} -> node-3 (")
    assert said[1] == f"preview {lab.url}/jobs/{job['id']}"
    assert "the whole answer" not in res.err
    res = await lab.cli("wait", job["id"], "--json")
    assert json.loads(res.out)["id"] == job["id"]


async def test_critique_json_is_one_document_with_and_without_wait(lab, tmp_path):
    plan = tmp_path / "plan.md"
    plan.write_text("a plan")
    res = await lab.cli("critique", str(plan), "--json")
    assert res.code == 0, res.err
    jobs = json.loads(res.out)["jobs"]
    assert [j["node"] for j in jobs] == ["node-1", "node-2"]
    assert all(j["state"] == "done" and j["findings"] is not None and j["kind"] == "critique" for j in jobs)
    assert res.err.splitlines()[0] == "fan-out 2 critique nodes"  # the progress, apart
    res = await lab.cli("critique", str(plan), "--json", "--no-wait")
    assert res.code == 0, res.err
    jobs = json.loads(res.out)["jobs"]
    assert [j["node"] for j in jobs] == ["node-1", "node-2"] and res.err == ""
    assert all(j["preview_url"] == f"{lab.url}/jobs/{j['id']}" for j in jobs)


async def test_critique_lists_its_children_at_once_then_their_progress(lab, tmp_path):
    # Both children stall after their first chunk: nothing finishes until the test deletes them.
    for name in ("node-1", "node-2"):
        lab.fakes[name].script.stall_after = 1
    plan = tmp_path / "plan.md"
    plan.write_text("a plan")
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
        env={**os.environ, **lab.env},
    )
    try:
        first = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        assert first == "fan-out 2 critique nodes\n"
        listed = [(await asyncio.wait_for(proc.stderr.readline(), 20)).decode().rstrip("\n") for _ in range(2)]
        children = {}
        for line in listed:
            m = re.fullmatch(rf"(node-[12]) ({ID}) \S+ (queued|running)  (http://\S+)", line)
            assert m, listed
            assert m.group(4) == f"{lab.url}/jobs/{m.group(2)}"
            children[m.group(1)] = m.group(2)
        assert set(children) == {"node-1", "node-2"}
        for job_id in children.values():  # listed while none has finished
            assert (await lab.job(job_id))["state"] in ("queued", "running")
        for job_id in children.values():
            await lab.wait_state(job_id, "running")
        for job_id in children.values():
            assert (await lab.request("DELETE", f"/api/jobs/{job_id}"))[0] == 200
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 1  # none is done
    results = [line for line in out.decode().splitlines() if not line.startswith("    ")]
    assert sorted(line.split()[:2] for line in results) == sorted([n, i] for n, i in children.items())
    assert all(" cancelled " in line for line in results), results


async def test_show_gives_each_runs_start_and_end_and_no_empty_reasons(lab):
    lab.fakes["node-3"].script.error_after = 2
    failed = (await lab.submit("task", "first", node="node-3"))[0]["id"]
    await lab.wait_state(failed, "failed")
    lab.fakes["node-3"].script.error_after = None
    assert (await lab.cli("retry", failed)).code == 0
    job = await lab.wait_state(failed, "done")
    res = await lab.cli("show", failed)
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    runs = lines[lines.index("-- runs --") + 1 : lines.index("-- events --") - 1]
    first, second = job["runs"]
    assert runs == [
        f"run {first['id']} on node-3: failed, started {first['started_at']}, ended {first['finished_at']} "
        f"({runs[0].split('(')[1].split(')')[0]}): {first['error']}",
        f"run {second['id']} on node-3: done, started {second['started_at']}, ended {second['finished_at']} "
        f"({runs[1].split('(')[1].split(')')[0]})",
    ]
    assert all(re.fullmatch(r"\d+s", r.split("(")[1].split(")")[0]) for r in runs)
    events = lines[lines.index("-- events --") + 1 :]
    assert len(events) == len(job["events"]) and not any(e.endswith(":") or e.endswith(": ") for e in events)
    assert any(e.endswith("running -> done by router") for e in events), events
    assert any(e.endswith(f"running -> failed by router: {first['error']}") for e in events), events
