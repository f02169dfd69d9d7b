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
OVERDUE_TIMES = 2.0  # a scheduled backup is overdue past twice `every` since the last success
RETRY_MAX_S = 3600.0  # a failed scheduled backup is tried again after min(every, this)


@dataclass(frozen=True)
class Sample:
    at: float  # epoch seconds
    database_bytes: int
    free_bytes: int | None


def growth_per_day(samples: Sequence[Sample], now: float) -> float | None:
    """Bytes a day the database grew over the last week: from the oldest sample in the window to
    the newest (a sweep that shrinks it shows as negative). None until the samples span an hour."""
    recent = sorted((s for s in samples if now - s.at <= GROWTH_WINDOW_S), key=lambda s: s.at)
    if len(recent) < 2 or recent[-1].at - recent[0].at < GROWTH_MIN_SPAN_S:
        return None
    first, last = recent[0], recent[-1]
    return (last.database_bytes - first.database_bytes) / (last.at - first.at) * DAY_S


def days_left(room: int, growth: float | None) -> float | None:
    """Days until `room` bytes are filled at `growth` bytes a day; None when it does not grow."""
    if growth is None or growth <= 0:
        return None
    return max(room, 0) / growth


@dataclass(frozen=True)
class Warning:
    """A storage warning: /health's and the page's words, and the alert kind it fires."""

    alert: str  # disk_filling | database_filling
    message: str
    fix: str


def storage_warnings(
    size: int, free: int | None, growth: float | None, warn_days: float, max_bytes: int | None, where: str
) -> list[Warning]:
    """What the storage budget warns of now: the disk filling within `warn_days` at the growth, the
    database past nine tenths of max_database_bytes or reaching it within `warn_days`."""
    found = []
    disk_days = days_left(free or 0, growth) if free is not None else None
    if disk_days is not None and disk_days < warn_days:
        found.append(
            Warning(
                "disk_filling",
                f"the disk holding {where} fills in about {disk_days:.1f} days at the database's growth "
                f"({human_bytes(growth or 0)}/day; {human_bytes(free or 0)} free)",
                "free space on that disk, or move the database; prune what the queue no longer needs",
            )
        )
    if max_bytes is not None:
        cap_days = days_left(max_bytes - size, growth)
        if size >= NEAR_CAP * max_bytes or (cap_days is not None and cap_days < warn_days):
            when = f"in about {cap_days:.1f} days" if cap_days is not None else "soon"
            found.append(
                Warning(
                    "database_filling",
                    f"{where} is {human_bytes(size)} of router.max_database_bytes {human_bytes(max_bytes)}; "
                    f"it reaches the cap {when}, then every write is refused",
                    "raise router.max_database_bytes (gpuq.toml, then a restart), or prune what the queue no longer needs",
                )
            )
    return found


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
        if n < 1000 or unit == "TB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1000
    return f"{sign}{n:.1f} TB"
