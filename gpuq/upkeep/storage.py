"""The storage budget, watched: the router samples the database's size (SQLite: its pages, what
router.max_database_bytes counts; not the WAL, which a checkpoint folds back) and its disk's free
space ([storage] sample_every, a row of storage_sample), reads its growth per day from the last
week's samples (with the span it was read over), and keeps in memory what /health, /metrics and
the page show (the size now, the file and the WAL, the growth, the free space, the days left) and
what the alerts fire on: the disk full or under [storage] min_free_bytes (at once), or filling
within [storage] warn_days at that growth; the database at, past or near
router.max_database_bytes."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..budget import GROWTH_WINDOW_S, Growth, Sample, Warning, days_left, growth_per_day, storage_warnings
from ..config import Settings
from ..errors import GpuqError
from ..jobs import iso, parse_iso
from ..store import Store
from .alerts import Condition
from .service import Periodic

log = logging.getLogger("gpuq")

REFRESH_S = 5.0  # the size and free space shown are at most this old
SAMPLE_GAP = 0.9  # a sample is skipped when one is younger than this share of sample_every


@dataclass
class Snapshot:
    at: float
    database_bytes: int
    file_bytes: int
    wal_bytes: int
    free_bytes: int | None
    page_size: int | None  # SQLite's; None on PostgreSQL
    growth: Growth | None
    warnings: list[Warning] = field(default_factory=list)
    since: dict[str, float] = field(default_factory=dict)  # each warning's alert: when it began


class StorageWatch(Periodic):
    name = "storage budget"
    interval_s = REFRESH_S
    alerts: tuple[str, ...] = ("disk_filling", "database_filling")

    def __init__(self, settings_of: Callable[[], Settings], store: Store, clock: Callable[[], float] = time.time):
        super().__init__()
        self.settings_of = settings_of
        self.store = store
        self.clock = clock
        self.now: Snapshot | None = None
        self.samples: list[Sample] = []  # the last week's, as last read
        self.sampled_at = 0.0  # this router's last sample (monotonic), 0: none yet

    async def run_once(self) -> Snapshot:
        """Measure now; record a sample when one is due; read the growth again after one."""
        settings = self.settings_of()
        sizes = await self.store.storage_now()
        now = self.clock()
        if not self.sampled_at or time.monotonic() - self.sampled_at >= settings.storage_sample_s:
            self.sampled_at = time.monotonic()
            with contextlib.suppress(GpuqError):  # a full database cannot take a sample: still measured
                await self.store.record_storage_sample(
                    sizes["database_bytes"], sizes["free_bytes"], settings.storage_sample_s * SAMPLE_GAP
                )
            rows = await self.store.storage_samples(now - GROWTH_WINDOW_S)
            self.samples = [Sample(parse_iso(r["at"]), int(r["database_bytes"]), r["free_bytes"]) for r in rows]
        growth = growth_per_day(self.samples, now)
        warnings = storage_warnings(
            sizes["database_bytes"],
            sizes["free_bytes"],
            growth,
            settings.storage_warn_days,
            None if self.store.dsn else settings.max_database_bytes,  # SQLite's cap (max_page_count)
            self.store.where,
            settings.storage_min_free,
            sizes["page_size"] or 4096,
        )
        before = self.now.since if self.now else {}
        since = {w.alert: before.get(w.alert, now) for w in warnings}
        self.now = Snapshot(now, **sizes, growth=growth, warnings=warnings, since=since)
        return self.now

    def json(self) -> dict[str, Any] | None:
        snap = self.now
        if snap is None:
            return None
        settings = self.settings_of()
        growth = snap.growth
        return {
            "database": self.store.where,
            "database_bytes": snap.database_bytes,
            "file_bytes": snap.file_bytes,
            "wal_bytes": snap.wal_bytes,
            "free_bytes": snap.free_bytes,
            "disk": None if self.store.dsn else str(Path(self.store.where).parent),
            "growth_bytes_per_day": None if growth is None else round(growth.per_day),
            "growth_window_s": None if growth is None else round(growth.span_s),  # what it was measured over
            "days_until_full": _rounded(days_left(snap.free_bytes or 0, growth.per_day))
            if snap.free_bytes is not None and growth is not None
            else None,
            "max_database_bytes": None if self.store.dsn else settings.max_database_bytes,
            "min_free_bytes": None if self.store.dsn else settings.storage_min_free,
            "warn_days": settings.storage_warn_days,
            "measured_at": iso(snap.at),
            "warnings": [w.message for w in snap.warnings],
        }

    def conditions(self) -> list[Condition]:
        snap = self.now
        if snap is None:
            return []
        return [Condition(w.alert, "", None, iso(snap.since[w.alert]), w.message, w.fix) for w in snap.warnings]

    def resolution(self, alert: str) -> str:
        days = self.settings_of().storage_warn_days
        if alert == "disk_filling":
            return f"the database's disk has room again: not nearly full, and not filling within {days:g} days"
        return "the database is no longer near router.max_database_bytes"


def _rounded(days: float | None) -> float | None:
    return None if days is None else round(days, 1)
