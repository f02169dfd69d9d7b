"""Background loops that never die silently. Each runs under `supervise`: an unexpected
exception is logged with its traceback, the loop is marked down (so /health turns red, naming
it) and starts again after a backoff. Cancelling a loop still stops it at once."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import described
from ..jobs import iso

log = logging.getLogger("gpuq")

BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 5.0
HEALTHY_S = 60.0  # a loop that ran this long before it crashed starts again from the first backoff


@dataclass
class Loop:
    """One background loop, as /health and /api/nodes show it."""

    name: str  # "worker", "health check", "stale monitor"
    node: str | None = None
    error: str | None = None  # set from a crash until the restart: the loop is not running
    crashed_at: float | None = None
    restart_in_s: float | None = None
    crashes: int = 0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.error is None

    @property
    def label(self) -> str:
        return f"node={self.node} {self.name}" if self.node else self.name

    def problem(self) -> str:
        return f"{self.name} crashed ({self.error}); restarting in {self.restart_in_s:g}s"

    def json(self) -> dict[str, Any]:
        return {
            "loop": self.name,
            "node": self.node,
            "since": iso(self.crashed_at) if self.crashed_at else None,
            "error": self.problem(),
            "crashes": self.crashes,
        }


def backoff(previous_s: float | None, ran_s: float) -> float:
    """The wait before a crashed loop starts again: 0.1 s, twice as long after each crash in a
    row up to 5 s, and 0.1 s again once the loop had run a healthy stretch before crashing."""
    if previous_s is None or ran_s >= HEALTHY_S:
        return BACKOFF_FIRST_S
    return min(previous_s * 2, BACKOFF_MAX_S)


async def supervise(loop: Loop, run: Callable[[], Awaitable[None]]) -> None:
    """Run `run()` until cancelled, starting it again after each crash."""
    delay = None
    while True:
        started = time.monotonic()
        try:
            await run()
            raise RuntimeError("the loop returned; it must run until it is cancelled")
        except Exception as exc:  # not CancelledError: a shutdown still stops the loop
            delay = backoff(delay, time.monotonic() - started)
            loop.error, loop.crashed_at, loop.restart_in_s = described(exc), time.time(), delay
            loop.crashes += 1
            log.exception("%s crashed, restarting in %gs: %s", loop.label, delay, loop.error)
        await asyncio.sleep(delay)
        loop.error = None


class Loops:
    """The router's background loops; stop() cancels them all and waits for them to end."""

    def __init__(self) -> None:
        self.all: list[Loop] = []

    def start(self, name: str, run: Callable[[], Awaitable[None]], node: str | None = None) -> Loop:
        loop = Loop(name, node)
        loop.task = asyncio.create_task(supervise(loop, run), name=f"{name}-{node}" if node else name)
        self.all.append(loop)
        return loop

    def down(self) -> list[Loop]:
        return [loop for loop in self.all if not loop.alive]

    async def stop(self) -> None:
        tasks = [loop.task for loop in self.all if loop.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
