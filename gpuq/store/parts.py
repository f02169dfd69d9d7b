"""A front-door request's large parts, stored once per content (migration 018): a chat
UI resends the same 20 MB base64 photo with every turn, and each turn stored it again in
job.request. Now every string of a request's JSON of PART_BYTES or more (a base64 image in
Ollama's `images`, an OpenAI `image_url` data URL, an Anthropic `source.data`, a long pasted
file) is kept once in request_part, keyed by the sha256 of its UTF-8 bytes; the job's request
holds {"$gpuq_part": "<sha256>"} in its place, and job_part says which jobs refer to which part.
A part is kept as its JSON text, as it stood in the request (quoted, escaped: a NUL in it is
`\u0000`, which PostgreSQL's TEXT takes), so a request is made whole again by text alone.
Whoever reads a request through the store gets it whole (`whole_request`): the claim that hands
a call to its worker, and a job's detail (`gpuq show`, the API, the page).

A part leaves only when no job refers to it (`drop_unreferenced`): job_part's rows go with
their job, or with its request when retention empties it (the schema's triggers)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from ..jobs import compact_json
from .engine import Connection
from .steps import Row

PART_BYTES = 64 << 10  # a string this large or larger is stored once, apart from its request
MARK = "$gpuq_part"  # {"$gpuq_part": sha256}: a part's place in its request


def sha256_of(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def split_request(request: str) -> tuple[str, dict[str, str]]:
    """A request's JSON with each large string in its place as a mark, and the strings by
    sha256. Stored as it came when it is not JSON, or holds a mark of its own (a client that
    sent {"$gpuq_part": ...} gets its request back exactly as it sent it)."""
    if len(request) < PART_BYTES:
        return request, {}
    try:
        value = json.loads(request)
    except ValueError:
        return request, {}
    parts: dict[str, str] = {}
    own_mark = False

    def walk(v: Any) -> Any:
        nonlocal own_mark
        if isinstance(v, str) and len(v) >= PART_BYTES // 4 and len(v.encode("utf-8", "surrogatepass")) >= PART_BYTES:
            digest = sha256_of(v)
            parts[digest] = compact_json(v)  # as it stands in the request: its JSON text, quoted
            return {MARK: digest}
        if isinstance(v, dict):
            own_mark = own_mark or MARK in v
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    stored = walk(value)
    if own_mark or not parts:
        return request, {}
    return compact_json(stored), parts  # as the front door wrote it: a joined request is the same text


def marks_in(request: str | None) -> bool:
    return request is not None and '{"$gpuq_part":"' in request


# A mark as split_request writes it (no spaces). Inside a JSON string a quote is escaped, so this
# text appears in a stored request only as a mark (a request with an object of its own under
# MARK is stored as it came): marks are found and replaced as text, without parsing a request
# that may be tens of MB, in the writer's thread at the claim.
MARK_TEXT = re.compile(r'\{"\$gpuq_part":"([0-9a-f]{64})"\}')


def join_request(request: str, parts: Callable[[list[str]], dict[str, str]]) -> str:
    """The request whole again: each mark replaced by its part's JSON text (`parts(sha256s)`
    gives them)."""
    wanted = sorted(set(MARK_TEXT.findall(request)))
    if not wanted:
        return request
    found = parts(wanted)
    # a KeyError: a part dropped while a job referred to it (by hand: the store never does)
    return MARK_TEXT.sub(lambda m: found[m.group(1)], request)


PARTS_SQL = "SELECT sha256, data FROM request_part WHERE sha256 IN ({marks})"


def parts_sql(digests: list[str]) -> str:
    return PARTS_SQL.format(marks=",".join("?" * len(digests)))


# -- the writer's verbs ---------------------------------------------------------------------------


def keep_parts(db: Connection, job_ids: list[str], parts: dict[str, str], at: str) -> None:
    """The parts of a submitted request, each stored once (kept if already there), and the jobs
    that refer to them. Inside the submit's transaction."""
    db.executemany(
        "INSERT INTO request_part (sha256, data, bytes, created_at) VALUES (?,?,?,?) ON CONFLICT (sha256) DO NOTHING",
        [(digest, data, len(data.encode("utf-8", "surrogatepass")), at) for digest, data in parts.items()],
    )
    db.executemany(
        "INSERT INTO job_part (job_id, sha256) VALUES (?,?)",
        [(job_id, digest) for job_id in job_ids for digest in parts],
    )


def whole_request_in(db: Connection, request: str) -> str:
    """A stored request whole, read on the writer's connection (the claim)."""

    def parts(digests: list[str]) -> dict[str, str]:
        return {r[0]: r[1] for r in db.execute(parts_sql(digests), digests).fetchall()}

    return join_request(request, parts) if marks_in(request) else request


def drop_unreferenced(db: Connection) -> Row:
    """The stored request parts (images) that no job refers to any more (their jobs deleted, or
    their requests emptied by retention), dropped: {"parts", "bytes"}. A part some job still
    refers to is never dropped."""
    row = db.execute(
        "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM request_part p"
        " WHERE NOT EXISTS (SELECT 1 FROM job_part j WHERE j.sha256 = p.sha256)"
    ).fetchone()
    db.execute(
        "DELETE FROM request_part WHERE NOT EXISTS (SELECT 1 FROM job_part j WHERE j.sha256 = request_part.sha256)"
    )
    return {"parts": int(row[0]), "bytes": int(row[1])}
