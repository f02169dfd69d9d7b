"""The CLI for daily use: --version, --json on the commands that print data (the API's shapes),
errors in the CLI's own words, a clear that says how many jobs it will cancel."""

from __future__ import annotations

import json
import re

from conftest import eventually


async def test_version(lab):
    res = await lab.cli("--version")
    assert res.code == 0 and re.fullmatch(r"gpuq \d+\.\d+\.\d+\n", res.out)


async def test_json_everywhere_in_the_apis_shapes(lab):
    res = await lab.cli("task", "hello", "--node", "node-3", "--json")
    job = json.loads(res.out)
    # (running: node-3's worker waited idle, so the submit's own commit claimed the job for it)
    assert job["node"] == "node-3" and job["state"] in ("queued", "running")
    await lab.wait_state(job["id"], "done")
    queue = json.loads((await lab.cli("queue", "--json")).out)
    assert [n["name"] for n in queue["nodes"]] == ["node-1", "node-2", "node-3"] and "queue_depth" in queue
    nodes = json.loads((await lab.cli("nodes", "--json")).out)
    assert [n["name"] for n in nodes["nodes"]] == ["node-1", "node-2", "node-3"]
    assert json.loads((await lab.cli("stale", "--json")).out) == {"stale": []}
    assert json.loads((await lab.cli("health", "--json")).out)["ok"] is True
    res = await lab.cli("wait", job["id"], "--json")
    final = json.loads(res.out.splitlines()[-1])
    assert final["id"] == job["id"] and final["state"] == "done"


async def test_nodes_says_since_as_an_age(lab):
    res = await lab.cli("nodes")
    for line in res.out.splitlines()[1:]:
        assert re.search(r"\s\d+(s|m\d\ds|h\d\dm) ago", line), line


async def test_move_and_clear_speak_the_clis_words(lab):
    lab.fakes["node-3"].script.token_delay_s = 0.3
    lab.fakes["node-3"].script.tokens = 200
    head = (await lab.submit("task", "head", node="node-3"))[0]["id"]
    await lab.wait_state(head, "running")
    waiting = [(await lab.submit("task", f"w{i}", node="node-3"))[0]["id"] for i in range(2)]
    res = await lab.cli("move", waiting[0])
    assert res.code == 2 and "say where to move it: --to N, --before ID, --after ID or --node NAME" in res.err
    assert "not retried" not in res.err
    res = await lab.cli("move", waiting[0], "--to", "99")
    assert res.code == 0
    assert res.out.strip() == f"{waiting[0]} -> node-3 position 2 (the end of its queue: --to 99 is past it)"
    res = await lab.cli("clear", "node-9")
    assert res.code == 2 and "unknown node 'node-9' (the nodes: node-1, node-2, node-3)" in res.err
    res = await lab.cli("clear", "node-3", stdin=b"n\n")
    assert "Cancel 2 jobs on node-3?" in res.out and res.code == 1
    assert [j["state"] for j in [await lab.job(i) for i in waiting]] == ["queued", "queued"]
    res = await lab.cli("clear", "node-3", "--running", stdin=b"y\n")
    assert "Cancel 3 jobs (the running one included) on node-3?" in res.out and res.code == 0
    assert (await lab.job(head))["state"] == "cancelled"  # the clear answered after its commit


async def test_one_token_is_singular(lab):
    lab.fakes["node-3"].script.reply = "one"
    res = await lab.cli("task", "x", "--node", "node-3", "--wait")
    assert res.out.splitlines()[-1].startswith("done 1 token ")


async def test_queue_has_a_header_an_idle_word_and_a_labelled_running_line(lab):
    lab.fakes["node-3"].script.token_delay_s = 0.2
    lab.fakes["node-3"].script.tokens = 200
    head = (await lab.submit("task", "the long one", node="node-3"))[0]["id"]
    await lab.wait_state(head, "running")
    await eventually(lambda: lab.fakes["node-3"].chunk_sent.is_set(), what="the first tokens")
    out = (await lab.cli("queue")).out
    blocks = {b.split()[0]: b for b in out.split("\n\n")[1:]}
    for block in blocks.values():
        assert re.search(r"^ +POS  JOB +KIND +OWNER +AGE ESTIMATE +PROMPT$", block, re.M), block
    assert re.search(r"^ +idle$", blocks["node-1"], re.M), blocks["node-1"]
    assert re.search(rf"running  {head} .*\[ran \d+s, \d+ tokens?\]  the long one$", blocks["node-3"], re.M), blocks[
        "node-3"
    ]


async def test_task_wait_says_where_the_job_waits_and_when_it_starts(lab):
    lab.fakes["node-3"].script.token_delay_s = 0.1
    lab.fakes["node-3"].script.tokens = 30
    head = (await lab.submit("task", "ahead", node="node-3"))[0]["id"]
    await lab.wait_state(head, "running")
    ahead = (await lab.submit("task", "also ahead", node="node-3"))[0]["id"]
    res = await lab.cli("task", "mine", "--node", "node-3", "--wait", timeout=60)
    assert res.code == 0, res.err
    said = res.err.splitlines()
    assert said[0] == "queued on node-3, position 2"
    assert "queued on node-3, position 1" in said  # the job ahead of it started
    assert said[-1] == "started on node-3"
    assert "queued on" not in res.out and (await lab.job(ahead))["state"] == "done"
