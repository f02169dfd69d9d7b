"""Is a job id in the retention archive? What a job's 404 says (gpuq/api/jobs.py): a job that
retention deleted is named as such, with the command that finds it (`gpuq archive search ID`).

Kept cheap, as anyone may ask for any id. A job id starts with the unix second it was made
(jobs.new_job_id), and the archive keeps a job in the file of the month it was made
(archive.file_for): a lookup reads that month's file and its two neighbours' (a clock at a
month's edge), never the whole archive. What a file holds is remembered as its job ids with the
file's size and modification time, and read again only when a sweep appended to it: a burst of
lookups costs one read per file, and at most CACHED files' ids are held."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import orjson

CACHED = 6  # the months whose ids are held at once (a month of a busy lab: ~100k ids, a few MB)


@dataclass(frozen=True)
class Archived:
    """A job's latest line in the archive: when it was archived and why ("prune" or "delete")."""

    job_id: str
    archived_at: str
    archived_for: str
    file: Path


Stamp = tuple[str, str]  # (archived_at, archived_for) of a job's latest line
Seen = tuple[tuple[int, int], dict[str, Stamp]]  # a file's (size, mtime) and the ids it held then


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
        """The month file the id's time names, then the month before and after it."""
        seconds = int(job_id.split("-", 1)[0])
        year, month = time.gmtime(seconds)[:2]
        months = [(year, month), _step(year, month, -1), _step(year, month, 1)]
        return [self.directory / f"jobs-{y:04d}-{m:02d}.jsonl.gz" for y, m in months]

    def _ids(self, path: Path) -> dict[str, Stamp]:
        try:
            st = path.stat()
        except OSError:
            return {}  # no such month in the archive
        version = (st.st_size, st.st_mtime_ns)
        with self._lock:
            seen = self._files.get(path)
            if seen is None or seen[0] != version:
                seen = (version, read_ids(path))
                self._files[path] = seen
            self._files.move_to_end(path)
            while len(self._files) > CACHED:
                self._files.popitem(last=False)
            return seen[1]


def _step(year: int, month: int, by: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + by
    return index // 12, index % 12 + 1


def read_ids(path: Path) -> dict[str, Stamp]:
    """Each job id in a month file with its latest line's stamp. A member cut short by a crash
    mid-append ends the reading there, as archive.lines does (what came before it is whole)."""
    ids: dict[str, Stamp] = {}
    try:
        with gzip.open(path, "rb") as f:
            for raw in f:
                if raw.strip():
                    line = orjson.loads(raw)
                    ids[line["id"]] = (line.get("archived_at") or "", line.get("archived_for") or "")
    except (OSError, EOFError, zlib.error, orjson.JSONDecodeError, KeyError, TypeError):
        pass
    return ids


_indexes: dict[Path, ArchiveIndex] = {}
_indexes_lock = threading.Lock()


def index_of(directory: Path) -> ArchiveIndex:
    """The one index of `directory` in this process (a reload may name another directory)."""
    with _indexes_lock:
        found = _indexes.get(directory)
        if found is None:
            found = _indexes[directory] = ArchiveIndex(directory)
        return found
