"""The usage page (/usage, issue 45 item 3) in real headless Chromium against the real daemon:
each node's busy share per step, GPU time by person and by model, each lane's waits, a window
chosen and kept in the URL, at a desktop's width and a phone's (nothing wider than the screen).
Screenshots go to test-artifacts/."""

from __future__ import annotations

import pytest
from conftest import eventually
from playwright.async_api import expect
from test_page import browser, page, screenshot  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser


async def ran(lab) -> None:
    """Two jobs of a half second on node-1 (qwen3-coder), one short one on node-3 (llama3.2)."""
    lab.fakes["node-1"].script.tokens = 10
    lab.fakes["node-1"].script.token_delay_s = 0.05
    lab.fakes["node-3"].script.tokens = 1
    ids = [(await lab.submit("task", f"job {i}", node="node-1"))[0]["id"] for i in range(2)]
    ids.append((await lab.submit("task", "short", node="node-3"))[0]["id"])
    for job_id in ids:
        await lab.wait_state(job_id, "done", timeout=20)


async def keys(page, section: str) -> list[str]:
    return await page.eval_on_selector_all(f"#{section} [data-key]", "rs => rs.map(r => r.dataset.key)")


async def test_usage_page_draws_nodes_people_models_and_lanes_and_keeps_its_window(lab, page):
    await ran(lab)
    await page.goto(lab.url + "/usage")
    await expect(page.locator("#nodes .timeline")).to_have_count(2)
    assert await keys(page, "nodes") == ["node-1", "node-3"]
    shares = await page.eval_on_selector_all(
        '#nodes [data-key="node-1"] rect.busy', "rs => rs.map(r => Number(r.dataset.share))"
    )
    assert shares and all(0 < s <= 1 for s in shares)  # its jobs' hour, busy part of it
    assert await keys(page, "people") == ["(no user)"]  # an open router: no user sent them
    assert await keys(page, "models") == ["qwen3-coder:30b", "llama3.2:latest"]  # the busiest first
    await expect(page.locator("#models .bar").first).to_contain_text("2 jobs")
    await expect(page.locator("#lanes .timeline")).to_have_count(1)
    await expect(page.locator("#lanes .timeline")).to_contain_text("3 jobs")
    assert await page.locator("#lanes rect.p50").count() >= 1
    await expect(page.locator("#scope")).to_have_text("everyone's jobs")
    await screenshot(page, "usage-desktop.png")

    await page.locator("#f-window").select_option("365d")
    assert "window=365d" in page.url

    async def by_day():
        return await page.evaluate("window.gpuqUsage.data && window.gpuqUsage.data.node.step_s") == 86400

    await eventually(by_day, 10, what="the year's usage, by the day")
    await expect(page.locator("#nodes .timeline")).to_have_count(2)


async def test_usage_page_fits_a_phone(lab, browser):  # noqa: F811 (the fixture)
    await ran(lab)
    context = await browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    try:
        phone = await context.new_page()
        problems: list[str] = []
        phone.on("pageerror", lambda exc: problems.append(str(exc)))
        await phone.goto(lab.url + "/usage?window=1d")
        await expect(phone.locator("#nodes .timeline")).to_have_count(2)
        await expect(phone.locator("#models .bar")).to_have_count(2)
        wide = await phone.evaluate("document.documentElement.scrollWidth")
        assert wide <= 390, f"the page is {wide} px wide on a 390 px screen"
        for section in ("nodes", "people", "models", "lanes"):
            box = await phone.locator(f"#{section} svg").first.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390 and box["width"] > 200, section
        await screenshot(phone, "usage-phone.png")
        assert not problems, problems
    finally:
        await context.close()
