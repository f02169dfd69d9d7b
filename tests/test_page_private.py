"""Private prompts on the pages ([router] private), in real headless Chromium against the real
daemon: a member's queue, job page and history show another user's jobs as "private: <owner>'s
job" placeholders, with no word of their prompts or outputs, and their own jobs whole."""

from __future__ import annotations

import pytest
from playwright.async_api import Page, expect
from test_lanes import TOKENS
from test_page import browser, card, column  # noqa: F401 (browser: a fixture)
from test_page_widths import LAPTOP, open_at  # noqa: F401 (open_at: a fixture)
from test_private import SECRET, private_lab  # noqa: F401 (private_lab: a fixture)

pytestmark = pytest.mark.browser

expect.set_options(timeout=15_000)


async def test_a_member_sees_placeholders_for_anothers_jobs_on_every_page(private_lab, open_at):  # noqa: F811
    d, ids = private_lab, private_lab.ids
    page: Page = await open_at(LAPTOP)
    await page.add_init_script(f"localStorage.setItem('gpuq-token', '{TOKENS['alice']}')")
    await page.goto(d.url + "/")
    await expect(page.locator("#conn")).to_have_text("live")
    running = page.locator(card(ids["running"]))
    await expect(running.locator(".prompt")).to_have_text("private: bob's job")
    await expect(page.locator(f"{card(ids['waiting'])} .prompt")).to_have_text("private: bob's job")
    await expect(page.locator(f"{card(ids['alices'])} .prompt")).to_have_text("alice's own question")
    await expect(page.locator(f"{column('node-1')} .card.queued")).to_have_count(2)
    # bob's job streams: the page counts its tokens (the events carry no text to alice).
    await expect(running.locator(".tok")).not_to_have_text("0 tokens")
    assert SECRET not in await page.content()

    await page.goto(f"{d.url}/jobs/{ids['running']}")
    await expect(page.locator("#private-notice")).to_contain_text("private: bob's job.")
    await expect(page.locator("#f-owner")).to_have_text("bob")
    await expect(page.locator("#f-tokens")).not_to_have_text("–")
    # Its count goes on from the events (which carry no text), without a reload.
    counted = int((await page.locator("#f-tokens").text_content()).replace(",", ""))
    await expect(page.locator("#f-tokens")).not_to_have_text(f"{counted:,}")
    for box in ("#prompt", "#output", "#runs", "#events", "#actions button"):
        await expect(page.locator(box)).to_have_count(0)
    assert SECRET not in await page.content() and d.output[:60] not in await page.content()

    await page.goto(f"{d.url}/jobs/{ids['alices']}")
    await expect(page.locator("#prompt")).to_have_text("alice's own question")
    await expect(page.locator("#private-notice")).to_have_count(0)

    await page.goto(f"{d.url}/history")
    row = page.locator(f'tr[data-id="{ids["done"]}"]')
    await expect(row.locator("td.what")).to_have_text("private: bob's job")
    await expect(row.locator("td.owner")).to_have_text("bob")
    content = await page.content()
    assert SECRET not in content and d.output[:60] not in content
