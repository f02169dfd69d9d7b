"""In-process publish/subscribe for live views: queue changes and streamed tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager


class Bus:
    def __init__(self, max_backlog: int = 10_000):
        self._subscribers: set[asyncio.Queue] = set()
        self.max_backlog = max_backlog

    def publish(self, topic: str, data: dict) -> None:
        for queue in list(self._subscribers):
            if queue.qsize() >= self.max_backlog:
                continue  # a reader that stopped reading must not hold the router's memory
            queue.put_nowait((topic, data))

    @contextmanager
    def subscribe(self) -> Iterator[asyncio.Queue]:
        queue: asyncio.Queue = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)


async def next_event(queue: asyncio.Queue, timeout_s: float) -> tuple[str, dict] | None:
    """The next (topic, data), or None after `timeout_s`. asyncio.timeout rather than wait_for:
    on Python 3.11 wait_for can swallow a cancel that lands as the item arrives (shutdown)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await queue.get()
    except TimeoutError:
        return None
