"""Store's API for upkeep, what keeps the router healthy over time: a backup while it runs
(backup.py) and the backups on record, the storage budget (storage.py: sizes, samples,
compaction), retention's writes (retention.py) and the sweeps on record."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import Conflict, GpuqError, StoreUnavailable
from . import backup, records, retention, sqlite, storage
from .backup import BackupBusy
from .core import Core, write, write_untimed
from .engine import Connection

log = logging.getLogger("gpuq")


class UpkeepVerbs(Core):
    # -- a backup while the router runs (gpuq/store/backup.py) ----------------------------------

    async def backup(self, path: str, force: bool = False, scheduled: bool = False) -> dict[str, Any]:
        """A consistent, checked copy of the database at `path` (absolute, on the router's
        machine; an existing file replaced only with `force`), made in a thread with a connection
        of its own: the writer and the readers go on meanwhile. Answered once the copy is in place.
        Each copy tried (its path accepted) is recorded in the backup table, made or failed, with
        `scheduled` (the router's own, gpuq/upkeep/backups.py). On PostgreSQL: Conflict, naming pg_dump."""
        if self.dsn:
            raise Conflict(backup.pg_dump_advice(self.dsn))
        if (lost := self.lost) is not None:  # a copy of whatever now stands at the path is no backup
            raise StoreUnavailable(lost)
        database = self._sqlite_path()
        started = self.clock()
        accepted: list[Path] = []  # the target, once its checks passed

        def run() -> dict[str, Any]:
            # Taken in the thread: a caller that goes away does not free it while the copy runs.
            if not self._backing_up.acquire(blocking=False):
                raise BackupBusy("a backup of this database is being made already; wait for it to finish")
            try:
                target = backup.target_of(database, path, force)
                accepted.append(target)
                return backup.back_up(database, target, self.busy_timeout_s)
            finally:
                self._backing_up.release()

        try:
            made = await asyncio.to_thread(run)
        except BackupBusy:
            raise
        except GpuqError as exc:
            # A copy that failed is on the record; a path refused only for a scheduled backup
            # (a person asking is told at once, and a typo is no failed backup).
            if accepted or scheduled:
                await self._record_backup_quietly(path, scheduled, started, None, exc.message)
            raise
        await self._record_backup_quietly(made["path"], scheduled, started, made, None)
        return made

    async def remove_backup_partials(self, folders: Iterable[Path]) -> list[Path]:
        """The copies killed backups left in `folders` (backup.remove_partials), removed while no
        backup of this database runs; the paths removed. Nothing on PostgreSQL."""
        if self.dsn:
            return []
        wanted = list(dict.fromkeys(folders))

        def run() -> list[Path]:
            with self._backing_up:
                return [path for folder in wanted for path in backup.remove_partials(folder)]

        return await asyncio.to_thread(run)

    async def _record_backup_quietly(
        self, path: str, scheduled: bool, started: float, made: dict[str, Any] | None, error: str | None
    ) -> None:
        """A backup made is made even when the database refuses its record (full, locked): the
        schedule keeps its own time of it too (gpuq/upkeep/backups.py), and the log says the record
        is missing (rotation, which goes by the records, leaves that file alone)."""
        try:
            await self.record_backup(path, scheduled, started, made, error)
        except GpuqError as exc:
            log.error("backup of %s: not recorded: %s", path, exc.message)

    record_backup = write(records.record_backup)
    backups_removed = write(records.backups_removed)
    record_sweep = write(records.record_sweep)

    # -- the storage budget (gpuq/store/storage.py) ------------------------------------------------

    record_storage_sample = write(records.record_storage_sample)

    async def storage_now(self) -> dict[str, Any]:
        """The database's bytes now: SQLite's pages (page_count x page_size, free pages included:
        what router.max_database_bytes caps and what its growth is read from; the file and its WAL
        on disk apart), PostgreSQL's pg_database_size; and the free bytes on its disk (None on
        PostgreSQL: the server's disk is not ours to see)."""
        if self.dsn:
            size = int((await self.read(storage.PG_DATABASE_BYTES_SQL))[0]["bytes"])
            return {"database_bytes": size, "file_bytes": size, "wal_bytes": 0, "free_bytes": None, "page_size": None}
        path = self._sqlite_path()
        [pages] = await self.read(storage.SQLITE_PAGES_SQL)
        main, wal = await asyncio.to_thread(storage.file_bytes, path)
        free = await asyncio.to_thread(storage.disk_free, path)
        return {
            "database_bytes": int(pages["page_count"]) * int(pages["page_size"]),
            "file_bytes": main,
            "wal_bytes": wal,
            "free_bytes": free,
            "page_size": int(pages["page_size"]),
        }

    async def relations(self) -> dict[str, Any]:
        """Which tables and indexes hold the bytes, largest first, how they were counted
        ("dbstat", "estimate" or "postgres"), the bytes a SQLite file holds empty (`empty_bytes`:
        counted by dbstat, else None; on PostgreSQL None, its VACUUM's business) and what of them a
        compaction could give back at most (`reclaimable_bytes`, see storage.sqlite_relations)."""
        if self.dsn:
            found = storage.pg_relations(await self.read(storage.PG_RELATIONS_SQL))
            return {"method": "postgres", "relations": found, "empty_bytes": None, "reclaimable_bytes": None}
        method, found, empty, reclaimable = await asyncio.to_thread(
            storage.sqlite_relations, self._sqlite_path(), self.busy_timeout_s
        )
        return {"method": method, "relations": found, "empty_bytes": empty, "reclaimable_bytes": reclaimable}

    async def compact(self) -> dict[str, Any] | None:
        """SQLite: the file rewritten without its empty space (VACUUM, then the WAL truncated),
        holding the writer meanwhile; {"before", "after", "seconds"} (bytes of file and WAL).
        None on PostgreSQL, whose autovacuum reuses the space (docs/operations)."""
        if self.dsn or self._writer is None:
            return None
        path = self._sqlite_path()
        before = sum(await asyncio.to_thread(storage.file_bytes, path))

        def compact(db: Connection) -> float:
            assert isinstance(db, sqlite3.Connection)
            return sqlite.compact(db)

        seconds: float = await self._writer.call(compact)
        after = sum(await asyncio.to_thread(storage.file_bytes, path))
        return {"before": before, "after": after, "seconds": seconds}

    # -- retention (gpuq/store/retention.py; its reads are in reads.py) -------------------------

    prune = write(retention.prune)
    delete_ended = write_untimed(retention.delete)
    prune_batches = write(retention.prune_batches)
    delete_batches = write_untimed(retention.delete_batches)

    async def give_back_space(self, pages: int = 2048) -> int:
        """SQLite: up to `pages` free pages back to the file system (PostgreSQL's autovacuum does
        its own); returns how many went."""
        if self.dsn or self._writer is None:
            return 0

        def give_back(db: Connection) -> int:
            assert isinstance(db, sqlite3.Connection)
            return sqlite.give_back(db, pages)

        freed: int = await self._writer.call(give_back)
        return freed
