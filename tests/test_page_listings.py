"""The pages over listings that carry excerpts (issue 11, item 8), in headless Chromium: the
queue page's cards and recent table show a large prompt's excerpt from /api/queue and
/api/jobs, and the job page shows the whole prompt from /api/jobs/{id}."""

from __future__ import annotations

import pytest
from conftest import eventually
from playwright.async_api import expect
from test_listings import large_prompt
from test_page import browser, busy, card, column, head, open_queue, page  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser


def shown(prompt: str, width: int) -> str:
    """What a card shows of a prompt longer than its excerpt: flattened, cut, marked as cut."""
    return " ".join(prompt[:300].split())[: width - 1] + "…"


async def test_cards_and_recent_rows_show_excerpts_and_the_job_page_the_whole_prompt(lab, page):
    finished = (await lab.submit("task", large_prompt("finished"), node="node-1"))[0]["id"]
    await lab.wait_state(finished, "done")
    busy(lab.fakes["node-3"])
    running = await head(lab, "node-3", large_prompt("running"))
    waiting = (await lab.submit("task", large_prompt("waiting"), node="node-3"))[0]["id"]

    await open_queue(page, lab)
    run_card = page.locator(f"{column('node-3')} .running-slot {card(running)}")
    await expect(run_card.locator(".prompt")).to_have_text(shown(large_prompt("running"), 180))
    await expect(run_card.locator(".tok")).to_contain_text("token")
    wait_card = page.locator(card(waiting))
    await expect(wait_card.locator(".prompt")).to_have_text(shown(large_prompt("waiting"), 180))
    await expect(wait_card.locator(".prompt")).to_have_attribute("title", shown(large_prompt("waiting"), 2000))
    row = page.locator(f'#recent tr[data-id="{finished}"] td.what')
    await expect(row).to_have_text(shown(large_prompt("finished"), 120))

    await page.goto(f"{lab.url}/jobs/{waiting}")
    prompt = page.locator("#prompt")
    await expect(prompt).to_be_visible()
    whole = large_prompt("waiting")
    await eventually(lambda: _text_is(prompt, whole), 15, what="the job page to show the whole prompt")
    await expect(page.locator("#prompt-box .box-head")).to_contain_text(f"{len(whole):,} characters")


async def _text_is(locator, text: str) -> bool:
    return await locator.text_content() == text
