"""A SQLite database backed up while its router runs (`gpuq backup`, POST /api/backup), and the
checks a file passes before `gpuq restore` puts it in the database's place (gpuq/ops/restore.py
does the file work around them).

The copy is made with `VACUUM INTO`, not the online backup API (`sqlite3.Connection.backup`).
Both read the database through a connection of their own, beside the router's, and neither
takes the write lock: in WAL mode a reader never blocks the writer, so claims, submits and
heartbeats go on throughout. `VACUUM INTO` copies one snapshot, under one read transaction, in
one statement. The backup API, run in steps (pages=N) so as to let the writer in between, starts
again from its first page whenever another connection writes between two steps, and a router
writes every few hundred milliseconds while a job streams (its heartbeats): a stepped backup of
a large database on a busy router may never finish, and one unstepped is the same single read
transaction as `VACUUM INTO`. `VACUUM INTO` also leaves the copy compact (no free pages) and in
rollback-journal mode: one self-contained file, nothing beside it. Its cost: while it reads, the
WAL cannot be checkpointed past its snapshot, so the WAL grows for the length of the backup and
is folded back at the next checkpoint after it. Measured (bench/backup.py): a 1 GB database in
13 s with the WAL at most 7 MB, while the stepped backup API under the same submits restarted
319 times and had not finished after 73 s.

The copy goes to a temporary file beside the target, is checked (`PRAGMA integrity_check` must
say "ok"), fsynced, and only then renamed over the target (os.replace; the directory fsynced):
a backup that fails leaves the target as it was, and a target that exists is always a whole,
checked copy."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

from ..disk import fsync, is_full, why
from ..errors import BadRequest, Conflict, GpuqError, NewerSchema, StoreUnavailable, Unprocessable
from . import sqlite
from .postgres import safe_dsn

log = logging.getLogger("gpuq")

# The database's own files, by suffix: none of them may be a backup's target.
OWN_FILES = ("", "-wal", "-shm", "-journal", ".lock")
# A copy being made (back_up's temp file beside its target), and what SQLite keeps beside it.
PARTIAL = re.compile(r"(?P<copy>\..+\.[0-9a-f]{8}\.partial)(?:-journal|-wal|-shm)?")


class BackupBusy(Conflict):
    """Another backup of this database is being made (a scheduled one waits for its turn)."""


def pg_dump_advice(dsn: str) -> str:
    """What a backup on PostgreSQL answers: gpuq does not reinvent pg_dump; the command to run."""
    return (
        "this router's database is on PostgreSQL, and gpuq does not reinvent pg_dump: back it up with "
        f"`pg_dump --format=custom --file=gpuq.dump '{safe_dsn(dsn)}'` (restore with `pg_restore --clean "
        "--dbname=...`), or PostgreSQL's WAL archiving; see docs/operations.md, Backup and restore"
    )


def target_of(database: Path, text: str, force: bool) -> Path:
    """The backup's file, checked before anything is written: an absolute path on the router's
    machine, in a directory that exists, not one of the database's own files, and not a file
    that exists unless `force`. The router does not guess what a relative path was relative to
    (its working directory is not the caller's): it refuses one, naming the rule."""
    if not text.strip():
        raise BadRequest("field 'path' is empty: give the backup's file, an absolute path on the router's machine")
    if "\x00" in text:
        raise BadRequest("field 'path' holds a NUL character, which no file name can")
    path = Path(text)
    if not path.is_absolute():
        raise BadRequest(
            f"the backup's path must be absolute (a path on the router's machine; the router does not resolve "
            f"a relative one against its own working directory): got {text!r}"
        )
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise Unprocessable(f"the backup's directory {parent} {what} on the router's machine; nothing was written")
    real = parent.resolve() / path.name
    own = {database.resolve().with_name(database.resolve().name + suffix) for suffix in OWN_FILES}
    if real in own or _same_file(path, database):
        raise Unprocessable(
            f"{path} is the database itself (or one of its files): a backup goes to another file; nothing was written"
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return path
    if stat.S_ISDIR(mode):
        raise Unprocessable(f"{path} is a directory: name the backup's file in it, e.g. {path / 'gpuq-backup.db'}")
    if not force:
        raise Conflict(f'{path} already exists; not replaced (send "force": true, or `gpuq backup --force`)')
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise Unprocessable(f"{path} is not a regular file; not replaced")
    return path


def _same_file(a: Path, b: Path) -> bool:
    """Are both names one file (a hard link, a symlink)? False when either is missing."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def back_up(database: Path, target: Path, busy_timeout_s: float) -> dict[str, Any]:
    """Copy `database` (the router's, open and written meanwhile) to `target` (checked by
    target_of), as the module says; blocking, run in a thread of its own. Returns what the
    answer says: the path, its bytes, the seconds it took, the integrity check's result, and when
    each step ended (`phases`: copied, checked, synced; seconds from the start)."""
    started = time.monotonic()
    remove_partials(target.parent)  # a killed backup's copy takes room this one may need
    temp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.partial")
    try:  # made empty, private (the queue holds people's prompts), and new: VACUUM INTO fills it
        os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise _refused(exc, f"cannot write in {target.parent}: {why(exc)}; nothing was written") from None
    phases: dict[str, float] = {}  # when each step ended, from the start: where a backup's time goes
    try:
        _vacuum_into(database, temp, busy_timeout_s, target)
        phases["copied"] = time.monotonic() - started
        try:
            checked = integrity(temp)
        except sqlite3.Error as exc:
            raise GpuqError(f"the copy could not be checked ({exc}); nothing was written to {target}") from None
        if checked != "ok":
            raise GpuqError(f"the copy failed its integrity check ({checked}); nothing was written to {target}")
        phases["checked"] = time.monotonic() - started
        size = temp.stat().st_size
        fsync(temp)
        os.replace(temp, target)
        fsync(target.parent)
        phases["synced"] = time.monotonic() - started
    except OSError as exc:
        _remove_copy(temp)
        raise _refused(exc, f"the backup could not be written to {target}: {why(exc)}; nothing was written") from None
    except BaseException:
        _remove_copy(temp)
        raise
    return {
        "path": str(target),
        "bytes": size,
        "seconds": round(time.monotonic() - started, 3),
        "integrity": checked,
        "database": str(database),
        "phases": {k: round(v, 3) for k, v in phases.items()},
    }


def _remove_copy(temp: Path) -> None:
    """A copy that failed, gone whole: the file and what SQLite kept beside it (its journal)."""
    for suffix in ("", "-journal", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            os.unlink(temp.with_name(temp.name + suffix))


def _refused(exc: OSError, message: str) -> GpuqError:
    """A full disk is a 503 (room may come back: try again), any other OSError a 422."""
    return StoreUnavailable(message) if is_full(exc) else Unprocessable(message)


def remove_partials(folder: Path) -> list[Path]:
    """The copies backups killed mid-way left in `folder` (a SIGKILL gives back_up no chance to
    remove its temp file): each `.NAME.<8 hex>.partial`, with its `-journal`, `-wal` and `-shm`,
    unless a backup is writing it now (SQLite's lock on it, held by this process or another).
    Best effort; the paths removed, each logged."""
    try:
        found = sorted((p, m["copy"]) for p in folder.iterdir() if (m := PARTIAL.fullmatch(p.name)))
    except OSError:
        return []
    copies: dict[str, bool] = {}  # each copy's name: may it go
    removed = []
    for path, name in found:
        copy = folder / name
        if copy.name not in copies:
            copies[copy.name] = not _being_written(copy)
        if not copies[copy.name] or not _regular(path):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
        log.info("backup: removed %s, left by a backup that was stopped mid-way", path)
    return removed


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _being_written(copy: Path) -> bool:
    """Does a backup write `copy` now? VACUUM INTO holds SQLite's write lock on it throughout."""
    if not _regular(copy):
        return False
    try:
        db = sqlite3.connect(f"{copy.as_uri()}?mode=rw", uri=True, timeout=0, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as exc:
        return "locked" in str(exc)
    except sqlite3.Error:
        return False
    finally:
        db.close()


def _vacuum_into(database: Path, temp: Path, busy_timeout_s: float, target: Path) -> None:
    try:  # mode=rw: a database gone from its path is an error here, never a new empty file
        db = sqlite3.connect(f"{database.as_uri()}?mode=rw", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"the backup failed: {exc}; nothing was written to {target}") from None
    try:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
        db.execute("VACUUM INTO ?", (str(temp),))
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"the backup failed: {exc}; nothing was written to {target}") from None
    finally:
        db.close()


def integrity(path: Path) -> str:
    """`PRAGMA integrity_check` on the file: "ok", else its first problems on one line."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        found = [str(r[0]) for r in db.execute("PRAGMA integrity_check(20)").fetchall()]
    finally:
        db.close()
    return "ok" if found == ["ok"] else "; ".join(found)


def check_restorable(path: Path, known: set[int]) -> dict[str, int]:
    """May `path` become the database? It opens as SQLite, its integrity check says "ok", it holds
    gpuq's schema (migrations recorded, a job table) and no migration this gpuq does not know (a
    newer gpuq wrote it: as the store refuses it, NewerSchema). Unprocessable naming what is
    wrong, else its jobs by state."""
    try:
        checked = integrity(path)
        if checked != "ok":
            raise Unprocessable(f"it fails SQLite's integrity check: {checked}")
        db = sqlite3.connect(path, isolation_level=None)
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "schema_migration" not in tables or "job" not in tables:
                raise Unprocessable("it is a SQLite database, but not gpuq's (no schema_migration or job table)")
            try:
                sqlite.refuse_newer(db, known, "it")
            except NewerSchema as exc:
                raise Unprocessable(exc.message) from None
            return {str(r[0]): int(r[1]) for r in db.execute("SELECT state, COUNT(*) FROM job GROUP BY state")}
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise Unprocessable(f"it does not open as a SQLite database ({exc})") from None


def checkpoint(path: Path) -> str | None:
    """Fold the database's WAL into its file (best effort: a restore keeps the replaced database
    aside whole either way, moving the WAL along). None when done, else SQLite's error."""
    try:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            db.close()
    except sqlite3.Error as exc:
        return str(exc)
    return None
