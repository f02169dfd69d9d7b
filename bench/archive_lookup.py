"""What a 404 for a job id costs when the archive is looked at (gpuq/upkeep/archived.py): a
month's file of the archive as a busy lab's retention writes it (JOBS jobs, each with a prompt,
a run with its output and reasoning, and events: about the year replay's month, 14 MB
compressed), then the lookup of an id that is not there (the worst: the id's month and both
neighbours read whole), the same again (the ids kept), and after a sweep appended (read again).

Alone: `.venv/bin/python -m bench.archive_lookup [JOBS]` (default 12,000)."""

from __future__ import annotations

import random
import string
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from gpuq.upkeep import archive
from gpuq.upkeep.archived import ArchiveIndex

MONTH_START = 1764547200  # 2025-12-01T00:00:00Z


def text(rng: random.Random, n: int) -> str:
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(n // 6)]
    return " ".join(words)[:n]


def job(rng: random.Random, i: int) -> dict:
    made = MONTH_START + i * 200
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(made))
    return {
        "id": f"{made}-{rng.getrandbits(32):08x}",
        "kind": "task",
        "state": "done",
        "node": "node-1",
        "created_at": stamp,
        "prompt": text(rng, 1500),
        "runs": [{"id": i, "output": text(rng, 4000), "thinking": text(rng, 1500)}],
        "events": [{"at": stamp, "kind": "state", "text": "queued -> running"}] * 4,
    }


def main(jobs: int) -> None:
    rng = random.Random(8)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        for start in range(0, jobs, 500):  # as sweeps append: one gzip member a batch
            archive.append(directory, [job(rng, i) for i in range(start, min(jobs, start + 500))], "delete", 0.0)
        [month] = archive.files(directory)
        absent = f"{MONTH_START + 86400}-ffffffff"
        index = ArchiveIndex(directory)
        tracemalloc.start()
        took = timed(index.find, absent)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        again = timed(index.find, absent)
        archive.append(directory, [job(rng, jobs)], "delete", 0.0)
        after = timed(index.find, absent)
        print(f"a month of {jobs} jobs: {month.stat().st_size / 1e6:.1f} MB compressed")
        print(f"absent id, first lookup (the month read whole): {took * 1000:.0f} ms; ids held: {held / 1e6:.1f} MB")
        print(f"absent id, again: {again * 1e6:.0f} us; after a sweep appended: {after * 1000:.0f} ms")


def timed(fn, *args) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 12_000)
