"""The retention sweep as a service of the router (River's job cleaner is the model): every
[retention] every, and once a minute after the start, ended jobs past their time are archived,
then deleted (their rows) or pruned (their bulk), in batches of at most [retention] batch jobs and
1 MiB, smaller after a long hold of the writer (gpuq/upkeep/pacing.py), each batch one short
transaction of the writer, so a claim or a submit never waits long behind it. Then,
on SQLite, the pages freed go back to the disk (incremental_vacuum), and once the space pruned
rows left empty inside pages is [retention] compact of the file, the file is rewritten at idle.
With several routers on one
PostgreSQL, only the router holding the "retention" maintenance lease sweeps. The settings are
read at each run: a reload changes the next one. `run_once()` returns counts (tests call it);
`plan()` is the dry run of `gpuq prune --dry-run`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import GpuqError, StoreUnavailable
from ..store import Store
from ..store.leases import Router
from ..store.retention import STEPS, Cutoffs
from . import archive
from .pacing import Pacer, fitting
from .retention_report import RetentionReport
from .service import Service

log = logging.getLogger("gpuq")

SERVICE = "retention"
FIRST_SWEEP_S = 60.0  # after a start: the router's own start goes first
# After each batch the sweep pauses PAUSE_FACTOR times as long as the batch took (at most
# MAX_PAUSE_S): the writer is the sweep's a tenth of the time, so few of the queue's own writes
# (a submit, a claim) find a batch in their way, and those wait a few milliseconds at most.
PAUSE_FACTOR = 9.0
MAX_PAUSE_S = 1.0
GIVE_BACK_PAGES = 2048  # free pages returned to the disk per step (8 MiB at 4 KiB pages)
COMPACT_MIN_BYTES = 1 << 20  # less empty space than this is not worth rewriting the file for
# A compacted file still holds this share of it empty: a B-tree's pages are never all full (the
# year benchmark's file held 2.4 of 16.3 MB empty right after a VACUUM). Only space past it counts.
SLACK = 0.15
POLL_S = 5.0  # the loop reads the sweeps' record this often: another router's sweep shows within it


@dataclass
class Swept:
    """What one sweep did (or, dry, would do)."""

    deleted: dict[str, int] = field(default_factory=lambda: {"jobs": 0, "runs": 0, "events": 0})
    pruned: dict[str, int] = field(default_factory=lambda: {"jobs": 0, "chunks": 0})
    archived: dict[str, int] = field(default_factory=lambda: {"jobs": 0, "bytes": 0})
    parts: dict[str, int] = field(default_factory=lambda: {"parts": 0, "bytes": 0})  # images no job holds now
    # ended batches: pruned (their files, their lines' replies), deleted, archived first
    sweeps: dict[str, int] = field(
        default_factory=lambda: {"pruned": 0, "deleted": 0, "lines": 0, "files": 0, "archived": 0}
    )
    pages_freed: int = 0
    compacted: dict[str, float] | None = None  # SQLite: the file rewritten at idle (before, after, seconds)
    batches: int = 0
    longest_batch_ms: float = 0.0  # the longest a batch's write took, its queueing and commit included
    longest_hold_ms: float = 0.0  # the longest a batch's statements held the writer
    seconds: float = 0.0
    skipped: str | None = None  # why it did not run (another router sweeps)

    def json(self) -> dict[str, Any]:
        return {
            "deleted": self.deleted,
            "pruned": self.pruned,
            "archived": self.archived,
            "parts": self.parts,
            "sweeps": self.sweeps,
            "pages_freed": self.pages_freed,
            "compacted": self.compacted,
            "batches": self.batches,
            "longest_batch_ms": round(self.longest_batch_ms, 3),
            "longest_hold_ms": round(self.longest_hold_ms, 3),
            "seconds": round(self.seconds, 3),
            "skipped": self.skipped,
        }


async def pause_after(began: float) -> None:
    """Between two batches of a sweep (of jobs or of ended batches): PAUSE_FACTOR times as long as
    the last one took, from its read to its commit, at most MAX_PAUSE_S."""
    await asyncio.sleep(min((time.monotonic() - began) * PAUSE_FACTOR, MAX_PAUSE_S))


def cutoffs_of(settings: Settings, now: float) -> Cutoffs:
    return Cutoffs.at(
        now,
        settings.retention_prune_after_s,
        settings.retention_prune_failed_after_s,
        settings.retention_delete_after_s,
        settings.retention_prune_cancelled_after_s,
    )


class Sweeper(Service):
    name = "retention sweep"

    def __init__(self, store: Store, settings: Callable[[], Settings], router: Callable[[], Router | None]):
        self.store = store
        self.settings = settings  # read at each run: a reload applies to the next sweep
        self.router = router  # this router's row (for the maintenance lease on PostgreSQL)
        self.lock = asyncio.Lock()  # one sweep at a time (the loop's, `gpuq prune`'s)
        self.slack: int | None = None  # the bytes the file held empty right after its last compaction here
        self.last: Swept | None = None
        # Each step's batch size, adapted to the holds measured (gpuq/upkeep/pacing.py).
        self.pacers = {(kind, step): Pacer() for kind in ("jobs", "batches") for step in STEPS}
        # What /health, `gpuq storage` and the alerts say of the sweeps (from their record).
        self.report = RetentionReport(store, settings, min(FIRST_SWEEP_S, settings().retention_every_s))
        self.began = time.monotonic()  # the first sweep is due a minute after the start
        self.ended: float | None = None  # the next, [retention] every after the last one ended

    async def plan(self) -> dict[str, Any]:
        """The dry run: what a sweep now would drop, and its bytes; nothing changes."""
        settings = self.settings()
        found = await self.store.retention_plan(cutoffs_of(settings, self.store.clock()))
        return found | {"archive": None if settings.retention_archive is None else str(settings.retention_archive)}

    async def holds_lease(self, settings: Settings) -> bool:
        """SQLite: always (one router). PostgreSQL: when this router holds the sweep's lease."""
        router = self.router()
        if self.store.alone or router is None:
            return self.store.alone
        return await self.store.take_service(router, SERVICE, max(settings.retention_every_s * 2, 60.0))

    async def run_once(self, force: bool = False) -> Swept:
        """One sweep, whole: every job due, batch by batch. `force`: even when another router
        holds the lease (an admin's `gpuq prune` on this router, which leaves the schedule be)."""
        try:
            return await self._run_once(force)
        finally:
            if not force:
                self.ended = time.monotonic()

    async def _run_once(self, force: bool) -> Swept:
        async with self.lock:
            settings = self.settings()
            started = time.monotonic()
            swept = Swept()
            if not force and not await self.holds_lease(settings):
                swept.skipped = "another router runs the retention sweep"
                return swept
            began = self.store.clock()
            self.report.running = True
            try:
                await self._sweep(settings, swept)
            except GpuqError as exc:  # on the record as far as it got, and why it stopped
                swept.seconds = time.monotonic() - started
                await self._ran(force, began, swept, exc.message)
                raise
            finally:
                self.report.running = False
            swept.seconds = time.monotonic() - started
            self.last = swept
            if swept.batches:
                log.info("retention sweep: %s", swept.json())
            await self._ran(force, began, swept, None)
            return swept

    async def _sweep(self, settings: Settings, swept: Swept) -> None:
        cutoffs = cutoffs_of(settings, self.store.clock())
        for step in STEPS:  # a batch first: its lines' jobs are deleted after it
            await self._batch_step(step, cutoffs, settings, swept)
        for step in STEPS:
            await self._step(step, cutoffs, settings, swept)
        if swept.deleted["jobs"] or swept.pruned["jobs"] or swept.sweeps["files"]:
            # The requests' large parts (gpuq/store/parts.py) that only these jobs held go too.
            dropped = await self.store.drop_unreferenced_parts()
            swept.parts = {"parts": int(dropped["parts"]), "bytes": int(dropped["bytes"] or 0)}
            swept.pages_freed = await self._give_back()
            swept.compacted = await self._compact_when_due(settings)

    async def _ran(self, asked: bool, began: float, swept: Swept, error: str | None) -> None:
        router = self.router()
        await self.report.ran(None if router is None else router.id, asked, began, swept.json(), error)

    async def _step(self, step: str, cutoffs: Cutoffs, settings: Settings, swept: Swept) -> None:
        pacer, cap = self.pacers["jobs", step], settings.retention_batch
        while True:
            began_batch = time.monotonic()
            asked = pacer.take(cap)
            ids = await self.store.retention_due(step, cutoffs, asked)
            if not ids:
                return
            if settings.retention_archive is not None:
                jobs = await self.store.whole_jobs(ids)
                ids, written = await self._archive(settings.retention_archive, jobs, step, "jobs")
                swept.archived["bytes"] += written
                swept.archived["jobs"] += len(ids)
            began = time.monotonic()
            if step == "delete":
                done = await self.store.delete_ended(ids, cutoffs)
                total = swept.deleted
            else:
                done = await self.store.prune(ids, cutoffs)
                total = swept.pruned
            swept.longest_batch_ms = max(swept.longest_batch_ms, (time.monotonic() - began) * 1000)
            swept.batches += 1
            held_ms = done.pop("held_ms")
            swept.longest_hold_ms = max(swept.longest_hold_ms, held_ms)
            pacer.held(asked, len(ids), held_ms, cap)
            for key, n in done.items():
                total[key] += n
            if not done["jobs"]:  # all changed since the read (a retry): they are not due any more
                return
            await pause_after(began_batch)

    async def _batch_step(self, step: str, cutoffs: Cutoffs, settings: Settings, swept: Swept) -> None:
        """Ended batches due for `step`, archived first (one line per batch, whole: its lines and
        files, in the archive's batches-YYYY-MM.jsonl.gz), then pruned or deleted."""
        pacer, cap = self.pacers["batches", step], settings.retention_batch
        while True:
            began_batch = time.monotonic()
            asked = pacer.take(cap)
            ids = await self.store.retention_batches_due(step, cutoffs, asked)
            if not ids:
                return
            if settings.retention_archive is not None:
                batches = await self.store.whole_batches(ids)
                ids, written = await self._archive(settings.retention_archive, batches, step, "batches")
                swept.archived["bytes"] += written
                swept.sweeps["archived"] += len(ids)
            if step == "delete":
                done = await self.store.delete_batches(ids, cutoffs)
                swept.sweeps["deleted"] += done["batches"]
                swept.sweeps["lines"] += done["lines"]
            else:
                done = await self.store.prune_batches(ids, cutoffs)
                swept.sweeps["pruned"] += done["batches"]
            swept.sweeps["files"] += done["files"]
            swept.batches += 1
            swept.longest_hold_ms = max(swept.longest_hold_ms, done["held_ms"])
            pacer.held(asked, len(ids), done["held_ms"], cap)
            if not done["batches"]:
                return
            await pause_after(began_batch)

    async def _archive(
        self, directory: Path, records: list[dict[str, Any]], step: str, kind: str
    ) -> tuple[list[str], int]:
        """The first of `records` (whole jobs or batches) whose lines fit one batch's byte budget
        (at least one; the rest stay due for the next batch), written and fsynced before they
        leave the database: their ids, and the bytes written. An archive that cannot be written
        stops the sweep with nothing of this batch dropped."""
        lines = await asyncio.to_thread(archive.encoded, directory, records, step, self.store.clock(), kind)
        lines = lines[: fitting([len(line) for _, line in lines])]
        try:
            written = await asyncio.to_thread(archive.write, directory, lines)
        except (archive.Unwritable, OSError) as exc:
            raise StoreUnavailable(
                f"the retention archive {directory} cannot be written ({exc}); nothing of this batch was pruned or"
                f" deleted: its {len(lines)} {kind} stay in the database until the archive takes them"
            ) from exc
        return [r["id"] for r in records[: len(lines)]], written

    async def _give_back(self) -> int:
        freed = 0
        while (n := await self.store.give_back_space(GIVE_BACK_PAGES)) > 0:
            freed += n
            if n < GIVE_BACK_PAGES:
                break
        return freed

    async def _compact_when_due(self, settings: Settings) -> dict[str, float] | None:
        """SQLite: the file rewritten (VACUUM) once the space left empty inside its pages, past what
        a compacted file holds empty anyway (measured after this router's last compaction, else
        SLACK of it), reaches [retention] compact of it, when no job waits or runs (the rewrite holds the writer: a
        submit meanwhile waits for it), and the disk has room for the copy. What it did, or None."""
        share = settings.retention_compact_share
        if share is None or not self.store.alone:
            return None
        if any(n.running or n.queued for n in (await self.store.active_by_node()).values()):
            return None
        empty = (await self.store.relations())["empty_bytes"]
        now = await self.store.storage_now()
        if empty is None:
            return None
        slack = self.slack if self.slack is not None else min(empty, int(SLACK * now["file_bytes"]))
        if empty - slack < max(COMPACT_MIN_BYTES, share * now["file_bytes"]):
            return None
        if now["free_bytes"] is not None and now["free_bytes"] < now["database_bytes"]:
            log.warning(
                "retention: the database holds %d MB empty, but its disk has no room for the rewritten copy"
                " (%d MB free): not compacted",
                empty >> 20,
                now["free_bytes"] >> 20,
            )
            return None
        done = await self.store.compact()
        if done is not None:
            self.slack = (await self.store.relations())["empty_bytes"]
            log.info(
                "retention: database compacted (%d MB empty inside its pages): %.1f -> %.1f MB in %.2fs",
                empty >> 20,
                done["before"] / 1e6,
                done["after"] / 1e6,
                done["seconds"],
            )
        return done

    async def pause(self) -> None:
        """Until the next sweep is due: a first one a minute after the start, then [retention]
        every after each ends (a reload's new `every` counts from there); meanwhile the record is
        read again every POLL_S, so a sweep by another router (or `gpuq prune`) shows."""
        while True:
            every = self.settings().retention_every_s
            due = self.began + min(FIRST_SWEEP_S, every) if self.ended is None else self.ended + every
            left = due - time.monotonic()
            self.report.next_at = self.store.clock() + max(left, 0.0)
            if left <= 0:
                return
            try:
                await self.report.refresh()
            except GpuqError as exc:  # the database refused a read: the last one read stays shown
                log.warning("retention sweep: its record not read: %s", exc.message)
            await asyncio.sleep(min(POLL_S, left))
