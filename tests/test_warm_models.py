"""Warm models for interactive tools: a front-door call's keep_alive (or [front] keep_alive when
the client sends none, never more than [front] max_keep_alive) keeps its model loaded while
nothing else waits for the node, so an editor's next call pays no load; the next job of another
model unloads it first, verified through /api/ps, and a kept time that runs out unloads it too."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import time
import tomllib

import aiohttp
import pytest
import tomli_w
from conftest import eventually, free_port, node_table
from playwright.async_api import expect
from test_front import FrontLab
from test_page import browser, open_queue, page  # noqa: F401 (the page tests' fixtures)

from gpuq.jobs import parse_iso

MODEL = "qwen3:8b"
OTHER = "llama3.2:latest"
LOAD_S = 1.0  # the fake's load time: a call that finds its model warm pays none of it


async def warm_lab(
    fakes, daemon_factory, front: dict | None = None, busy_timeout: str | None = None, **script
) -> FrontLab:
    """One task node, node-1 (qwen3:8b, llama3.2 installed too), behind the front door; `front`:
    the config's [front] table."""
    node = await fakes(MODEL, OTHER, load_delay_s=LOAD_S, tokens=4, **script)
    port = free_port()
    router = {"busy_timeout": busy_timeout} if busy_timeout else {}
    daemon = await daemon_factory(
        [node_table("node-1", node, 1, ["task"], MODEL)], ollama_listen=f"127.0.0.1:{port}", start=False, **router
    )
    if front:
        config = tomllib.loads(daemon.config.read_text())
        daemon.config.write_text(tomli_w.dumps(dict(config, front=front)))
    await daemon.start()
    lab = FrontLab(daemon, f"http://127.0.0.1:{port}", {"node-1": node})
    daemon.fakes = lab.fakes
    await eventually(lambda: lab.models_ready(), 10, what="the front door to know the node's models")
    return lab


def chat(lab: FrontLab, prompt: str, **extra):
    return lab.ollama().chat(model=MODEL, messages=[{"role": "user", "content": prompt}], **extra)


async def warm_of(lab: FrontLab) -> dict | None:
    return next(n for n in (await lab.daemon.get("/api/nodes"))["nodes"] if n["name"] == "node-1")["warm"]


async def kept(lab: FrontLab) -> dict:
    """The node's warm model, once the worker has ended the call (its client may hear the last
    chunk a moment before)."""
    return await eventually(lambda: warm_of(lab), 10, what="the node to show its warm model")


async def metrics(lab: FrontLab) -> str:
    async with lab.daemon.session.get(lab.daemon.url + "/metrics") as resp:
        return await resp.text()


def order(fake) -> list[str]:
    """The node's requests in order: 'gen:<model>', or 'unload:<model>' (an empty chat)."""
    return [("gen:" if r.get("messages") or r.get("prompt") else "unload:") + r["model"] for r in fake.requests]


def loads_noted(fake) -> list[tuple[str, set]]:
    """Each generation the node gets, as (its model, the models loaded when it came), in order."""
    seen: list[tuple[str, set]] = []
    acquire = fake._acquire

    async def noting(name, body, num_ctx):
        seen.append((name, set(fake.loaded)))
        return await acquire(name, body, num_ctx)

    fake._acquire = noting
    return seen


async def test_a_second_call_with_keep_alive_finds_its_model_loaded(fakes, daemon_factory):
    lab = await warm_lab(fakes, daemon_factory)
    fake = lab.fakes["node-1"]
    try:
        first = await chat(lab, "complete this", keep_alive="5m")
        assert first.load_duration >= LOAD_S * 0.9e9  # the cold load
        loaded = fake.loaded[MODEL]  # still loaded after the call: the client's 5m holds
        assert fake.requests[-1]["keep_alive"] == 300
        second = await chat(lab, "and this", keep_alive="5m")
        assert fake.loaded[MODEL] is loaded  # the same runner: not loaded again
        assert second.load_duration < LOAD_S * 0.5e9
        assert [r["model"] for r in fake.requests] == [MODEL, MODEL]  # no unload between them
        assert 'gpuq_warm_hits_total{node="node-1"} 1.0' in await metrics(lab)
    finally:
        await lab.close()


async def test_a_job_of_another_model_unloads_the_warm_one_first(fakes, daemon_factory):
    # Ollama lists a model in /api/ps for a while after its unload: the task's model may load
    # only once /api/ps shows the warm one gone.
    lab = await warm_lab(fakes, daemon_factory, unload="delay", unload_delay_s=0.3)
    fake = lab.fakes["node-1"]
    seen_at_load = loads_noted(fake)
    try:
        await chat(lab, "autocomplete", keep_alive="5m")
        assert (await kept(lab))["model"] == MODEL
        job = (await lab.daemon.submit("task", "a long task", model="llama3.2"))[0]
        await lab.daemon.wait_state(job["id"], "done")
        assert order(fake) == [f"gen:{MODEL}", f"unload:{MODEL}", "gen:llama3.2", "unload:llama3.2"]
        assert seen_at_load[-1] == (OTHER, set())  # nothing in VRAM when the task's model loaded
        assert await warm_of(lab) is None
        await eventually(lambda: fake.loaded == {}, 10, what="the task's model to leave VRAM")
        assert 'gpuq_warm_unloads_total{node="node-1"} 1.0' in await metrics(lab)
        # The task's wait for it is in the task's own events (its history, `gpuq show`, its page).
        events = (await lab.daemon.job(job["id"]))["events"]
        [said] = [e for e in events if "unloaded warm" in (e.get("reason") or "")]
        found = re.fullmatch(rf"unloaded warm {re.escape(MODEL)} first, (\d+\.\d) s", said["reason"])
        assert found and float(found.group(1)) >= 0.2, said  # the fake's 0.3 s unload, measured
        shown = await lab.daemon.cli("show", job["id"])
        assert f"unloaded warm {MODEL} first" in shown.out, shown
    finally:
        await lab.close()


async def test_a_gpuq_task_of_the_same_model_runs_warm_then_unloads_after(fakes, daemon_factory):
    lab = await warm_lab(fakes, daemon_factory)
    fake = lab.fakes["node-1"]
    try:
        await chat(lab, "autocomplete", keep_alive="5m")
        loaded = fake.loaded[MODEL]
        job = (await lab.daemon.submit("task", "a task on the warm model", model=MODEL))[0]
        await lab.daemon.wait_state(job["id"], "done")
        assert fake.requests[-1]["keep_alive"] == 0 and order(fake) == [f"gen:{MODEL}"] * 2
        assert fake.requests[-1]["messages"][0]["content"] == "a task on the warm model"
        assert fake.loaded.get(MODEL) in (None, loaded)  # it ran on the warm runner, no load
        await eventually(lambda: fake.loaded == {}, 10, what="the model to leave VRAM after the task")
        assert await warm_of(lab) is None
    finally:
        await lab.close()


async def test_keep_alive_0_from_the_client_unloads_at_once_even_when_warm(fakes, daemon_factory):
    lab = await warm_lab(fakes, daemon_factory)
    fake = lab.fakes["node-1"]
    try:
        await chat(lab, "warm it", keep_alive="5m")
        loaded = fake.loaded[MODEL]
        second = await chat(lab, "then let it go", keep_alive=0)
        assert second.load_duration < LOAD_S * 0.5e9  # it ran warm
        assert fake.requests[-1]["keep_alive"] == 0
        assert fake.loaded.get(MODEL) in (None, loaded)

        async def gone():
            return await warm_of(lab) is None and fake.loaded == {}

        await eventually(gone, 10, what="the model to leave VRAM at once")
    finally:
        await lab.close()


async def test_a_kept_model_leaves_vram_when_its_time_runs_out(fakes, daemon_factory):
    lab = await warm_lab(fakes, daemon_factory)
    fake = lab.fakes["node-1"]
    try:
        await chat(lab, "briefly", keep_alive="1s")
        warm = await kept(lab)
        assert warm["model"] == MODEL
        assert MODEL in fake.loaded

        async def gone():
            return await warm_of(lab) is None and fake.loaded == {}

        await eventually(gone, 15, what="the kept model to leave VRAM once its second ran out")
        assert 'gpuq_warm_unloads_total{node="node-1"} 1.0' in await metrics(lab)
        assert (await lab.daemon.get("/api/nodes"))["nodes"][0]["vram_stuck"] is None
    finally:
        await lab.close()


async def test_gpuq_nodes_and_api_nodes_show_the_warm_model_and_until_when(fakes, daemon_factory):
    lab = await warm_lab(fakes, daemon_factory)
    try:
        before = time.time()
        await chat(lab, "keep it", keep_alive="10m")
        warm = await kept(lab)
        assert warm["model"] == MODEL
        until = parse_iso(warm["until"])
        assert before + 590 < until < time.time() + 610
        res = await lab.daemon.cli("nodes")
        assert res.code == 0, res.err
        assert f"warm: {MODEL} until {time.strftime('%H:%M', time.localtime(until))}" in res.out
    finally:
        await lab.close()


async def test_the_default_and_the_cap_of_front_keep_alive(fakes, daemon_factory):
    lab = await warm_lab(fakes, daemon_factory, front={"keep_alive": "2m", "max_keep_alive": "15m"})
    fake = lab.fakes["node-1"]
    try:
        await lab.openai().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert fake.requests[-1]["keep_alive"] == 120  # no keep_alive from OpenAI's API: the default
        await chat(lab, "forever", keep_alive=-1)
        assert fake.requests[-1]["keep_alive"] == 900  # forever becomes the cap
        await chat(lab, "an hour", keep_alive="1h")
        assert fake.requests[-1]["keep_alive"] == 900
        await chat(lab, "a minute", keep_alive=60)
        assert fake.requests[-1]["keep_alive"] == 60
    finally:
        await lab.close()


@pytest.mark.browser
async def test_the_node_card_shows_the_warm_model_until_another_job_unloads_it(fakes, daemon_factory, page):
    lab = await warm_lab(fakes, daemon_factory)
    try:
        await open_queue(page, lab.daemon)
        await chat(lab, "keep it", keep_alive="10m")
        # The page gives the time, and the date too when that time is not today (near midnight).
        at = time.localtime(parse_iso((await kept(lab))["until"]))
        today = time.strftime("%Y-%m-%d", at) == time.strftime("%Y-%m-%d")
        until = time.strftime("%H:%M:%S" if today else "%Y-%m-%d %H:%M:%S", at)
        line = page.locator('.col[data-node="node-1"] .col-warm')
        await expect(line).to_have_text(f"warm: {MODEL} until {until}")
        job = (await lab.daemon.submit("task", "another model", model="llama3.2"))[0]
        await lab.daemon.wait_state(job["id"], "done")
        await expect(line).to_have_count(0)
    finally:
        await lab.close()


async def test_a_job_deleted_while_the_warm_model_unloads_still_sees_it_gone_before_the_next(fakes, daemon_factory):
    """The warm model's unload for another model's job is cut short by that job's delete: the
    kept model must still leave VRAM, verified, before the next job's model loads."""
    lab = await warm_lab(fakes, daemon_factory, unload="delay", unload_delay_s=2.0)
    fake = lab.fakes["node-1"]
    seen_at_load = loads_noted(fake)
    try:
        await chat(lab, "warm it", keep_alive="5m")
        await kept(lab)
        [cut] = await lab.daemon.submit("task", "cut short", model=OTHER)
        await eventually(lambda: order(fake)[-1:] == [f"unload:{MODEL}"], 10, what="the warm model's unload asked")
        status, body = await lab.daemon.request("DELETE", f"/api/jobs/{cut['id']}")
        assert status == 200, body
        [after] = await lab.daemon.submit("task", "the next one", model=OTHER)
        await lab.daemon.wait_state(after["id"], "done", timeout=20)
        assert seen_at_load[-1] == (OTHER, set()), seen_at_load  # nothing left in VRAM when it loaded
    finally:
        await lab.close()


async def leave_mid_stream(lab: FrontLab, prompt: str) -> None:
    """An editor's abandoned autocomplete: a streamed call with keep_alive, dropped (its
    connection closed) once its first chunk came."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "keep_alive": "5m"}
    async with aiohttp.ClientSession() as session:
        resp = await session.post(lab.url + "/api/chat", json=body)
        assert resp.status == 200, await resp.text()
        await resp.content.readline()
        resp.close()


async def test_an_abandoned_call_keeps_its_model_warm_for_the_next(fakes, daemon_factory):
    """As Ollama: a request its client cancels does not unload the model; its keep_alive holds,
    so the editor's next autocomplete pays no load (issue 36)."""
    lab = await warm_lab(fakes, daemon_factory)
    fake = lab.fakes["node-1"]
    fake.script.tokens, fake.script.token_delay_s = 400, 0.02
    try:
        await leave_mid_stream(lab, "def expo")
        job = await lab.job_with("def expo", "cancelled")
        await eventually(lambda: fake.in_flight == 0, 10, what="the node's request to end")
        assert (await kept(lab))["model"] == MODEL
        assert MODEL in fake.loaded and order(fake) == [f"gen:{MODEL}"]  # no unload
        assert (await lab.daemon.job(job["id"]))["error"] == "client disconnected"
        fake.script.tokens, fake.script.token_delay_s = 4, 0
        second = await chat(lab, "def export", keep_alive="5m")
        assert second.load_duration < LOAD_S * 0.5e9  # warm: no load
    finally:
        await lab.close()


async def test_a_client_that_leaves_frees_its_node_while_the_database_is_locked(fakes, daemon_factory, tmp_path):
    """The node's request is cut as the client leaves, not once its cancel is committed: a
    database held by another program (the sqlite3 shell) does not keep the node generating for
    no one; the cancel is recorded once the store takes it."""
    lab = await warm_lab(fakes, daemon_factory, busy_timeout="0.2s")
    fake = lab.fakes["node-1"]
    fake.script.tokens, fake.script.token_delay_s = 2000, 0.02  # 40 s if never cut
    try:
        await chat(lab, "warm", keep_alive="5m")
        fake.script.tokens, fake.script.token_delay_s = 2000, 0.02
        shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
        try:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "locked"}], "keep_alive": "5m"}
            async with aiohttp.ClientSession() as session:
                resp = await session.post(lab.url + "/api/chat", json=body)
                await resp.content.readline()
                shell.execute("BEGIN IMMEDIATE")  # from now the router's writes wait, then are refused
                resp.close()
            await eventually(lambda: fake.in_flight == 0, 10, what="the node's request to be cut")
            job = await lab.job_with("locked")
            assert job["state"] == "running"  # not recorded yet: the store is held
        finally:
            shell.execute("ROLLBACK")
            shell.close()
        await lab.job_with("locked", "cancelled")
        fake.script.tokens, fake.script.token_delay_s = 4, 0
        after = await chat(lab, "and the node works on", keep_alive="5m")
        assert after.message.content
    finally:
        await lab.close()


async def post_and_wait(lab: FrontLab, prompt: str) -> None:
    """An editor's streamed autocomplete, read until its task is cancelled (the editor drops it)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "keep_alive": "5m"}
    async with aiohttp.ClientSession() as session, session.post(lab.url + "/api/chat", json=body) as resp:
        async for _ in resp.content:
            pass


async def test_a_call_whose_client_left_before_its_claim_never_reaches_the_node(fakes, daemon_factory, tmp_path):
    """An editor drops a call that waits behind another, and its cancel is not committed before
    the node's worker claims it (here the store is held by the sqlite3 shell, as a loaded machine
    delays the cancel's commit): the job is cancelled with its client's reason and never sent
    (its run row stays, with no request in the node's log); the node's warm model stays loaded,
    and the next kept call pays no load (issue 44)."""
    lab = await warm_lab(fakes, daemon_factory, busy_timeout="0.2s")
    fake = lab.fakes["node-1"]
    try:
        await chat(lab, "warm", keep_alive="5m")
        assert (await kept(lab))["model"] == MODEL
        loads = fake.loads
        fake.script.tokens, fake.script.hold_after = 8, 2  # the next call holds the node until released
        fake.script.released.clear()
        holding = asyncio.create_task(chat(lab, "holding", keep_alive="5m"))
        await lab.job_with("holding", "running")
        dropped = asyncio.create_task(post_and_wait(lab, "dropped"))
        job = await lab.job_with("dropped", "queued")
        shell = sqlite3.connect(tmp_path / "gpuq.db", isolation_level=None)
        try:
            shell.execute("BEGIN IMMEDIATE")  # the cancel's commit waits, then is refused
            dropped.cancel()  # the editor types on: its connection closes
            with pytest.raises(asyncio.CancelledError):
                await dropped
            await eventually(
                lambda: f"job={job['id']} could not be cancelled" in lab.daemon.log.read_text(),
                10,
                what="the cancel to be refused by the held store",
            )
        finally:
            shell.execute("ROLLBACK")
            shell.close()
        fake.script.hold_after = None
        fake.script.released.set()
        await holding  # its finish claims the dropped call's job in the same commit
        ended = await lab.job_with("dropped", "cancelled", "done", "failed")
        assert (ended["state"], ended["error"]) == ("cancelled", "client disconnected")
        assert not [r for r in fake.chat_requests if "dropped" in str(r)]  # never sent to the node
        assert (await kept(lab))["model"] == MODEL and MODEL in fake.loaded
        after = await chat(lab, "the next one", keep_alive="5m")
        assert after.load_duration < LOAD_S * 0.5e9 and fake.loads == loads  # warm: no load
    finally:
        await lab.close()
