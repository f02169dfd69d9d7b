"""A stuck queue never looks healthy when the store is the trouble: a write lock held in the
sqlite3 shell while a node goes down, a store that does not answer at all, waiting jobs that
nothing can claim. /health tells what the router knows in memory, answers within a second
whatever the store does, and a submit's wait is bounded."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import sys
import time

import pytest
from conftest import eventually, node_table

from gpuq.demo import FakeOllama, Script

HEALTH_BOUND_S = 3.0  # the router answers in ~0.5 s at most; a frozen store held the old one ~10 s: the bound tells them apart on a busy 2-core machine too


async def timed_health(d) -> tuple[int, dict]:
    started = time.monotonic()
    status, body = await d.request("GET", "/health")
    took = time.monotonic() - started
    assert took < HEALTH_BOUND_S, f"/health took {took:.2f}s: {body}"
    return status, body


async def red(d, test, what: str, timeout: float = 10.0) -> dict:
    """Poll /health (each answer within the bound) until it is red and `test(body)` holds."""

    async def check():
        status, body = await timed_health(d)
        return body if status == 503 and body["ok"] is False and test(body) else None

    return await eventually(check, timeout, 0.1, what)


async def green(d, timeout: float = 20.0) -> dict:
    async def check():
        status, body = await d.request("GET", "/health")
        return body if status == 200 else None

    return await eventually(check, timeout, 0.1, "/health to be green again")


def node_row(path) -> dict:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    db.row_factory = sqlite3.Row
    try:
        return dict(db.execute("SELECT * FROM node WHERE name = 'node-1'").fetchone())
    finally:
        db.close()


async def test_a_write_locked_store_and_a_node_going_down_turn_health_red_naming_both(fakes, daemon_factory, tmp_path):
    fake = await fakes("qwen3-coder:30b")
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], busy_timeout="0.3s")
    [job] = await d.submit("task", "before the shell")
    await d.wait_state(job["id"], "done")
    assert (await timed_health(d))[0] == 200
    shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")  # a person doing forensics in the sqlite3 shell
    try:
        await fake.stop()  # the node goes down: the router cannot record it
        body = await red(d, lambda b: b["store"] and b["nodes_down"], "/health to name the lock and the node")
        assert body["store"]["problem"].startswith("the database refuses writes")
        assert "locked by another process" in body["store"]["problem"]
        [down] = body["nodes_down"]
        assert down["name"] == "node-1" and down["recorded"] is False and "cannot connect" in down["error"]
        [node] = (await d.get("/api/nodes"))["nodes"]
        assert node["up"] is False and node["health_recorded"] is False
        # It stays red while the lock is held, every probe answered within the bound.
        for _ in range(10):
            status, body = await timed_health(d)
            assert status == 503 and body["store"] is not None
    finally:
        shell.execute("ROLLBACK")
        shell.close()
    # The lock is gone: the node's health is recorded, and /health is green (no job waits).
    await eventually(lambda: node_row(tmp_path / "gpuq.db")["up"] == 0, 10, what="node-1 recorded down")
    body = await green(d)
    assert body["store"] is None and "recorded" not in body["nodes_down"][0]


# The WAL-index lock bytes of the -shm file (SQLite's WAL_WRITE_LOCK .. WAL_READ_LOCK(4), at
# offset 120). Another process holding them all exclusively is what a process stopped in the
# middle of WAL recovery leaves: every read and every write of the router's (both connections)
# waits ~10 s in SQLite's own retry loop, then fails, and the next call waits again. It is how a
# frozen disk looks to the router (each call hangs), made real and deterministic without
# fsfreeze: the helper holds the locks until its stdin closes.
HOLD_WAL_LOCKS = (
    "import fcntl, sys; f = open(sys.argv[1], 'r+b'); fcntl.lockf(f, fcntl.LOCK_EX, 8, 120);"
    " print('held', flush=True); sys.stdin.read()"
)


async def test_a_store_that_does_not_answer_health_answers_within_a_second_and_a_submit_is_bounded(
    fakes, daemon_factory, tmp_path
):
    fake = await fakes("qwen3-coder:30b")
    d = await daemon_factory(
        [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], busy_timeout="0.5s", submit_timeout="0.5s"
    )
    [acked] = await d.submit("task", "acknowledged before the freeze")
    await d.wait_state(acked["id"], "done")
    helper = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        HOLD_WAL_LOCKS,
        str(tmp_path / "gpuq.db-shm"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert (await asyncio.wait_for(helper.stdout.readline(), 10)).strip() == b"held"
        body = await red(
            d,
            lambda b: b["store"] and "not answering" in b["store"]["problem"],
            "/health to say the store is not answering",
        )
        assert body["store"]["problem"].startswith("the database is not answering")
        started = time.monotonic()
        status, refused = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": "during the freeze"})
        waited = time.monotonic() - started
        assert status == 503, refused
        message = refused["error"]["message"]
        assert message.startswith("the database did not take the submit within 0.5s (router.submit_timeout): ")
        assert "the database is not answering: a " in message and message.endswith("; nothing was changed")
        assert waited < 2.0, f"the submit waited {waited:.1f}s"
        for _ in range(5):  # still answered within the bound, still red
            status, body = await timed_health(d)
            assert status == 503 and "not answering" in body["store"]["problem"]
    finally:
        helper.stdin.close()
        await helper.wait()
    await green(d, 30)
    jobs = (await d.get("/api/jobs?limit=100"))["jobs"]
    assert [j["id"] for j in jobs] == [acked["id"]]  # the acknowledged job kept, the refused one absent
    [after] = await d.submit("task", "after the freeze")
    await d.wait_state(after["id"], "done", timeout=15)


async def test_jobs_waiting_on_an_up_idle_node_that_cannot_claim_them_turn_health_red_naming_both(
    fakes, daemon_factory, tmp_path
):
    fake = await fakes("qwen3-coder:30b")
    port = fake.port
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], busy_timeout="0.2s")
    await d.take_down(fake, "node-1")
    jobs = [(await d.submit("task", f"waits {i}"))[0] for i in range(3)]
    shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")  # the store refuses every claim, as a full disk does
    try:
        await fake.start(port=port)

        def names_the_head(body):
            return [(u["node"], u["job"]) for u in body["unclaimed"]] == [("node-1", jobs[0]["id"])]

        body = await red(
            d, lambda b: not b["nodes_down"] and names_the_head(b), "/health to name the node whose jobs nothing claims"
        )
        assert body["queue_depth"] == 3 and body["running"] == 0 and body["stale"] == []
        assert "locked by another process" in body["unclaimed"][0]["error"]
    finally:
        shell.execute("ROLLBACK")
        shell.close()
    for job in jobs:
        await d.wait_state(job["id"], "done", timeout=20)
    body = await green(d)
    assert body["unclaimed"] == []


async def test_an_ending_refused_by_the_store_lands_once_it_takes_writes_again(fakes, daemon_factory, tmp_path):
    fake = await fakes("qwen3-coder:30b")
    d = await daemon_factory(
        [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")],
        busy_timeout="0.2s",
        stale_grace="0.3s",
        unload="when-idle",
    )
    fake.script.token_delay_s = 0.05
    fake.script.tokens = 20
    [job] = await d.submit("task", "ends while the store refuses writes")
    [nxt] = await d.submit("task", "waits behind it")
    await d.wait_state(job["id"], "running")
    shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    try:
        refused = f"job={job['id']} end of stream not recorded yet"
        await eventually(lambda: refused in d.log.read_text(), 20, 0.05, "the refused end of stream")
        await red(d, lambda b: b["store"] is not None, "/health to name the refusing store")
    finally:
        shell.execute("ROLLBACK")
        shell.close()
    done = await d.wait_state(job["id"], "done", timeout=20)
    assert len(done["output"].split()) == 20
    await d.wait_state(nxt["id"], "done", timeout=20)
    body = await green(d)
    assert body["stale"] == [] and body["running"] == 0
    assert len(fake.chat_requests) == 2  # nothing ran twice


class ShowHeld(FakeOllama):
    """A node whose /api/show waits for the test: the worker asks it between recording the end
    of the stream and closing the job, which opens a window to freeze the store in."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.show_asked = asyncio.Event()
        self.show_gate = asyncio.Event()

    async def _show(self, request):
        self.show_asked.set()
        await self.show_gate.wait()
        return await super()._show(request)


async def test_a_job_whose_ending_meets_a_frozen_store_is_closed_with_its_output_once_it_answers(
    daemon_factory, tmp_path
):
    # "when-idle" reads the next job's model before closing the job; a store that does not
    # answer that read used to crash the ending, whose one try to fail the job was refused too:
    # the job stayed running with its work done ("ollama finished but the job was not closed")
    # until a restart. Each call of the frozen store waits ~10 s (SQLite's own retry loop).
    fake = ShowHeld(models={"qwen3-coder:30b"}, script=Script())
    await fake.start()
    try:
        d = await daemon_factory(
            [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")],
            busy_timeout="0.5s",
            stale_grace="0.3s",
            unload="when-idle",
        )
        [job] = await d.submit("task", "ends as the store freezes")
        await eventually(fake.show_asked.is_set, 15, what="the worker to ask /api/show after the stream")
        helper = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            HOLD_WAL_LOCKS,
            str(tmp_path / "gpuq.db-shm"),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert (await asyncio.wait_for(helper.stdout.readline(), 10)).strip() == b"held"
            fake.show_gate.set()
            lines = (f"job={job['id']} outcome not recorded yet", f"job={job['id']} node=node-1 could not record")
            await eventually(
                lambda: any(line in d.log.read_text() for line in lines),
                40,
                0.1,
                "the store to refuse the job's ending",
            )
        finally:
            helper.stdin.close()
            await helper.wait()
        done = await d.wait_state(job["id"], "done", timeout=30)
        assert done["output"] and done["output"] == "".join(done["runs"][-1]["output"])
        body = await green(d, 30)
        assert body["stale"] == [] and body["running"] == 0
        assert len(fake.chat_requests) == 1
    finally:
        await fake.stop()


@pytest.mark.browser
async def test_the_queue_page_names_a_store_that_does_not_answer(fakes, daemon_factory, tmp_path):
    """A frozen store holds every read for ~10 s at a time: the page still shows /health's truth
    (it fetches each part apart, and the router bounds its other reads), not a page that waits."""
    from playwright.async_api import async_playwright, expect
    from test_page import CHROMIUM_ARGS, slow_poll_now

    fake = await fakes("qwen3-coder:30b")
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], busy_timeout="0.5s")
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=shutil.which("chromium") or "/usr/bin/chromium", args=CHROMIUM_ARGS
        )
        helper = None
        try:
            page = await browser.new_page()
            await page.clock.install()  # the test's clock: the page's slow poll is brought forward
            await page.goto(d.url + "/")
            await expect(page.locator("#conn")).to_have_text("live")
            helper = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                HOLD_WAL_LOCKS,
                str(tmp_path / "gpuq.db-shm"),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            assert (await asyncio.wait_for(helper.stdout.readline(), 10)).strip() == b"held"
            await red(
                d,
                lambda b: b["store"] and "not answering" in b["store"]["problem"],
                "/health to say the store is not answering",
            )
            await slow_poll_now(page)  # a refresh that began with the store frozen is on the screen
            alert = page.locator("[data-store=trouble]")
            await expect(alert).to_contain_text("the database is not answering")
            status, body = await d.request("GET", "/api/queue")  # bounded: a 503 naming why, not a wait
            assert status == 503 and body["error"]["message"].startswith("the database did not answer within 5s")
        finally:
            if helper is not None:
                helper.stdin.close()
                await helper.wait()
            await browser.close()
    await green(d, 30)


async def test_a_refused_claim_that_succeeds_while_health_reads_is_not_named_and_health_answers(fakes, tmp_path):
    """In-process, to time the race exactly: /health picks the nodes whose claims the store
    refused, then reads the store; a claim that succeeds meanwhile clears the refusal. /health
    answers (it was a 500) and names no unclaimed node: the queue moves again."""
    from aiohttp.test_utils import TestClient, TestServer

    from gpuq.api.app import create_app
    from gpuq.api.state import DISPATCHER, STORE
    from gpuq.config import NodeConfig, Settings

    fake = await fakes("qwen3-coder:30b")
    port = fake.port
    settings = Settings(
        database=tmp_path / "gpuq.db",
        health_interval_s=0.1,
        busy_timeout_s=0.2,
        nodes=(NodeConfig("n", fake.url, 1, ("task",), "qwen3-coder:30b"),),
    )
    client = TestClient(TestServer(create_app(settings), host="127.0.0.1"))
    await client.start_server()
    shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
    try:
        app = client.server.app
        store, worker = app[STORE], app[DISPATCHER].workers["n"]
        await fake.stop()
        await eventually(lambda: not worker.rt.up, what="node n to be seen down")
        resp = await client.post("/api/jobs", json={"kind": "task", "prompt": "waits for a claim"})
        assert resp.status == 201
        shell.execute("BEGIN IMMEDIATE")  # the store refuses every claim, as a full disk does
        await fake.start(port=port)
        await eventually(
            lambda: worker.claim_refused is not None and worker.rt.claimable, what="a claim refused on the up node"
        )
        real_next_ready = store.next_ready

        async def claimed_meanwhile(node: str):
            # What the worker's next claim does when it lands (within /health's read bound, which
            # a real claim's retry would outlast): its refusal is cleared.
            worker.claim_refused = None
            return await real_next_ready(node)

        store.next_ready = claimed_meanwhile
        resp = await client.get("/health")
        body = await resp.json()
        assert resp.status in (200, 503) and "unclaimed" in body, body
        assert body["unclaimed"] == []
    finally:
        if shell.in_transaction:
            shell.execute("ROLLBACK")
        shell.close()
        await client.close()
