"""The queue page at the lab's scale (issue 28): 50 nodes and 10,000 waiting jobs, seeded by
direct SQL on the router's own database before it starts, in headless Chromium. The board draws
only the cards in view (plus a margin), and reads only those: each column's first screenful, and
the part of a column scrolled into view (/api/queue?node=&offset=), never the whole queue. What a
person sees must not change: every column's first and last job reachable by scrolling, in order,
the counts right, and a move still goes through."""

from __future__ import annotations

import sqlite3
import time

import pytest
from conftest import eventually
from playwright.async_api import expect
from test_page import browser, card, column, page, queued_ids  # noqa: F401 (fixtures)

from gpuq.jobs import POSITION_GAP, iso
from gpuq.store import Store

pytestmark = pytest.mark.browser

NODES = 50
PER_NODE = 200  # the page's limit per column: every job is on the board
MODEL = "qwen3-coder:30b"


def name(i: int) -> str:
    return f"n{i:02d}"


def job_id(node: int, k: int) -> str:
    return f"1700000000-{node:02d}{k:06x}"


async def seed(path) -> None:
    store = Store(path)  # the schema, from gpuq's migrations
    await store.open()
    await store.close()
    now = time.time()
    rows = [
        (
            job_id(n, k),
            "task",
            name(n),
            MODEL,
            f"bulk job {k} on {name(n)}",
            (k + 1) * POSITION_GAP,
            "asked",
            iso(now - 10_000 + k),
        )
        for n in range(1, NODES + 1)
        for k in range(PER_NODE)
    ]
    db = sqlite3.connect(path)
    with db:
        db.executemany(
            "INSERT INTO job (id, kind, node, model, prompt, position, placement, created_at) VALUES (?,?,?,?,?,?,?,?)",
            rows,
        )
    db.close()


@pytest.fixture
async def big_lab(fakes, daemon_factory, tmp_path):
    """50 nodes, each busy with a running job that streams a token every 0.5 s (its first
    claimed job), and the rest of its 200 waiting."""
    nodes = []
    for i in range(1, NODES + 1):
        fake = await fakes(MODEL, token_delay_s=0.5, tokens=100_000)
        nodes.append({"name": name(i), "url": fake.url, "rank": i, "roles": ["task", "critique"], "model": MODEL})
    daemon = await daemon_factory(nodes, start=False, health_interval="2s", stall_timeout="10m")
    await seed(tmp_path / "gpuq.db")
    await daemon.start(timeout=60)

    async def all_running():
        body = await daemon.get("/api/queue?limit=0")
        return sum(1 for n in body["nodes"] if n["running"]) == NODES

    await eventually(all_running, 60, interval=0.2, what="every node to run its first job")
    return daemon


def list_of(node: str) -> str:
    return f"{column(node)} .queue"


async def scroll_list(page, node: str, where: str) -> None:
    """Scroll a column's list to its top or bottom, as a person does with the wheel."""
    await page.evaluate(
        "([col, where]) => { const c = document.querySelector(col); c.scrollIntoView();"
        " const l = c.querySelector('.queue'); l.scrollTop = where === 'top' ? 0 : l.scrollHeight; }",
        [column(node), where],
    )


async def jobs_read(answers) -> int:
    """How many waiting jobs the page's reads of /api/queue carried."""
    return sum([len(n["queued"]) for a in answers for n in (await a.json())["nodes"]])


async def test_ten_thousand_waiting_jobs_on_fifty_nodes_are_all_reachable_and_movable(big_lab, page):
    waiting = NODES * (PER_NODE - 1)  # each node runs its first
    answers = []
    page.on("response", lambda r: answers.append(r) if "/api/queue?" in r.url and r.status == 200 else None)
    await page.goto(big_lab.url + "/")
    await expect(page.locator("#conn")).to_have_text("live")
    await expect(page.locator(".col")).to_have_count(NODES)
    await expect(page.locator("#stat-depth")).to_have_text(f"{waiting:,}")
    await expect(page.locator("#stat-running")).to_have_text(str(NODES))
    # The first read listed the waiting jobs of the columns in view only (a 1400 px window: 5
    # columns of 300 px, and the next two, drawn beyond it); the others came as counts.
    first = await answers[0].json()
    listed = [n["name"] for n in first["nodes"] if n["queued"]]
    assert listed == [name(i) for i in range(1, len(listed) + 1)] and 5 <= len(listed) <= 8, listed
    assert [n["queued_count"] for n in first["nodes"]] == [PER_NODE - 1] * NODES
    # The first frame draws the cards in the window; the margins beyond it (20 cards) follow its
    # paint: the cards just below the first column's view are there before it is scrolled.
    below = page.locator(f"{list_of(name(1))} > .card:not(.loading)")
    await expect(below.nth(24)).to_be_attached()
    await expect(below.nth(24)).not_to_be_in_viewport()

    for node_i in (1, NODES):  # the first column, and the last (scrolled to sideways)
        node = name(node_i)
        col = page.locator(column(node))
        await scroll_list(page, node, "top")
        await expect(col.locator(".queue-head .count")).to_have_text(str(PER_NODE - 1))
        await expect(col.locator(".more")).to_have_count(0)  # the first load's screenful, then all
        first, second, last = job_id(node_i, 1), job_id(node_i, 2), job_id(node_i, PER_NODE - 1)
        await expect(col.locator(card(first))).to_be_visible()
        await expect(col.locator(f"{card(first)} .pos")).to_have_text("1")
        await scroll_list(page, node, "bottom")
        await expect(col.locator(card(last))).to_be_in_viewport()
        await expect(col.locator(f"{card(last)} .pos")).to_have_text(str(PER_NODE - 1))
        # The whole view read, seen in one look (a refresh of the page may redraw between two looks):
        # the cards drawn then, none of them still loading.
        ids = await (
            await page.wait_for_function(
                "(list) => { const cs = [...document.querySelectorAll(list + ' > .card')];"
                " return cs.length && !cs.some((c) => c.classList.contains('loading')) && cs.map((c) => c.dataset.id); }",
                arg=list_of(node),
            )
        ).json_value()
        expected = [job_id(node_i, k) for k in range(1, PER_NODE)]
        assert ids == expected[len(expected) - len(ids) :], (
            "the cards drawn at the bottom are the queue's tail, in order"
        )
        await scroll_list(page, node, "top")
        await expect(col.locator(card(first))).to_be_in_viewport()

    # The page read what was on screen: each column's first screenful (40), on each refresh, and
    # the bottoms scrolled to; never the whole queue (9,950 jobs, 8 MB), not even once.
    refreshes = await page.evaluate("window.gpuq.refreshes")
    read = await jobs_read(answers)
    assert read <= refreshes * NODES * 40 + 20 * PER_NODE, (read, refreshes)
    assert max([len((await a.json())["nodes"][0]["queued"]) for a in answers if "node=" in a.url] or [0]) <= 100
    assert all("limit=40" in a.url for a in answers if "node=" not in a.url), [a.url for a in answers]

    # Each card's "Move to…" lists the other 49 nodes (one list built per column, copied into its
    # cards): choosing on one card leaves the others' as they were.
    names = [name(i) for i in range(1, NODES + 1)]
    for node_i, k in ((NODES, 1), (NODES, 2), (NODES - 1, 1)):  # in view: the last columns
        options = await page.eval_on_selector_all(
            f"{card(job_id(node_i, k))} select.move-to option", "os => os.map(o => o.value)"
        )
        assert options == [""] + [n for n in names if n != name(node_i)], (node_i, k, options[:3])
    second_move = page.locator(f"{card(job_id(NODES, 2))} select.move-to")
    await second_move.evaluate("s => { s.value = 'n01'; }")  # set, not chosen: no change event
    assert await page.locator(f"{card(job_id(NODES, 1))} select.move-to").input_value() == ""
    await second_move.evaluate("s => { s.value = ''; }")

    # A move from the keyboard still goes through: the first job of the last column one place down.
    node = name(NODES)
    first, second = job_id(NODES, 1), job_id(NODES, 2)
    await page.locator(card(first)).focus()
    await page.keyboard.press("Alt+ArrowDown")
    await expect(page.locator(f"{card(first)} .pos")).to_have_text("2")

    async def moved():
        return (await queued_ids(big_lab, node))[:2] == [second, first]

    await eventually(moved, 30, what="the first job to move down one place")
    # The last job, from the bottom of its list, to the head (Alt+Home).
    last = job_id(NODES, PER_NODE - 1)
    await scroll_list(page, node, "bottom")
    await page.locator(card(last)).focus()
    await page.keyboard.press("Alt+Home")
    await expect(page.locator(f"{card(last)} .pos")).to_have_text("1")

    async def headed():
        return (await queued_ids(big_lab, node))[:1] == [last]

    await eventually(headed, 30, what="the last job to move to the head")
    await expect(page.locator(card(last))).to_be_in_viewport()


async def test_a_small_board_wider_than_the_window_is_whole_in_its_first_render(fakes, daemon_factory, page):
    """A board of 400 waiting jobs or fewer is drawn whole: its first read asks for the columns
    in view only (the board's size is not known yet), so one with columns beyond them is read
    again, whole, before its first render: never a column that says "nothing waiting" over a
    count of one."""
    nodes = []
    for i in range(1, 13):
        fake = await fakes(MODEL, token_delay_s=0.5, tokens=100_000)
        nodes.append({"name": name(i), "url": fake.url, "rank": i, "roles": ["task"], "model": MODEL})
    lab = await daemon_factory(nodes)
    last = name(12)
    await lab.wait_state((await lab.submit("task", "the head", node=last))[0]["id"], "running")
    waiting = (await lab.submit("task", "waits on the last column", node=last))[0]["id"]
    await page.goto(lab.url + "/")
    # Looked at in the first frame that shows an answer (the same poll that sees it).
    first = await (
        await page.wait_for_function(
            "(col) => window.gpuq && window.gpuq.shown > 0"
            " && [...document.querySelectorAll(col + ' .queue > li')].map((c) => c.dataset.id || c.textContent)",
            arg=column(last),
            polling="raf",
        )
    ).json_value()
    assert first == [waiting], first
