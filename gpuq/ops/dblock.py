"""The database's lock, `<database>.lock` beside a SQLite file: one router (or `gpuq restore`)
per file, and what holds it written in it (pid, address, the URL its clients use, since when), so
that the refused are told who holds it and the CLI finds the router running on its database.
Only the standard library: the CLI reads it without loading the router."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path
from typing import Any

from ..disk import why
from ..errors import DatabaseInUse, StartupError
from ..jobs import iso


def lock_database(database: Path, listen: str, holder: str = "router", url: str = "") -> int:
    """Hold `<database>.lock` for as long as this router runs: a second router on the same database
    stops here, before it touches the file. The kernel drops the lock when the process ends, even
    by SIGKILL, so a crash never blocks the restart; a router that stops by itself, or cannot
    start, removes the file (unlock_database). `holder`: what holds it, as the refused are told
    (a router, or `gpuq restore`); `url`: where a router's clients reach it, which the CLI reads
    to find the router of this database (running_router). Returns the lock's file descriptor."""
    path = lock_path(database)
    for _ in range(10):  # the file this router opened was removed by its holder meanwhile: open the new one
        try:  # as the store does: a removed directory (see gpuq/store/dbfile.py) must not stop the restart
            database.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StartupError(f"cannot open the lock file {path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock_holder(fd)
            os.close(fd)
            raise DatabaseInUse(database, holder) from None
        except OSError as exc:
            os.close(fd)
            raise StartupError(f"cannot lock {path}: {exc.strerror}") from None
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    else:
        raise StartupError(f"cannot lock {path}: it was removed and created again ten times over")
    me = {"pid": os.getpid(), "listen": listen, "url": url, "started": iso(time.time()), "holder": holder}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
    except OSError as exc:  # a full disk: said, and the empty lock file not left behind
        unlock_database(database, fd)
        raise StartupError(f"cannot write the lock file {path}: {why(exc)}", 503) from None
    return fd


def unlock_database(database: Path, fd: int) -> None:
    """Remove the lock file while still holding it, then let go: a router that opened the file
    meanwhile finds, once it holds its lock, that the file is no longer there (lock_database)."""
    try:
        os.unlink(lock_path(database))
    except OSError:
        pass  # removed with its directory: nothing is left behind either
    os.close(fd)


def lock_path(database: Path) -> Path:
    return database.with_name(database.name + ".lock")


def lock_holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it: pid, address, start time."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
        if holder.get("holder", "router") != "router":  # not a router: what it is doing, since when
            return f"{holder['holder']}, pid {holder['pid']}, since {holder['started']}"
        return f"another router (pid {holder['pid']}, listening on {holder['listen']} since {holder['started']})"
    except (OSError, ValueError, TypeError, KeyError):
        return "another router (its pid is not recorded yet)"


def running_router(database: Path) -> dict[str, Any] | None:
    """The router that holds `database`'s lock now, as it wrote itself there (pid, listen, url,
    started); None when none does: no file, another holder (a restore), or a file left by a
    router that died (its pid is gone). Read without taking the lock, so a router starting
    meanwhile is never refused for it."""
    try:
        holder: dict[str, Any] = json.loads(lock_path(database).read_bytes())  # not an object: TypeError below
        pid = holder["pid"]
        if holder.get("holder", "router") != "router" or not holder.get("listen") or not isinstance(pid, int):
            return None
    except (OSError, ValueError, TypeError, KeyError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None  # SIGKILLed: the file stayed, the router did not
    except PermissionError:
        pass  # alive, another user's
    return holder
