"""The stale monitor: once a second, the queue heads that sit on a finished or silent job (the
store's stale_heads view) get an event naming them, once each, and a warning in the log with the
command that clears them. It only names them: a person decides (nothing is retried)."""

from __future__ import annotations

import logging

from ..bus import Bus
from ..store import Row, Store
from .service import Periodic

log = logging.getLogger("gpuq")

STALE_CHECK_S = 1.0


class StaleMonitor(Periodic):
    name = "stale monitor"
    first_at_once = False

    def __init__(self, store: Store, bus: Bus, interval_s: float = STALE_CHECK_S):
        super().__init__()
        self.store = store
        self.bus = bus
        self.interval_s = interval_s

    async def run_once(self) -> list[Row]:
        """Note the heads that turned stale since the last check; returns them."""
        heads = await self.store.note_stale()
        for head in heads:
            log.warning(
                "job=%s node=%s stale reason=%r since=%s fix='gpuq delete %s'",
                head["id"],
                head["node"],
                head["reason"],
                head["since"],
                head["id"],
            )
            self.bus.publish("queue", {"stale": head["id"]})
        return heads
