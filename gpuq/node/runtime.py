"""What the router holds of each node in memory: its health as last heard (NodeRuntime) and the
job it runs now (Current). The monitor writes the one, the worker the other; the pages, /health,
the alerts and the metrics read both."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ..config import NodeConfig
from .ollama import OllamaClient
from .supervise import Loop


@dataclass
class NodeRuntime:
    """One node now: what the pages, /health, the alerts and the metrics show of it."""

    config: NodeConfig
    client: OllamaClient
    up: bool = False
    checked: bool = False  # False until the first health check has answered
    last_error: str | None = None
    since: float = field(default_factory=time.time)
    model_installed: bool | None = None
    installed: frozenset[str] | None = None  # the models /api/tags listed at the last answer
    models_recorded: frozenset[str] | None = None  # those models as the node's row has them (other routers read it)
    tags: list[dict[str, Any]] = field(default_factory=list)  # those models as /api/tags described them
    version: str | None = None  # /api/version's answer at the last check
    vram_stuck: str | None = None  # set when a model would not leave VRAM
    stuck_model: str | None = None  # which model (a job may have asked for another than the node's)
    stuck_since: float | None = None  # when it was flagged
    stuck_job: str | None = None  # the job after which it would not leave (None: a dead router's)
    health_unrecorded: bool = False  # the database refused the last health change
    current: Current | None = None  # the job it runs now (its output so far, in memory)
    # The model left loaded on purpose between jobs, and until when (epoch; None: until the node
    # goes idle, "when-idle"'s rule): a front-door call's keep_alive, or the next job's same model.
    warm_model: str | None = None
    warm_until: float | None = None
    warm_hits: int = 0  # jobs that found their model warm: a load avoided
    warm_unloads: int = 0  # kept models unloaded (their time ran out, another model or job came)
    # The last kept model a client asked to unload (`ollama stop`, Open WebUI's unload): which,
    # who asked, when it left (ISO), how long its verified unload took, whether /api/ps confirmed it.
    asked_unload: dict[str, Any] | None = None
    loops: list[Loop] = field(default_factory=list)  # its worker and health loop

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def claimable(self) -> bool:
        return self.up and self.vram_stuck is None


@dataclass
class Current:
    """The job a node is running now."""

    job_id: str
    run_id: int
    model: str = ""  # the model it runs (a client's unload of it waits for its end)
    task: asyncio.Task[None] | None = None
    output: list[str] = field(default_factory=list)  # the answer, one piece per token
    thinking: list[str] = field(default_factory=list)  # the reasoning, apart from the answer
    options: dict[str, Any] | None = None  # the Ollama options the request carried
    keep_s: float = 0.0  # a front-door call's keep_alive: how long its model may stay loaded after
    saved: tuple[int, int] = (0, 0)  # pieces of output and of thinking the store already holds
    size: int = 0  # bytes of output and thinking held (UTF-8), against max_output_bytes
    merged: tuple[int, int] = (0, 0)  # pieces of output and of thinking joined by compact()
    abort_reason: str | None = None
    abort_actor: str = "router"  # who cut it (Dispatcher.cut): the cancel's event names them
    # Generating (its request to the node in flight, or about to be): a client that leaves may cut
    # it at once (Dispatcher.cut), before its cancel is committed; not while it is recorded and
    # finished, whose commit may claim the node's next job.
    generating: bool = False
    lost: bool = False  # another router took the node mid-job (and failed the job): not relayed further
    next_job: dict[str, Any] | None = None  # claimed in the same transaction that finished this one

    @property
    def thinking_tokens(self) -> int:
        """Chunks of reasoning streamed so far (Ollama streams one token per chunk)."""
        return len(self.thinking) + self.merged[1]

    @property
    def tokens(self) -> int:
        """Chunks streamed so far, answer and reasoning."""
        return len(self.output) + self.merged[0] + self.thinking_tokens

    def compact(self) -> None:
        """Join the pieces the store holds into one each: a piece of a few bytes costs ~60 bytes
        in a list, and the millions of an 8 MiB reply doubled the router's peak memory."""
        merged = []
        for pieces, done, before in zip((self.output, self.thinking), self.saved, self.merged):
            if done > 1:
                pieces[:done] = ["".join(pieces[:done])]
            merged.append(before + max(done - 1, 0))
        self.merged = (merged[0], merged[1])
        self.saved = (min(self.saved[0], 1), min(self.saved[1], 1))

    def unsaved(self) -> tuple[str, str | None, tuple[int, int]]:
        """The output and thinking not stored yet (each written once: the store appends), and
        the mark to put in `saved` once the write that carries them has returned."""
        done_out, done_thought = self.saved
        return (
            "".join(self.output[done_out:]),
            "".join(self.thinking[done_thought:]) or None,
            (len(self.output), len(self.thinking)),
        )
