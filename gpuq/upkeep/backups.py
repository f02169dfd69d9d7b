"""Scheduled backups ([backup] every, keep, dir): the router backs its own SQLite database up with
the code `gpuq backup` runs (Store.backup: a checked `VACUUM INTO` copy, renamed into place),
names each copy with the UTC time, and after each keeps the newest `keep` it made, deleting
older ones it wrote (the backup table says which: never a file it did not write). A failure is
tried again after min(every, an hour). /health and the page show the last success; an alert
fires while the last scheduled backup failed, and while none has succeeded for twice `every`.

One router per database takes them: SQLite has one router (its lock file). On PostgreSQL gpuq
takes none (pg_dump's work; the config refuses [backup] there): the schedule is off."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..budget import NAME, backup_name, next_backup_at, overdue_since, to_rotate
from ..config import Settings
from ..errors import GpuqError
from ..jobs import iso, parse_iso, span
from ..store import Row, Store
from ..store.backup import BackupBusy
from .alerts import Condition
from .service import Periodic

log = logging.getLogger("gpuq")

POLL_S = 5.0  # the longest the loop sleeps: a reload's new `every` is seen within it
PG_OFF = "the database is on PostgreSQL: back it up with pg_dump, pg_basebackup or WAL archiving (docs/operations.md)"


def at(row: Row | None) -> float | None:
    return None if row is None else parse_iso(row["finished_at"])


def latest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return max(known) if known else None


class Backups(Periodic):
    """The schedule, its state for /health (from the backup table, refreshed at each turn) and
    its alert conditions."""

    name = "scheduled backups"
    alerts: tuple[str, ...] = ("backup_failed", "backup_overdue")

    def __init__(
        self,
        settings_of: Callable[[], Settings],
        store: Store,
        clock: Callable[[], float] = time.time,
        on_end: Callable[[Row | None], None] = lambda row: None,
    ):
        self.settings_of = settings_of
        self.store = store
        self.clock = clock
        self.on_end = on_end  # each scheduled backup's end, made or failed: the pages look again
        self.last: dict[str, Row | None] = {}  # Store.last_backups, as last read
        self.born: float | None = None  # the database's first migration
        self.running_since: float | None = None  # a scheduled backup is being made
        self.wake = asyncio.Event()  # a reload: look again now
        self.waiting_turn = False  # `gpuq backup` was making one: look again after POLL_S
        # This router's own last success and failure, beside the records: a database that refuses
        # the record (full) must not make the schedule take a backup again at once, and again.
        self.made_at: float | None = None
        self.failed_at: float | None = None
        super().__init__()

    async def start(self) -> None:
        """Before the first round: the copies that backups killed mid-way left (a SIGKILL, a
        crash) removed from the backup folder and the folders of the backups on record."""
        settings = self.settings_of()
        folders = [] if settings.backups_dir is None else [settings.backups_dir]
        try:
            await self.refresh()
        except GpuqError as exc:
            log.warning("backups on record not read (%s): only %s is cleaned", exc.message, folders)
        folders += [Path(row["path"]).parent for row in self.last.values() if row is not None]
        await self.store.remove_backup_partials(folders)

    @property
    def every_s(self) -> float | None:
        return None if self.store.dsn else self.settings_of().backup_every_s

    async def wait(self) -> None:
        """Until the next backup is due, a reload's wake, or POLL_S."""
        self.wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._wait_s()):
                await self.wake.wait()

    async def refresh(self) -> None:
        self.last = await self.store.last_backups()
        if self.born is None:
            self.born = parse_iso(await self.store.born())

    async def run_once(self) -> Row | None:
        """Take a backup if one is due (then rotate); its record, or None when none was due."""
        await self.refresh()
        every = self.every_s
        if every is None or self.clock() < self.due_at(every):
            return None
        settings = self.settings_of()
        folder = settings.backups_dir
        assert folder is not None and isinstance(settings.database, Path), "scheduled backups are SQLite's"
        self.running_since, self.waiting_turn = self.clock(), False
        try:
            try:
                target = self._free_name(folder, settings.database.name)
            except GpuqError as exc:
                await self._record_unmade(folder, exc)
                raise
            log.info("scheduled backup: to %s", target)
            made = await self.store.backup(str(target), scheduled=True)
        except BackupBusy:  # `gpuq backup` is making one: this one waits its turn
            self.waiting_turn = True
            return None
        except GpuqError as exc:  # on the record (Store.backup's or _record_unmade's)
            self.failed_at = self.clock()
            log.error("scheduled backup failed: %s; trying again in %s", exc.message, span(min(every, 3600.0)))
            await self.refresh()
            self.on_end(self.last.get("scheduled_failure"))
            return self.last.get("scheduled_failure")
        finally:
            self.running_since = None
        self.made_at = self.clock()
        log.info("scheduled backup: %s (%d bytes in %.1fs, integrity ok)", made["path"], made["bytes"], made["seconds"])
        await self.rotate(settings.backup_keep)
        await self.refresh()
        self.on_end(self.last.get("scheduled_success"))
        return self.last.get("scheduled_success")

    def due_at(self, every: float) -> float:
        return next_backup_at(
            latest(at(self.last.get("scheduled_success")), self.made_at),
            latest(at(self.last.get("scheduled_failure")), self.failed_at),
            self.born or self.clock(),
            every,
        )

    def _wait_s(self) -> float:
        every = self.every_s
        if every is None or self.born is None or self.waiting_turn:
            return POLL_S
        return min(max(self.due_at(every) - self.clock(), 0.05), POLL_S)

    def _free_name(self, folder: Path, database: str) -> Path:
        """The folder made (private: backups hold prompts) and a name no file has yet."""
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise GpuqError(f"cannot make the backup folder {folder}: {exc.strerror or exc}") from None
        name = backup_name(database, self.clock())
        target, n = folder / name, 1
        while target.exists():
            n += 1
            target = folder / name.replace(".db", f"-{n}.db")
        return target

    async def _record_unmade(self, folder: Path, exc: GpuqError) -> None:
        """A folder that cannot be made fails the backup before Store.backup (which records the
        rest): on the record here, so the failure shows and alerts."""
        try:
            await self.store.record_backup(str(folder), True, self.running_since or self.clock(), None, exc.message)
        except GpuqError as err:
            log.error("scheduled backup failure not recorded: %s", err.message)

    async def rotate(self, keep: int) -> list[str]:
        """Delete the scheduled backups past the newest `keep`: only files the backup table says the
        router made, still named as it named them and of the size it wrote. Returns the paths deleted."""
        old = to_rotate(await self.store.rotatable_backups(), keep)
        deleted, let_go = [], []
        for row in old:
            path = Path(row["path"])
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                let_go.append(row["id"])  # deleted by someone else already
                continue
            except OSError as exc:
                log.warning("rotation: cannot look at %s (%s); kept", path, exc.strerror)
                continue
            if not NAME.match(path.name) or size != row["bytes"]:
                log.warning(
                    "rotation: %s is no longer the backup the router wrote (%d bytes); left in place", path, size
                )
                let_go.append(row["id"])
                continue
            try:
                os.unlink(path)
            except OSError as exc:
                log.warning("rotation: cannot delete %s (%s); kept", path, exc.strerror)
                continue
            deleted.append(str(path))
            let_go.append(row["id"])
        if let_go:
            await self.store.backups_removed(let_go)
        for path_text in deleted:
            log.info("rotation: deleted %s (keeping the newest %d)", path_text, keep)
        return deleted

    # -- what /health, the page and the alerts say ----------------------------------------------

    def json(self) -> dict[str, Any]:
        every = self.every_s
        last = self.last.get("last_success")
        failure = self.last.get("scheduled_failure")
        success = self.last.get("scheduled_success")
        failing = failure is not None and (success is None or failure["id"] > success["id"])
        settings = self.settings_of()
        return {
            "scheduled": every is not None,
            "off": PG_OFF if self.store.dsn else None if every is not None else 'off ([backup] every = "off")',
            "every_s": every,
            "keep": settings.backup_keep,
            "dir": None if every is None else str(settings.backups_dir),
            "last": None if last is None else _shown(last),
            "last_failure": _shown(failure) if failing and failure is not None else None,
            "next_at": None if every is None or self.born is None else iso(self.due_at(every)),
            "running": self.running_since is not None,
            "overdue": any(c.alert == "backup_overdue" for c in self.conditions()),
        }

    def conditions(self) -> list[Condition]:
        """backup_failed while the newest scheduled backup failed; backup_overdue while none has
        succeeded for twice `every` (a backup being made by then is late too: the next one was due
        at once `every`, so saying so does not flicker while a retry runs)."""
        every = self.every_s
        if every is None or self.born is None:
            return []
        found = []
        success, failure = self.last.get("scheduled_success"), self.last.get("scheduled_failure")
        if failure is not None and (success is None or failure["id"] > success["id"]):
            found.append(
                Condition(
                    "backup_failed",
                    "",
                    None,
                    failure["finished_at"],
                    f"the scheduled backup to {failure['path']} failed: {failure['error']}",
                    f"make {self.settings_of().backups_dir} writable with room for the database (or set "
                    "[backup] dir); `gpuq backup PATH` tries one by hand",
                )
            )
        late = overdue_since(at(success), self.born, every)
        if self.clock() > late:
            since = f"since {success['finished_at']}" if success else "yet"
            found.append(
                Condition(
                    "backup_overdue",
                    "",
                    None,
                    iso(late),
                    f"no scheduled backup has succeeded {since} (every {span(every)}); the last one is overdue",
                    "see the router's log for why (gpuq logs); `gpuq backup PATH` takes one now",
                )
            )
        return found

    def resolution(self, alert: str) -> str:
        if self.every_s is None:
            return "scheduled backups are off"
        success = self.last.get("scheduled_success")
        where = f": {success['path']}" if success else ""
        return f"a scheduled backup succeeded{where}"


def _shown(row: Row) -> dict[str, Any]:
    return {
        "at": row["finished_at"],
        "path": row["path"],
        "bytes": row["bytes"],
        "seconds": row["seconds"],
        "scheduled": bool(row["scheduled"]),
        "error": row["error"],
    }
