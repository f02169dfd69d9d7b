"""The queue page by touch (issue 24): HTML5 drag has no touch, so each waiting card has ↑ / ↓
buttons and a "Move to…" choice of the other nodes that take it; the node-down banner moves the
down node's waiting jobs elsewhere; stacked columns put a down node with waiting jobs first; the
top bar says while the router keeps the machine awake. Real headless Chromium at a phone's
400 px (touch, Playwright's tap) and at 1400 px (a mouse), against the real daemon and fakes."""

from __future__ import annotations

import pytest
from conftest import eventually, node_table
from playwright.async_api import Page, expect
from test_awake import no_systemd, stand_ins
from test_page import (  # noqa: F401 (browser: a fixture)
    GUARD,
    api_shows,
    box_of,
    browser,
    busy,
    card,
    column,
    head,
    node2_down_with_two_critiques,
    page_shows,
    queued_ids,
    screenshot,
    shown_after_now,
    slow_poll_now,
)
from test_page_widths import LAPTOP, PHONE, no_sideways_scroll, open_at  # noqa: F401 (open_at: a fixture)

pytestmark = pytest.mark.browser

SIZES = pytest.mark.parametrize("size", [PHONE, LAPTOP], ids=["400px", "1400px"])

expect.set_options(timeout=15_000)


def touch(size: dict) -> bool:
    return bool(size.get("has_touch"))


async def tap_or_click(page: Page, selector: str, size: dict) -> None:
    if touch(size):
        await page.locator(selector).tap()
    else:
        await page.locator(selector).click()


async def open_queue(page: Page, daemon, nodes: int) -> None:
    await page.goto(daemon.url + "/")
    await expect(page.locator("#conn")).to_have_text("live")
    await expect(page.locator(".col")).to_have_count(nodes)


@SIZES
async def test_up_down_and_move_to_another_node_by_touch(lab, open_at, size):
    page = await open_at(size)
    busy(lab.fakes["node-1"])
    busy(lab.fakes["node-3"])
    await head(lab, "node-1")
    await head(lab, "node-3")
    a, b, c = [(await lab.submit("task", f"node-3 job {x}", node="node-3"))[0]["id"] for x in "abc"]
    await open_queue(page, lab, 3)
    await page_shows(page, "node-3", [a, b, c])
    if touch(size):
        await no_sideways_scroll(page, "the queue page with touch actions at 400 px")
    # The first card cannot go up, the last cannot go down.
    await expect(page.locator(f'{card(a)} button[aria-label="Move {a} up"]')).to_be_disabled()
    await expect(page.locator(f'{card(c)} button[aria-label="Move {c} down"]')).to_be_disabled()
    if touch(size):  # big enough for a finger, and shown without a hover
        box = await box_of(page.locator(f'{card(b)} button[aria-label="Move {b} up"]'))
        assert box["height"] >= 36 and box["width"] >= 36, box
        await expect(page.locator(f"{card(b)} select.move-to")).to_be_visible()
    await screenshot(page, f"touch-queue-{size['viewport']['width']}.png")

    await tap_or_click(page, f'{card(c)} button[aria-label="Move {c} up"]', size)
    await api_shows(lab, "node-3", [a, c, b])
    await shown_after_now(page)
    await page_shows(page, "node-3", [a, c, b])

    await tap_or_click(page, f'{card(a)} button[aria-label="Move {a} down"]', size)
    await api_shows(lab, "node-3", [c, a, b])
    await shown_after_now(page)
    await page_shows(page, "node-3", [c, a, b])
    events = (await lab.job(a))["events"]
    assert events[-1]["actor"].startswith("page "), events[-1]

    # "Move to…" lists the other nodes that take tasks: node-1, not node-2 (critiques only).
    options = await page.eval_on_selector_all(f"{card(a)} select.move-to option", "os => os.map(o => o.value)")
    assert options == ["", "node-1"]
    await page.locator(f"{card(a)} select.move-to").select_option("node-1")
    await api_shows(lab, "node-1", [a])
    await api_shows(lab, "node-3", [c, b])
    await shown_after_now(page)
    await page_shows(page, "node-1", [a])
    await page_shows(page, "node-3", [c, b])
    assert (await lab.job(a))["placement"] == "moved"
    await expect(page.locator("#toasts .toast")).to_have_count(0)


@SIZES
async def test_a_refused_move_shows_the_409_and_keeps_the_order(lab, open_at, size):
    page = await open_at(size)
    await page.clock.install()  # the test's clock: the page's slow poll is brought forward
    first, crit = await node2_down_with_two_critiques(lab)
    await open_queue(page, lab, 3)
    await page_shows(page, "node-2", [first, crit])

    await page.locator(f"{card(crit)} select.move-to").select_option("node-1")
    await expect(page.locator("#toasts")).to_contain_text(GUARD)
    await expect(page.locator("#toasts")).to_contain_text("409")
    await slow_poll_now(page)  # a refusal changes nothing: no live event, the slow poll reads again
    await page_shows(page, "node-2", [first, crit])
    assert await queued_ids(lab, "node-2") == [first, crit]


@SIZES
async def test_the_node_down_banner_moves_its_jobs_and_names_refusals(lab, open_at, size):
    page = await open_at(size)
    first, crit = await node2_down_with_two_critiques(lab)
    await open_queue(page, lab, 3)
    await page_shows(page, "node-2", [first, crit])
    banner = page.locator('.alert.down[data-node="node-2"]')
    await expect(banner).to_contain_text("2 jobs waiting on it")

    # Stacked at 400 px, the down node with jobs waiting comes first; side by side, rank order.
    boxes = {n: await box_of(page.locator(column(n))) for n in ("node-1", "node-2", "node-3")}
    if touch(size):
        assert boxes["node-2"]["y"] < boxes["node-1"]["y"] < boxes["node-3"]["y"], boxes
    else:
        assert boxes["node-1"]["x"] < boxes["node-2"]["x"] < boxes["node-3"]["x"], boxes

    await screenshot(page, f"touch-node-down-{size['viewport']['width']}.png")
    await banner.locator("select").select_option("node-1")
    await tap_or_click(page, '.alert.down[data-node="node-2"] button.move-all', size)

    # The unrelated critique moves (and runs there); the parent's critique is refused by the guard.
    async def moved():
        return (await lab.job(first))["node"] == "node-1"

    await eventually(moved, 15, what=f"{first} to be moved to node-1")
    toast = page.locator("#toasts")
    await expect(toast).to_contain_text("Moved 1 job from node-2 to node-1")
    await expect(toast).to_contain_text(f"could not move {crit}")
    await expect(toast).to_contain_text(GUARD)
    assert await queued_ids(lab, "node-2") == [crit]
    await shown_after_now(page)
    await page_shows(page, "node-2", [crit])
    await expect(banner).to_contain_text("1 job waiting on it")


@SIZES
async def test_the_top_bar_says_while_the_machine_is_kept_awake(fakes, daemon_factory, open_at, tmp_path, size):
    env, _ = stand_ins(tmp_path)
    fake = await fakes("qwen3-coder:30b", token_delay_s=0.05, tokens=2000)
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], env=env)
    page = await open_at(size)
    await page.clock.install()  # the test's clock: the page's slow poll is brought forward
    await open_queue(page, d, 1)
    awake = page.locator("#awake")
    await shown_after_now(page)
    await expect(awake).to_be_hidden()  # idle: nothing held, nothing said

    [job] = await d.submit(prompt="a long one")
    await d.wait_state(job["id"], "running")
    await expect(awake).to_be_visible()
    await expect(awake).to_contain_text("keeping this machine awake (systemd-inhibit) since")
    await expect(awake).not_to_have_class("awake warn")
    if touch(size):
        await no_sideways_scroll(page, "the queue page with the awake line at 400 px")
    await screenshot(page, f"touch-awake-{size['viewport']['width']}.png")

    fake.script.token_delay_s = 0
    await d.wait_state(job["id"], "done")

    # Let go a second after the lab is idle, which no live event says: the page's slow poll shows it.
    async def released():
        await slow_poll_now(page)
        return await awake.is_hidden()

    await eventually(released, 30, 0.2, "the awake line to go once the inhibitor is let go")


@SIZES
async def test_an_inhibitor_that_could_not_be_held_is_a_warning(fakes, daemon_factory, open_at, tmp_path, size):
    empty = tmp_path / "empty"
    empty.mkdir()
    fake = await fakes("qwen3-coder:30b", token_delay_s=0.05, tokens=2000)
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], env={"PATH": str(empty)})
    page = await open_at(size)
    [job] = await d.submit(prompt="a long one")
    await d.wait_state(job["id"], "running")
    await open_queue(page, d, 1)
    awake = page.locator("#awake")
    await expect(awake).to_contain_text("cannot keep this machine awake")
    await expect(awake).to_contain_text("systemd-inhibit not found")
    await expect(awake).to_have_class("awake warn")
    fake.script.token_delay_s = 0
    await d.wait_state(job["id"], "done")


@SIZES
async def test_no_systemd_is_a_quiet_note_while_idle(fakes, daemon_factory, open_at, tmp_path, size):
    """systemd-inhibit on a machine without systemd exits 1: amber only while a job runs; once the
    lab is idle, a quiet note, not a standing warning (issue 36)."""
    fake = await fakes("qwen3-coder:30b", token_delay_s=0.05, tokens=2000)
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], env=no_systemd(tmp_path))
    page = await open_at(size)
    await page.clock.install()  # the test's clock: the page's slow poll is brought forward
    [job] = await d.submit(prompt="a long one")
    await d.wait_state(job["id"], "running")
    await open_queue(page, d, 1)
    awake = page.locator("#awake")

    async def warned():
        await slow_poll_now(page)
        return "cannot keep this machine awake: systemd-inhibit exited with code 1" in await awake.inner_text()

    await eventually(warned, 30, 0.2, "the warning while the job runs")
    await expect(awake).to_have_class("awake warn")
    fake.script.token_delay_s = 0
    await d.wait_state(job["id"], "done")

    async def quiet():
        await slow_poll_now(page)
        return "no sleep inhibitor here" in await awake.inner_text()

    await eventually(quiet, 30, 0.2, "the quiet note once the lab is idle")
    await expect(awake).to_contain_text("systemd-inhibit exited with code 1")
    await expect(awake).not_to_have_class("awake warn")
    await screenshot(page, f"awake-no-systemd-{size['viewport']['width']}.png")
