"""In-process publish/subscribe for live views: queue changes and streamed tokens."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeAlias

# What a subscriber reads: (topic, data), e.g. ("queue", {...}) or a job's streamed tokens.
Event: TypeAlias = tuple[str, dict[str, Any]]


class Bus:
    def __init__(self, max_backlog: int = 10_000):
        self._subscribers: set[asyncio.Queue[Event]] = set()
        self.max_backlog = max_backlog

    def publish(self, topic: str, data: dict[str, Any]) -> None:
        for queue in list(self._subscribers):
            if queue.qsize() >= self.max_backlog:
                continue  # a reader that stopped reading must not hold the router's memory
            queue.put_nowait((topic, data))

    @contextmanager
    def subscribe(self) -> Iterator[asyncio.Queue[Event]]:
        queue: asyncio.Queue[Event] = asyncio.Queue()
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)


async def next_event(queue: asyncio.Queue[Event], timeout_s: float) -> Event | None:
    """The next (topic, data), or None after `timeout_s`. asyncio.timeout rather than wait_for:
    on Python 3.11 wait_for can swallow a cancel that lands as the item arrives (shutdown)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await queue.get()
    except TimeoutError:
        return None
