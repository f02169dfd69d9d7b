"""Owners and lanes on the pages (issue 26), in real headless Chromium at a phone's width and a
laptop's, against the real daemon with two users: each card shows who sent it (and an
interactive job its badge), a held job says its owner's max_running holds it, the job page shows
owner, client and lane, and history shows the owner."""

from __future__ import annotations

import pytest
from conftest import node_table
from playwright.async_api import Page, expect
from test_lanes import TOKENS, bearer, with_users
from test_page import browser, busy, card, column  # noqa: F401 (browser: a fixture)
from test_page_widths import LAPTOP, PHONE, no_sideways_scroll, open_at  # noqa: F401 (open_at: a fixture)

pytestmark = pytest.mark.browser

expect.set_options(timeout=15_000)


async def submit_as(daemon, user: str, prompt: str, **extra) -> str:
    status, body = await daemon.request(
        "POST",
        "/api/jobs",
        {"kind": "task", "prompt": prompt, **extra},
        headers={**bearer(user), "User-Agent": f"{user}-sweeper/2.1"},
    )
    assert status == 201, body
    return body["jobs"][0]["id"]


@pytest.fixture
async def two_users(fakes, daemon_factory):
    """node-1 busy with alice's long task; waiting behind it: alice's batch task and bob's
    interactive one (ahead of it: [router] interactive_preempts is off here, so it waits rather
    than interrupting). On node-2 (free), alice's second batch task, held by her max_running of
    1; alice's quick task done earlier, in history."""
    f1 = await fakes("qwen3-coder:30b", tokens=3)
    f2 = await fakes("qwen3-coder:30b")
    daemon = await daemon_factory(
        [
            node_table("node-1", f1, 1, ["task"], "qwen3-coder:30b"),
            node_table("node-2", f2, 2, ["task"], "qwen3-coder:30b"),
        ],
        start=False,
        stall_timeout="120s",
        interactive_preempts=False,
    )
    await with_users(
        daemon,
        [
            {"name": "admin", "token": TOKENS["admin"], "role": "admin"},
            {"name": "alice", "token": TOKENS["alice"], "max_running": 1},
            {"name": "bob", "token": TOKENS["bob"]},
        ],
    )
    daemon.fakes = {"node-1": f1, "node-2": f2}
    ids = {"done": await submit_as(daemon, "alice", "alice's quick one", node="node-1")}
    await daemon.wait_state(ids["done"], "done")
    busy(f1)
    ids["running"] = await submit_as(daemon, "alice", "alice's long sweep step", node="node-1")
    await daemon.wait_state(ids["running"], "running")
    ids["batch"] = await submit_as(daemon, "alice", "alice's next step", node="node-1")
    ids["interactive"] = await submit_as(
        daemon, "bob", "bob asks a quick question", node="node-1", priority="interactive"
    )
    ids["held"] = await submit_as(daemon, "alice", "alice's other step", node="node-2")
    daemon.ids = ids
    return daemon


@pytest.mark.parametrize("size", [PHONE, LAPTOP], ids=["400px", "1400px"])
async def test_cards_job_page_and_history_show_owner_client_and_lane(two_users, open_at, size):
    daemon, ids = two_users, two_users.ids
    page: Page = await open_at(size)
    # The lab's admin looks: the page keeps the token as a person's paste into its form does.
    await page.add_init_script(f"localStorage.setItem('gpuq-token', '{TOKENS['admin']}')")
    await page.goto(daemon.url + "/")
    await expect(page.locator("#conn")).to_have_text("live")
    queued = page.locator(f"{column('node-1')} .card.queued")
    await expect(queued).to_have_count(2)
    # bob's interactive job waits first, with its badge; alice's batch job behind it, without one.
    await expect(queued.nth(0)).to_have_attribute("data-id", ids["interactive"])
    await expect(page.locator(f"{card(ids['interactive'])} .owner")).to_have_text("bob")
    await expect(page.locator(f"{card(ids['interactive'])} .badge.lane-interactive")).to_have_text("interactive")
    await expect(page.locator(f"{card(ids['batch'])} .owner")).to_have_text("alice")
    await expect(page.locator(f"{card(ids['batch'])} .badge.lane-interactive")).to_have_count(0)
    await expect(page.locator(f"{card(ids['running'])} .owner")).to_have_text("alice")
    held = page.locator(card(ids["held"]))
    await expect(held.locator(".owner")).to_have_text("alice")
    await expect(held.locator(".badge.held")).to_have_text("max running")
    await expect(held.locator(".eta")).to_contain_text("starts")
    await no_sideways_scroll(page, "the queue page")

    await page.goto(f"{daemon.url}/jobs/{ids['interactive']}")
    await expect(page.locator("#f-owner")).to_have_text("bob")
    await expect(page.locator("#f-lane")).to_have_text("interactive")
    await expect(page.locator("#f-client")).to_have_text("bob-sweeper/2.1")
    await no_sideways_scroll(page, "the job page")

    await page.goto(f"{daemon.url}/history")
    row = page.locator(f'tr[data-id="{ids["done"]}"]')
    await expect(row.locator("td.owner")).to_have_text("alice")
    await no_sideways_scroll(page, "the history page")
