"""No loop dies silently: the router in-process with a fake Ollama, a fault injected into its
store. A crash inside a job fails that job and the worker goes on; a crash of a loop itself
is logged with its traceback, turns /health red naming the node, and the loop restarts."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sqlite3
import sys
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer
from conftest import eventually

from gpuq.api.app import create_app
from gpuq.api.state import DISPATCHER, SETTINGS, STORE, UPKEEP
from gpuq.config import NodeConfig, Settings
from gpuq.demo import FakeOllama, Script
from gpuq.jobs import NewJob
from gpuq.node import worker as worker_module
from gpuq.node.supervise import BACKOFF_FIRST_S, BACKOFF_MAX_S, HEALTHY_S, Loops, backoff


@pytest.fixture
async def router(tmp_path):
    """The app on loopback with one node, n1, on a fake Ollama; yields (client, fake)."""
    fake = FakeOllama(models={"m:latest"}, script=Script(tokens=4))
    await fake.start()
    # (a short busy timeout: a write the sqlite3 shell's lock blocks fails, and is logged, soon)
    settings = Settings(
        database=tmp_path / "gpuq.db",
        health_interval_s=0.2,
        unload_timeout_s=2,
        busy_timeout_s=0.3,
        nodes=(NodeConfig("n1", fake.url, 1, ("task",), "m:latest"),),
    )
    client = TestClient(TestServer(create_app(settings), host="127.0.0.1"))
    await client.start_server()
    try:

        async def up():
            _, body = await get(client, "/api/nodes")
            return body["nodes"][0]["up"]

        await eventually(up, what="the node to be up")
        yield client, fake
    finally:
        await client.close()
        await fake.stop()


async def get(client, path: str) -> tuple[int, dict]:
    resp = await client.get(path)
    return resp.status, await resp.json()


async def submit(client, prompt: str) -> str:
    resp = await client.post("/api/jobs", json={"kind": "task", "prompt": prompt})
    assert resp.status == 201, await resp.text()
    return (await resp.json())["jobs"][0]["id"]


async def wait_state(client, job_id: str, state: str) -> dict:
    async def reached():
        _, job = await get(client, f"/api/jobs/{job_id}")
        return job if job["state"] == state else None

    return await eventually(reached, 20, what=f"job {job_id} to be {state}")  # a restart may wait 5 s


def break_once(store, verb: str, message: str, after: bool = False) -> None:
    """The store's `verb` raises RuntimeError(message) once: before its work, or `after` it."""
    real = getattr(store, verb)

    async def broken(*args, **kwargs):
        setattr(store, verb, real)
        if after:
            await real(*args, **kwargs)
        raise RuntimeError(message)

    setattr(store, verb, broken)


def crashes(caplog, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage() and r.exc_info]


@pytest.mark.parametrize(
    "verb,error,logged",
    [
        # Inside the job's steps: the job fails and the worker goes straight on.
        ("work_done", "unexpected error in the router: ", "job={job} node=n1 unexpected error"),
        # Ending it (before: the job stayed "running" with no one running it, and its queue waited
        # behind it until the stale check noticed): the job fails, the worker's loop restarts.
        ("finish", "the node's worker crashed while ending the job: ", "node=n1 worker crashed, restarting in"),
    ],
)
async def test_an_unexpected_error_in_a_job_fails_it_and_the_worker_runs_the_next(router, caplog, verb, error, logged):
    client, fake = router
    break_once(client.server.app[STORE], verb, f"injected: {verb} broke")
    first = await submit(client, "meets the bug")
    second = await submit(client, "runs after it")

    failed = await wait_state(client, first, "failed")
    assert failed["error"] == f"{error}RuntimeError: injected: {verb} broke"
    assert len(failed["output"].split()) == 4  # what streamed is kept
    assert failed["events"][-1]["to_state"] == "failed" and failed["events"][-1]["reason"] == failed["error"]
    # (the job's failure is committed, and readable, a moment before its worker's crash is logged)
    [record] = await eventually(lambda: crashes(caplog, logged.format(job=first)), what="the crash in the log")
    assert f"injected: {verb} broke" in logging.Formatter().formatException(record.exc_info)
    assert (await wait_state(client, second, "done"))["error"] is None
    assert fake.loaded == {} and fake.max_in_flight == 1
    status, health = await get(client, "/health")
    assert status == 200 and health["loops_down"] == []


async def test_a_crashed_worker_is_logged_turns_health_red_and_restarts(router, caplog):
    client, fake = router
    store = client.server.app[STORE]
    real = store.claim
    calls = 0

    async def broken(node):
        nonlocal calls
        calls += 1
        raise RuntimeError("injected: claim broke")

    store.claim = broken
    client.server.app[DISPATCHER].wake("n1")  # the idle worker claims, and crashes

    async def red():
        status, health = await get(client, "/health")
        return health if status == 503 and health["loops_down"] else None

    health = await eventually(red, what="/health to report the crashed worker")
    assert health["ok"] is False
    [down] = health["loops_down"]
    assert (down["loop"], down["node"]) == ("worker", "n1")
    assert down["error"].startswith("worker crashed (RuntimeError: injected: claim broke); restarting in ")
    _, nodes = await get(client, "/api/nodes")
    assert nodes["nodes"][0]["loop_error"].startswith("worker crashed (RuntimeError: injected: claim broke)")
    res = await cli(client, "nodes")
    line = next(line for line in res.splitlines() if line.startswith("n1"))
    assert " crashed " in line and "injected: claim broke" in line

    # A crashed worker waits for no submit: this job is queued, not claimed in its submit.
    job = await submit(client, "waits for the worker")
    await eventually(lambda: calls >= 3, what="the worker to restart twice")  # backoff 0.1 s, 0.2 s
    logged = crashes(caplog, "node=n1 worker crashed, restarting in")
    assert len(logged) >= 2
    assert "injected: claim broke" in logging.Formatter().formatException(logged[0].exc_info)
    assert [r.getMessage().split("restarting in ")[1].split("s:")[0] for r in logged[:2]] == ["0.1", "0.2"]
    _, queued = await get(client, f"/api/jobs/{job}")
    assert queued["state"] == "queued"

    store.claim = real  # the fault is gone: the next restart runs the job
    await wait_state(client, job, "done")
    status, health = await get(client, "/health")
    assert status == 200 and health["loops_down"] == [] and health["ok"] is True
    _, nodes = await get(client, "/api/nodes")
    assert nodes["nodes"][0]["loop_error"] is None


async def test_a_worker_that_crashes_after_its_finish_claimed_the_next_job_puts_that_job_back(router, caplog):
    client, fake = router
    fake.script.token_delay_s = 0.05  # the second job is queued before the first one ends
    break_once(client.server.app[STORE], "finish", "injected: broke after the finish", after=True)
    first = await submit(client, "ends, then the worker breaks")
    second = await submit(client, "claimed by that finish")
    assert (await wait_state(client, first, "done"))["error"] is None
    done = await wait_state(client, second, "done")
    reasons = [e["reason"] for e in done["events"]]
    assert (
        f"back to the head of the queue: the node's worker crashed after {first} ended "
        "(RuntimeError: injected: broke after the finish); the request never reached Ollama"
    ) in reasons
    assert [r["state"] for r in done["runs"]] == ["cancelled", "done"]
    # sent once: the put-back run never reached it
    assert sum(1 for r in fake.chat_requests if "claimed by that finish" in str(r.get("messages"))) == 1


async def test_a_crashed_stale_monitor_turns_health_red_until_it_runs_again(router, caplog):
    client, fake = router
    store = client.server.app[STORE]
    real = store.note_stale

    async def broken():
        raise KeyError("injected")

    store.note_stale = broken

    async def red():
        status, health = await get(client, "/health")
        return health if status == 503 else None

    health = await eventually(red, what="/health to report the crashed monitor")
    [down] = health["loops_down"]
    assert (down["loop"], down["node"]) == ("stale monitor", None)
    assert down["error"].startswith("stale monitor crashed (KeyError: 'injected'); restarting in ")
    assert crashes(caplog, "stale monitor crashed, restarting in")

    store.note_stale = real

    async def green():
        status, _ = await get(client, "/health")
        return status == 200

    await eventually(green, 15, what="/health to be ok again")


async def test_every_upkeep_service_that_crashes_turns_health_red_and_runs_again(router, caplog):
    """The upkeep's services (the stale check, the alerts, backups, storage, retention, the batch
    finalizer) run under one supervisor: each one's crash is named on /health and logged, and
    the service runs again once its fault is gone."""
    client, fake = router
    upkeep = client.server.app[UPKEEP]
    names = [service.name for service in upkeep.services]
    assert names == [
        "stale monitor",
        "alert check",
        "alert delivery",
        "retention sweep",
        "scheduled backups",
        "storage budget",
        "batch finalizer",
    ]

    async def soon() -> None:
        await asyncio.sleep(0.01)

    async def broken() -> None:
        raise KeyError("injected")

    for service in upkeep.services:

        async def down(name=service.name):
            status, health = await get(client, "/health")
            return status == 503 and [d["loop"] for d in health["loops_down"]] == [name]

        service.pause, service.run_once = soon, broken  # due at once, and failing
        upkeep.sweeper.began -= 3600  # (the retention sweep's first is due now, not in a minute)
        await eventually(down, 15, what=f"/health to name the crashed {service.name}")
        assert crashes(caplog, f"{service.name} crashed, restarting in")
        del service.pause, service.run_once  # the class's own again

        async def green():
            status, _ = await get(client, "/health")
            return status == 200

        await eventually(green, 15, what=f"{service.name} to run again")


async def cli(client, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuq.cli",
        "--router",
        str(client.make_url("")).rstrip("/"),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_healthy_stretch():
    delays = [backoff(None, 0.0)]
    for _ in range(7):
        delays.append(backoff(delays[-1], 0.01))
    assert delays == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert (BACKOFF_FIRST_S, BACKOFF_MAX_S) == (0.1, 5.0)
    assert backoff(5.0, HEALTHY_S) == BACKOFF_FIRST_S


async def test_stop_ends_a_loop_that_waits_for_its_restart():
    loops = Loops()
    crashed = asyncio.Event()

    async def crash():
        crashed.set()
        raise RuntimeError("always")

    loop = loops.start("crasher", crash)
    await asyncio.wait_for(crashed.wait(), 5)
    assert not loop.alive and loop.error == "RuntimeError: always"
    await asyncio.wait_for(loops.stop(), 5)
    assert loop.task.cancelled()


@pytest.mark.browser
async def test_the_queue_page_names_a_crashed_loop(router):
    """A person looking at the page sees the crash, not just a red title. The crash is not a live
    event: the page learns it at its next refresh (its slow poll), so the test waits for the
    router to know it, then for a refresh the page started after that, and reads the banner. The
    page's clock is the test's: its slow poll is brought forward rather than waited for."""
    import shutil

    from playwright.async_api import async_playwright, expect
    from test_page import CHROMIUM_ARGS, slow_poll_now

    client, fake = router
    store = client.server.app[STORE]
    real = store.note_stale

    async def broken():
        raise KeyError("injected")

    async def loops_down():
        _, health = await get(client, "/health")
        return [loop["loop"] for loop in health["loops_down"]]

    store.note_stale = broken
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        try:
            page = await browser.new_page()
            await page.clock.install()
            await page.goto(str(client.make_url("/")))
            await eventually(lambda: page.evaluate("window.gpuq.shown > 0"), 60, what="the page's first render")
            await eventually(loops_down, 30, what="the router to see its stale monitor crash")
            await slow_poll_now(page)
            alert = page.locator('.alert[data-loop="stale monitor"]')
            await expect(alert).to_contain_text("The router's stale monitor crashed")
            await expect(alert).to_contain_text("KeyError: 'injected'")
            store.note_stale = real
            await eventually(lambda: async_not(loops_down), 30, what="the stale monitor to run again")
            await slow_poll_now(page)
            await expect(alert).to_have_count(0)
        finally:
            await browser.close()


async def async_not(check) -> bool:
    return not await check()


async def test_a_crash_without_text_reads_as_its_class_not_an_empty_colon():
    loops = Loops()
    crashed = asyncio.Event()

    async def crash():
        crashed.set()
        raise TimeoutError()

    loop = loops.start("crasher", crash)
    await asyncio.wait_for(crashed.wait(), 5)
    assert not loop.alive and loop.error == "TimeoutError"
    await asyncio.wait_for(loops.stop(), 5)


async def test_an_idle_nodes_poll_reads_first_so_a_write_lock_in_the_shell_meets_no_claim(router, monkeypatch, caplog):
    """The worker's fallback poll (a wait no wake ended) reads before it claims: an idle node
    does not take the write lock every few seconds, so a person holding it in the sqlite3 shell
    sees no refused claims in the log; a job that appears with no wake is still found and run."""
    client, fake = router
    app = client.server.app
    store, dispatcher = app[STORE], app[DISPATCHER]
    claims, polls, calls = [], [], []  # calls: both, in order, with what each poll found
    real_claim, real_peek = store.claim, store.next_ready_model

    async def claim(node):
        claims.append(node)
        calls.append(("claim", node))
        return await real_claim(node)

    async def peek(node):
        polls.append(node)
        found = await real_peek(node)
        calls.append(("peek", found))
        return found

    monkeypatch.setattr(store, "claim", claim)
    monkeypatch.setattr(store, "next_ready_model", peek)
    monkeypatch.setattr(worker_module, "IDLE_POLL_S", 0.02)
    dispatcher.wake("n1")  # out of its 5 s wait, into the short one
    await eventually(lambda: len(polls) >= 2, what="the idle worker to poll")

    shell = sqlite3.connect(store.path, isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")  # `BEGIN IMMEDIATE;` typed in the sqlite3 shell
    try:
        claims.clear()
        seen, held = len(polls), time.monotonic()
        # Held past the busy timeout, so that any write the lock blocked has failed and been logged.
        past = app[SETTINGS].busy_timeout_s + 0.2
        await eventually(
            lambda: len(polls) >= seen + 10 and time.monotonic() - held > past,
            what="ten more polls, and the busy timeout, under the lock",
        )
        assert claims == []
        assert [r.getMessage() for r in caplog.records if "locked" in r.getMessage()] == []
    finally:
        shell.execute("ROLLBACK")
        shell.close()

    # A job stored with no wake and no hand-over (as if its wake were lost): the poll runs it.
    not_idle = [dataclasses.replace(n, idle=False) for n in dispatcher.node_infos()]
    calls.clear()
    [job] = await store.submit(NewJob("task", "found by the poll"), not_idle, "test")
    assert job["state"] == "queued"
    assert (await wait_state(client, job["id"], "done"))["events"][1]["reason"] == "claimed by n1"
    assert claims[:1] == ["n1"]
    first = next(i for i, c in enumerate(calls) if c[0] == "claim")
    assert first > 0 and calls[first - 1] == ("peek", "m:latest")  # asked by the poll that saw the job
