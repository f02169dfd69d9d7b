"""From one job to the next on a node: no health check stands between a submit and its request
to the node (the monitor asks on its own timer); between two jobs the node hears only the
previous job's unload check. A node that went away since its monitor last asked gets its job
back at the head of the queue (tests/test_faults.py), instead of a check before each claim."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from conftest import eventually, node_table

from gpuq.demo import FakeOllama, Script


@dataclass
class PathLog(FakeOllama):
    paths: list[str] = field(default_factory=list)  # every request, in arrival order

    def app(self) -> web.Application:
        app = super().app()

        @web.middleware
        async def note(request, handler):
            self.paths.append(request.path)
            return await handler(request)

        app.middlewares.append(note)
        return app


def between_chats(paths: list[str]) -> list[list[str]]:
    """The requests before each generation (after the previous one)."""
    runs, current = [], []
    for p in paths:
        if p == "/api/chat":
            runs.append(current)
            current = []
        else:
            current.append(p)
    return runs


async def test_no_health_check_stands_between_a_submit_and_its_request(daemon_factory):
    # A check before each claim cost every job's first token a round trip to the node; a node that
    # went away since its monitor last asked gets its job back instead (tests/test_faults.py).
    fake = PathLog(models={"qwen3-coder:30b"}, script=Script(tokens=3, token_delay_s=0.05))
    await fake.start()
    try:
        d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], health_interval="60s")
        await eventually(lambda: "/api/tags" in fake.paths, what="the monitor's first check")
        submitted = await asyncio.gather(*(d.submit("task", f"job {i}") for i in range(3)))
        ids = [job["id"] for jobs in submitted for job in jobs]
        for job_id in ids:
            await d.wait_state(job_id, "done")
        [late] = await d.submit("task", "after the others")
        await d.wait_state(late["id"], "done")
        before = between_chats(fake.paths)
        assert len(before) == 4
        for gap in before[1:]:  # between jobs: the previous job's unload check, nothing else
            assert "/api/ps" in gap and "/api/version" not in gap and "/api/tags" not in gap, fake.paths
    finally:
        await fake.stop()


async def test_a_stop_in_the_same_tick_as_a_wake_still_ends_the_idle_worker(tmp_path, fakes):
    # On Python 3.11, asyncio.wait_for swallows a cancel that lands together with the event it
    # waits for: an idle worker woken by a submit at the moment of shutdown never stopped.
    from gpuq.bus import Bus
    from gpuq.config import NodeConfig, Settings
    from gpuq.node.dispatcher import Dispatcher
    from gpuq.store import Store

    fake = await fakes("m:latest")
    settings = Settings(
        database=tmp_path / "q.db", health_interval_s=60, nodes=(NodeConfig("n", fake.url, 1, ("task",), "m:latest"),)
    )
    store = Store(settings.database)
    await store.open()
    dispatcher = Dispatcher(settings, store, Bus())
    await dispatcher.start()
    try:
        await eventually(lambda: dispatcher.nodes["n"].checked, what="the node's first check")
        worker = next(loop.task for loop in dispatcher.nodes["n"].loops if loop.name == "worker")
        await eventually(lambda: awaiting(worker, "_wait"), what="the worker to wait for a wake")
        dispatcher.wake()
        await asyncio.wait_for(dispatcher.stop(), 5)
    finally:
        await store.close()


def awaiting(task: asyncio.Task, name: str) -> bool:
    """Is the task suspended inside a coroutine called `name` (following its await chain)?"""
    coro = task.get_coro()
    while coro is not None:
        if getattr(coro, "__name__", None) == name:
            return True
        coro = getattr(coro, "cr_await", None)
    return False
