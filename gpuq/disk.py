"""The one seam through which gpuq's own files (the archive's members, the backups' copies) are
written and fsynced: a test without root, which cannot mount a small filesystem to fill, makes a
full disk (ENOSPC) here, and nowhere else. A short count from `os.write` is not success (a disk
that fills writes part of a buffer first, then fails): `write_all` writes the rest or raises. After
a failed write or fsync a file's bytes are unknown (PostgreSQL's lesson, "fsyncgate"): a caller
treats that copy as broken, never as probably written."""

from __future__ import annotations

import errno
import os
from pathlib import Path

FULL = (errno.ENOSPC, errno.EDQUOT)


def write_some(fd: int, data: memoryview) -> int:
    """One write: as many bytes as the file takes now (the seam's write)."""
    return os.write(fd, data)


def write_all(fd: int, data: bytes) -> None:
    """Every byte of `data` to `fd`, however many writes it takes; OSError otherwise."""
    view = memoryview(data)
    while view:
        n = write_some(fd, view)
        if n <= 0:  # no progress and no error: as good as a full disk
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def fsync_fd(fd: int) -> None:
    """The file's bytes on disk (the seam's fsync)."""
    os.fsync(fd)


def fsync(path: Path) -> None:
    """The file's (or a directory's: its entries') bytes on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync_fd(fd)
    finally:
        os.close(fd)


def is_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in FULL


def why(exc: OSError) -> str:
    """An OSError as a person reads it: a full disk said so, else its strerror."""
    if is_full(exc):
        return f"the disk is full ({exc.strerror or os.strerror(errno.ENOSPC)})"
    return exc.strerror or str(exc)
