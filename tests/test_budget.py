"""The storage budget's and the backup schedule's pure rules (gpuq/budget.py): the growth read
from the router's samples, when the disk or the cap is reached, when a backup is due, overdue
and which ones rotation deletes; and a router alert's ntfy title."""

from __future__ import annotations

import pytest

from gpuq.budget import (
    DAY_S,
    NAME,
    Growth,
    Sample,
    backup_name,
    days_left,
    growth_per_day,
    human_bytes,
    next_backup_at,
    overdue_since,
    storage_warnings,
    to_rotate,
)
from gpuq.config import Settings
from gpuq.upkeep.alerts import request_for

NOW = 1_800_000_000.0
GB = 1_000_000_000


def test_growth_is_read_over_the_last_week_once_the_samples_span_an_hour_and_says_over_how_long():
    assert growth_per_day([], NOW) is None
    assert growth_per_day([Sample(NOW - 1800, 100, None), Sample(NOW, 200, None)], NOW) is None  # half an hour
    day = [Sample(NOW - DAY_S, 1 * GB, None), Sample(NOW - DAY_S / 2, 3 * GB, None), Sample(NOW, 2 * GB, None)]
    assert growth_per_day(day, NOW) == Growth(pytest.approx(GB), DAY_S)  # oldest to newest, whatever came between
    old = [Sample(NOW - 30 * DAY_S, 0, None), *day]  # older than a week: not read
    assert growth_per_day(old, NOW) == Growth(pytest.approx(GB), DAY_S)
    shrank = growth_per_day([Sample(NOW - DAY_S, 2 * GB, None), Sample(NOW, GB, None)], NOW)
    assert shrank is not None and shrank.per_day == pytest.approx(-GB)  # a sweep shrank it
    assert days_left(10 * GB, 1 * GB) == 10 and days_left(GB, -GB) is None and days_left(GB, None) is None
    # An hour of samples is an hour's growth, said per day: never "over the last week".
    hour = growth_per_day([Sample(NOW - 3600, GB, None), Sample(NOW, GB + 3_100_000, None)], NOW)
    assert hour is not None and hour.words() == "+74.4 MB/day over the last 1 h"
    assert Growth(-GB, 3 * DAY_S).words() == "-1.0 GB/day over the last 3 days"


def test_a_disk_filling_within_warn_days_and_a_database_near_its_cap_are_warned_of():
    day = Growth(1 * GB, DAY_S)
    assert storage_warnings(GB, 100 * GB, day, 14, None, "/q.db") == []  # 100 days of room
    [disk] = storage_warnings(GB, 10 * GB, day, 14, None, "/q.db")
    assert disk.alert == "disk_filling"
    assert disk.message == (
        "the disk holding /q.db fills in about 10.0 days at the database's growth"
        " (+1.0 GB/day over the last 24 h; 10.0 GB free)"
    )
    assert storage_warnings(GB, None, day, 14, None, "pg") == []  # PostgreSQL: no disk seen
    [cap] = storage_warnings(int(0.95 * GB), 100 * GB, None, 14, GB, "/q.db")  # past nine tenths
    assert cap.alert == "database_filling" and cap.message == (
        "/q.db is 950.0 MB of pages of router.max_database_bytes 1.0 GB (95%); its growth is not measured yet"
    )
    [cap] = storage_warnings(GB // 2, 100 * GB, Growth(GB // 10, 3600), 14, GB, "/q.db")  # five days at 100 MB/day
    assert "in about 5.0 days (+100.0 MB/day over the last 1 h)" in cap.message
    assert "router.max_database_bytes 1.0 GB" in cap.message
    assert storage_warnings(GB // 2, 100 * GB, Growth(GB // 100, DAY_S), 14, GB, "/q.db") == []  # fifty days


def test_a_full_or_nearly_full_disk_warns_at_once_without_any_growth_known():
    [full] = storage_warnings(GB, 0, None, 14, None, "/q.db")  # no samples yet, and no room at all
    assert full.alert == "disk_filling" and full.message.startswith("the disk holding /q.db is full (0 B free)")
    [low] = storage_warnings(GB, 200_000_000, None, 14, None, "/q.db", min_free=GB)
    assert low.alert == "disk_filling" and "is nearly full: 200.0 MB free, under [storage] min_free_bytes 1.0 GB" in (
        low.message
    )
    assert storage_warnings(GB, 2 * GB, None, 14, None, "/q.db", min_free=GB) == []


def test_a_database_at_or_past_its_cap_says_so():
    """The cap counts the database's pages: at it (a few pages left) or past it (a cap lowered
    below the size), the warning says so rather than "it reaches the cap soon"."""
    [at] = storage_warnings(GB - 8192, 100 * GB, None, 14, GB, "/q.db")
    assert at.message == (
        "/q.db is at router.max_database_bytes 1.0 GB (1.0 GB of pages, 8.2 kB left):"
        " a write that needs more room is refused"
    )
    [past] = storage_warnings(2 * GB, 100 * GB, Growth(0, DAY_S), 14, GB, "/q.db")
    assert past.message.startswith("/q.db is past router.max_database_bytes 1.0 GB (2.0 GB of pages)")


def test_a_backup_is_due_every_after_the_last_success_a_failure_retries_within_the_hour_and_twice_is_overdue():
    born = NOW - 10 * DAY_S
    assert next_backup_at(None, None, born, DAY_S) == born + DAY_S  # never backed up: due since long ago
    assert next_backup_at(NOW, None, born, DAY_S) == NOW + DAY_S
    assert next_backup_at(NOW, NOW + 2 * DAY_S, born, DAY_S) == NOW + 2 * DAY_S + 3600  # failed: an hour on
    assert next_backup_at(NOW, NOW + 10, born, 60) == NOW + 70  # every minute: a minute on
    assert next_backup_at(NOW + 5, NOW, born, DAY_S) == NOW + 5 + DAY_S  # a success since the failure
    assert overdue_since(NOW, born, DAY_S) == NOW + 2 * DAY_S and overdue_since(None, born, 60) == born + 120


def test_backups_are_named_by_utc_time_and_rotation_takes_the_oldest_past_keep():
    assert backup_name("gpuq.db", 1764727200.0) == "gpuq-20251203T020000Z.db"
    assert backup_name("queue", 0) == "queue-19700101T000000Z.db"
    assert NAME.match("gpuq-20251203T020000Z.db") and NAME.match("gpuq-20251203T020000Z-2.db")
    assert not NAME.match("gpuq-backup.db") and not NAME.match("notes.txt")
    made = [{"id": i} for i in (3, 1, 5, 2, 4)]
    assert [r["id"] for r in to_rotate(made, 2)] == [3, 2, 1] and to_rotate(made, 7) == []
    assert [human_bytes(n) for n in (812, 3_400_000, -1_200_000_000)] == ["812 B", "3.4 MB", "-1.2 GB"]
    assert [human_bytes(n) for n in (999_996, 999.6, 999_949)] == ["1.0 MB", "1.0 kB", "999.9 kB"]  # as rounded


def test_a_router_alert_is_titled_without_a_node_on_ntfy():
    settings = Settings(alert_url="https://ntfy.sh/lab", alert_format="ntfy")
    body = {"status": "firing", "alert": "backup_failed", "node": "", "job": None, "message": "m", "fix": "f"}
    assert request_for(body, settings, 7)["headers"]["Title"] == "gpuq: backup failed"
    body = {**body, "alert": "node_down", "node": "node-1"}
    assert request_for(body, settings, 7)["headers"]["Title"] == "gpuq: node down on node-1"
