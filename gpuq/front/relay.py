"""The front door's side of a called job's run (gpuq/node/calls.py's Calls): the node's request
made from the client's under the node's policy, its chunks relayed to the waiting client as
the node sends them, an embedding's one reply, and the front door's own retry (Anthropic's
"relax thinking"). The worker runs it on its node and keeps its output; it knows no client API.

Memory per call is bounded, however slowly its client reads: the node is read at its own pace
(never slowed by a client), so what a streaming client has not taken yet waits in its call's
Inbox, which holds at most CLIENT_BACKLOG_BYTES. A client that falls further behind is not fed
from the store but cut off: its call is marked behind, the rest of the node's chunks are not
held for it, and its handler ends the stream with an error line saying where the whole answer
is (gpuq/front/call.py; a write its client does not take within [front] stalled_client_timeout
closes the connection). The job runs on to its end and keeps its whole output. Why not feed a
late client from the store: the store keeps the answer's text, not the node's lines (their
timings, tool calls as the node sent them, a /v1 stream's events), so a client fed from it
would get a different stream than the one it asked for; a client that reads nothing for seconds
while a model writes has stopped (a live client reads far faster than any model writes), and
its answer is one `gpuq show` away."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..errors import OllamaError
from ..jobs import api_of
from ..node.calls import Policy, Sink
from ..node.ollama import OllamaClient
from ..node.vram import call_keep_alive, call_keep_s
from .anthropic import relaxes_thinking
from .endpoints import STREAMED_ROUTES, node_request
from .ollama_api import keep_alive_s
from .shapes import chunk_text
from .stored import StoredCall

log = logging.getLogger("gpuq")

# A front-door generate's last chunk carries its whole token context (`context`), which may be
# far past the reader's buffer; still bounded, so a broken node cannot fill the router's memory.
FRONT_MAX_LINE = 16 << 20
EMBED_MAX_BYTES = 256 << 20  # an embedding's reply, read whole (its vectors go to the client)

# What a streaming call holds for a client that has not taken it yet (its chunks' lines, and the
# parsed chunk beside each, counted as CHUNK_OVERHEAD): a few hundred KB, whatever the answer's size.
CLIENT_BACKLOG_BYTES = 512 << 10
CHUNK_OVERHEAD = 1024  # a parsed chunk (a dict of dicts and strings) beside its line, in bytes, roughly

# What a call's inbox holds: its kind first, then what that kind carries (Relay lists them, and
# gpuq/front/call.py's Call adds ("data", bytes)). Told through Relay.tell(job_id, *item).
InboxItem = tuple[Any, ...]


def held_bytes(item: InboxItem) -> int:
    """The bytes an inbox's item holds: a chunk's line and its parse, a translated chunk's data."""
    if item[0] == "chunk":
        return len(item[1]) + CHUNK_OVERHEAD
    if item[0] == "data":
        return len(item[1])
    return 0


class Inbox(asyncio.Queue[InboxItem]):
    """One call's queue, what it holds counted: once a chunk would take it past `limit` (None:
    no limit, a stream:false call holds its whole answer anyway), the call is `behind` and holds
    no more chunks; ("behind", bytes dropped) tells its handler, once, after what it holds."""

    def __init__(self, limit: int | None = None) -> None:
        super().__init__()
        self.limit = limit
        self.held = 0
        self.behind = False
        self.dropped = 0  # the node's bytes not held for the client since it fell behind

    def put_nowait(self, item: InboxItem) -> None:
        super().put_nowait(item)
        self.held += held_bytes(item)

    def get_nowait(self) -> InboxItem:
        item = super().get_nowait()
        self.held -= held_bytes(item)
        return item

    def hold_chunk(self, raw: bytes, chunk: dict[str, Any]) -> None:
        """A chunk of the node's stream for the client, unless that takes it past its limit."""
        if not self.behind and (self.limit is None or self.held + len(raw) + CHUNK_OVERHEAD <= self.limit):
            self.put_nowait(("chunk", raw, chunk))
            return
        if not self.behind:
            self.behind = True
            self.put_nowait(("behind",))
        self.dropped += len(raw)


class Relay:
    """The calls whose client waits, by job id: what their run sends each, in order:
    ("start", node), ("chunk", raw line, chunk), ("reply", object), ("error", status, message),
    ("ended", reason), ("shutdown",). A call's handler opens its queue before its submit.

    A chunk may instead be taken at once by the call's `direct` (set while its handler waits
    with nothing queued): the node's reading task then writes it to the client itself, and the
    handler's task is not woken for it (a paced token woke two tasks, three turns of the loop).
    What `direct` took is written by its `flush`, once the node's read is handled (`flush`)."""

    def __init__(self) -> None:
        self.waiting: dict[str, Inbox] = {}
        self.direct: dict[str, tuple[Callable[[bytes, dict[str, Any]], bool], Callable[[], None]]] = {}

    def open(
        self,
        job_id: str,
        direct: Callable[[bytes, dict[str, Any]], bool] | None = None,
        flush: Callable[[], None] | None = None,
        limit: int | None = None,
    ) -> Inbox:
        """The call's inbox; `limit`: what it may hold for a client that does not read (Inbox)."""
        queue = self.waiting[job_id] = Inbox(limit)
        if direct is not None and flush is not None:
            self.direct[job_id] = (direct, flush)
        return queue

    def close(self, job_id: str) -> None:
        self.waiting.pop(job_id, None)
        self.direct.pop(job_id, None)

    def tell(self, job_id: str, *item: Any) -> None:
        queue = self.waiting.get(job_id)
        if queue is not None:
            queue.put_nowait(item)

    def chunk(self, job_id: str, raw: bytes, chunk: dict[str, Any]) -> None:
        """A chunk of the node's stream: taken for its client now if it can be (written at the
        next `flush`), else held in its inbox (up to the inbox's limit)."""
        inbox = self.waiting.get(job_id)
        if inbox is None or inbox.behind:
            return
        direct = self.direct.get(job_id)
        if direct is None or not direct[0](raw, chunk):
            inbox.hold_chunk(raw, chunk)

    def flush(self, job_id: str) -> None:
        """The chunks `chunk` took since the last flush, written to their client in one write."""
        direct = self.direct.get(job_id)
        if direct is not None:
            direct[1]()

    def shutdown(self) -> None:
        """The router stops: every waiting call ends (its job cancelled if it had not started)."""
        for queue in list(self.waiting.values()):
            queue.put_nowait(("shutdown",))

    # -- Calls (gpuq/node/calls.py) -------------------------------------------------------------

    def prepare(self, job: dict[str, Any], policy: Policy, node: str) -> NodeRun:
        self.tell(job["id"], "start", node)
        call = StoredCall.parse(job["request"])
        client = call.body
        keep_s = client_keep_s(job["endpoint"], client, policy)
        # The node is asked with the client's keep_alive (capped), so a router that dies leaves the
        # model to Ollama's own timer; else with the node's unload policy (0 for "after-each", a
        # bounded keep-warm for "when-idle": gpuq/node/vram.py request_keep_alive).
        route, body = node_request(
            job["endpoint"], client, policy.think, policy.options, call_keep_alive(keep_s, policy), job["model"]
        )
        return NodeRun(self, job, node, route, body, keep_s, call)

    def waits(self, job_id: str) -> bool:
        return job_id in self.waiting

    def failed(self, job_id: str, status: int | None, message: str) -> None:
        self.tell(job_id, "error", status, message)

    def ended(self, job_ids: list[str], reason: str) -> None:
        for job_id in job_ids:
            self.tell(job_id, "ended", reason)


def client_keep_s(endpoint: str, body: dict[str, Any], policy: Policy) -> float:
    """How long a call's model may stay loaded after it, in seconds: the client's keep_alive as
    Ollama reads it (a negative one, forever, becomes the cap), [front] keep_alive when it sends
    none (OpenAI's and Anthropic's APIs carry none: Ollama gives them its default too), never
    more than [front] max_keep_alive (gpuq/node/vram.py's call_keep_s)."""
    value = body.get("keep_alive") if api_of(endpoint) == "ollama" and isinstance(body, dict) else None
    if value is None:
        asked: float | None = policy.front_keep_s
    else:
        asked = keep_alive_s(value)
    return call_keep_s(asked, policy)


class NodeRun:
    """One called job's request to its node, relayed chunk by chunk as Ollama sent it; the
    answer, the reasoning and any tool calls kept as the job's output."""

    def __init__(
        self,
        relay: Relay,
        job: dict[str, Any],
        node: str,
        route: str,
        body: dict[str, Any],
        keep_s: float,
        call: StoredCall,
    ) -> None:
        self.relay, self.job, self.node, self.route, self.body = relay, job, node, route, body
        self.keep_s = keep_s
        self.call = call  # the job's stored request (its batch, when it is a batch's line)
        self.options = body.get("options")

    async def run(self, client: OllamaClient, sink: Sink) -> dict[str, Any]:
        if self.route not in STREAMED_ROUTES:  # an embedding: one answer
            return await self._embed(client, sink)
        relay, job_id = self.relay, self.job["id"]
        async for lines in self._stream(client, sink):
            try:  # the lines of one read of the node, written to the client in one write
                for raw, chunk in lines:
                    relay.chunk(job_id, raw, chunk)
                    text, thought, calls = chunk_text(chunk)
                    for call in calls:  # shown with the answer on the job's page
                        function = call.get("function") or {}
                        text += f"\n[tool call {function.get('name')} {json.dumps(function.get('arguments'))}]"
                    sink.keep(thought, text)
                    if chunk.get("done"):
                        return chunk
            finally:
                relay.flush(job_id)
            await sink.beat()
        raise OllamaError("Ollama's stream ended without done: true")

    async def _stream(self, client: OllamaClient, sink: Sink) -> AsyncIterator[list[tuple[bytes, dict[str, Any]]]]:
        """The node's chunks, a read's at a time. An Anthropic call asking a model that cannot
        think to think is sent again without `think`, as Ollama relaxes it for Claude Code and
        the like (server/routes.go ChatHandler, "relax_thinking"): the node refused it before
        any work."""
        body, sent = self.body, False
        try:
            async for lines in client.stream_reads(self.route, body, max_line=FRONT_MAX_LINE):
                sent = True
                yield lines
            return
        except OllamaError as exc:
            if sent or not relaxes_thinking(self.job["endpoint"], body.get("think"), exc.status, exc.message):
                raise
        warning = f"warning: {body.get('model')} does not support thinking: sent again without it, as Ollama relaxes it"
        log.warning("job=%s node=%s %s", self.job["id"], self.node, warning)
        await sink.note(warning)
        body = {k: v for k, v in body.items() if k != "think"}
        async for lines in client.stream_reads(self.route, body, max_line=FRONT_MAX_LINE):
            yield lines

    async def _embed(self, client: OllamaClient, sink: Sink) -> dict[str, Any]:
        reply = await client.post(self.route, self.body, max_bytes=EMBED_MAX_BYTES)
        vectors = reply.get("embeddings") if isinstance(reply, dict) else None
        if vectors is None and isinstance(reply, dict) and "embedding" in reply:
            vectors = [reply["embedding"]]
        dims = len(vectors[0]) if vectors else 0
        sink.summary(f"{len(vectors or [])} embedding(s) of {dims} dimensions (the vectors went to the client)")
        self.relay.tell(self.job["id"], "reply", reply)
        return (
            {k: reply.get(k) for k in ("prompt_eval_count", "total_duration", "load_duration")}
            if isinstance(reply, dict)
            else {}
        )
