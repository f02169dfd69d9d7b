"""How big the retention sweep's next batch is (gpuq/upkeep/retention.py): bounded by work, not only by
a count. A batch of [retention] batch jobs whatever their size held the writer 39 ms on a quiet
2-core VM and 72-147 ms under load, on the days whose batch archived the most bytes (a job's
request with its images frees many pages in the one transaction). So a batch stops taking jobs
once their bytes reach BATCH_BYTES, and its size adapts to the holds it measures: a hold over
TARGET_HOLD_MS halves the next batch (at least one job), and holds well under it grow it back
slowly, a quarter at a time, up to the configured batch. Pure functions: tests call them."""

from __future__ import annotations

from collections.abc import Sequence

TARGET_HOLD_MS = 20.0  # a batch that held the writer longer than this: the next one is half
GROW_BELOW_MS = TARGET_HOLD_MS / 4  # a batch that held it less: the next one grows a quarter
BATCH_BYTES = 1 << 20  # the most a batch archives and drops: 1 MiB of whole jobs (their JSON)


def next_size(asked: int, taken: int, held_ms: float, cap: int) -> int:
    """The next batch's size after one that asked for `asked` jobs and took `taken` (fewer when
    the byte budget or the jobs due ran out) held the writer `held_ms`; within 1..cap. Halved
    from what held it too long; grown from what was asked (a batch cut by bytes says nothing
    about the count)."""
    if held_ms > TARGET_HOLD_MS:
        size = taken // 2
    elif held_ms < GROW_BELOW_MS:
        size = asked + max(asked // 4, 1)
    else:
        size = asked
    return max(1, min(size, cap))


def fitting(sizes: Sequence[int], budget: int = BATCH_BYTES) -> int:
    """How many of the records (their `sizes`, in order) one batch takes: while their bytes stay
    within `budget`, and always the first (a record larger than the budget goes alone)."""
    total = 0
    for n, size in enumerate(sizes):
        total += size
        if total > budget and n > 0:
            return n
    return len(sizes)


class Pacer:
    """One step's batch size across batches and sweeps (a sweep starts where the last one ended)."""

    def __init__(self) -> None:
        self.size: int | None = None  # None: none measured yet, the configured batch

    def take(self, cap: int) -> int:
        """How many jobs to ask for now: the adapted size, within a reload's new cap."""
        return cap if self.size is None else max(1, min(self.size, cap))

    def held(self, asked: int, taken: int, held_ms: float, cap: int) -> None:
        self.size = next_size(asked, taken, held_ms, cap)
