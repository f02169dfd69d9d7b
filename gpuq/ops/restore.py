"""`gpuq restore BACKUP`: a backup (`gpuq backup`'s, or any copy of a gpuq database) put in the
database's place, on the router's machine, with no router running on it.

In order: the database's lock is taken as a router takes it (lock_database), so a restore refuses
while a router runs and no router starts during one; the backup is copied beside the database
(a private temporary file) and that copy is checked (gpuq/store/backup.py check_restorable: it
opens as SQLite, its integrity check says "ok", gpuq's schema and no newer one); the database is
kept aside as `<db>.replaced-<UTC time>` (its WAL checkpointed into it first, and any WAL or
shared-memory file left moved along under the same name, so the aside file opens with every
commit it had); the checked copy is fsynced and renamed into place (os.replace, the directory
fsynced). A backup that fails a check replaces nothing. The restored queue's running jobs are
failed by the next router's start, as after a crash (gpuq/store/leases.py take, `alone`)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..disk import fsync, why
from ..errors import Conflict, DatabaseInUse, NotFound, StoreUnavailable, Unprocessable
from ..jobs import JobState
from ..store.backup import check_restorable, checkpoint
from ..store.facade import migration_files
from .dblock import lock_database, unlock_database

# How the lock file names the restore to a router that tries to start meanwhile.
HOLDER = "`gpuq restore`, replacing the database"
WAL_FILES = ("-wal", "-shm")


@dataclass(frozen=True)
class Restored:
    database: Path
    backup: Path
    jobs: dict[str, int]  # the restored queue's jobs by state
    aside: Path | None  # where the replaced database is kept (None: there was none)


def restore(backup: Path, database: Path, now: float | None = None) -> Restored:
    """Put `backup` in the place of `database`, as the module says. Raises GpuqError (a status and
    a message) when it cannot; then nothing was replaced."""
    backup, database = backup.absolute(), database.absolute()
    if not backup.is_file():
        what = "is not a file" if backup.exists() else "does not exist"
        raise NotFound(f"the backup {backup} {what}; nothing was replaced")
    if database.is_dir():
        raise Unprocessable(f"the database {database} is a directory; nothing was replaced")
    if database.exists() and os.path.samefile(backup, database):
        raise Unprocessable(f"{backup} is the database itself; nothing was replaced")
    try:
        lock = lock_database(database, "", HOLDER)
    except DatabaseInUse as exc:
        raise Conflict(f"{database} is in use by {exc.holder}; stop it first; nothing was replaced") from None
    try:
        return _replace(backup, database, time.time() if now is None else now)
    finally:
        unlock_database(database, lock)


def _replace(backup: Path, database: Path, now: float) -> Restored:
    temp = database.with_name(f".{database.name}.restore-{secrets.token_hex(4)}")
    os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # private: it holds prompts
    try:
        try:
            shutil.copyfile(backup, temp)
        except OSError as exc:  # a full disk most often: said so, and nothing replaced
            raise StoreUnavailable(
                f"{backup} cannot be copied beside {database}: {why(exc)}; nothing was replaced"
            ) from None
        known = {int(f.name[:3]) for f in migration_files()}
        try:
            jobs = check_restorable(temp, known)
        except Unprocessable as exc:
            raise Unprocessable(f"{backup} cannot be restored: {exc.message}; nothing was replaced") from None
        fsync(temp)
        aside = _keep_aside(database, now)
        os.replace(temp, database)
        fsync(database.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return Restored(database, backup, jobs, aside)


def _keep_aside(database: Path, now: float) -> Path | None:
    """The database as it was, kept as `<db>.replaced-<UTC time>` with whatever WAL it has; None
    when there is no database yet. The database's own path keeps a file until the restored one
    replaces it (the aside is a hard link, where the file system has them)."""
    if not database.exists():
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    aside = database.with_name(f"{database.name}.replaced-{stamp}")
    n = 1
    while any(aside.with_name(aside.name + s).exists() for s in ("", *WAL_FILES)):
        n += 1
        aside = database.with_name(f"{database.name}.replaced-{stamp}-{n}")
    checkpoint(database)  # the WAL folded in: the aside file whole by itself (best effort, see below)
    try:
        os.link(database, aside)
    except OSError:  # no hard links here: moved instead (the restored file follows at once)
        os.rename(database, aside)
    for suffix in WAL_FILES:  # what the checkpoint left (it failed: a damaged database) goes along
        wal = database.with_name(database.name + suffix)
        if wal.exists():
            os.replace(wal, aside.with_name(aside.name + suffix))
    return aside


def summary(restored: Restored) -> str:
    """'restored DB from BACKUP: 12 done, 3 queued, 1 running (fails on start, as after a crash)'."""
    order: list[str] = [JobState.DONE, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED, JobState.RUNNING]
    states = order + sorted(set(restored.jobs) - set(order))
    parts = []
    for state in states:
        count = restored.jobs.get(state, 0)
        if count:
            part = f"{count} {state}"
            if state == JobState.RUNNING:
                part += " (fails on start, as after a crash)"
            parts.append(part)
    held = ", ".join(parts) if parts else "no jobs"
    line = f"restored {restored.database} from {restored.backup}: {held}"
    if restored.aside is not None:
        line += f"\nthe replaced database is kept as {restored.aside}"
    return line
