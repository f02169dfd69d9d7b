"""The shape of every upkeep service, as River's queue maintainer gives its services one: each is
started, run once whenever it is due, and stopped, by the one composition root (gpuq/upkeep/
__init__.py). `run_once` does one round of the work and returns what it did (the tests call it);
`pause` waits until the next round is due (a sleep, or an event a reload or a new firing sets)."""

from __future__ import annotations

import asyncio


class Service:
    """A background service that keeps the router healthy over time."""

    name = "service"  # the loop's name on /health when it crashes

    async def start(self) -> None:
        """Before the first round: what the service opens (a session, its first reads)."""

    async def stop(self) -> None:
        """After the last round: what the service closes."""

    async def run_once(self) -> object:
        """One round of the work; what it did."""
        raise NotImplementedError

    async def pause(self) -> None:
        """Until the next round is due."""
        raise NotImplementedError


class Periodic(Service):
    """A service run every `interval_s`: its first round at once, or after one interval when
    `first_at_once` is False."""

    interval_s = 1.0
    first_at_once = True

    def __init__(self) -> None:
        self.rounds_begun = 0

    async def pause(self) -> None:
        self.rounds_begun += 1
        if self.rounds_begun > 1 or not self.first_at_once:
            await self.wait()

    async def wait(self) -> None:
        """Between two rounds: `interval_s` (a service woken early waits on its event instead)."""
        await asyncio.sleep(self.interval_s)
