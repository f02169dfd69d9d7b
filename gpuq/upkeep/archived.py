"""Is a job id in the retention archive? What a job's 404 says (gpuq/api/jobs.py): a job that
retention deleted is named as such, with the command that finds it (`gpuq archive search ID`).

Kept cheap, as anyone may ask for any id. A job id starts with the unix second it was made
(jobs.new_job_id), and the archive keeps a job in the file of the month it was made
(archive.file_for): a lookup reads that month's file and its two neighbours' (a clock at a
month's edge), never the whole archive. What a file holds is remembered as its job ids with the
file's size and modification time, and read again only when a sweep appended to it: a burst of
lookups costs one read per file, and at most CACHED files' ids are held."""

from __future__ import annotations

import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import orjson

from .archive import numbered

CACHED = 6  # the months whose ids are held at once (a month of a busy lab: ~100k ids, a few MB)


@dataclass(frozen=True)
class Archived:
    """A job's latest line in the archive: when it was archived and why ("prune" or "delete")."""

    job_id: str
    archived_at: str
    archived_for: str
    file: Path


Stamp = tuple[str, str]  # (archived_at, archived_for) of a job's latest line
CHUNK = 1 << 20


@dataclass
class Seen:
    """What one month file held when last read: its ids, and where its last whole member ended
    (a sweep appends whole gzip members: the next read starts there)."""

    ids: dict[str, Stamp]
    offset: int = 0
    mtime_ns: int = 0


class ArchiveIndex:
    """The job ids in one archive directory's month files, read as they are asked for."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: OrderedDict[Path, Seen] = OrderedDict()
        self._lock = threading.Lock()  # lookups run in threads: one reads a file, the others wait

    def find(self, job_id: str) -> Archived | None:
        for path in self.months_of(job_id):
            stamp = self._ids(path).get(job_id)
            if stamp is not None:
                return Archived(job_id, stamp[0], stamp[1], path)
        return None

    def months_of(self, job_id: str) -> list[Path]:
        """The month file the id's time names, then the month before and after it; each followed
        by the month's next files, where a damaged one's month goes on (archive.numbered)."""
        seconds = int(job_id.split("-", 1)[0])
        year, month = time.gmtime(seconds)[:2]
        months = [(year, month), _step(year, month, -1), _step(year, month, 1)]
        return [path for y, m in months for path in _month_files(self.directory / f"jobs-{y:04d}-{m:02d}.jsonl.gz")]

    def _ids(self, path: Path) -> dict[str, Stamp]:
        try:
            st = path.stat()
        except OSError:
            return {}  # no such month in the archive
        with self._lock:
            seen = self._files.get(path)
            if seen is None or st.st_size < seen.offset:  # new, or replaced by a smaller file
                seen = Seen({})
            if seen.mtime_ns != st.st_mtime_ns or seen.offset < st.st_size:
                seen.offset = read_members(path, seen.offset, st.st_size, seen.ids)
                seen.mtime_ns = st.st_mtime_ns
            self._files[path] = seen
            self._files.move_to_end(path)
            while len(self._files) > CACHED:
                self._files.popitem(last=False)
            return seen.ids


def _month_files(first: Path) -> list[Path]:
    """A month's first file, and its `.2`, `.3`... for as long as they exist."""
    found, n = [first], 2
    while (path := numbered(first, n)).exists():
        found.append(path)
        n += 1
    return found


def _step(year: int, month: int, by: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + by
    return index // 12, index % 12 + 1


def read_members(path: Path, start: int, end: int, ids: dict[str, Stamp]) -> int:
    """Each job id in the gzip members from byte `start` to `end`, with its latest line's stamp,
    into `ids`; returns where the last whole member ended. A member cut short (a crash
    mid-append, or an append under way) ends the reading there: a sweep never appends after a
    damaged member (its month goes on in the next file, which months_of reads too)."""
    offset = start
    with open(path, "rb") as f:
        f.seek(start)
        member, pending, left = zlib.decompressobj(wbits=31), b"", end - start
        while left > 0:
            data = f.read(min(CHUNK, left))
            if not data:
                break
            left -= len(data)
            while data:
                try:
                    pending += member.decompress(data)
                except zlib.error:
                    return offset
                pending = _take_lines(pending, ids)
                if not member.eof:
                    break
                offset += len(data) - len(member.unused_data)  # a whole member: the next read starts here
                data, member = member.unused_data, zlib.decompressobj(wbits=31)
    return offset


def _take_lines(pending: bytes, ids: dict[str, Stamp]) -> bytes:
    """The whole lines of `pending` into `ids`; what is left of a line still coming."""
    *whole, rest = pending.split(b"\n")
    for raw in whole:
        if raw.strip():
            try:
                line = orjson.loads(raw)
                ids[line["id"]] = (line.get("archived_at") or "", line.get("archived_for") or "")
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue  # not a job's line: nothing to find by id
    return rest


_indexes: dict[Path, ArchiveIndex] = {}
_indexes_lock = threading.Lock()


def index_of(directory: Path) -> ArchiveIndex:
    """The one index of `directory` in this process (a reload may name another directory)."""
    with _indexes_lock:
        found = _indexes.get(directory)
        if found is None:
            found = _indexes[directory] = ArchiveIndex(directory)
        return found
