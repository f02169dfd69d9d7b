"""What a worker needs of a job that a client called for (`job["endpoint"]` set), and no more:
the front door (gpuq/front/relay.py) prepares the node's request from the client's and runs it,
relaying what the node sends to the waiting client; the worker runs it on its node within the
job's limits, and keeps its output through a Sink. The worker knows no client API.

The Dispatcher is given the front door's Calls by the daemon; without them (tests that start a
Dispatcher alone) a called job fails, naming why."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import GpuqError
from .ollama import OllamaClient

CLIENT_LEFT = "client disconnected"  # a called job's cancel reason when its client goes away


@dataclass(frozen=True)
class Policy:
    """What the node decides of every request it gets, whatever the client asked."""

    think: bool | str | None  #: the node's think, for its own model (None: the client's, or none)
    options: dict[str, Any] | None  #: the node's options, under the client's
    keep_alive: int | str  #: 0: the model leaves VRAM after the job; or how long it stays warm
    #: A called job's model stays loaded as its client asks ([front] keep_alive when it does not
    #: ask, max_keep_alive at most), while nothing else waits for the node (the worker sees to that).
    front_keep_s: float = 0.0
    front_max_keep_s: float = 0.0


class Sink(Protocol):
    """The worker's side of a running call: what it keeps of the job, and its heartbeat."""

    def keep(self, thinking: str, text: str) -> None:
        """A chunk's reasoning and answer, kept and shown to live followers (raises when the
        job's output passes its cap: the request is then cut)."""

    def summary(self, text: str) -> None:
        """What the job's output shows of a reply not kept (an embedding's vectors)."""

    def beat(self) -> Awaitable[None]:
        """Write the progress so far (at most every HEARTBEAT_S)."""

    async def note(self, message: str) -> None:
        """An event on the job (e.g. "warning: ...")."""


class NodeCall(Protocol):
    options: dict[str, Any] | None  #: the options the node gets (for the context-length check after)
    keep_s: float  #: how long the client asked its model to stay loaded after (0: unload as ever)

    async def run(self, client: OllamaClient, sink: Sink) -> dict[str, Any]:
        """Send the request and follow it to its end; returns Ollama's last chunk (its stats).
        Raises OllamaError (OllamaUnreachable: nothing was sent) as the client does."""


class Calls(Protocol):
    def prepare(self, job: dict[str, Any], policy: Policy, node: str) -> NodeCall:
        """The node's request for a called job (raises GpuqError for a stored request this
        router cannot read)."""

    def waits(self, job_id: str) -> bool:
        """Does the job's client wait on this router (else nobody would read its answer)?"""

    def gone(self, job_id: str) -> str | None:
        """Why the job's client left before its run reached the node (its cancel may not be
        committed yet: the store was busy, or refused), or None. Told once: the worker that
        asks ends the job itself, and touches nothing on the node for it."""

    def failed(self, job_id: str, status: int | None, message: str) -> None:
        """The run failed: its waiting client (if any) hears it now, with Ollama's status."""

    def ended(self, job_ids: list[str], reason: str) -> None:
        """Jobs someone ended (deleted, preempted, cleared): their waiting clients hear why."""


class NoCalls:
    """A Dispatcher with no front door wired: nothing waits, and a called job cannot run."""

    def prepare(self, job: dict[str, Any], policy: Policy, node: str) -> Any:
        raise GpuqError("no front door is wired to this router's workers: a called job cannot be translated")

    def waits(self, job_id: str) -> bool:
        return False  # (nothing waits here)

    def gone(self, job_id: str) -> str | None:
        return None

    def failed(self, job_id: str, status: int | None, message: str) -> None:
        pass

    def ended(self, job_ids: list[str], reason: str) -> None:
        pass
