"""A gzip file read member by member, as the archive needs it (gpuq/upkeep/archive.py): each whole
member's bytes, and each stretch that is not a whole member (a member cut short by a crash or a
full disk, bytes that are not gzip) named as a Damage, with its offset and length, and read past:
the reading resyncs at the next gzip member header after it. A gzip reader (`zcat`, Python's
gzip) stops at the first bad member and loses every line after it; this one loses only the
damaged stretch."""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

CHUNK = 1 << 16
MAGIC = b"\x1f\x8b\x08"  # a gzip member's header: its id and the deflate method


@dataclass(frozen=True)
class Damage:
    """Bytes of `path` that are no whole member: from `offset`, `length` bytes, and why."""

    path: Path
    offset: int
    length: int
    why: str

    def text(self) -> str:
        return f"{self.path}: {self.length} byte(s) at offset {self.offset} cannot be read ({self.why})"


@dataclass(frozen=True)
class Member:
    """A whole member: where it starts, its length in the file, its decompressed bytes."""

    offset: int
    length: int
    data: bytes


def members(path: Path) -> Iterator[Member | Damage]:
    """Each whole member in order, and a Damage for each stretch between them that is not one
    (consecutive bad stretches as one)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos, bad = 0, None
        while pos < size:
            data, end, why = _member(f, pos)
            if data is not None:
                if bad is not None:
                    yield bad
                    bad = None
                yield Member(pos, end - pos, data)
                pos = end
                continue
            following = _next_header(f, pos + 1, size)
            bad = Damage(path, pos, following - pos, why) if bad is None else _longer(bad, following)
            pos = following
        if bad is not None:
            yield bad


def first_damage(path: Path) -> Damage | None:
    """The file's first damaged stretch, or None when it is whole members only."""
    return next((part for part in members(path) if isinstance(part, Damage)), None)


def _longer(bad: Damage, end: int) -> Damage:
    return Damage(bad.path, bad.offset, end - bad.offset, bad.why)


def _member(f: IO[bytes], pos: int) -> tuple[bytes | None, int, str]:
    """The member that starts at `pos`: its bytes and where it ends, or None and why not."""
    f.seek(pos)
    inflate = zlib.decompressobj(wbits=31)  # gzip's header and trailer (CRC-32, length) checked
    out: list[bytes] = []
    fed = 0
    while not inflate.eof:
        chunk = f.read(CHUNK)
        if not chunk:
            return None, pos, "a gzip member cut short"
        try:
            out.append(inflate.decompress(chunk))
        except zlib.error as exc:
            return None, pos, f"not a whole gzip member: {exc}"
        fed += len(chunk)
    return b"".join(out), pos + fed - len(inflate.unused_data), ""


def _next_header(f: IO[bytes], start: int, size: int) -> int:
    """The offset of the next gzip header at or after `start`, else the file's end."""
    f.seek(start)
    pos, tail = start, b""
    while pos < size:
        chunk = f.read(CHUNK)
        if not chunk:
            break
        window = tail + chunk
        found = window.find(MAGIC)
        if found >= 0:
            return pos - len(tail) + found
        tail = window[-(len(MAGIC) - 1) :]
        pos += len(chunk)
    return size
