"""The job page of a job whose text retention pruned (issue 35), in real headless Chromium against
the real daemon: it says "output pruned on <date> (retention)" where the output was, never an
empty box that looks like a job that produced nothing; its record (prompt, runs, events) stays."""

from __future__ import annotations

import re
import signal

import pytest
from conftest import node_table
from playwright.async_api import expect
from test_page import browser, page  # noqa: F401 (fixtures)
from test_retention import age

pytestmark = pytest.mark.browser

MODEL = "qwen3-coder:30b"


async def test_the_job_page_says_its_output_was_pruned(fakes, daemon_factory, page):
    fake = await fakes(MODEL, tokens=6, thinking_tokens=0)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)])
    asked = "summarise last month's incidents: " + "the disk filled, the backup was late; " * 20
    [old] = await daemon.submit("task", asked)
    [new] = await daemon.submit("task", "summarise this week's incidents")
    for job in (old, new):
        await daemon.wait_state(job["id"], "done")
    await daemon.kill(signal.SIGTERM)
    age(daemon.config.parent / "gpuq.db", [old["id"]], 40)
    await daemon.start()
    status, swept = await daemon.request("POST", "/api/prune", {})
    assert status == 200 and swept["pruned"]["jobs"] == 1, swept

    await page.goto(f"{daemon.url}/jobs/{old['id']}")
    await expect(page.locator("#output")).to_have_text(
        re.compile(r"^\(output pruned on \d{4}-\d\d-\d\d \(retention\)\)$")
    )
    await expect(page.locator("#output-box .box-head")).to_contain_text("dropped by retention")
    await expect(page.locator("#prompt")).to_have_text(asked[:300])  # the rest is in the archive
    await expect(page.locator("#prompt-note")).to_have_text(
        re.compile(r"^prompt kept to its first 300 characters on \d{4}-\d\d-\d\d \(retention\)$")
    )
    await page.goto(f"{daemon.url}/jobs/{new['id']}")
    await expect(page.locator("#output")).not_to_contain_text("pruned")
    await expect(page.locator("#output")).not_to_be_empty()
