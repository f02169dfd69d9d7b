"""Is the open database still the file at its path? A person (or a cleanup script) can unlink the
database, its WAL file or its directory, or put another file in its place, while the router runs:
SQLite keeps writing happily into the open, now nameless, inodes, and everything acknowledged
since is gone at the next start. The store checks the files' identity (device and inode, one
os.stat each, a few microseconds) before each write and again after its commit, before the write
is acknowledged; /health checks it too. Once lost, it stays lost until the router restarts."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("gpuq")

# The files SQLite keeps open in WAL mode, by suffix; each must stay the one opened (none is ever
# recreated while a connection is open: SQLite removes the WAL and shm only when the last closes).
SUFFIXES = {"": "database file", "-wal": "database's WAL file", "-shm": "database's shared-memory file"}


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:  # FileNotFoundError, NotADirectoryError...: not the file either
        return None
    return st.st_dev, st.st_ino


class DatabaseFile:
    """The identity of the database's files as opened; `check()` says what happened to them."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.opened: dict[Path, tuple[tuple[int, int], str]] = {}  # path: (identity, what it is)
        self.lost: str | None = None  # what happened, once noticed (then writes are refused)

    def record(self) -> None:
        """Call once the connections are open: the files as they are now are the ones SQLite has."""
        self.lost = None
        self.opened = {}
        for suffix, name in SUFFIXES.items():
            p = self.path.with_name(self.path.name + suffix)
            if (ident := _identity(p)) is not None:
                self.opened[p] = ident, name

    def check(self) -> str | None:
        """None while every opened file is still at its path; else (from then on) what happened."""
        if self.lost is not None:
            return self.lost
        for p, (ident, name) in self.opened.items():
            now = _identity(p)
            if now == ident:
                continue
            if not p.parent.is_dir():
                what = f"the database's directory {p.parent} was removed while the router ran"
            elif now is None:
                what = f"the {name} {p} was deleted while the router ran"
            else:
                what = f"the {name} {p} was replaced by another file while the router ran"
            self.lost = what + "; restart the router (nothing is stored until then)"
            log.error("%s", self.lost)
            return self.lost
        return None
