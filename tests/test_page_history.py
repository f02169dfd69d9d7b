"""The pages answer what happened today, in real headless Chromium against the real daemon: the
history view (every finished job, paged, filtered by state, node, kind and text, today's
counts per state), each node's busy strip and jobs per hour, failed-today in the header, and
start estimates on the cards and the job page. Screenshots go to test-artifacts/."""

from __future__ import annotations

import re

import pytest
from conftest import eventually
from playwright.async_api import expect
from test_page import browser, busy, card, column, head, open_queue, page, press, screenshot  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

PAGE = 50


async def finished_mix(lab) -> dict[str, list[str]]:
    """A day's work: 55 quick tasks done on node-1, a critique done on node-2, a task failed on
    node-3 (Ollama's error verbatim), and one cancelled while it waited."""
    node1 = lab.fakes["node-1"]
    node1.script.tokens = 3
    done = [(await lab.submit("task", f"batch job {i}", node="node-1"))[0]["id"] for i in range(55)]
    [crit] = await lab.submit("critique", "review the needle-in-a-haystack plan", node="node-2")
    lab.fakes["node-3"].script.load_error = (500, "llama-server reported out-of-memory")
    failed = (await lab.submit("task", "too big for node-3", node="node-3"))[0]["id"]
    await lab.wait_state(failed, "failed")
    lab.fakes["node-3"].script.load_error = None
    busy(lab.fakes["node-3"])
    await head(lab, "node-3", "keeps node-3 busy")
    cancelled = (await lab.submit("task", "never runs", node="node-3"))[0]["id"]
    status, _ = await lab.request("DELETE", f"/api/jobs/{cancelled}")
    assert status == 200
    for job_id in done + [crit["id"]]:
        await lab.wait_state(job_id, "done", timeout=30)
    return {"done": done + [crit["id"]], "failed": [failed], "cancelled": [cancelled]}


async def rows(page) -> list[str]:
    return await page.eval_on_selector_all("#history-table tbody tr", "rs => rs.map(r => r.dataset.id)")


async def shows(page, ids: set[str], what: str) -> None:
    """Wait until the table lists exactly these jobs (a count alone could be the last view's)."""

    async def same():
        return set(await rows(page)) == ids

    await eventually(same, 15, what=what)


async def test_history_view_pages_and_filters_every_finished_job(lab, page):
    jobs = await finished_mix(lab)
    await page.goto(lab.url + "/history")
    today = page.locator("#today")
    await expect(today.locator('[data-state="done"] b')).to_have_text("56")
    await expect(today.locator('[data-state="failed"] b')).to_have_text("1")
    await expect(today.locator('[data-state="cancelled"] b')).to_have_text("1")
    await expect(page.locator("#history-table tbody tr")).to_have_count(PAGE)
    await expect(page.locator("#pager")).to_contain_text("1–50 of 58 · page 1 of 2")
    newest = (await lab.get("/api/history?limit=1"))["jobs"][0]["id"]
    assert (await rows(page))[0] == newest

    await page.locator("#pager .older").click()
    await expect(page.locator("#pager")).to_contain_text("51–58 of 58 · page 2 of 2")
    await expect(page.locator("#history-table tbody tr")).to_have_count(8)
    assert "page=2" in page.url

    await page.locator("#f-state").select_option("failed")
    await shows(page, set(jobs["failed"]), "only the failed job")
    row = page.locator(f'#history-table tr[data-id="{jobs["failed"][0]}"]')
    await expect(row).to_contain_text("llama-server reported out-of-memory")
    await expect(row.locator("a")).to_have_attribute("href", f"/jobs/{jobs['failed'][0]}")
    assert "state=failed" in page.url and "page=" not in page.url
    await screenshot(page, "history-failed.png")

    await page.locator("#f-clear").click()
    await page.locator("#f-kind").select_option("critique")
    await shows(page, {jobs["done"][-1]}, "only the critique")
    await page.locator("#f-kind").select_option("")
    await page.locator("#f-node").select_option("node-3")
    await shows(page, {jobs["failed"][0], jobs["cancelled"][0]}, "only node-3's jobs")
    await page.locator("#f-node").select_option("")
    await page.locator("#f-q").fill("needle-in-a")
    await shows(page, {jobs["done"][-1]}, "the job whose prompt has the words")
    await page.locator("#f-q").fill("no such words anywhere")
    await expect(page.locator("#no-jobs")).to_have_text("No finished job matches these filters.")

    # A link keeps its filters; the day's counts filter too.
    await page.goto(lab.url + "/history?state=cancelled")
    await expect(page.locator("#f-state")).to_have_value("cancelled")
    await shows(page, set(jobs["cancelled"]), "only the cancelled job")
    await page.locator('#today [data-state="done"]').click()
    await expect(page.locator("#pager")).to_contain_text("of 56")

    # Each node over the last hour: busy bars where it ran, jobs per hour.
    util = page.locator("#util")
    await expect(util.locator('.util-text[data-node="node-1"]')).to_contain_text("55 jobs/h")
    await expect(util.locator('.util-text[data-node="node-2"]')).to_contain_text("1 job/h")
    assert await util.locator('svg.strip[data-node="node-1"] rect.strip-busy').count() >= 1
    assert await util.locator('svg.strip[data-node="node-3"] rect.strip-busy').count() >= 1  # running now
    await util.screenshot(path=str(await screenshot(page, "history.png")).replace("history.png", "history-util.png"))
    await page.locator("#f-clear").click()
    await expect(page.locator("#pager")).to_contain_text("1–50 of 58 · page 1 of 2")
    await screenshot(page, "history.png")


async def test_queue_page_shows_failed_today_busy_strips_estimates_and_links_the_history(lab, page):
    node3 = lab.fakes["node-3"]
    node3.script.load_error = (500, "llama-server reported out-of-memory")
    [failed] = await lab.submit("task", "fails", node="node-3")
    await lab.wait_state(failed["id"], "failed")
    node3.script.load_error = None
    node3.script.token_delay_s, node3.script.tokens = 0.05, 60  # 3 s runs: estimates in seconds
    for i in range(2):  # history for the estimates
        [job] = await lab.submit("task", f"timed {i}", node="node-3")
        await lab.wait_state(job["id"], "done")
    busy(node3)
    running = await head(lab, "node-3", "the running head")
    waiting = [(await lab.submit("task", f"waits {i}", node="node-3"))[0]["id"] for i in range(2)]

    await open_queue(page, lab)
    await expect(page.locator("#stat-failed")).to_have_text("1")
    await expect(page.locator("#stat-failed").locator("..")).to_have_class(re.compile(r"\bbad\b"))
    await expect(page.locator("#stat-done")).to_have_text("2")
    col = page.locator(column("node-3"))
    await expect(col.locator(".col-util .util-text")).to_contain_text("3 jobs/h")
    assert await col.locator(".col-util rect.strip-busy").count() >= 1
    await expect(page.locator(f"{card(running)} .eta")).to_have_text(re.compile(r"^ends (now|in ~\d+s)$"))
    for job_id in waiting:
        await expect(page.locator(f"{card(job_id)} .eta")).to_have_text(re.compile(r"^starts (now|in ~\d+s)$"))
    idle = page.locator(column("node-2"))
    await expect(idle.locator(".col-util .util-text")).to_contain_text("0 jobs/h · busy 0%")
    assert await idle.locator(".col-util rect.strip-busy").count() == 0
    await screenshot(page, "queue-estimates-and-strips.png")

    await page.goto(f"{lab.url}/jobs/{waiting[1]}")
    await expect(page.locator("#f-eta-start")).to_contain_text(re.compile(r"(now|in ~\d+s) · \d\d:\d\d:\d\d"))
    await expect(page.locator("#f-eta-finish")).to_contain_text(re.compile(r"in ~\d+s"))
    await screenshot(page, "job-estimate.png")

    await page.goto(lab.url + "/")
    await page.locator("#recent-title a").click()
    await page.wait_for_url("**/history")
    await expect(page.locator("#history-table tbody tr")).to_have_count(3)
    await page.goto(lab.url + "/")
    await page.locator("#stat-failed").click()
    await page.wait_for_url("**/history?state=failed")
    await expect(page.locator("#history-table tbody tr")).to_have_count(1)


async def test_a_job_without_history_says_its_start_is_not_known(lab, page):
    busy(lab.fakes["node-3"])
    await head(lab, "node-3")
    [job] = await lab.submit("task", "no history yet", node="node-3")
    await open_queue(page, lab)
    eta = page.locator(f"{card(job['id'])} .eta .eta-time")
    await expect(eta).to_have_text("?")
    await expect(eta).to_have_attribute("title", re.compile("no finished run on node-3 yet"))
    await page.goto(f"{lab.url}/jobs/{job['id']}")
    await expect(page.locator("#f-eta-start")).to_contain_text("not known: no finished run on node-3 yet")


async def test_history_page_is_served_with_the_pages_csp(lab):
    status, _ = await lab.request("GET", "/history")
    assert status == 200
    async with lab.session.get(lab.url + "/history") as resp:
        assert resp.headers["Content-Security-Policy"].startswith("default-src 'none'; script-src 'self'")
    await eventually(lambda: True)


async def test_a_link_pressed_while_a_job_finishes_still_opens_its_job(lab, page):
    """A job finishes (the table is read again) between the press on a row's link and its
    release: the table is drawn again after the release, so the click still opens the job."""
    lab.fakes["node-1"].script.tokens = 3
    first = (await lab.submit("task", "finished first", node="node-1"))[0]["id"]
    await lab.wait_state(first, "done")
    await page.goto(lab.url + "/history")
    await shows(page, {first}, "the first finished job")
    link = page.locator(f'#history-table tr[data-id="{first}"] a')
    await press(page, link)
    second = (await lab.submit("task", "finished while the link is held", node="node-1"))[0]["id"]
    await lab.wait_state(second, "done")
    await eventually(
        lambda: page.evaluate("(id) => window.gpuqHistory.jobs.some((j) => j.id === id)", second),
        15,
        what="the page to read the second job while the link is held",
    )
    assert await rows(page) == [first]  # drawn after the release
    await page.mouse.up()
    await page.wait_for_url(f"**/jobs/{first}")
    await expect(page.locator(".job-title")).to_contain_text(first)
