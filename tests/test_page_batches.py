"""A batch on the queue page (issue 37), in real headless Chromium against the real daemon: its
lines folded to one line in their node's queue ("eval-sweep: 0 of 3 done"), unfolded to its
jobs, and cancelled from there."""

from __future__ import annotations

import json

import pytest
from conftest import eventually
from playwright.async_api import expect
from test_page import api_shows, browser, busy, card, drag, head, open_queue, page, page_shows  # noqa: F401 (fixtures)

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


async def test_a_batchs_own_cards_fold_under_its_line_and_the_column_still_drags(lab, page):  # noqa: F811
    """The batch's job cards in the column are hidden while its line is folded (they keep their
    places: positions count them), shown once it unfolds; a job behind them is dragged to the
    head past them, and the router's order is the page's."""
    busy(lab.fakes["node-3"])
    await head(lab, "node-3")
    status, body = await lab.request(
        "POST", "/api/batches", {"input": "\n".join(line(i) for i in range(3)), "name": "eval-sweep"}
    )
    assert status == 201, body
    lines = [j["job_id"] for j in (await lab.get(f"/api/batches/{body['batch']['id']}"))["batch"]["jobs"]]
    task = (await lab.submit("task", "a job behind the sweep", node="node-3"))[0]["id"]
    await open_queue(page, lab)
    await page_shows(page, "node-3", [*lines, task])  # all in their places in the column
    cards = page.locator('.col[data-node="node-3"] .queue > .card')
    visible = page.locator('.col[data-node="node-3"] .queue > .card:visible')
    await expect(visible).to_have_count(1)
    await expect(visible.first.locator(".pos")).to_have_text("4")  # behind the three folded lines
    for job_id in lines:
        await expect(page.locator(card(job_id))).to_be_hidden()

    folded = page.locator('.col[data-node="node-3"] .batch-line')
    await folded.locator("summary").click()
    await expect(visible).to_have_count(4)
    await expect(cards.first).to_contain_text("sweep line 0")
    await folded.locator("summary").click()  # folded again
    await expect(visible).to_have_count(1)

    # Dragged onto the batch's line (above the list): to the head, ahead of the folded lines.
    await drag(page, task, '.col[data-node="node-3"] .batch-line')
    await api_shows(lab, "node-3", [task, *lines])
    await page_shows(page, "node-3", [task, *lines])
    await expect(visible).to_have_count(1)
    await expect(visible.first.locator(".pos")).to_have_text("1")


async def test_a_large_board_scrolls_past_a_folded_batch_and_unfolds_it(lab, page):  # noqa: F811
    """Past 400 waiting jobs on the board it draws only the cards in view: a folded batch's 190
    cards take no room (the jobs behind it are in view at once, the column is not 190 cards of
    blank), and unfolded they are reachable by scrolling, the jobs behind them last."""
    import asyncio

    for node in ("node-1", "node-3"):
        busy(lab.fakes[node])
        await head(lab, node)
    status, body = await lab.request(
        "POST", "/api/batches", {"input": "\n".join(line(i) for i in range(190)), "name": "big-sweep"}
    )
    assert status == 201, body
    behind = [(await lab.submit("task", f"behind the sweep {i}", node="node-3"))[0]["id"] for i in range(2)]
    for chunk in range(0, 220, 20):  # node-1's column: the board passes 400 cards, drawn by the window
        await asyncio.gather(*(lab.submit("task", f"bulk {k}", node="node-1") for k in range(chunk, chunk + 20)))
    await open_queue(page, lab)
    queue = page.locator('.col[data-node="node-3"] .queue')
    visible = page.locator('.col[data-node="node-3"] .queue > .card:visible')
    await page.locator('.col[data-node="node-1"] .more button').click()  # 200 more: 412 on the board
    await expect(page.locator('.col[data-node="node-1"] .queue > .vspace')).not_to_have_count(0)  # windowed
    await expect(visible).to_have_count(2)
    for job_id in behind:
        await expect(page.locator(card(job_id))).to_be_in_viewport()
    await expect(visible.first.locator(".pos")).to_have_text("191")
    folded_height = await queue.evaluate("q => q.scrollHeight")

    await page.locator('.col[data-node="node-3"] .batch-line summary').click()
    await expect(visible.first).to_contain_text("sweep line 0")
    unfolded_height = await queue.evaluate("q => q.scrollHeight")
    assert unfolded_height > folded_height + 100 * 40, (folded_height, unfolded_height)  # 190 cards' room

    async def last_reached():
        await queue.evaluate("q => { q.scrollTop = q.scrollHeight; }")
        return await page.locator(card(behind[-1])).is_visible()

    await eventually(last_reached, 15, what="the last job behind the sweep, scrolled to")
