"""The pages at a phone's width and on desktop screens (issue 16, "Pages"), in real headless
Chromium against the real daemon and fake Ollama nodes: nothing scrolls sideways at 400 px, a
node's column shows nine waiting jobs at 1400x900, dense cards (the model only where it is not
the node's own, a critique's parent id in full), a running critique's thinking and answer
tokens, and the job page's timeout, failed-run tokens, dated events and critique findings.

Screenshots of every page at each width go to test-artifacts/widths/ (or $GPUQ_SHOTS)."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import eventually
from playwright.async_api import Page, expect
from test_page import ARTIFACTS, browser, busy, card, column, critique_of, head, queue_of  # noqa: F401 (browser: a fixture)

pytestmark = pytest.mark.browser

SHOTS = Path(os.environ.get("GPUQ_SHOTS") or ARTIFACTS / "widths")
PHONE = {"viewport": {"width": 400, "height": 860}, "is_mobile": True, "has_touch": True}
LAPTOP = {"viewport": {"width": 1400, "height": 900}}
DESKTOP = {"viewport": {"width": 1920, "height": 1080}}
SEVERITY = {"high": 0, "medium": 1, "low": 2}
WAITING = 11  # tasks waiting on node-1 behind its running head, with a critique after them
STREAMED = 9  # tokens the failing job streams before Ollama's error line

expect.set_options(timeout=15_000)


@pytest.fixture
async def open_at(browser):
    """open_at(size) -> a fresh page of that size, in UTC; a script error or CSP violation fails the test."""
    contexts, problems = [], []

    async def make(size: dict) -> Page:
        context = await browser.new_context(timezone_id="UTC", **size)
        contexts.append(context)
        pg = await context.new_page()
        pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
        pg.on(
            "console",
            lambda msg: problems.append(f"console: {msg.text}") if "Content Security Policy" in msg.text else None,
        )
        return pg

    yield make
    for context in contexts:
        await context.close()
    assert not problems, problems


async def a_busy_day(lab) -> dict:
    """node-1 runs a long task with a critique and WAITING tasks behind it (one for another model);
    node-2, a thinking model, runs a long critique; node-3 is idle after a task that failed part
    way through its reply and one submitted with a 0.5 s timeout. The parent task's first two
    critiques: one done with three findings, one running."""
    lab.fakes["node-1"].models.add("qwen3:8b")  # pulled now; the router sees it at its next health check
    fast = lab.fakes["node-3"]
    fast.script.tokens = 5
    parent = (await lab.submit("task", "add a retry budget to the export job", node="node-3"))[0]["id"]
    await lab.wait_state(parent, "done")
    lab.fakes["node-1"].script.findings = 3
    thinker = lab.fakes["node-2"].script
    thinker.thinking_tokens, thinker.findings, thinker.token_delay_s = 4, 400, 0.3
    first = {c["node"]: c["id"] for c in await critique_of(lab, parent)}
    await lab.wait_state(first["node-1"], "done")
    await lab.wait_state(first["node-2"], "running")

    busy(lab.fakes["node-1"])
    await head(lab, "node-1", "refactor the dispatcher into one worker per node")
    waiting = [
        (
            await lab.submit(
                "task",
                f"write test {i} for the placement rules: the guard, the ranks, "
                "the roles and what a preemption leaves behind",
                node="node-1",
            )
        )[0]["id"]
        for i in range(WAITING - 1)
    ]

    async def submit_other():  # once the router's health check has seen the model pulled above
        status, body = await lab.request(
            "POST",
            "/api/jobs",
            {"kind": "task", "node": "node-1", "model": "qwen3:8b", "prompt": "summarise the incident in a haiku"},
        )
        return body["jobs"][0]["id"] if status == 201 else None

    other = await eventually(submit_other, what="node-1's new model to be seen")
    waiting.append(other)
    second = {c["node"]: c["id"] for c in await critique_of(lab, parent)}

    fast.script.tokens, fast.script.error_after = 30, STREAMED
    failed = (await lab.submit("task", "explain keep_alive: 0 in two sentences", node="node-3"))[0]["id"]
    await lab.wait_state(failed, "failed")
    fast.script.error_after = None
    timed = (await lab.submit("task", "answer within half a second", node="node-3", timeout=0.5))[0]["id"]
    await eventually(lambda: _ended(lab, timed), 20, what="the 0.5 s job to end")
    return {
        "parent": parent,
        "done_critique": first["node-1"],
        "running_critique": first["node-2"],
        "waiting": waiting,
        "other_model": other,
        "waiting_critique": second["node-1"],
        "failed": failed,
        "timed": timed,
    }


async def _ended(lab, job_id: str) -> bool:
    return (await lab.job(job_id))["state"] in ("done", "failed")


def yesterday(db_path: Path, job_id: str) -> str:
    """Move the job's first event to this time yesterday (UTC); returns it as the page shows it."""
    at = time.gmtime(time.time() - 86400)
    db = sqlite3.connect(db_path, timeout=10)
    with db:
        db.execute(
            "UPDATE event SET at = ? WHERE id = (SELECT MIN(id) FROM event WHERE job_id = ?)",
            (time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", at), job_id),
        )
    db.close()
    return time.strftime("%Y-%m-%d %H:%M:%S", at)


# Boxes that scroll sideways on a page: only a table's own box may (the board's columns stack).
SIDEWAYS = """() => [...document.querySelectorAll('body *')].filter(e => e.scrollWidth > e.clientWidth + 1
    && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX) && !e.matches('.table-scroll'))
  .map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.className}: ${e.scrollWidth} px in ${e.clientWidth}`)"""


async def no_sideways_scroll(page: Page, what: str) -> None:
    """Neither the page (measured against the width asked for: a phone zooms out to fit a wider
    page, widening innerWidth with it) nor any box but a table's scrolls sideways."""
    width = page.viewport_size["width"]
    sizes = await page.evaluate("[document.scrollingElement.scrollWidth, window.innerWidth]")
    assert max(sizes) <= width, f"{what} scrolls sideways: {sizes[0]} px wide, {sizes[1]} px window, in {width} px"
    assert await page.evaluate(SIDEWAYS) == [], f"{what}: a box scrolls sideways"


async def shoot(page: Page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / name), full_page=True)


async def open_queue(page: Page, lab, day: dict) -> None:
    await page.goto(lab.url + "/")
    await expect(page.locator("#conn")).to_have_text("live")
    await expect(page.locator(f"{column('node-1')} .queue > .card")).to_have_count(WAITING + 1)
    await expect(page.locator(f'#recent tr[data-id="{day["failed"]}"]')).to_be_visible()


async def every_page_fits(page: Page, lab, day: dict, label: str) -> None:
    """Each page at this size: no sideways scroll; a screenshot of each."""
    await open_queue(page, lab, day)
    await no_sideways_scroll(page, f"the queue page at {label}")
    await shoot(page, f"{label}-queue.png")
    for name, job_id in (
        ("failed", day["failed"]),
        ("parent", day["parent"]),
        ("critique", day["done_critique"]),
        ("running-critique", day["running_critique"]),
    ):
        await page.goto(f"{lab.url}/jobs/{job_id}")
        await expect(page.locator("#events .timeline li").first).to_be_visible()
        await no_sideways_scroll(page, f"the job page of the {name} job at {label}")
        await shoot(page, f"{label}-job-{name}.png")
    await page.goto(lab.url + "/history")
    await expect(page.locator("#history-table tbody tr").first).to_be_visible()
    await no_sideways_scroll(page, f"the history page at {label}")
    await shoot(page, f"{label}-history.png")


async def test_every_page_fits_a_phone_and_wide_screens(lab, open_at):
    day = await a_busy_day(lab)
    for label, size in (("400", PHONE), ("1400", LAPTOP), ("1920", DESKTOP)):
        await every_page_fits(await open_at(size), lab, day, label)


async def test_a_node_column_shows_nine_dense_cards_at_1400(lab, open_at):
    day = await a_busy_day(lab)
    page = await open_at(LAPTOP)
    await open_queue(page, lab, day)
    # In one read (see measure): the board is redrawn as jobs change, and a card read alone could be gone.
    boxes = await measure(
        page,
        f"{column('node-1')} .queue > .card",
        "cs => cs.slice(0, 9).map(c => { const r = c.getBoundingClientRect(); return [r.top, r.bottom, r.right]; })",
        every=True,
    )
    assert len(boxes) == 9
    for i, (top, bottom, right) in enumerate(boxes):
        assert top >= 0 and bottom <= 900 and right <= 1400, f"waiting card {i + 1} is not on the screen: {boxes[i]}"
    assert await page.evaluate("window.scrollY") == 0

    node_model = (await queue_of(lab, "node-1"))["model"]
    for job_id in day["waiting"][:-1]:  # the model is said only where it is not the node's own
        await expect(page.locator(f"{card(job_id)} .card-meta .model")).to_have_count(0)
    await expect(page.locator(f"{card(day['other_model'])} .card-meta .model")).to_have_text("qwen3:8b")
    assert node_model != "qwen3:8b"
    # The prompt comes first, the id under it in a smaller type.
    prompt, jid = await measure(
        page,
        card(day["waiting"][0]),
        "c => [c.querySelector('.prompt'), c.querySelector('.jid')]"
        ".map(e => [e.getBoundingClientRect().top, parseFloat(getComputedStyle(e).fontSize)])",
    )
    assert prompt[0] < jid[0] and jid[1] < prompt[1], (prompt, jid)
    # A critique's parent, in full and inside its card.
    crit = page.locator(card(day["waiting_critique"]))
    await expect(crit.locator(".parent a")).to_have_text(day["parent"])
    link_right, card_right = await measure(
        page,
        card(day["waiting_critique"]),
        "c => [c.querySelector('.parent a').getBoundingClientRect().right, c.getBoundingClientRect().right]",
    )
    assert link_right <= card_right, (link_right, card_right)


async def measure(page: Page, selector: str, read: str, every: bool = False):
    """`read` of the element `selector` finds (of all of them, as an array, with `every`), found
    and read in one turn of the page's script. The board is redrawn as jobs change; Playwright's
    eval_on_selector(_all) finds elements in one call and reads them in the next, by when they
    can be detached: a detached card's box is all zeros (it passes any on-screen check) and its
    font size NaN."""
    find = "[...document.querySelectorAll(selector)]" if every else "document.querySelector(selector)"
    return await page.evaluate(f"selector => ({read})({find})", selector)
