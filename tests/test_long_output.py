"""A long streamed job through the real daemon and a fake thinking node: its text is stored in
pieces (one run_chunk row per heartbeat, issue 12), and every way a person reads it back (the
API, the stream's replay, `gpuq show`, `gpuq wait`, the job page in headless Chromium) gives
exactly the text the node streamed, reasoning and answer apart."""

from __future__ import annotations

import json
import sqlite3

import pytest
from conftest import node_table
from playwright.async_api import expect
from test_page import browser, page  # noqa: F401 (fixtures)

MODEL = "qwen3:8b"  # thinks by default, as in Ollama
# Multi-byte characters and newlines, each line numbered: a piece lost, doubled or out of order shows.
REPLY = "".join(f"line {i:02d}: ünïcode “quoted” ✓ word{i}\n" for i in range(30))
TOKEN_DELAY_S = 0.015  # ~200 pieces: about 3 s of streaming, so the router writes several heartbeats


@pytest.fixture
async def streamer(fakes, daemon_factory):
    fake = await fakes(MODEL, token_delay_s=TOKEN_DELAY_S, reply=REPLY, thinking_tokens=50)
    d = await daemon_factory([node_table("gpu", fake, 1, ["task"], MODEL)])
    d.fake = fake
    return d


async def node_streams(d, body: dict) -> tuple[str, str]:
    """What the node streams for the router's request: the same request again, straight to the
    fake (its reply is a function of the request), unpaced."""
    d.fake.script.token_delay_s = 0.0
    thinking, content = [], []
    async with d.session.post(f"{d.fake.url}/api/chat", json={**body, "stream": True}) as resp:
        async for line in resp.content:
            if line.strip():
                message = json.loads(line).get("message") or {}
                thinking.append(message.get("thinking") or "")
                content.append(message.get("content") or "")
    return "".join(thinking), "".join(content)


async def long_job(d) -> tuple[str, str]:
    """Run one long job to its end; its id and the reasoning the node streamed."""
    res = await d.cli("task", "write at length")
    assert res.code == 0, res.err
    job_id = res.out.split()[0]
    job = await d.wait_state(job_id, "done", "failed", timeout=60)
    assert job["state"] == "done", job["error"]
    thinking, content = await node_streams(d, d.fake.chat_requests[-1])
    assert content == REPLY and len(thinking.split()) == 50
    # Stored in pieces as it streamed (heartbeats in between), none of it in the run row itself.
    db = sqlite3.connect(d.config.parent / "gpuq.db")
    try:
        [(chunks,)] = db.execute("SELECT COUNT(*) FROM run_chunk WHERE run_id = ?", (job["run_id"],)).fetchall()
        [row] = db.execute("SELECT output, thinking FROM run WHERE id = ?", (job["run_id"],)).fetchall()
    finally:
        db.close()
    assert chunks >= 3 and row == ("", None), (chunks, row)
    return job_id, thinking


async def test_a_long_jobs_text_reads_back_exactly_as_the_node_streamed_it(streamer):
    d = streamer
    job_id, thinking = await long_job(d)
    job = await d.job(job_id)
    assert (job["output"], job["thinking"]) == (REPLY, thinking)
    [run] = job["runs"]
    assert (run["output"], run["thinking"]) == (REPLY, thinking)
    async with d.session.get(f"{d.url}/api/jobs/{job_id}/stream") as resp:
        replay = [json.loads(line) async for line in resp.content if line.strip()]
    assert (replay[0].get("thinking"), replay[1].get("text")) == (thinking, REPLY)
    shown = await d.cli("show", job_id)
    assert (
        shown.code == 0 and f"\n-- thinking --\n{thinking}\n" in shown.out and f"\n-- output --\n{REPLY}" in shown.out
    )
    waited = await d.cli("wait", job_id)
    assert waited.code == 0 and waited.out.startswith(f"-- thinking --\n{thinking}\n-- answer --\n{REPLY}\n"), (
        waited.out
    )


@pytest.mark.browser
async def test_the_job_page_shows_a_long_jobs_whole_text(streamer, page):  # noqa: F811 (fixture)
    d = streamer
    job_id, thinking = await long_job(d)
    await page.goto(f"{d.url}/jobs/{job_id}")
    await expect(page.locator("#output")).to_have_text(REPLY, use_inner_text=False)
    assert await page.locator("#output").text_content() == REPLY
    assert await page.locator("#thinking").text_content() == thinking
