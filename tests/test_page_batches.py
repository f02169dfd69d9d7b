"""A batch on the queue page (issue 37), in real headless Chromium against the real daemon: its
lines folded to one line in their node's queue ("eval-sweep: 0 of 3 done"), unfolded to its
jobs, and cancelled from there."""

from __future__ import annotations

import json

import pytest
from conftest import eventually
from playwright.async_api import expect
from test_page import browser, busy, head, open_queue, page  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

MODEL = "llama3.2:latest"  # node-3's: the lines go there


def line(i: int) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"sweep line {i}"}]}
    return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})


async def test_a_batch_is_one_line_in_its_queue_that_unfolds_to_its_jobs_and_cancels(lab, page):  # noqa: F811
    busy(lab.fakes["node-3"])
    await head(lab, "node-3")  # the batch's lines wait behind it
    status, body = await lab.request(
        "POST", "/api/batches", {"input": "\n".join(line(i) for i in range(3)), "name": "eval-sweep"}
    )
    assert status == 201, body
    batch_id = body["batch"]["id"]
    await open_queue(page, lab)
    folded = page.locator('.col[data-node="node-3"] .batch-line')
    await expect(folded).to_have_count(1)
    await expect(folded.locator("summary")).to_have_text("eval-sweep: 0 of 3 done")
    await expect(folded).to_contain_text("3 of its lines here")
    await folded.locator("summary").click()
    jobs = folded.locator(".batch-jobs li")
    await expect(jobs).to_have_count(3)
    await expect(jobs.first).to_contain_text("c0")
    await folded.get_by_role("button", name="Cancel").click()
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text("Cancels its 3 waiting lines")
    await dialog.get_by_role("button", name="Cancel batch").click()
    await expect(page.locator(".batch-line")).to_have_count(0)

    async def cancelled():
        return (await lab.get(f"/api/batches/{batch_id}"))["batch"]["status"] == "cancelled"

    await eventually(cancelled, 15, what="the batch to be cancelled")
    # The history page names each cancelled line's batch.
    await page.goto(lab.url + "/history")
    rows = page.locator("#history-table tbody tr", has=page.locator(".badge.batch-of"))
    await expect(rows).to_have_count(3)
    await expect(rows.first.locator(".batch-of")).to_have_text("batch eval-sweep")
