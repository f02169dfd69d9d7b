"""The store's health as the router lives it, in memory (it cannot be asked of the store): the
calls waiting for the database now, and the last write it refused. /health reads it through
Store.trouble without asking the database, so it answers whatever the database does."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..jobs import iso

# A call to the database (a read, or a write with its commit) that has not returned after this
# long means the store is not answering: /health says so from memory, without asking it.
SLOW_CALL_S = 2.0


class Health:
    def __init__(self, busy_timeout_s: float):
        self.busy_timeout_s = busy_timeout_s
        # The calls waiting for the store now: their monotonic start, per kind ("read", "write").
        self.waiting: dict[str, dict[int, float]] = {"read": {}, "write": {}}
        self.refused: tuple[float, float, str] | None = None  # (since, wall; last, monotonic; why)

    @contextmanager
    def call(self, kind: str) -> Iterator[None]:
        """Count a read or a write as waiting for the store while it runs."""
        key = object()
        self.waiting[kind][id(key)] = time.monotonic()
        try:
            yield
        finally:
            del self.waiting[kind][id(key)]

    def note_refused(self, why: str) -> None:
        now = time.monotonic()
        since = self.refused[0] if self.refused and now - self.refused[1] < self.refusal_hold_s() else time.time()
        self.refused = (since, now, why)

    def refusal_hold_s(self) -> float:
        """A refusal counts for this long: while a lock is held every write is refused, one
        after another, each after the busy timeout; writes between refusals may still land
        (a full disk takes the small ones)."""
        return 2 * self.busy_timeout_s + 2.0

    def trouble(self, slow_s: float = SLOW_CALL_S) -> dict[str, str] | None:
        """What is wrong with the store now, or None: a call waiting past `slow_s` (the store does
        not answer), else writes refused within the last few seconds."""
        now = time.monotonic()
        for kind in ("read", "write"):
            started = min(self.waiting[kind].values(), default=None)
            if started is not None and now - started >= slow_s:
                return {
                    "problem": f"the database is not answering: a {kind} has waited {now - started:.1f}s",
                    "since": iso(time.time() - (now - started)),
                }
        if self.refused is not None and now - self.refused[1] < self.refusal_hold_s():
            since, _, why = self.refused
            return {
                "problem": f"the database refuses writes (for {time.time() - since:.0f}s): {why}",
                "since": iso(since),
            }
        return None
