"""The archive: what retention takes out of the database is written here first, in a
form a person reads with ordinary tools. One gzip JSON Lines file per month, by the month the job
was made (`jobs-2026-12.jsonl.gz`); each line one whole job as it was at that moment: every column,
its runs each with its output and reasoning, its events, and `archived_at` / `archived_for`
("prune": its bulk left; "delete": its rows left). Each write appends one gzip member (a reader
sees one stream: `zcat jobs-*.jsonl.gz | jq`). So a job may have several lines (archived again by
a sweep after a crash, pruned then deleted): a search gives each job once, from its latest line
with its text from whichever line still had it.

Whole or not at all. A member is written whole (every byte, however many writes a filling disk
takes: gpuq/disk.py), fsynced, and read back from the file and compared, and the directory is
fsynced, before `write` returns: only then may the database let go of its records (a crash
between the two leaves a job in both places, never in neither). A write that fails (a full
disk) cuts the file back to its length before it (a file it made is removed), so the next sweep
appends after whole members only.

Never after a damaged member. A file may still hold one: a crash mid-append, a cut that failed, a
copy cut short. Before a file is first appended to by this process it is read whole, member by
member (gpuq/upkeep/members.py), and once it is known whole only its length is checked before the
next append (a file that changed length meanwhile is read again). A damaged file is never
appended to again: the month's lines go on in the next file of the month that is whole,
`jobs-2026-12.2.jsonl.gz`, then `.3` (each one `zcat` reads whole, and `jobs-*.jsonl.gz` still
names them all). Chosen over a file per sweep, which would leave thousands of small files a month
for a person to read; the cost is one read of each month's file per start of the router.

A search reads every whole member of every file, a damaged one's too, past its damage, and names
each damaged stretch (its file, offset and length): `gpuq archive search` prints them."""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import disk
from ..jobs import compact_json, iso
from .members import Damage, first_damage, members

log = logging.getLogger("gpuq")

# A month's file, and the next ones of the month written after a damaged one (`.2`, `.3`, ...).
FILE = re.compile(r"jobs-(\d{4})-(\d{2})(?:\.(\d+))?\.jsonl\.gz")
# The files this process knows are whole members only: (device, inode, length) when last seen so.
_whole: dict[Path, tuple[int, int, int]] = {}
_told: set[Path] = set()  # the damaged files already named in the log


class Unwritable(Exception):
    """The archive cannot take a member: its file, and why (a full disk says so)."""

    def __init__(self, path: Path, exc: OSError):
        self.path, self.full = path, disk.is_full(exc)
        super().__init__(f"{path} cannot be written: {disk.why(exc)}")


def file_for(directory: Path, job: dict[str, Any], kind: str = "jobs") -> Path:
    """The month's file of a job (or, `kind` "batches", of a batch: a file of their own, so a
    search of the jobs reads jobs only): the month it was made."""
    return directory / f"{kind}-{job['created_at'][:7]}.jsonl.gz"


Line = tuple[Path, bytes]  # a record's month file and its line


def encoded(directory: Path, records: Iterable[dict[str, Any]], why: str, now: float, kind: str = "jobs") -> list[Line]:
    """Each record (whole, as Store.whole_jobs or whole_batches reads it) as its line of the
    archive, with the file it goes to: what `write` appends, and what a batch of the sweep weighs
    (gpuq/upkeep/pacing.py) before it is cut to its budget."""
    stamp = {"archived_at": iso(now), "archived_for": why}
    return [(file_for(directory, r, kind), compact_json(r | stamp).encode() + b"\n") for r in records]


def write(directory: Path, lines: Iterable[Line]) -> int:
    """Append `lines` to their months' files, each as one member written whole, fsynced and read
    back, then fsync the directory; returns the bytes written. Raises Unwritable (a full disk, no
    permission): then the caller must not let their records leave the database."""
    by_file: dict[Path, list[bytes]] = {}
    for path, line in lines:
        by_file.setdefault(path, []).append(line)
    if not by_file:
        return 0
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # it holds people's prompts
    except OSError as exc:
        raise Unwritable(directory, exc) from exc
    written = 0
    for path, chunk in sorted(by_file.items()):
        member = gzip.compress(b"".join(chunk), mtime=0)
        _append(_whole_file(path), member)
        written += len(member)
    try:
        disk.fsync(directory)
    except OSError as exc:
        raise Unwritable(directory, exc) from exc
    return written


def append(directory: Path, jobs: Iterable[dict[str, Any]], why: str, now: float, kind: str = "jobs") -> int:
    """Write `jobs` (whole) to their months' files, fsynced; the bytes written (see `write`)."""
    return write(directory, encoded(directory, jobs, why, now, kind))


def numbered(path: Path, n: int) -> Path:
    """The month's `n`th file: `jobs-2026-12.jsonl.gz`, then `jobs-2026-12.2.jsonl.gz`..."""
    return path if n == 1 else path.with_name(path.name.replace(".jsonl.gz", f".{n}.jsonl.gz"))


def _whole_file(path: Path) -> Path:
    """The month's first file that is absent or whole members only: what the next member may
    follow. A damaged one is named in the log, once."""
    n = 1
    while True:
        candidate = numbered(path, n)
        try:
            st = os.stat(candidate)
        except FileNotFoundError:
            return candidate
        except OSError as exc:
            raise Unwritable(candidate, exc) from exc
        if _whole.get(candidate) == (st.st_dev, st.st_ino, st.st_size):
            return candidate
        try:
            damage = first_damage(candidate)
        except OSError as exc:
            raise Unwritable(candidate, exc) from exc
        if damage is None:
            _whole[candidate] = (st.st_dev, st.st_ino, st.st_size)
            return candidate
        _whole.pop(candidate, None)
        if candidate not in _told:
            _told.add(candidate)
            log.warning("archive: %s; never appended to again, its month goes on in the next file", damage.text())
        n += 1


def _append(path: Path, member: bytes) -> None:
    """`member` after the file's whole members: written whole, fsynced, read back; else the file
    cut back to its length before (removed, if it was empty) and Unwritable."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError as exc:
        raise Unwritable(path, exc) from exc
    try:
        st = os.fstat(fd)
        before = st.st_size
        try:
            disk.write_all(fd, member)
            disk.fsync_fd(fd)
            _read_back(fd, before, member)
        except OSError as exc:
            _cut_back(fd, path, before)
            raise Unwritable(path, exc) from exc
        _whole[path] = (st.st_dev, st.st_ino, before + len(member))
    finally:
        os.close(fd)


def _read_back(fd: int, at: int, member: bytes) -> None:
    """The file holds `member` at `at`, and ends there: else OSError (EIO)."""
    if os.fstat(fd).st_size != at + len(member):
        raise OSError(5, "the file's length after the write is not what was written")
    got = b""
    while len(got) < len(member):
        piece = os.pread(fd, len(member) - len(got), at + len(got))
        if not piece:
            break
        got += piece
    if got != member:
        raise OSError(5, "the member read back differs from what was written")


def _cut_back(fd: int, path: Path, before: int) -> None:
    """The file as it was before a failed append: cut to its old length and fsynced, or removed
    when it held nothing. Failing that, it is no longer known whole: the next append reads it
    again, and finds the damage."""
    _whole.pop(path, None)
    with contextlib.suppress(OSError):
        if before == 0:
            os.unlink(path)
            return
        os.ftruncate(fd, before)
        disk.fsync_fd(fd)
        st = os.fstat(fd)
        _whole[path] = (st.st_dev, st.st_ino, before)


def files(directory: Path) -> list[Path]:
    """The archive's monthly files, oldest first (a month's `.2`, `.3`... after its first)."""
    if not directory.is_dir():
        return []
    found = [(m[1], m[2], int(m[3] or 1), p) for p in directory.iterdir() if (m := FILE.fullmatch(p.name))]
    return [p for *_, p in sorted(found)]


def lines(path: Path, damaged: list[Damage] | None = None) -> Iterator[dict[str, Any]]:
    """Every line of every whole member of one file, past any damage (added to `damaged`): a
    member cut short by a crash, bytes that are not gzip, a line that is not JSON."""
    for part in members(path):
        if isinstance(part, Damage):
            if damaged is not None:
                damaged.append(part)
            continue
        for text in part.data.splitlines():
            if not text.strip():
                continue
            try:
                yield json.loads(text)
            except ValueError:
                if damaged is not None:
                    damaged.append(Damage(path, part.offset, part.length, "a member holds a line that is not JSON"))


def _text(job: dict[str, Any]) -> str:
    """What a search looks in: the id, the prompt, the output of every run, a call's request."""
    runs = " ".join((r.get("output") or "") + " " + (r.get("thinking") or "") for r in job.get("runs") or [])
    return f"{job['id']} {job.get('prompt') or ''} {runs} {json.dumps(job.get('request') or '')}"


def merged(found: list[dict[str, Any]]) -> dict[str, Any]:
    """One job's lines as one: its latest line, with the text of runs an earlier line still had
    (a job pruned, then deleted, has its output only in its first line)."""
    latest = dict(found[-1])
    texts = {r["id"]: r for line in found for r in line.get("runs") or [] if r.get("output") or r.get("thinking")}
    latest["runs"] = [texts.get(r["id"], r) for r in latest.get("runs") or []]
    if latest.get("runs"):
        latest["output"] = latest["runs"][-1].get("output") or ""
    if latest.get("request") is None:
        latest["request"] = next((line["request"] for line in reversed(found) if line.get("request")), None)
    latest["archived_lines"] = len(found)
    return latest


@dataclass
class Found:
    """A search's answer: the jobs, and the damage it read past (each file's damaged stretches)."""

    jobs: list[dict[str, Any]]
    damaged: list[Damage] = field(default_factory=list)


def find(directory: Path, text: str, limit: int = 50) -> Found:
    """The archived jobs whose id, prompt, output or request holds `text` (ignoring case), each
    once (merged), newest first, at most `limit`; read from every whole member of every file, and
    the damage read past."""
    needle = text.lower()
    damaged: list[Damage] = []
    by_id: dict[str, list[dict[str, Any]]] = {}
    for path in files(directory):
        for line in lines(path, damaged):
            by_id.setdefault(line["id"], []).append(line)
    hits = [merged(found) for found in by_id.values()]
    hits = [job for job in hits if needle in _text(job).lower()]
    hits.sort(key=lambda j: (j.get("created_at") or "", j["id"]), reverse=True)
    return Found(hits[:limit], damaged)


def search(directory: Path, text: str, limit: int = 50) -> list[dict[str, Any]]:
    """`find`'s jobs alone."""
    return find(directory, text, limit).jobs
