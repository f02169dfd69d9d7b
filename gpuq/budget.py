"""Pure rules of the storage budget and the backup schedule: the database's growth per day from
the router's samples, when the disk (or max_database_bytes) is reached at that growth, when the
next scheduled backup is due and when one is overdue, which backups rotation deletes, and a
scheduled backup's file name. No I/O, no clock: the router's services (gpuq/upkeep/backups.py,
gpuq/upkeep/storage.py) give them the facts and the time."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DAY_S = 86400.0
GROWTH_WINDOW_S = 7 * DAY_S  # growth is read over the last week of samples
GROWTH_MIN_SPAN_S = 3600.0  # samples closer than this say nothing of a day's growth yet
NEAR_CAP = 0.9  # max_database_bytes is near past nine tenths of it
# ...and reached with less room left than a few pages or a hundredth of it: a submit's few pages
# may no longer fit (SQLite refuses the write, naming the cap: gpuq/store/sqlite.py cap_reached).
AT_CAP_PAGES = 8
AT_CAP_SHARE = 0.01
OVERDUE_TIMES = 2.0  # a scheduled backup is overdue past twice `every` since the last success
RETRY_MAX_S = 3600.0  # a failed scheduled backup is tried again after min(every, this)


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds
    database_bytes: int
    free_bytes: int | None


@dataclass(frozen=True)
class Growth:
    """The database's growth, and the window it was measured over: from the oldest sample of the
    last week to the newest (an hour of samples is an hour's growth, said per day)."""

    per_day: float  # bytes a day (negative: it shrank)
    span_s: float  # the seconds between the two samples it was read from

    def words(self) -> str:
        """'+5.1 MB/day over the last 3 h'."""
        return f"{'+' if self.per_day >= 0 else ''}{human_bytes(self.per_day)}/day over the last {duration_words(self.span_s)}"


def growth_per_day(samples: Sequence[Sample], now: float) -> Growth | None:
    """Bytes a day the database grew over the last week: from the oldest sample in the window to
    the newest (a sweep that shrinks it shows as negative), with the span it was read over. None
    until the samples span an hour."""
    recent = sorted((s for s in samples if now - s.at <= GROWTH_WINDOW_S), key=lambda s: s.at)
    if len(recent) < 2 or recent[-1].at - recent[0].at < GROWTH_MIN_SPAN_S:
        return None
    first, last = recent[0], recent[-1]
    span = last.at - first.at
    return Growth((last.database_bytes - first.database_bytes) / span * DAY_S, span)


def days_left(room: int, growth: float | None) -> float | None:
    """Days until `room` bytes are filled at `growth` bytes a day; None when it does not grow."""
    if growth is None or growth <= 0:
        return None
    return max(room, 0) / growth


def duration_words(seconds: float) -> str:
    """'45 min', '1 h', '2.5 h', '6.9 days'."""
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * DAY_S:
        return f"{_short(seconds / 3600)} h"
    return f"{_short(seconds / DAY_S)} days"


def _short(x: float) -> str:
    return f"{x:.1f}".removesuffix(".0")


@dataclass(frozen=True)
class Warning:
    """A storage warning: /health's and the page's words, and the alert kind it fires."""

    alert: str  # disk_filling | database_filling
    message: str
    fix: str


DISK_FIX = "free space on that disk, or move the database; prune what the queue no longer needs"
CAP_FIX = "raise router.max_database_bytes (gpuq.toml, then a restart), or prune what the queue no longer needs"


def disk_warning(
    free: int | None, growth: Growth | None, warn_days: float, min_free: int, where: str
) -> Warning | None:
    """The disk holding the database: full or nearly full (under `min_free` bytes free) at once,
    whatever the growth; else filling within `warn_days` at the growth measured."""
    if free is None:  # PostgreSQL: the server's disk is not ours to see
        return None
    if free <= 0 or free < min_free:
        state = (
            "is full (0 B free): writes that need room fail"
            if free <= 0
            else f"is nearly full: {human_bytes(free)} free, under [storage] min_free_bytes {human_bytes(min_free)};"
            " writes that need room fail once it is full"
        )
        return Warning("disk_filling", f"the disk holding {where} {state}", DISK_FIX)
    days = days_left(free, growth.per_day) if growth is not None else None
    if growth is None or days is None or days >= warn_days:
        return None
    return Warning(
        "disk_filling",
        f"the disk holding {where} fills in about {days:.1f} days at the database's growth"
        f" ({growth.words()}; {human_bytes(free)} free)",
        DISK_FIX,
    )


def cap_warning(
    size: int, growth: Growth | None, warn_days: float, max_bytes: int | None, where: str, page_size: int = 4096
) -> Warning | None:
    """router.max_database_bytes (SQLite's max_page_count): `size` is what it counts, the
    database's pages (page_count x page_size, free pages included; not the WAL). Reached or past
    it, said so; past nine tenths, or reaching it within `warn_days` at the growth, warned of."""
    if max_bytes is None:
        return None
    cap = f"router.max_database_bytes {human_bytes(max_bytes)}"
    room = max_bytes - size
    if room < max(AT_CAP_PAGES * page_size, AT_CAP_SHARE * max_bytes):
        at = (
            f"is past {cap} ({human_bytes(size)} of pages)"
            if room < 0
            else (f"is at {cap} ({human_bytes(size)} of pages, {human_bytes(room)} left)")
        )
        return Warning("database_filling", f"{where} {at}: a write that needs more room is refused", CAP_FIX)
    days = days_left(max_bytes - size, growth.per_day) if growth is not None else None
    if size < NEAR_CAP * max_bytes and (days is None or days >= warn_days):
        return None
    if growth is None:
        when = "its growth is not measured yet"
    elif days is None:
        when = f"it does not grow ({growth.words()})"
    else:
        when = f"it reaches the cap in about {days:.1f} days ({growth.words()}), then every write that needs room is refused"
    return Warning(
        "database_filling",
        f"{where} is {human_bytes(size)} of pages of {cap} ({size / max_bytes:.0%}); {when}",
        CAP_FIX,
    )


def storage_warnings(
    size: int,
    free: int | None,
    growth: Growth | None,
    warn_days: float,
    max_bytes: int | None,
    where: str,
    min_free: int = 0,
    page_size: int = 4096,
) -> list[Warning]:
    """What the storage budget warns of now: the disk full or nearly full, or filling within
    `warn_days` at the growth; the database at or past max_database_bytes, past nine tenths of
    it, or reaching it within `warn_days`."""
    found = (
        disk_warning(free, growth, warn_days, min_free, where),
        cap_warning(size, growth, warn_days, max_bytes, where, page_size),
    )
    return [w for w in found if w is not None]


def next_backup_at(last_success: float | None, last_failure: float | None, born: float, every_s: float) -> float:
    """When the next scheduled backup is due: `every` after the last success (after the
    database's birth when there is none: a new, empty database is not backed up at once); a
    failure since then is tried again after min(every, an hour)."""
    due = (last_success if last_success is not None else born) + every_s
    if last_failure is not None and (last_success is None or last_failure > last_success):
        due = max(due, last_failure + min(every_s, RETRY_MAX_S))
    return due


def overdue_since(last_success: float | None, born: float, every_s: float) -> float:
    """From when a scheduled backup is overdue: twice `every` after the last success (or birth)."""
    return (last_success if last_success is not None else born) + OVERDUE_TIMES * every_s


def backup_name(database: str, now: float) -> str:
    """A scheduled backup's file name: the database's stem and the UTC time, sortable."""
    stem = database.rsplit(".", 1)[0] if "." in database else database
    return f"{stem}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(now))}.db"


NAME = re.compile(r"^.+-\d{8}T\d{6}Z(-\d+)?\.db$")  # what backup_name makes (a second in one second: -2)


def to_rotate(made: Sequence[dict[str, Any]], keep: int) -> list[dict[str, Any]]:
    """Of the scheduled backups made and not removed yet (rows of the backup table), the ones
    past the newest `keep`: by id, newest first."""
    newest_first = sorted(made, key=lambda r: r["id"], reverse=True)
    return newest_first[keep:]


def human_bytes(n: float) -> str:
    """'812 B', '3.4 MB', '1.2 GB' (decimal, as disks are sold and `df -H` shows)."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        shown = f"{n:.0f}" if unit == "B" else f"{n:.1f}"
        if float(shown) < 1000 or unit == "TB":  # as rounded: 999,996 bytes are 1.0 MB, not 1000.0 kB
            return f"{sign}{shown} {unit}"
        n /= 1000
    return f"{sign}{n:.1f} TB"
