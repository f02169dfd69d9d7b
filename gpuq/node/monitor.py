"""Each node's health as the router sees it: up or down, the models it has, a model stuck in
VRAM. The monitor asks the node (/api/version and /api/tags) on a timer (health_interval), and
at once when the worker finds the node down, then more often until it answers; nothing asks
before a claim. The worker reports what it learns on the way: a node it cannot reach (the job
goes back to the head of its queue, see Worker._not_reached), a model that would not leave VRAM."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from ..errors import OllamaError, StoreUnavailable
from ..jobs import normalize_model
from ..store import Store
from .runtime import NodeRuntime

log = logging.getLogger("gpuq")

DOWN_RECHECK_S = 2.0  # a node that is down is asked again at least this often


class NodeMonitor:
    """Health checks of one node; `changed` tells the pages (the bus) what changed."""

    def __init__(
        self,
        rt: NodeRuntime,
        store: Store,
        interval_s: float,
        changed: Callable[..., None],
        came_up: Callable[[], None],
    ):
        self.rt = rt
        self.store = store
        self.interval_s = interval_s
        self.changed = changed
        self.came_up = came_up  # wakes the node's worker
        self.went_down = asyncio.Event()  # set when the node is found down (by the worker too)

    async def run(self) -> None:
        """The health loop: a node that is down is asked more often, to notice it is back, and
        from the moment it is found down, not at the end of a healthy node's long interval."""
        while True:
            await self.check()
            self.went_down.clear()
            try:
                async with asyncio.timeout(self.interval_s if self.rt.up else min(self.interval_s, DOWN_RECHECK_S)):
                    await self.went_down.wait()
            except TimeoutError:
                pass

    async def check(self) -> None:
        """Ask the node what it runs and has; it is up when both answer."""
        rt = self.rt
        # Both questions at once: one round trip, not two. A failure is
        # reported as the sequential check would: /api/version's first.
        answers = await asyncio.gather(rt.client.version(), rt.client.tags(), return_exceptions=True)
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None and not isinstance(failed, OllamaError):
            raise failed
        rt.checked = True
        if failed is None:
            rt.version, rt.tags = answers[0], answers[1]
            rt.installed = frozenset(normalize_model(m["name"]) for m in rt.tags)
            rt.model_installed = normalize_model(rt.config.model) in rt.installed
            await self._clear_stuck_if_gone()
        await self.set_up(failed is None, None if failed is None else failed.message)
        await self._record_models()  # (after: the health in memory never waits on this write)

    async def _record_models(self) -> None:
        """The models it lists, in its row when they changed: other routers on the database place
        batch lines here by them (Store.nodes_driven_elsewhere). Refused: written at a next check."""
        rt = self.rt
        if rt.installed is None or rt.installed == rt.models_recorded:
            return
        try:
            await self.store.record_node_models(rt.name, sorted(rt.installed))
            rt.models_recorded = rt.installed
        except StoreUnavailable as exc:
            log.error("node=%s models not recorded: %s", rt.name, exc.message)

    async def set_up(self, up: bool, error: str | None) -> None:
        """Record up or down (and why) in memory at once, in the node table when it changed."""
        rt = self.rt
        changed = up != rt.up or (not up and error != rt.last_error)
        if up != rt.up:
            rt.since = time.time()
            if up:
                log.info("node=%s health=up", rt.name)
                self.came_up()
            else:
                log.warning("node=%s health=down error=%r", rt.name, error)
                self.went_down.set()
            self.changed(node=rt.name, up=up)
        rt.up = up
        rt.last_error = error if not up else rt.last_error
        if changed or rt.health_unrecorded:
            try:
                await self.store.set_node_health(rt.name, up, rt.last_error)
                rt.health_unrecorded = False
            except StoreUnavailable as exc:  # claims follow the state in memory; the row catches up
                rt.health_unrecorded = True
                log.error("node=%s health not recorded: %s", rt.name, exc.message)

    def flag_stuck(self, message: str, model: str, job_id: str | None) -> None:
        """A model would not leave VRAM: nothing is claimed onto the node until it is gone."""
        rt = self.rt
        rt.vram_stuck, rt.stuck_model, rt.stuck_since, rt.stuck_job = message, model, time.time(), job_id
        self.changed(node=rt.name, vram_stuck=True)

    async def _clear_stuck_if_gone(self) -> None:
        rt = self.rt
        if not rt.vram_stuck or rt.current is not None:  # never behind a running job's back
            return
        try:
            if normalize_model(rt.stuck_model or rt.config.model) not in await rt.client.loaded():
                log.info("node=%s vram=clear", rt.name)
                rt.vram_stuck = rt.stuck_model = rt.stuck_since = rt.stuck_job = None
                self.changed(node=rt.name, vram_stuck=False)
        except OllamaError:
            pass
