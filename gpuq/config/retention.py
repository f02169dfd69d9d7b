"""gpuq.toml's [retention] table, checked whole: how long an ended job keeps its bulk and its
rows, where what leaves the database is archived first, and how the sweep paces itself."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .checks import check_table, parse_duration, within
from .keys import RETENTION_KEYS
from .settings import DAY_S

# Retention is counted in days; a setting past ten years is a typo ("off" keeps forever).
_DAYS = re.compile(r"(\d+(?:\.\d+)?)d")
MAX_RETENTION_S = 10 * 366 * DAY_S
BATCH_RANGE = (1, 10_000)
OFF = "off"


def retention_period(value: object, key: str) -> float | None:
    """'30d', '12h', '90m', a number of seconds, or "off" (None: never)."""
    if isinstance(value, str) and value.strip().lower() == OFF:
        return None
    if isinstance(value, str) and (days := _DAYS.fullmatch(value.strip().lower())):
        seconds = float(days[1]) * DAY_S
    else:
        try:
            seconds = parse_duration(value, key)
        except ConfigError:
            raise ConfigError(f'{key}: expected a period like "30d" or "12h", or "off", got {value!r}') from None
    if seconds <= 0:
        raise ConfigError(
            f'{key}: must be more than 0 (it would prune every job as it ends); "off" keeps them, got {value!r}'
        )
    if seconds > MAX_RETENTION_S:
        raise ConfigError(f'{key}: more than ten years is surely a mistake; "off" keeps them for ever, got {value!r}')
    return seconds


def compact_share(value: object) -> float | None:
    """'10%' (of the file left empty), or "off" (None: never compacted by the sweep)."""
    if isinstance(value, str) and value.strip().lower() == OFF:
        return None
    text = value.strip() if isinstance(value, str) else ""
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else -1.0
    except ValueError:
        share = -1.0
    if not 1 <= share * 100 <= 90:
        raise ConfigError(f'retention.compact: expected a percentage from "1%" to "90%", or "off", got {value!r}')
    return share


def archive_dir(value: object, database: Path | str, base_dir: Path) -> Path | None:
    """The archive's directory: as written (relative to gpuq.toml's directory), "off", or left
    out: gpuq-archive beside the SQLite database (on PostgreSQL, beside gpuq.toml)."""
    if value is None:
        return (database.parent if isinstance(database, Path) else base_dir) / "gpuq-archive"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f'retention.archive: expected a directory or "off", got {value!r}')
    if value.strip().lower() == OFF:
        return None
    return base_dir / Path(value).expanduser()


def retention_settings(table: object, database: Path | str, base_dir: Path) -> dict[str, Any]:
    """The [retention] table's Settings fields (every one: its archive's default is computed)."""
    table = check_table(table, "retention", "[retention]", RETENTION_KEYS)
    values: dict[str, Any] = {}
    for key in ("prune_after", "prune_failed_after", "prune_cancelled_after", "delete_after"):
        if key in table:
            values[f"retention_{key}_s"] = retention_period(table[key], f"retention.{key}")
    values["retention_archive"] = archive_dir(table.get("archive"), database, base_dir)
    if "every" in table:
        every = parse_duration(table["every"], "retention.every")
        if every < 1.0:
            raise ConfigError(
                f"retention.every: must be at least 1s (a sweep more often only burns CPU), got {table['every']!r}"
            )
        values["retention_every_s"] = every
    if "compact" in table:
        values["retention_compact_share"] = compact_share(table["compact"])
    batch = within(table, "batch", int, "retention", *BATCH_RANGE)
    if batch is not None:
        values["retention_batch"] = batch
    return values
