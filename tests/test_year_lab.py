"""The year benchmark's lab (bench/year.py) does what bench/README and docs/performance.md say a
day of it is: a weekday's and a weekend day's jobs, three of each four autocomplete calls
abandoned, a chat's image sent again with every later turn, the chat node's calls waiting out
its down day, every job ended by the day's end. (Its timings are the bench's, not a test's.)"""

from __future__ import annotations

import json

from bench import year
from bench.core import SETTINGS
from gpuq.store import Store

DAY = year.Day(bursts=2, chats=3, turns=2, sweep=2, critiques=1)
MIDNIGHT = 1_764_547_200.0  # 2025-12-01 00:00 UTC


async def live(tmp_path, days: list[int], seed: int = 1, name: str = "lab") -> list[dict]:
    path = tmp_path / f"{name}.db"
    store = Store(path)
    await store.open()
    await store.configure(SETTINGS, [])
    await store.close()
    clock = [MIDNIGHT]
    store = Store(path, clock=lambda: clock[0])
    await store.open()
    try:
        lab = year.Lab(store, clock, DAY, seed, None)
        for d in days:
            await lab.live(d, MIDNIGHT + d * year.DAY_S)
        jobs = [dict(r) for r in await store.read("SELECT * FROM job ORDER BY created_at, id")]
        for j in jobs:  # its request whole: an image is stored once, apart (gpuq/store/parts.py)
            j["request"] = await store.whole_request(j["id"])
        return jobs
    finally:
        await store.close()


def on_day(jobs: list[dict], d: int) -> list[dict]:
    return [j for j in jobs if j["created_at"].startswith(f"2025-12-{d + 1:02d}")]


async def test_a_week_has_the_days_the_docs_describe(tmp_path):
    jobs = await live(tmp_path, list(range(7)))
    assert [len(on_day(jobs, d)) for d in range(7)] == [DAY.jobs(True)] * 5 + [DAY.jobs(False)] * 2
    assert all(j["finished_at"] is not None for j in jobs), "every job ended by its day's end"
    editor = [j for j in jobs if j["endpoint"] == "/api/generate"]
    assert len(editor) == 5 * DAY.bursts * 4
    assert sum(j["state"] == "cancelled" for j in editor) == 3 * len(editor) // 4
    assert {j["lane"] for j in editor} == {"interactive"}
    assert sum(j["kind"] == "critique" for j in jobs) == 7 * DAY.critiques, "the nightly sweep's, every night"
    nightly = [j for j in jobs if j["client"] == "nightly-sweep/1.0" and j["kind"] == "task"]
    assert len(nightly) == 7 * DAY.sweep and {j["lane"] for j in nightly} == {"batch"}


async def test_a_chats_image_is_sent_again_with_every_later_turn(tmp_path):
    jobs = await live(tmp_path, list(range(5)))
    requests = [json.loads(j["request"]) for j in jobs if j["endpoint"] == "/api/chat"]
    assert len(requests) == 5 * DAY.chats * DAY.turns
    with_image = [r for r in requests if any("images" in m for m in r["body"]["messages"])]
    assert with_image, "some conversations carry an image"
    for r in with_image:
        first = r["body"]["messages"][0]
        assert len(first["images"][0]) > year.IMAGE_BYTES, "the image, base64, in the first message"
    turns = [len(r["body"]["messages"]) for r in requests]
    assert set(turns) == {1, 3}, "each turn's request carries the conversation so far"


async def test_the_chat_nodes_calls_wait_out_its_down_day_and_the_same_seed_gives_the_same_year(tmp_path):
    down = year.DOWN_EVERY_DAYS - 1
    jobs = await live(tmp_path, [down])
    chats = [j for j in jobs if j["endpoint"] == "/api/chat"]
    assert chats and all(j["node"] == year.CHAT and j["state"] == "done" for j in chats)
    assert all(j["finished_at"] >= f"2025-12-{down + 1:02d}T17:00" for j in chats), "they ran once the node was back"
    again = await live(tmp_path, [down], seed=1, name="again")

    def seen(rows: list[dict]) -> list[tuple]:
        return sorted((j["created_at"], j["kind"], j["prompt"] or "", j["state"], j["node"]) for j in rows)

    assert seen(again) == seen(jobs)
