"""A critique of a task that has not finished: the guard is judged first, whatever the parent's
state; otherwise the critique is accepted, held until the parent is done (never blocking the
jobs behind it, never stale), then reviews the parent's prompt and result. A parent that
fails or is cancelled takes its held critiques with it, loudly. On each engine (a SQLite file,
then PostgreSQL)."""

from __future__ import annotations

import re
import time

import pytest
from conftest import eventually

ID = r"\d{10}-[0-9a-f]{8}"


@pytest.fixture
def lab(lab_on_each_engine):
    return lab_on_each_engine


async def slow_task(
    lab, node: str = "node-1", delay: float = 0.2, prompt: str = "write the export retry", tokens: int = 200
):
    """A task that is still running while the test looks (tokens x delay), however loaded the machine."""
    lab.fakes[node].script.token_delay_s = delay
    lab.fakes[node].script.tokens = tokens
    res = await lab.cli("task", prompt, "--node", node)
    assert res.code == 0, res.err
    return res.out.split()[0]


async def test_the_design_transcript_verbatim_while_the_parent_is_queued_or_running(lab):
    running = await slow_task(lab)
    waiting = (await lab.cli("task", "second", "--node", "node-1")).out.split()[0]
    await lab.wait_state(running, "running")
    for parent in (running, waiting):
        assert (await lab.job(parent))["state"] in ("running", "queued")
        res = await lab.cli("critique", "--parent", parent, "--node", "node-1")
        assert res.code == 1
        assert res.err.splitlines() == ["error 409 a critique never runs on its parent task's node", "not retried"]
    assert all(j["kind"] == "task" for j in (await lab.get("/api/jobs"))["jobs"])  # nothing stored


async def test_a_held_critique_waits_for_its_parent_without_blocking_the_queue(fakes, daemon_factory, tmp_path):
    from conftest import make_lab

    lab = await make_lab(fakes, daemon_factory, stale_after="1s")
    parent = await slow_task(lab, delay=0.1, tokens=80)  # ~8 s: it runs while everything below is checked
    res = await lab.cli("critique", "--parent", parent, "--no-wait")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert lines[:2] == [
        "fan-out 1 critique node",
        f"waiting for parent {parent} to finish; then each reviews its result",
    ]
    assert re.fullmatch(rf"node-2 ({ID}) deepseek-r1:32b queued \(waiting for parent {parent}\)", lines[2]), lines
    held = lines[2].split()[1]
    job = await lab.job(held)
    assert job["waiting_for"] == parent and job["state"] == "queued"

    # A file critique submitted after it on node-2 runs while the held one keeps waiting.
    plan = tmp_path / "plan.md"
    plan.write_text("a plan")
    behind = (await lab.cli("critique", str(plan), "--node", "node-2", "--no-wait")).out.splitlines()[1].split()[1]
    await lab.wait_state(behind, "done")
    assert (await lab.job(parent))["state"] == "running"
    assert (await lab.job(held))["waiting_for"] == parent

    # Shown as held everywhere, and never stale, however long it waits (stale_after is 1 s).
    queue = await lab.cli("queue")
    assert re.search(rf"{held} +critique .*\(waiting for parent {parent}\)", queue.out), queue.out
    shown = await lab.cli("show", held)
    assert f"waiting for parent {parent} to finish" in shown.out
    # (The running parent writes its progress about once a second, so on a loaded machine it
    # may itself look stale at 1 s; what matters here is that the held critique never does.)
    created = time.time()
    await eventually(lambda: time.time() - created > 1.5, 5, 0.1, "the held critique to wait past stale_after")
    assert held not in [h["id"] for h in (await lab.get("/api/stale"))["stale"]]
    assert held not in [h["id"] for h in (await lab.get("/health"))["stale"]]

    # The parent finishes (its last tokens at once, all being checked): the critique runs and
    # reviews the parent's prompt and result.
    lab.fakes["node-1"].script.token_delay_s = 0
    done = await lab.wait_state(parent, "done", timeout=30)
    reviewed = await lab.wait_state(held, "done", timeout=30)
    assert reviewed["waiting_for"] is None and reviewed["findings"] is not None
    content = lab.fakes["node-2"].chat_requests[-1]["messages"][0]["content"]
    assert "write the export retry" in content and done["output"] in content
    assert reviewed["prompt"].startswith("## Task\nwrite the export retry")


async def test_preempting_a_held_critique_is_refused(lab):
    parent = await slow_task(lab)
    [held] = await lab.submit("critique", None, parent=parent)
    res = await lab.cli("preempt", held["id"])
    assert res.code == 1
    assert (
        res.err.splitlines()[0]
        == f"error 409 job {held['id']} is waiting for parent {parent} to finish; it cannot run before"
    )


async def test_a_parent_that_fails_cancels_its_held_critiques(lab):
    lab.fakes["node-1"].script.error_after = 3
    parent = await slow_task(lab, delay=0.3)  # fails after ~1 s: `gpuq task` has returned (it asks for an estimate too)
    [held] = await lab.submit("critique", None, parent=parent)
    failed = await lab.wait_state(parent, "failed")
    job = await lab.wait_state(held["id"], "cancelled")
    assert job["error"] == f"parent task {parent} failed ({failed['error']}); nothing to critique"
    assert job["events"][-1]["to_state"] == "cancelled" and job["events"][-1]["actor"] == "router"
    assert lab.fakes["node-2"].chat_requests == []  # it never ran
    retry = await lab.cli("retry", held["id"])
    again = await lab.cli("critique", "--parent", parent)
    # The same words whichever way the critique of nothing is asked for.
    said = (
        f"error 409 parent task {parent} is failed: there is no result to critique; retry the parent first "
        f"(gpuq retry {parent}) or critique a file"
    )
    assert (retry.code, retry.err.splitlines()) == (again.code, again.err.splitlines()) == (1, [said, "not retried"])


async def test_a_deleted_parent_cancels_its_held_critiques_and_nothing_else(lab, tmp_path):
    parent = await slow_task(lab)
    res = await lab.cli("critique", "--parent", parent, "--no-wait")
    held = res.out.splitlines()[2].split()[1]
    plan = tmp_path / "plan.md"
    plan.write_text("unrelated")
    other = (await lab.cli("critique", str(plan), "--no-wait")).out.splitlines()[1:]
    assert (await lab.cli("delete", parent)).code == 0
    # The slow pace was for the parent; the critiques' JSON streams token by token, as Ollama's does.
    lab.fakes["node-1"].script.token_delay_s = 0.0
    job = await lab.wait_state(held, "cancelled")
    assert job["error"] == f"parent task {parent} was cancelled (deleted by cli 127.0.0.1); nothing to critique"
    for line in other:
        assert (await lab.wait_state(line.split()[1], "done"))["state"] == "done"
    assert all(parent not in r["messages"][0]["content"] for r in lab.fakes["node-2"].chat_requests)


async def test_a_critique_of_a_failed_parent_is_refused_at_submit(lab):
    lab.fakes["node-1"].script.error_after = 0
    parent = await slow_task(lab, delay=0)
    await lab.wait_state(parent, "failed")
    res = await lab.cli("critique", "--parent", parent)
    assert res.code == 1
    assert res.err.startswith(f"error 409 parent task {parent} is failed: there is no result to critique")
