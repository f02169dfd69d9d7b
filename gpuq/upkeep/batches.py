"""The batches' upkeep: every second, a batch whose create will never finish (its router died
mid-create, or its create failed) is dropped, the waiting lines of a batch past its completion_window are
cancelled as expired, and each open batch whose every line has ended is finalized (the batch
service's `finalize`, the one place a batch ends), so a batch nobody polls still gets its output,
and the page and /metrics see it end."""

from __future__ import annotations

from ..batches.service import BatchService
from ..bus import Bus
from .service import Periodic

FINALIZE_EVERY_S = 1.0  # how often open batches are looked at, so a finished one is written soon


class BatchFinalizer(Periodic):
    name = "batch finalizer"
    interval_s = FINALIZE_EVERY_S
    first_at_once = False

    def __init__(self, batches: BatchService, bus: Bus) -> None:
        super().__init__()
        self.batches = batches
        self.bus = bus

    async def run_once(self) -> int:
        """Drop the creates that will never finish, expire what is due, finalize what has ended;
        how many batches ended."""
        await self.batches.drop_unfinished()
        ended = await self.batches.expire_due() + await self.batches.finalize_open()
        if ended:
            self.bus.publish("queue", {"batches": "ended"})
        return ended
