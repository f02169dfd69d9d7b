"""A batch's lines are placed and queued in one go (gpuq/store/batches.py queue_lines,
placement.place_batch), exactly where one submit per line would put them: the same nodes by
model and queue length, the same places in each queue with fair share and the lanes."""

from __future__ import annotations

import pytest

from gpuq.config import NodeConfig
from gpuq.errors import ModelMissing
from gpuq.jobs import Lane, NewJob, NodeCounts
from gpuq.placement import node_views, place_batch, place_task
from gpuq.store import NodeInfo, Store
from gpuq.store.batches import NewBatch, NewLine

NODES = [
    NodeInfo("a", 1, ("task",), "m:1", True, frozenset({"m:1", "big:70b"})),
    NodeInfo("b", 2, ("task",), "m:1", True, frozenset({"m:1"})),
    NodeInfo("c", 3, ("task", "critique"), "m:1", False, frozenset({"m:1", "big:70b"})),
]


def test_place_batch_chooses_as_place_task_would_one_by_one():
    counts = {"a": NodeCounts(1, 2), "b": NodeCounts(0, 0), "c": NodeCounts(0, 5)}
    models = ["m:1", "big:70b", "m:1", "m:1", "nowhere:1", "big:70b", "m:1", None]
    got = place_batch(node_views(NODES, counts), models)
    live = dict(counts)
    for model, placed in zip(models, got, strict=True):
        try:
            expected = place_task(node_views(NODES, live), None, model, Lane.BATCH)
        except ModelMissing as exc:
            assert isinstance(placed, ModelMissing) and placed.message == exc.message
            continue
        assert placed == expected
        running, queued = live.get(expected.node, NodeCounts())
        live[expected.node] = NodeCounts(running, queued + 1)


async def queue_of(store: Store, node: str) -> list[tuple[str, str]]:
    _, queued, _ = await store.queue(node, 1000)
    return [(j["owner"], j["lane"]) for j in queued]


@pytest.mark.parametrize("fair", [False, True])
async def test_a_batch_enters_each_queue_where_one_submit_per_line_would(tmp_path, fair):
    """bob and carol have batch jobs waiting, someone an interactive one; alice's 6 lines enter
    node a's queue (one node) in one go and one by one: the same order."""
    node = [NodeInfo("a", 1, ("task",), "m:1", True, frozenset({"m:1"}))]
    orders = []
    for way in ("one by one", "in one go"):
        store = Store(tmp_path / f"{way}.db")
        await store.open()
        await store.configure(
            {"stale_after_s": 600.0, "stale_grace_s": 30.0, "max_runtime_s": 3600.0},
            [NodeConfig("a", "http://a:11434", 1, ("task",), "m:1")],
        )
        for owner, lane in [
            ("bob", "batch"),
            ("bob", "batch"),
            ("carol", "batch"),
            ("bob", "batch"),
            ("dan", "interactive"),
            ("carol", "batch"),
        ]:
            await store.submit(NewJob("task", "old", model="m:1", owner=owner, lane=lane), node, "api", fair=fair)
        jobs = [
            NewJob("task", f"l{i}", model="m:1", endpoint="/v1/chat/completions", request="{}", owner="alice")
            for i in range(6)
        ]
        if way == "one by one":
            for job in jobs:
                await store.submit(job, node, "api", fair=fair)
        else:
            lines = [NewLine(i, f"c{i}", job) for i, job in enumerate(jobs)]
            await store.create_batch(
                NewBatch("b", "openai", "/v1/chat/completions", "24h", 0.0, "alice"), lines, node, "api", fair=fair
            )
        orders.append(await queue_of(store, "a"))
        await store.close()
    assert orders[0] == orders[1]
    if fair:  # alice's first lines interleave with bob's and carol's waiting ones
        assert [o for o, _ in orders[1]][:6] == ["dan", "bob", "carol", "alice", "bob", "carol"]
