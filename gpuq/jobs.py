"""States, ids and times: the vocabulary the rest of gpuq speaks."""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, NamedTuple

from .errors import BadRequest, TooLarge
from .params import options_problem, think_problem


class JobState(StrEnum):
    """A job's state. The schema's CHECK constraints (migrations/001, 005) spell the same values,
    and SQL text names them literally; Python code names them here."""

    QUEUED = "queued"  #: waiting in its node's queue
    RUNNING = "running"  #: claimed by its node's worker; at most one per node
    DONE = "done"  #: Ollama finished and the model was unloaded
    FAILED = "failed"  #: Ollama or a limit failed it; never retried by itself
    CANCELLED = "cancelled"  #: deleted or cleared by a person


class Lane(StrEnum):
    """Where a job waits on its node: interactive ahead of every waiting batch job."""

    INTERACTIVE = "interactive"  #: a person waits for it (a chat, an editor): the front door's default
    BATCH = "batch"  #: long or bulk work: the router's API's and the CLI's default


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


JOB_ID = re.compile(r"\d{1,12}-[0-9a-f]{8}")  # what new_job_id makes
MAX_TIMEOUT_S = 7 * 86400  # a job's own timeout: a week at most
MAX_CLIENT_CHARS = 200  # a User-Agent as kept with its job


def check_job_id(text: str) -> str:
    """`text` when it has a job id's shape, else BadRequest: an id in a path or a field never
    reaches the store unchecked."""
    if not JOB_ID.fullmatch(text):
        raise BadRequest(f"'{text[:80]}' is not a job id (ids look like 1760883402-9f3a7c21)")
    return text


@dataclass(frozen=True)
class NewJob:
    """A job to submit. Constructing one checks every rule of its own fields, whichever door it
    came in by (the router's API, the front door, a test): there is no other place that does.
    The doors check only JSON types, in their own API's words; what needs the database (the
    parent exists, is a task, has a result to review) the store judges; where it may go,
    placement."""

    kind: str
    prompt: str | None  # None: a critique of its parent's prompt and result
    model: str | None = None  # None: the node's model; kept stripped of surrounding spaces
    node: str | None = None  # asked for; None lets placement choose
    parent: str | None = None
    timeout_s: float | None = None
    think: bool | str | None = None  # Ollama's think; None: the node's default
    options: dict[str, Any] | None = None  # Ollama model options, over the node's
    # A front-door call (gpuq/front/listener.py): the route it came in on, the request as received
    # (JSON text), and the id its client chose, so that it can follow the job from the start.
    endpoint: str | None = None
    request: str | None = None
    job_id: str | None = None
    # Who sent it and how: the user (None: the router knows no one), the program (its
    # User-Agent), and its lane (each door's is access/lanes.py's lane_for; a job built in code
    # waits in batch).
    owner: str | None = None
    client: str | None = None
    lane: str = Lane.BATCH

    def __post_init__(self) -> None:
        # An embedding is a front-door call (it has its request); gpuq's own API takes the others.
        if self.kind not in (Kind.TASK, Kind.CRITIQUE) and not (self.kind == Kind.EMBED and self.request):
            raise BadRequest(f"unknown kind '{str(self.kind)[:40]}' (expected 'task' or 'critique')")
        if self.parent is not None:
            check_job_id(self.parent)
        if self.timeout_s is not None:
            if not 0 < self.timeout_s <= MAX_TIMEOUT_S:  # (NaN is in no range)
                raise BadRequest(f"field 'timeout' must be between 0 and {MAX_TIMEOUT_S} seconds, got {self.timeout_s}")
            object.__setattr__(self, "timeout_s", float(self.timeout_s))
        if self.model is not None:
            if not self.model.strip():
                raise BadRequest("field 'model' must not be empty")
            object.__setattr__(self, "model", self.model.strip())
        if wrong := think_problem(self.think):
            raise BadRequest(wrong)  # Ollama's words, which name the field
        if self.options is not None and (wrong := options_problem(self.options)):
            raise BadRequest(f"field 'options': {wrong}")
        if self.lane not in tuple(Lane):
            raise BadRequest(f"unknown lane {str(self.lane)[:40]!r} (expected 'interactive' or 'batch')")
        if self.client is not None:
            object.__setattr__(self, "client", self.client[:MAX_CLIENT_CHARS])
        if self.parent is not None and self.kind != Kind.CRITIQUE:
            raise BadRequest("only a critique takes a parent")
        reviews_parent = self.prompt is None and self.parent is not None
        # A front-door call keeps its whole request; its prompt is only what the page shows.
        if self.request is None and not reviews_parent and not (self.prompt or "").strip():
            raise BadRequest("field 'prompt' must not be empty")

    @classmethod
    def checked(cls, max_prompt_bytes: int, **fields: Any) -> NewJob:
        """A client's job: its prompt within router.max_prompt_bytes (413, counted in UTF-8
        bytes), then every rule of its fields."""
        prompt = fields.get("prompt")
        if prompt is not None and (size := len(prompt.encode("utf-8"))) > max_prompt_bytes:
            raise TooLarge(f"prompt is {size} bytes, over the limit of {max_prompt_bytes} (router.max_prompt_bytes)")
        return cls(**fields)


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
    # submit's own commit and hands it over (lifecycle.submit_and_claim, Worker.take).
    idle: bool = False


@dataclass(frozen=True)
class Interrupted:
    """A running job that an operation took off its node; its worker must abort it."""

    job_id: str
    node: str
    run_id: int


def compact_json(obj: object) -> str:
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
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pruned_words(pruned_at: str) -> str:
    """What a job whose bulk retention shed says in place of its output (the API, the page and
    the CLI all show these words): never an empty output that looks like a job that gave none."""
    return f"output pruned on {pruned_at[:10]} (retention)"


# What retention keeps of a pruned job's prompt: its first characters, the excerpt listings show
# (the schema's prompt_excerpt is substr(prompt, 1, 300)); the rest is bulk, like the output.
PROMPT_KEPT_CHARS = 300


def prompt_pruned_words(pruned_at: str) -> str:
    """What a pruned job says of its prompt when retention may have cut it (one of at least
    PROMPT_KEPT_CHARS characters): the whole is in the archive."""
    return f"prompt kept to its first {PROMPT_KEPT_CHARS} characters on {pruned_at[:10]} (retention)"


def parse_iso(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def span(seconds: float) -> str:
    """How long something took or has lasted, to the second: '42s', '3m05s', '2h07m' (the CLI's
    listings, an alert's resolution). Estimates are the CLI's `about`: '~4 min'."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


DEFAULT_NAME_PREFIXES = ("registry.ollama.ai/", "library/")


def normalize_model(name: str) -> str:
    """The name as Ollama matches it (types/model/name.go): case-insensitively, the default
    registry and `library/` namespace dropped, `:latest` implied. 'Qwen3' is 'qwen3:latest'."""
    key = name.strip().lower()
    for prefix in DEFAULT_NAME_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
    return key if ":" in key.rsplit("/", 1)[-1] else f"{key}:latest"


def api_of(path: str) -> str:
    """Which API a front-door path speaks: "anthropic" (/v1/messages and its batches), "openai"
    (the rest of /v1, its unknown paths too: they get OpenAI's error shape) or "ollama"."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "openai" if path.startswith("/v1/") else "ollama"
