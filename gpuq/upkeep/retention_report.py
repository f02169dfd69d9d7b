"""The retention sweep as /health, `gpuq storage`, the page and the alerts see it: each sweep that
ran is on the record (the retention_sweep table, migration 024), so every router sharing a
PostgreSQL database reports the last one truthfully though only the lease holder sweeps, and a
restart keeps it. The rules mirror the scheduled backups' (gpuq/upkeep/backups.py): an alert fires
while the newest sweep failed (retention_failed) and while none has succeeded for OVERDUE_EVERY x
[retention] every (retention_overdue); both are warnings, and /health's `ok` stays true, since
neither stops a job and a restart mends neither."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from ..config import Settings
from ..errors import GpuqError
from ..jobs import iso, parse_iso, span
from ..store import Row, Store
from .alerts import Condition

log = logging.getLogger("gpuq")

OVERDUE_EVERY = 3  # no sweep succeeded for this many [retention] every: retention_overdue


class RetentionReport:
    """The last sweeps as last read from the record (or, when the database refused the record,
    this router's own), and the alert conditions they make."""

    alerts: tuple[str, ...] = ("retention_failed", "retention_overdue")

    def __init__(self, store: Store, settings: Callable[[], Settings], first_sweep_s: float):
        self.store = store
        self.settings = settings
        self.record: dict[str, Row | None] = {}  # Store.last_sweeps, as last read
        self.unrecorded: Row | None = None  # this router's newest sweep, when its record was refused
        # While no sweep has succeeded, overdue is judged from the first one this router would run.
        self.first_due_at = store.clock() + first_sweep_s
        self.next_at: float | None = None  # this router's next sweep (its lease decides on PostgreSQL)
        self.running = False

    async def refresh(self) -> None:
        self.record = await self.store.last_sweeps()

    async def ran(
        self, router: str | None, asked: bool, started: float, swept: dict[str, Any], error: str | None
    ) -> None:
        """A sweep of this router ended (done, or failed with `error`): on the record, then read back.
        A database that refuses the record (full, locked) still shows it, from memory."""
        try:
            await self.store.record_sweep(router, asked, started, swept, error)
            self.unrecorded = None
            await self.refresh()
        except GpuqError as exc:
            log.error("retention sweep not recorded: %s", exc.message)
            self.unrecorded = {
                "router": router,
                "asked": int(asked),
                "started_at": iso(started),
                "finished_at": iso(self.store.clock()),
                "ok": int(error is None),
                "swept": swept,
                "error": error,
            }

    def last(self) -> Row | None:
        """The newest sweep that ran, done or failed."""
        return newer(self.record.get("last"), self.unrecorded)

    def last_success(self) -> Row | None:
        mine = self.unrecorded if self.unrecorded is not None and self.unrecorded["ok"] else None
        return newer(self.record.get("last_success"), mine)

    def json(self) -> dict[str, Any]:
        settings = self.settings()
        last, success = self.last(), self.last_success()
        return {
            "every_s": settings.retention_every_s,
            "batch": settings.retention_batch,
            "archive": None if settings.retention_archive is None else str(settings.retention_archive),
            "running": self.running,
            "next_at": None if self.next_at is None else iso(self.next_at),
            "last": None if last is None else shown(last),
            "last_success_at": None if success is None else success["finished_at"],
            "failing": last is not None and not last["ok"],
            "overdue": any(c.alert == "retention_overdue" for c in self.conditions()),
        }

    def conditions(self) -> list[Condition]:
        settings = self.settings()
        found = []
        last, success = self.last(), self.last_success()
        if last is not None and not last["ok"]:
            archive = settings.retention_archive
            found.append(
                Condition(
                    "retention_failed",
                    "",
                    None,
                    last["finished_at"],
                    f"the retention sweep failed at {last['finished_at']}: {last['error']}",
                    (f"make {archive} a writable directory with room (or set [retention] archive)" if archive else "")
                    + ("; " if archive else "")
                    + "see the router's log (gpuq logs); `gpuq prune` sweeps again now",
                )
            )
        every = settings.retention_every_s
        late = (parse_iso(success["finished_at"]) if success else self.first_due_at) + OVERDUE_EVERY * every
        if self.store.clock() > late:
            since = f"since {success['finished_at']}" if success else "yet"
            found.append(
                Condition(
                    "retention_overdue",
                    "",
                    None,
                    iso(late),
                    f"no retention sweep has succeeded {since} (every {span(every)}): ended jobs are not "
                    "pruned, the database keeps growing",
                    "see the router's log for why (gpuq logs); `gpuq prune` sweeps now",
                )
            )
        return found

    def resolution(self, alert: str) -> str:
        success = self.last_success()
        return "a retention sweep succeeded" + (f" at {success['finished_at']}" if success else "")


def newer(stored: Row | None, mine: Row | None) -> Row | None:
    """The later of a recorded sweep and this router's unrecorded one (another router's sweep,
    recorded after it, is newer)."""
    if mine is None or (stored is not None and stored["finished_at"] > mine["finished_at"]):
        return stored
    return mine


def shown(row: Row) -> dict[str, Any]:
    swept = row["swept"]
    return {
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "ok": bool(row["ok"]),
        "error": row["error"],
        "by": "gpuq prune" if row["asked"] else "the schedule",
        "router": row["router"],
        "swept": json.loads(swept) if isinstance(swept, str) else swept,
    }
