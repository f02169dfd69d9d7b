"""The job page follows a job from the queue to its end, in real headless Chromium against the
real daemon and the faithful simulator: a page opened while the job waited (where the CLI's
preview link leads) shows the thinking model's reasoning live once it starts, as a page opened
after the start does; a job that cannot start because its node is down says so, not "starts ?"."""

from __future__ import annotations

import pytest
from conftest import eventually, node_table
from playwright.async_api import expect
from test_page import box_of, browser, busy, card, open_queue, page, screenshot  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

MODEL = "qwen3:8b"  # thinks unless asked not to (Ollama since 0.12.4)
OTHER = "llama3.2:latest"


async def thinking_lab(fakes, daemon_factory):
    fake = await fakes(MODEL, OTHER)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task", "critique"], MODEL)])
    return daemon, fake


async def test_thinking_streams_live_on_a_page_opened_while_the_job_waited(fakes, daemon_factory, page):
    lab, fake = await thinking_lab(fakes, daemon_factory)
    busy(fake)
    [blocker] = await lab.submit("task", "keeps node-1 busy", node="node-1", model=OTHER)
    await lab.wait_state(blocker["id"], "running")
    job = (await lab.submit("task", "plan the export job's retries", node="node-1"))[0]["id"]
    await page.goto(f"{lab.url}/jobs/{job}")
    await expect(page.locator(".job-title .st-queued")).to_be_visible()
    await expect(page.locator("#notice")).to_contain_text("Waiting on node-1")

    # Its turn: its model loads (the job runs, nothing generated yet), then a long, slow
    # reasoning, then a short answer.
    fake.script.load_delay_s = 2
    fake.script.token_delay_s = 0.25
    fake.script.thinking_tokens = 60
    fake.script.tokens = 5
    status, _ = await lab.request("DELETE", f"/api/jobs/{blocker['id']}")
    assert status == 200
    await expect(page.locator(".job-title .st-running")).to_be_visible()

    await expect(page.locator("#thinking-box")).to_be_attached()
    await page.locator("#thinking-box summary").click()
    await expect(page.locator("#thinking")).to_be_visible()

    async def live_thinking():
        shown, chars = await page.evaluate(
            "() => [document.getElementById('thinking').textContent,"
            " document.getElementById('thinking-chars').textContent]"
        )
        assert chars == f"{len(shown):,}", (chars, shown)  # the box's count keeps up with the text
        detail = await lab.job(job)
        held = detail["thinking"] or ""
        if detail["state"] != "running" or not shown or not held:
            return None
        # The page and the API saw the same stream, one a few pieces ahead of the other.
        assert held.startswith(shown) or shown.startswith(held), (shown, held)
        return shown if len(shown.split()) >= 3 else None

    await eventually(live_thinking, 15, what="the reasoning on the page while the job runs")
    await screenshot(page, "job-page-thinking-live.png")
    fake.script.token_delay_s = 0  # seen live: the rest of the reasoning and the answer come at once

    await expect(page.locator(".job-title .st-done")).to_be_visible(timeout=40_000)
    done = await lab.job(job)
    assert done["thinking"]
    await expect(page.locator("#thinking")).to_have_text(done["thinking"])
    await expect(page.locator("#output")).to_have_text(done["output"])


@pytest.mark.parametrize("width", [400, 1400])
async def test_a_job_on_a_down_node_says_why_it_does_not_start(lab, page, width):
    await page.set_viewport_size({"width": width, "height": 900})
    await lab.take_down(lab.fakes["node-3"], "node-3")
    [job] = await lab.submit("task", "waits for node-3 to come back", node="node-3")
    detail = await lab.job(job["id"])
    assert detail["state"] == "queued" and detail["eta_start"] is None
    assert detail["eta_reason"].startswith("node-3 is down")

    await open_queue(page, lab)
    eta = page.locator(f"{card(job['id'])} .eta")
    await expect(eta).to_have_text("starts ? (node down)")
    await expect(eta.locator(".eta-time")).to_have_attribute("title", detail["eta_reason"])
    box, inside = await box_of(eta), await box_of(page.locator(card(job["id"])))
    assert box["x"] + box["width"] <= inside["x"] + inside["width"] + 1, (box, inside)  # not cut off
    await screenshot(page, f"queue-down-node-eta-{width}.png")

    await page.goto(f"{lab.url}/jobs/{job['id']}")
    await expect(page.locator("#f-eta-start")).to_contain_text("not known: node-3 is down")
