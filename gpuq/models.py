"""States, ids and times: the vocabulary the rest of gpuq speaks."""

import json
import secrets
import time
from datetime import datetime, timezone
from dataclasses import dataclass
from enum import Enum, StrEnum
from typing import NamedTuple

from .errors import BadRequest


class JobState(StrEnum):
    """A job's state. The schema's CHECK constraints (migrations/001, 005) spell the same values,
    and SQL text names them literally; Python code names them here."""

    QUEUED = "queued"  #: waiting in its node's queue
    RUNNING = "running"  #: claimed by its node's worker; at most one per node
    DONE = "done"  #: Ollama finished and the model was unloaded
    FAILED = "failed"  #: Ollama or a limit failed it; never retried by itself
    CANCELLED = "cancelled"  #: deleted or cleared by a person


class Kind(StrEnum):
    TASK = "task"  #: long work, to the first free task node by rank
    CRITIQUE = "critique"  #: a review, fanned out to every critique node
    EMBED = "embed"  #: an embedding through the front door, placed as a task


ACTIVE = (JobState.QUEUED, JobState.RUNNING)  #: on a node: waiting or running
FINAL = (JobState.DONE, JobState.FAILED, JobState.CANCELLED)  #: ended; only a retry starts it again
NO_RESULT = (JobState.FAILED, JobState.CANCELLED)  #: ended without a result: what a retry takes


class NodeCounts(NamedTuple):
    """A node's active jobs (the table node_load keeps them, migration 009)."""

    running: int = 0
    queued: int = 0

POSITION_GAP = 1024


@dataclass(frozen=True)
class NewJob:
    kind: str
    prompt: str | None  # None: a critique of its parent's prompt and result
    model: str | None = None  # None: the node's model
    node: str | None = None  # asked for; None lets placement choose
    parent: str | None = None
    timeout_s: float | None = None
    think: bool | str | None = None  # Ollama's think; None: the node's default
    options: dict | None = None  # Ollama model options, over the node's
    # A front-door call (gpuq/front/listener.py): the route it came in on, the request as received
    # (JSON text), and the id its client chose, so that it can follow the job from the start.
    endpoint: str | None = None
    request: str | None = None
    job_id: str | None = None

    def __post_init__(self) -> None:
        """The shape every new job must have, whichever door it came in by. What needs the
        database (the parent exists, is a task, has a result to review) the store judges."""
        if self.parent is not None and self.kind != Kind.CRITIQUE:
            raise BadRequest("only a critique takes a parent")
        reviews_parent = self.prompt is None and self.parent is not None
        # A front-door call keeps its whole request; its prompt is only what the page shows.
        if self.request is None and not reviews_parent and not (self.prompt or "").strip():
            raise BadRequest("field 'prompt' must not be empty")


@dataclass(frozen=True)
class NodeInfo:
    """What the store needs to know of a node to place and move jobs."""

    name: str
    rank: int
    roles: tuple[str, ...]
    model: str
    up: bool
    models: frozenset[str] | None = None  # installed, as of its last health check; None: unknown
    # Its worker waits for work with nothing claimed: a submit to it claims its head in the
    # submit's own commit and hands it over (verbs.submit_and_claim, Worker.take).
    idle: bool = False


@dataclass(frozen=True)
class Interrupted:
    """A running job that an operation took off its node; its worker must abort it."""

    job_id: str
    node: str
    run_id: int


def compact_json(obj) -> str:
    """JSON as the router sends it (and Go's encoder writes it): no spaces, UTF-8 as is, so a
    listing's excerpts in any script cost their UTF-8 bytes, not six per character."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def new_job_id(now: float | None = None) -> str:
    """`<unix seconds>-<8 lowercase hex>`: sorts by time. Not unique by itself in a burst: the
    store checks each new id against the table."""
    return f"{int(now if now is not None else time.time())}-{secrets.token_hex(4)}"


def preview_url(public_url: str, job_id: str) -> str:
    """The job's own page, where a person follows it."""
    return f"{public_url}/jobs/{job_id}"


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


DEFAULT_NAME_PREFIXES = ("registry.ollama.ai/", "library/")


def normalize_model(name: str) -> str:
    """The name as Ollama matches it (types/model/name.go): case-insensitively, the default
    registry and `library/` namespace dropped, `:latest` implied. 'Qwen3' is 'qwen3:latest'."""
    key = name.strip().lower()
    for prefix in DEFAULT_NAME_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
    return key if ":" in key.rsplit("/", 1)[-1] else f"{key}:latest"
