"""Upkeep: every background service that keeps the router healthy over time, as one list of
services of one shape (service.py: start, run once when due, stop), composed here and started and
stopped from here alone, each in a supervised loop (a crash is logged, shown on /health and
restarted: gpuq/node/supervise.py).

The services: the stale check (stale.py), the alerts' check and their delivery (alerts.py), the
scheduled backups (backups.py), the storage watch (storage.py), the retention sweep with its
archive (retention.py, archive.py, retention_report.py, pacing.py), and the batches' expiry and
finalization (batches.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial

from ..batches.service import BatchService
from ..bus import Bus
from ..config import Settings
from ..errors import GpuqError
from ..node.dispatcher import Dispatcher
from ..node.supervise import Loop, Loops
from ..store import Store
from .alerts import AlertDelivery, Alerter
from .backups import Backups
from .batches import BatchFinalizer
from .retention import Sweeper
from .service import Service
from .stale import StaleMonitor
from .storage import StorageWatch

log = logging.getLogger("gpuq")


async def keep(service: Service) -> None:
    """A service's loop: each round when due; a round the database refused is logged and the
    next one tries again (an unexpected error crashes the loop, which its supervisor restarts)."""
    while True:
        await service.pause()
        try:
            await service.run_once()
        except GpuqError as exc:
            log.error("%s: %s", service.name, exc.message)


class Upkeep:
    """The router's upkeep services, by name, and their loops."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        dispatcher: Dispatcher,
        bus: Bus,
        batches: BatchService,
        clock: Callable[[], float] = time.time,
    ) -> None:
        def live() -> Settings:  # the settings in force: a reload changes them
            return dispatcher.settings

        self.stale = StaleMonitor(store, bus)
        self.backups = Backups(live, store, clock, lambda row: bus.publish("queue", {"backup": row and row["id"]}))
        self.storage = StorageWatch(live, store, clock)
        self.sweeper = Sweeper(store, live, lambda: dispatcher.router)
        self.alerter = Alerter(settings, store, dispatcher, sources=(self.backups, self.storage, self.sweeper.report))
        self.delivery = AlertDelivery(self.alerter)
        self.finalizer = BatchFinalizer(batches, bus)
        self.loops = Loops()

    @property
    def services(self) -> Sequence[Service]:
        return (self.stale, self.alerter, self.delivery, self.sweeper, self.backups, self.storage, self.finalizer)

    async def start(self) -> None:
        for service in self.services:
            await service.start()
            self.loops.start(service.name, partial(keep, service))

    async def stop(self) -> None:
        """The loops cancelled and awaited, then each service closed."""
        await self.loops.stop()
        for service in reversed(self.services):
            await service.stop()

    def down(self) -> list[Loop]:
        """The loops not running now (crashed, about to restart), for /health."""
        return self.loops.down()
