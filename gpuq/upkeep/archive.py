"""The archive: what retention takes out of the database is written here first, in a
form a person reads with ordinary tools. One gzip JSON Lines file per month, by the month the job
was made (`jobs-2026-12.jsonl.gz`); each line one whole job as it was at that moment: every column,
its runs each with its output and reasoning, its events, and `archived_at` / `archived_for`
("prune": its bulk left; "delete": its rows left). Each write appends one gzip member (a reader
sees one stream: `zcat jobs-*.jsonl.gz | jq`) and is fsynced, with its directory, before the
database lets go of the job: a crash between the two leaves the job in both places, never in
neither. So a job may have several lines (archived again by a sweep after a crash, pruned then
deleted): a search gives each job once, from its latest line with its text from whichever line
still had it."""

from __future__ import annotations

import gzip
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..jobs import compact_json, iso
from ..store.backup import fsync

FILE = re.compile(r"jobs-(\d{4})-(\d{2})\.jsonl\.gz")


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
    """Append `lines` to their months' files and fsync each, and the directory; returns the bytes
    written. Raises OSError (a full disk, no permission): then the caller must not let their
    records leave the database."""
    by_file: dict[Path, list[bytes]] = {}
    for path, line in lines:
        by_file.setdefault(path, []).append(line)
    if not by_file:
        return 0
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)  # it holds people's prompts
    written = 0
    for path, chunk in sorted(by_file.items()):
        member = gzip.compress(b"".join(chunk), mtime=0)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, member)
            os.fsync(fd)
        finally:
            os.close(fd)
        written += len(member)
    fsync(directory)
    return written


def append(directory: Path, jobs: Iterable[dict[str, Any]], why: str, now: float, kind: str = "jobs") -> int:
    """Write `jobs` (whole) to their months' files, fsynced; the bytes written (see `write`)."""
    return write(directory, encoded(directory, jobs, why, now, kind))


def files(directory: Path) -> list[Path]:
    """The archive's monthly files, oldest first."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if FILE.fullmatch(p.name))


def lines(path: Path) -> Iterator[dict[str, Any]]:
    """Every line of one file. A member cut short by a crash mid-append ends the file's reading
    there (what came before it is whole: each member was fsynced before the next began)."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for text in f:
                if text.strip():
                    yield json.loads(text)
    except (EOFError, gzip.BadGzipFile, json.JSONDecodeError):
        return


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


def search(directory: Path, text: str, limit: int = 50) -> list[dict[str, Any]]:
    """The archived jobs whose id, prompt, output or request holds `text` (ignoring case), each
    once (merged), newest first, at most `limit`."""
    needle = text.lower()
    by_id: dict[str, list[dict[str, Any]]] = {}
    for path in files(directory):
        for line in lines(path):
            by_id.setdefault(line["id"], []).append(line)
    hits = [merged(found) for found in by_id.values()]
    hits = [job for job in hits if needle in _text(job).lower()]
    hits.sort(key=lambda j: (j.get("created_at") or "", j["id"]), reverse=True)
    return hits[:limit]
