"""States, ids and times: the vocabulary the rest of gpuq speaks."""

import secrets
import time
from datetime import datetime, timezone
from enum import Enum
from typing import NamedTuple


class JobState(str, Enum):
    QUEUED = "queued"  #: waiting in its node's queue
    RUNNING = "running"  #: claimed by its node's worker; at most one per node
    DONE = "done"  #: Ollama finished and the model was unloaded
    FAILED = "failed"  #: Ollama or a limit failed it; never retried by itself
    CANCELLED = "cancelled"  #: deleted or cleared by a person


class Kind(str, Enum):
    TASK = "task"  #: long work, to the first free task node by rank
    CRITIQUE = "critique"  #: a review, fanned out to every critique node
    EMBED = "embed"  #: an embedding through the front door, placed as a task


ACTIVE = (JobState.QUEUED.value, JobState.RUNNING.value)


class NodeCounts(NamedTuple):
    """A node's active jobs (the table node_load keeps them, migration 009)."""

    running: int = 0
    queued: int = 0

POSITION_GAP = 1024


def new_job_id(now: float | None = None) -> str:
    """`<unix seconds>-<8 lowercase hex>`: sorts by time. Not unique by itself in a burst: the
    store checks each new id against the table."""
    return f"{int(now if now is not None else time.time())}-{secrets.token_hex(4)}"


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
