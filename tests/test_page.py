"""The queue page (/) and the job page (/jobs/{id}) in real headless Chromium: Debian's
`chromium` driven by Playwright's async API, against the real daemon and fake Ollama nodes.

A node is kept busy by a fake that streams one token every half second for a very long reply
(tokens keep flowing, so no stall timeout fires). Synchronisation is by Playwright's
auto-waiting `expect` or `eventually`, never a bare sleep."""

from __future__ import annotations

import shutil
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import ROOT, eventually, make_lab, node_table
from playwright.async_api import Page, async_playwright, expect

pytestmark = pytest.mark.browser

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
GUARD = "a critique never runs on its parent task's node"
HOSTILE = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> <b>bold?</b> & done'

expect.set_options(timeout=15_000)  # two shared cores: be generous


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture
async def browser():
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        await b.close()


@pytest.fixture
async def page(browser):
    """A fresh page; any script error, CSP violation or native dialog fails the test."""
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    pg = await context.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    pg.on(
        "console",
        lambda msg: problems.append(f"console: {msg.text}") if "Content Security Policy" in msg.text else None,
    )

    async def native_dialog(dialog):
        problems.append(f"native {dialog.type}: {dialog.message}")
        await dialog.dismiss()

    pg.on("dialog", native_dialog)
    yield pg
    await context.close()
    assert not problems, problems


# -- helpers ----------------------------------------------------------------------------------


def card(job_id: str) -> str:
    return f'.card[data-id="{job_id}"]'


def column(node: str) -> str:
    return f'.col[data-node="{node}"]'


def busy(fake) -> None:
    """Every job on this fake runs until the test ends, streaming a token every 0.5 s."""
    fake.script.token_delay_s = 0.5
    fake.script.tokens = 100_000


async def head(daemon, node: str, prompt: str = "head", kind: str = "task") -> str:
    """Submit a job to `node` and wait until it runs there (the node's fake should be busy)."""
    job = (await daemon.submit(kind, prompt, node=node))[0]
    await daemon.wait_state(job["id"], "running")
    return job["id"]


async def three_waiting_on_node3(lab, page: Page) -> list[str]:
    """node-3 busy with a running head and three tasks waiting behind it, shown on the page."""
    busy(lab.fakes["node-3"])
    await head(lab, "node-3")
    ids = [(await lab.submit("task", f"job {x}", node="node-3"))[0]["id"] for x in "abc"]
    await open_queue(page, lab)
    return await page_shows(page, "node-3", ids)


async def critique_of(daemon, parent: str) -> list[dict]:
    """A critique of a done task's result, fanned out (no prompt: the router builds the subject)."""
    status, body = await daemon.request("POST", "/api/jobs", {"kind": "critique", "parent": parent})
    assert status == 201, (status, body)
    return body["jobs"]


async def queue_of(daemon, node: str) -> dict:
    body = await daemon.get("/api/queue")
    return next(n for n in body["nodes"] if n["name"] == node)


async def queued_ids(daemon, node: str) -> list[str]:
    return [j["id"] for j in (await queue_of(daemon, node))["queued"]]


async def dom_ids(page: Page, node: str) -> list[str]:
    return await page.eval_on_selector_all(f"{column(node)} .queue > .card", "cs => cs.map(c => c.dataset.id)")


async def until_ids(fetch, ids: list[str], what: str) -> list[str]:
    """Wait until `fetch()` returns exactly `ids`; on a timeout, say what it returned last."""
    seen: list = []

    async def same():
        seen[:] = await fetch()
        return seen == ids

    try:
        await eventually(same, 15, what=f"{what} to be {ids}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it was {seen}") from None
    return ids


async def page_shows(page: Page, node: str, ids: list[str]) -> list[str]:
    """Wait until the node's column lists exactly `ids`, in order."""
    return await until_ids(lambda: dom_ids(page, node), ids, f"{node}'s column")


async def api_shows(daemon, node: str, ids: list[str]) -> None:
    await until_ids(lambda: queued_ids(daemon, node), ids, f"{node}'s queue")


async def drag(page: Page, job_id: str, target: str, x: float | None = None, y: float | None = None) -> None:
    """Drag a card by its handle onto `target` (at x, y inside it, else its centre), step by step:
    the drop waits until the page reports the drag started (Playwright's one-shot drag_to can
    release the mouse before Chromium has begun the drag, and then nothing is dropped)."""
    handle = page.locator(f"{card(job_id)} .handle")
    await handle.hover()
    await page.mouse.down()
    start = await eventually(lambda: handle.bounding_box(), 15, what="the handle on screen")
    await page.mouse.move(start["x"] + start["width"] / 2, start["y"] + start["height"] / 2 + 12, steps=3)
    await eventually(lambda: page.evaluate("window.gpuq.dragging !== null"), 15, what="the drag to start")
    box = await eventually(lambda: page.locator(target).bounding_box(), 15, what=f"{target} on screen")
    await page.mouse.move(
        box["x"] + (box["width"] / 2 if x is None else x), box["y"] + (box["height"] / 2 if y is None else y), steps=4
    )
    await page.mouse.up()


async def shown_after_now(page: Page, timeout_s: float = 60) -> None:
    """Wait until the queue page shows the answers of a refresh it started after this call: what
    the router knows now is on the screen. The page refreshes on a live event, or within its 10 s
    slow poll, so the deadline is generous: it is not a timing bound, only a hang guard."""
    asked = await page.evaluate("window.gpuq.refreshes")
    await page.wait_for_function("asked => window.gpuq.shown > asked", arg=asked, timeout=timeout_s * 1000)


async def slow_poll_now(page: Page) -> None:
    """Bring the queue page's slow poll forward, for what no live event says: on a page whose clock
    the test installed before opening it (`page.clock.install()`), jump its clock to the next poll
    (every 10 s) instead of waiting for it, then wait until that refresh's answers are shown."""
    asked = await page.evaluate("window.gpuq.refreshes")
    await page.clock.fast_forward(10_000)
    await page.wait_for_function("asked => window.gpuq.shown > asked", arg=asked, timeout=60_000)


async def box_of(target) -> dict:
    """An element's box on screen, read again while a live redraw has it detached (None)."""
    return await eventually(lambda: target.bounding_box(), 15, what=f"{target} on screen")


async def press(page: Page, target) -> None:
    """Press the mouse on `target` and hold it (the caller releases)."""
    box = await box_of(target)
    await page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    await page.mouse.down()


async def open_queue(page: Page, daemon) -> None:
    await page.goto(daemon.url + "/")
    await expect(page.locator("#conn")).to_have_text("live")
    await expect(page.locator(".col")).to_have_count(len(daemon.fakes))


async def screenshot(page: Page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    await page.screenshot(path=str(path), full_page=True)
    return path


# -- the queue page -----------------------------------------------------------------------------


async def test_queue_page_shows_every_node_and_job(lab, page):
    parent = (await lab.submit("task", "add a retry budget to the export job", node="node-3"))[0]["id"]
    await lab.wait_state(parent, "done")
    busy(lab.fakes["node-1"])
    busy(lab.fakes["node-3"])
    await head(lab, "node-1", "refactor the dispatcher into one worker per node")
    victim = await head(lab, "node-3", "summarise the 49-minute incident")
    for i in range(3):
        await lab.submit("task", f"write test {i} for the placement rules", node="node-1")
    critiques = await critique_of(lab, parent)  # fan-out: node-1 and node-2
    assert {c["node"] for c in critiques} == {"node-1", "node-2"}
    on_node2 = next(c["id"] for c in critiques if c["node"] == "node-2")
    await lab.wait_state(on_node2, "done")  # a critique is one structured reply: node-2 is idle again
    jumper = (await lab.submit("task", "urgent: fix the stuck unload", node="node-3"))[0]["id"]
    status, _ = await lab.request("POST", f"/api/jobs/{jumper}/preempt")
    assert status == 200
    await lab.wait_state(jumper, "running")
    await lab.submit("task", "explain keep_alive: 0 in two sentences", node="node-3")

    await open_queue(page, lab)
    queue = await lab.get("/api/queue")
    names = await page.eval_on_selector_all(".col", "cs => cs.map(c => c.dataset.node)")
    assert names == [n["name"] for n in queue["nodes"]] == ["node-1", "node-2", "node-3"]
    for node in queue["nodes"]:
        col = page.locator(column(node["name"]))
        await expect(col.locator(".col-head h2")).to_have_text(node["name"])
        await expect(col.locator(".col-head .model")).to_have_text(node["model"])
        for role in node["roles"]:
            await expect(col.locator(f".col-head .role-{role}")).to_have_count(1)
        await expect(col.locator(".pill")).to_have_text("up")
        if node["name"] == "node-2":
            await expect(col.locator(".running-slot .idle")).to_be_visible()
        else:
            running = node["running"]["id"]
            await expect(col.locator(f".running-slot {card(running)}")).to_be_visible()
            await expect(col.locator(f"{card(running)} .tok")).to_contain_text("token")
        await page_shows(page, node["name"], [j["id"] for j in node["queued"]])
        await expect(col.locator(".queue-head .count")).to_have_text(str(node["queued_count"]))
        for job in node["queued"]:
            c = col.locator(card(job["id"]))
            await expect(c.locator(".jid")).to_have_attribute("href", f"/jobs/{job['id']}")
            await expect(c.locator(".kind")).to_have_text(job["kind"])
            model = c.locator(".card-meta .model")  # said only where it is not the node's own
            if job["model"] == node["model"]:
                await expect(model).to_have_count(0)
            else:
                await expect(model).to_have_text(job["model"])
            await expect(c.locator(".card-meta")).to_contain_text("queued")
    on_node1 = next(c["id"] for c in critiques if c["node"] == "node-1")
    await expect(page.locator(f"{card(on_node1)} .parent")).to_contain_text(f"critique of {parent}")
    await expect(page.locator(f"{card(victim)} .preempted")).to_have_text("preempted")
    await expect(page.locator("#stat-depth")).to_have_text(str(queue["queue_depth"]))
    await expect(page.locator("#stat-running")).to_have_text("2")
    await expect(page.locator("#stat-up")).to_have_text("3/3")
    for done in (parent, on_node2):
        await expect(page.locator(f'#recent tr[data-id="{done}"]')).to_contain_text("done")
    await expect(page.locator("#alerts .alert")).to_have_count(0)
    await screenshot(page, "queue-page.png")


async def test_drag_reorders_the_queue(lab, page):
    a, b, c = await three_waiting_on_node3(lab, page)

    await drag(page, c, card(a), 80, 4)
    await api_shows(lab, "node-3", [c, a, b])
    await page_shows(page, "node-3", [c, a, b])
    events = (await lab.job(c))["events"]
    assert events[-1]["actor"].startswith("page "), events[-1]
    assert events[-1]["reason"] == "moved at position 1"

    await drag(page, c, card(b), 80, 50)
    await api_shows(lab, "node-3", [a, b, c])
    await page_shows(page, "node-3", [a, b, c])


async def test_drag_into_another_column_moves_the_job(lab, page):
    busy(lab.fakes["node-1"])
    busy(lab.fakes["node-3"])
    await head(lab, "node-1")
    await head(lab, "node-3")
    x = (await lab.submit("task", "stays on node-1", node="node-1"))[0]["id"]
    a, b = [(await lab.submit("task", f"node-3 job {n}", node="node-3"))[0]["id"] for n in "ab"]
    await open_queue(page, lab)
    await page_shows(page, "node-3", [a, b])

    await drag(page, b, card(x), 80, 4)
    await api_shows(lab, "node-1", [b, x])
    await api_shows(lab, "node-3", [a])
    await page_shows(page, "node-1", [b, x])
    await page_shows(page, "node-3", [a])
    assert (await lab.job(b))["placement"] == "moved"


async def node2_down_with_two_critiques(lab) -> tuple[str, str]:
    """node-2 down with two critiques waiting: an unrelated one, then one of a task done on node-1
    (the guard keeps that one off node-1)."""
    parent = (await lab.submit("task", "the parent task", node="node-1"))[0]["id"]
    await lab.wait_state(parent, "done")
    await lab.fakes["node-2"].stop()

    async def node2_down():
        return not (await queue_of(lab, "node-2"))["up"]

    await eventually(node2_down, 15, what="node-2 to be seen down")
    first = (await lab.submit("critique", "an unrelated review", node="node-2"))[0]["id"]
    crit = await critique_of(lab, parent)  # fan-out skips node-1, the parent's node
    assert [c["node"] for c in crit] == ["node-2"]
    return first, crit[0]["id"]


async def test_drag_refused_by_the_guard_shows_409_and_restores_order(lab, page):
    # A critique replies in one piece, so node-2 is kept from running them by taking it down.
    first, crit = await node2_down_with_two_critiques(lab)
    await open_queue(page, lab)
    await page_shows(page, "node-2", [first, crit])
    await expect(page.locator(".alert.down")).to_contain_text("node-2 down for")

    await drag(page, crit, f"{column('node-1')} .queue")
    await expect(page.locator("#toasts")).to_contain_text(GUARD)
    await expect(page.locator("#toasts")).to_contain_text("409")
    await screenshot(page, "queue-guard-refused.png")
    await page_shows(page, "node-2", [first, crit])
    await page_shows(page, "node-1", [])
    assert await queued_ids(lab, "node-2") == [first, crit]
    assert (await lab.job(crit))["node"] == "node-2"


async def test_a_drag_in_progress_survives_live_updates(lab, page):
    a, b, c = await three_waiting_on_node3(lab, page)
    changes = await page.evaluate("window.gpuq.changes")

    await page.locator(f"{card(c)} .handle").hover()
    await page.mouse.down()
    box = await eventually(lambda: page.locator(card(b)).bounding_box(), 15, what="card b on screen")
    await page.mouse.move(box["x"] + 80, box["y"] + 30, steps=4)
    await page.mouse.move(box["x"] + 80, box["y"] + 20, steps=2)
    await eventually(lambda: page.evaluate("window.gpuq.dragging !== null"), 15, what="the drag to start")
    d = (await lab.submit("task", "arrives mid-drag", node="node-3"))[0]["id"]
    await eventually(
        lambda: page.evaluate(f"window.gpuq.changes > {changes} && window.gpuq.deferred"),
        15,
        what="a live update to arrive, and wait, during the drag",
    )
    await expect(page.locator(card(d))).to_have_count(0)  # held back: the drag goes on
    await expect(page.locator(".drop-marker")).to_have_count(1)
    box = await eventually(lambda: page.locator(card(a)).bounding_box(), 15, what="card a on screen")
    await page.mouse.move(box["x"] + 80, box["y"] + 4, steps=4)
    await page.mouse.up()
    await api_shows(lab, "node-3", [c, a, b, d])
    await page_shows(page, "node-3", [c, a, b, d])


async def test_keyboard_reorders_and_moves(lab, page):
    busy(lab.fakes["node-1"])
    await head(lab, "node-1")
    a, b, c = await three_waiting_on_node3(lab, page)
    await expect(page.locator("#keys")).to_contain_text("Alt")

    await page.locator(card(c)).focus()
    await page.keyboard.press("Alt+ArrowUp")
    await api_shows(lab, "node-3", [a, c, b])
    await page.keyboard.press("Alt+ArrowUp")
    await api_shows(lab, "node-3", [c, a, b])
    await page_shows(page, "node-3", [c, a, b])
    assert await page.evaluate("document.activeElement.dataset.id") == c
    await page.keyboard.press("Alt+End")
    await api_shows(lab, "node-3", [a, b, c])
    # node-2 takes only critiques: Alt+Left takes the task past it to node-1.
    await page.keyboard.press("Alt+ArrowLeft")
    await api_shows(lab, "node-1", [c])
    await api_shows(lab, "node-3", [a, b])
    await page_shows(page, "node-1", [c])
    assert await page.evaluate("document.activeElement.dataset.id") == c
    # Plain arrows move the focus; Enter opens the preview.
    await page.keyboard.press("ArrowRight")
    await page.keyboard.press("ArrowDown")
    focused = await page.evaluate("document.activeElement.dataset.id")
    assert focused in (a, b)
    await page.keyboard.press("Enter")
    await page.wait_for_url(f"**/jobs/{focused}")
    await expect(page.locator("h1")).to_have_text(focused)


async def test_preempt_and_delete_buttons(lab, page):
    busy(lab.fakes["node-3"])
    h = await head(lab, "node-3", "the running head")
    a, b = [(await lab.submit("task", f"job {x}", node="node-3"))[0]["id"] for x in "ab"]
    await open_queue(page, lab)
    await page_shows(page, "node-3", [a, b])

    await page.locator(card(b)).get_by_role("button", name="Preempt").click()
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text(h)
    await dialog.get_by_role("button", name="Preempt").click()
    await lab.wait_state(b, "running")
    await api_shows(lab, "node-3", [h, a])
    await expect(page.locator(f"{column('node-3')} .running-slot {card(b)}")).to_be_visible()
    await page_shows(page, "node-3", [h, a])
    await expect(page.locator(f"{card(h)} .preempted")).to_have_text("preempted")

    await page.locator(card(a)).get_by_role("button", name="Delete").click()
    await expect(dialog).to_contain_text(a)
    await dialog.get_by_role("button", name="Cancel").click()
    await expect(dialog).to_have_count(0)
    assert (await lab.job(a))["state"] == "queued"
    await page.locator(card(a)).get_by_role("button", name="Delete").click()
    await dialog.get_by_role("button", name="Delete").click()
    await lab.wait_state(a, "cancelled")
    await page_shows(page, "node-3", [h])
    deleted = await lab.job(a)
    assert deleted["events"][-1]["actor"].startswith("page "), deleted["events"][-1]

    # The preempted job's page shows its interrupted run, then (live) its second run.
    await page.goto(f"{lab.url}/jobs/{h}")
    runs = page.locator("#runs tbody tr")
    await expect(runs).to_have_count(1)
    await expect(runs.first).to_contain_text("preempted")
    await expect(page.locator(".job-title .preempted")).to_have_text("preempted")
    await expect(page.locator("#notice")).to_contain_text("position 1")
    status, _ = await lab.request("DELETE", f"/api/jobs/{b}")
    assert status == 200
    await expect(runs).to_have_count(2)
    await expect(runs.nth(1)).to_contain_text("running")
    await expect(page.locator(".job-title .st-running")).to_be_visible()


async def test_a_click_survives_the_board_redrawn_while_the_button_is_pressed(lab, page):
    """A live change redraws the board; a button pressed before it and released after it still
    acts (the board waits for the release: a replaced button gets no click from the browser)."""
    busy(lab.fakes["node-3"])
    await head(lab, "node-3")
    a = (await lab.submit("task", "job a", node="node-3"))[0]["id"]
    await open_queue(page, lab)
    await page_shows(page, "node-3", [a])
    await press(page, page.locator(card(a)).get_by_role("button", name="Delete"))
    renders = await page.evaluate("window.gpuq.renders")
    b = (await lab.submit("task", "job b", node="node-3"))[0]["id"]
    await api_shows(lab, "node-3", [a, b])
    read = (
        "(id) => window.gpuq.queue.nodes.find((n) => n.name === 'node-3').queued.some((j) => j && j.id === id)"
        " && window.gpuq.deferred"
    )
    await eventually(lambda: page.evaluate(read, b), 15, what="the page to read job b while the button is held")
    assert await dom_ids(page, "node-3") == [a]  # not redrawn under the pressed button
    assert await page.evaluate("window.gpuq.renders") == renders
    await page.mouse.up()
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text(a)
    await page_shows(page, "node-3", [a, b])  # the held redraw, once released
    await dialog.get_by_role("button", name="Delete").click()
    await lab.wait_state(a, "cancelled")
    await page_shows(page, "node-3", [b])


async def test_clear_a_node(lab, page):
    busy(lab.fakes["node-3"])
    h = await head(lab, "node-3")
    ids = [(await lab.submit("task", f"job {x}", node="node-3"))[0]["id"] for x in "abc"]
    await open_queue(page, lab)
    await page_shows(page, "node-3", ids)
    await page.locator(column("node-3")).get_by_role("button", name="Clear").click()
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text("3 jobs waiting")
    await dialog.get_by_role("button", name="Clear").click()
    await api_shows(lab, "node-3", [])
    await page_shows(page, "node-3", [])
    assert (await lab.job(h))["state"] == "running"  # the checkbox was left unticked


async def test_a_job_finishing_elsewhere_appears_without_a_reload(lab, page):
    await open_queue(page, lab)
    await page.evaluate("window.__same_page = true")
    fake = lab.fakes["node-3"]
    fake.script.token_delay_s = 0.1
    fake.script.tokens = 15
    job = (await lab.submit("task", "submitted from the CLI", node="node-3"))[0]["id"]
    await expect(page.locator(f"{column('node-3')} .running-slot {card(job)}")).to_be_visible()
    await lab.wait_state(job, "done", timeout=20)
    row = page.locator(f'#recent tr[data-id="{job}"]')
    await expect(row).to_contain_text("done")
    await expect(row).to_contain_text("submitted from the CLI")
    await expect(page.locator(f"{column('node-3')} .running-slot .card")).to_have_count(0)
    assert await page.evaluate("window.__same_page") is True


async def test_stale_head_banner(fakes, daemon_factory, page):
    f1 = await fakes("qwen3-coder:30b")
    f3 = await fakes("llama3.2:latest", stall_after=1)
    daemon = await daemon_factory(
        [
            node_table("node-1", f1, 1, ["task", "critique"], "qwen3-coder:30b"),
            node_table("node-3", f3, 3, ["task"], "llama3.2:latest"),
        ],
        stale_after="1s",
        stall_timeout="60s",
    )
    daemon.fakes = {"node-1": f1, "node-3": f3}
    stuck = (await daemon.submit("task", "streams one token, then nothing", node="node-3"))[0]["id"]
    behind = (await daemon.submit("task", "waits behind the stuck head", node="node-3"))[0]["id"]
    await daemon.wait_state(stuck, "running")

    await open_queue(page, daemon)
    banner = page.locator(".alert.stale")
    await expect(banner).to_contain_text(stuck)
    await expect(banner).to_contain_text("node-3 is blocked")
    await expect(banner).to_contain_text("stuck for")
    await expect(banner).to_contain_text("1 job wait")
    await expect(page.locator(f"{card(stuck)}.stale")).to_be_visible()
    status, health = await daemon.request("GET", "/health")
    assert status == 503 and health["stale"][0]["id"] == stuck
    assert (await page.title()).startswith("⚠")
    await screenshot(page, "queue-stale-banner.png")

    f3.script.stall_after = None  # the job behind it streams normally once it gets the node
    await banner.get_by_role("button", name="Delete stuck job").click()
    await page.locator("dialog[open]").get_by_role("button", name="Delete").click()
    await daemon.wait_state(stuck, "cancelled")
    await expect(banner).to_have_count(0)
    await daemon.wait_state(behind, "done", timeout=20)


async def test_hostile_prompt_renders_as_text(lab, page):
    busy(lab.fakes["node-3"])
    await head(lab, "node-3")
    job = (await lab.submit("task", HOSTILE, node="node-3"))[0]["id"]
    await open_queue(page, lab)
    prompt = page.locator(f"{card(job)} .prompt")
    await expect(prompt).to_have_text(HOSTILE)
    assert await page.locator("#board img").count() == 0
    assert await prompt.locator("b, script").count() == 0
    assert await page.evaluate("window.__pwned") is None

    await page.goto(f"{lab.url}/jobs/{job}")
    await expect(page.locator("#prompt")).to_have_text(HOSTILE)
    assert await page.locator("main img, main script, #prompt b").count() == 0
    assert await page.evaluate("window.__pwned") is None


async def test_ten_thousand_queued_jobs_do_not_freeze_the_page(lab, page, tmp_path):
    busy(lab.fakes["node-3"])
    await head(lab, "node-3")
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(now))
    rows = [
        (f"{int(now)}-{i:08x}", "task", "node-3", "llama3.2:latest", f"bulk job {i}", (i + 10) * 1024, "asked", stamp)
        for i in range(10_000)
    ]
    db = sqlite3.connect(tmp_path / "gpuq.db", timeout=10)
    with db:
        db.executemany(
            "INSERT INTO job (id, kind, node, model, prompt, position, placement, created_at) VALUES (?,?,?,?,?,?,?,?)",
            rows,
        )
    db.close()

    started = time.monotonic()
    await open_queue(page, lab)
    col = page.locator(column("node-3"))
    await expect(col.locator(".queue-head .count")).to_have_text("10,000")
    await expect(col.locator(".more")).to_contain_text("+9,800 more waiting")
    assert await col.locator(".queue > .card").count() == 200
    assert time.monotonic() - started < 30
    # Still responsive: a keyboard move of the first job goes through.
    first, second = rows[0][0], rows[1][0]
    await page.locator(card(first)).focus()
    await page.keyboard.press("Alt+ArrowDown")

    async def moved():
        return (await queued_ids(lab, "node-3"))[:2] == [second, first]

    await eventually(moved, 15, what="the first bulk job to move down one place")
    await col.get_by_role("button", name="Show 200 more").click()
    await expect(col.locator(".queue > .card")).to_have_count(400)
    await screenshot(page, "queue-10000-jobs.png")


async def test_live_updates_come_back_after_a_router_restart(lab, page):
    await open_queue(page, lab)
    await lab.kill(signal.SIGTERM)
    await expect(page.locator("#conn")).to_have_text("reconnecting…")
    await lab.start()
    await expect(page.locator("#conn")).to_have_text("live")
    job = (await lab.submit("task", "after the restart", node="node-3"))[0]["id"]
    await lab.wait_state(job, "done")
    await expect(page.locator(f'#recent tr[data-id="{job}"]')).to_contain_text("done")


async def test_access_token_is_asked_once_and_sent(fakes, daemon_factory, page):
    """Against a real router with a token: the page asks for it once, then sends it on every
    /api call (as a Bearer header; the event stream, which cannot send headers, in its URL)."""
    token = "s3cret-token-for-the-page-test"
    d = await make_lab(fakes, daemon_factory, token=token)
    seen: list[tuple[str, str | None]] = []

    async def note(request):
        if "/api/" in request.url:
            seen.append((request.url, await request.header_value("authorization")))

    page.on("request", note)
    await page.goto(d.url + "/")
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text("Access token needed")
    await dialog.locator("#token-input").fill(token)
    await dialog.get_by_role("button", name="Save token").click()
    await expect(page.locator(".col")).to_have_count(3)
    await expect(page.locator("#conn")).to_have_text("live")
    assert await page.evaluate("localStorage.getItem('gpuq-token')") == token
    assert await page.locator("dialog").count() == 0  # asked once, not once per request
    first = next(i for i, (_, auth) in enumerate(seen) if auth)
    later = [(url, auth) for url, auth in seen[first:] if "/api/events" not in url]
    assert later and all(auth == f"Bearer {token}" for _, auth in later), later
    assert any(f"/api/events?token={token}" in url for url, _ in seen)


# -- the job page -------------------------------------------------------------------------------


async def test_job_page_streams_output_then_shows_the_result(lab, page):
    fake = lab.fakes["node-3"]
    fake.script.token_delay_s = 0.12
    fake.script.tokens = 30
    job = (await lab.submit("task", "stream me slowly", node="node-3"))[0]["id"]
    await lab.wait_state(job, "running")
    await page.goto(f"{lab.url}/jobs/{job}")
    await expect(page.locator(".job-title .st-running")).to_be_visible()
    await expect(page.locator("#output-box")).to_contain_text("streaming live")

    async def words():
        return len((await page.locator("#output").text_content()).split())

    early = await eventually(words, 15, what="some streamed output")
    await eventually(lambda: _more(words, early), 15, what="the output to grow while it runs")
    assert (await lab.job(job))["state"] == "running"  # it grew live, not at the end
    await expect(page.locator("#f-tokens")).not_to_have_text("–")
    await screenshot(page, "job-page-streaming.png")

    await expect(page.locator(".job-title .st-done")).to_be_visible(timeout=30_000)
    done = await lab.job(job)
    await expect(page.locator("#output")).to_have_text(done["output"])
    await expect(page.locator("#f-tokens")).to_have_text("30")
    await expect(page.locator("#f-rate")).to_contain_text("tok/s")
    await expect(page.locator("#events .timeline li")).to_have_count(3)
    await expect(page.locator("#runs tbody tr")).to_have_count(1)
    await expect(page.locator(".job-sub")).to_contain_text("node-3")
    await expect(page.locator(".job-sub")).to_contain_text("llama3.2:latest")


async def _more(words, than: int) -> bool:
    return await words() > than


async def test_job_page_of_a_critique_and_its_parent(lab, page):
    parent = (await lab.submit("task", "add a retry budget to the export job", node="node-3"))[0]["id"]
    await lab.wait_state(parent, "done")
    lab.fakes["node-1"].script.findings = 3
    crits = await critique_of(lab, parent)
    for c in crits:
        await lab.wait_state(c["id"], "done")
    await page.goto(f"{lab.url}/jobs/{parent}")
    children = page.locator("#children tbody tr")
    await expect(children).to_have_count(2)
    on_node1 = next(c["id"] for c in crits if c["node"] == "node-1")
    await page.locator("#children").get_by_role("link", name=on_node1).click()
    await page.wait_for_url(f"**/jobs/{on_node1}")
    await expect(page.locator(".job-sub")).to_contain_text(f"critique of task {parent}")
    findings = (await lab.job(on_node1))["findings"]
    assert len(findings) == 3
    await expect(page.locator("#findings li")).to_have_count(3)
    for f in findings:
        await expect(page.locator("#findings")).to_contain_text(f["title"])
        await expect(page.locator("#findings")).to_contain_text(f["detail"])
    await expect(page.locator(".fact").filter(has_text="Parent task")).to_contain_text(parent)
    await screenshot(page, "job-page-critique.png")
    await page.locator(".fact").filter(has_text="Parent task").get_by_role("link").click()
    await page.wait_for_url(f"**/jobs/{parent}")


async def test_job_page_shows_the_error_verbatim_and_retries(lab, page):
    message = "llama-server reported out-of-memory during startup: cudaMalloc failed <oom>"
    lab.fakes["node-3"].script.load_error = (500, message)
    job = (await lab.submit("task", "too big", node="node-3"))[0]["id"]
    await lab.wait_state(job, "failed")
    await page.goto(f"{lab.url}/jobs/{job}")
    await expect(page.locator("#error pre")).to_have_text(message)
    await screenshot(page, "job-page-failed.png")
    lab.fakes["node-3"].script.load_error = None
    await page.locator("#actions").get_by_role("button", name="Retry").click()
    await lab.wait_state(job, "done", timeout=20)
    await expect(page.locator(".job-title .st-done")).to_be_visible()
    await expect(page.locator("#runs tbody tr")).to_have_count(2)
    await screenshot(page, "job-page.png")


async def test_job_page_delete_pressed_while_the_job_moves_still_asks(lab, page):
    """The job's record changes (another job is moved ahead of it) between the press on Delete
    and its release: the page is drawn again after the release, not under the pointer, so the
    click still asks."""
    busy(lab.fakes["node-3"])
    await head(lab, "node-3")
    a, b = [(await lab.submit("task", f"job {x}", node="node-3"))[0]["id"] for x in "ab"]
    await page.goto(f"{lab.url}/jobs/{a}")
    await expect(page.locator("#notice")).to_contain_text("position 1")
    await press(page, page.locator("#actions").get_by_role("button", name="Delete"))
    status, body = await lab.request("POST", f"/api/jobs/{b}/move", {"position": 1})
    assert status == 200, body
    await eventually(
        lambda: page.evaluate("window.gpuqJob.job.queue_position === 2"),
        15,
        what="the page to read the move while Delete is held",
    )
    await expect(page.locator("#notice")).to_contain_text("position 1")  # drawn after the release
    await page.mouse.up()
    dialog = page.locator("dialog[open]")
    await expect(dialog).to_contain_text(a)
    await expect(page.locator("#notice")).to_contain_text("position 2")
    await dialog.get_by_role("button", name="Delete").click()
    await lab.wait_state(a, "cancelled")
    await expect(page.locator(".job-title .st-cancelled")).to_be_visible()


async def test_unknown_job_page_says_so(lab, page):
    await page.goto(f"{lab.url}/jobs/1700000000-deadbeef")
    await expect(page.locator("main")).to_contain_text("No such job")


async def test_a_held_critique_says_what_it_waits_for_then_runs(lab, page):
    busy(lab.fakes["node-1"])
    parent = await head(lab, "node-1", "add a retry budget to the export job")
    [held] = await critique_of(lab, parent)
    assert held["node"] == "node-2" and held["waiting_for"] == parent
    await open_queue(page, lab)
    await page_shows(page, "node-2", [held["id"]])
    await expect(page.locator(f"{card(held['id'])} .badge.held")).to_have_text(f"waiting for parent {parent}")
    await expect(page.locator(f"{column('node-2')} .idle")).to_have_text(
        "idle — every waiting job waits for its parent"
    )
    await screenshot(page, "queue-page-held.png")
    await page.goto(f"{lab.url}/jobs/{held['id']}")
    await expect(page.locator("#notice")).to_contain_text(f"Waiting for parent {parent} to finish")
    lab.fakes["node-1"].script.tokens = 5  # the parent's next run is short: delete, retry it
    await lab.request("DELETE", f"/api/jobs/{parent}")
    await lab.wait_state(held["id"], "cancelled")
    await expect(page.locator("#error pre")).to_have_text(
        f"parent task {parent} was cancelled (deleted by api 127.0.0.1); nothing to critique"
    )
