"""The retention sweep's batches bounded by work (gpuq/upkeep/pacing.py): a batch stops taking jobs at
a byte budget, and its size adapts to the writer holds it measures (halved after a hold over the
target, grown back a quarter at a time after short ones). The rules as pure functions, then the
real sweep on a real SQLite file: jobs whose archived lines outweigh the budget go in several
batches, each within it, and every one is archived and pruned."""

from __future__ import annotations

import json
import zlib

from gpuq.store import Store
from gpuq.upkeep.pacing import BATCH_BYTES, GROW_BELOW_MS, TARGET_HOLD_MS, Pacer, fitting, next_size
from gpuq.upkeep.retention import Sweeper

DAY = 86400


def test_a_hold_over_the_target_halves_the_next_batch_down_to_one_job():
    assert next_size(100, 100, TARGET_HOLD_MS + 1, 100) == 50
    assert next_size(100, 30, 147.0, 100) == 15  # halved from the jobs that held it, not from those asked
    sizes = [100]
    for _ in range(10):
        sizes.append(next_size(sizes[-1], sizes[-1], 80.0, 100))
    assert sizes[:8] == [100, 50, 25, 12, 6, 3, 1, 1] and sizes[-1] == 1  # never zero


def test_short_holds_grow_the_batch_back_slowly_up_to_the_configured_batch():
    assert next_size(1, 1, 0.5, 100) == 2
    assert next_size(8, 8, GROW_BELOW_MS - 0.1, 100) == 10  # a quarter more
    grown, steps = 1, 0
    while grown < 100:
        grown = next_size(grown, grown, 1.0, 100)
        steps += 1
    assert grown == 100 and steps > 10  # not back at once: one short hold is no proof
    assert next_size(100, 100, 0.1, 100) == 100  # never past the configured batch
    assert next_size(100, 100, 0.1, 40) == 40  # a reload's smaller batch applies at once


def test_a_hold_between_grows_nothing_and_a_batch_cut_by_bytes_keeps_its_count():
    assert next_size(40, 40, (GROW_BELOW_MS + TARGET_HOLD_MS) / 2, 100) == 40
    assert next_size(40, 3, 1.0, 100) == 50  # three jobs filled the byte budget: the count was not the problem


def test_a_batch_takes_jobs_up_to_the_byte_budget_and_always_one():
    assert fitting([100] * 10, 1000) == 10
    assert fitting([300] * 10, 1000) == 3
    assert fitting([5000, 10], 1000) == 1  # a job larger than the budget goes alone
    assert fitting([], 1000) == 0
    assert fitting([BATCH_BYTES // 2] * 4) == 2


def test_a_pacer_starts_at_the_configured_batch_and_follows_its_holds():
    pacer = Pacer()
    assert pacer.take(100) == 100
    pacer.held(100, 100, 60.0, 100)
    assert pacer.take(100) == 50 and pacer.take(10) == 10


async def test_jobs_heavier_than_a_batchs_budget_are_swept_in_several_batches_each_within_it(tmp_path):
    from gpuq.config import Settings
    from gpuq.jobs import NewJob
    from gpuq.store import NodeInfo

    now = [1_800_000_000.0]
    store = Store(tmp_path / "q.db", clock=lambda: now[0])
    await store.open()
    try:
        node = [NodeInfo("a", 1, ("task",), "m", True, idle=False)]
        ids = []
        for i in range(6):  # 6 prompts of 400 KB each: about 2.4 MB to archive, 1 MiB a batch
            [job] = await store.submit(NewJob("task", f"{i} " + "x" * (400 << 10), node="a"), node, "api")
            await store.delete(job["id"], "api")
            ids.append(job["id"])
        now[0] += 400 * DAY
        settings = Settings(retention_archive=tmp_path / "archive")
        sweeper = Sweeper(store, lambda: settings, lambda: None)
        swept = await sweeper.run_once()
        assert swept.deleted["jobs"] == 6 and swept.archived["jobs"] == 6
        assert swept.batches >= 3  # two jobs fit in 1 MiB, not three
        members = []
        for path in (tmp_path / "archive").glob("jobs-*.jsonl.gz"):
            raw = path.read_bytes()
            while raw:  # each gzip member is one batch's append
                d = zlib.decompressobj(31)
                members.append(d.decompress(raw))
                raw = d.unused_data
        assert len(members) == swept.batches and all(len(m) <= BATCH_BYTES for m in members)
        lines = [json.loads(t) for m in members for t in m.splitlines()]
        assert sorted(line["id"] for line in lines) == sorted(ids)
    finally:
        await store.close()
