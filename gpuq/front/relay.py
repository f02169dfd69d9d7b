"""The front door's side of a called job's run (gpuq/node/calls.py's Calls): the node's request
made from the client's under the node's policy, its chunks relayed to the waiting client as
the node sends them, an embedding's one reply, and the front door's own retry (Anthropic's
"relax thinking"). The worker runs it on its node and keeps its output; it knows no client API.

Memory per call is bounded, however slowly its client reads: the node is read at its own pace
(never slowed by a client), so what a streaming client has not taken yet waits in its call's
Inbox, which holds at most CLIENT_BACKLOG_BYTES. A client that falls further behind is not cut:
the node's lines it has not taken go on to its call's Spool, an unnamed file on the router's disk
(beside its database), which its handler reads back in order as the client takes them; once it
has read all the spool holds, the call rejoins the live tail (gpuq/front/call.py `catch_up`), as a
log's consumer reads old offsets from disk and new ones from memory. The client gets every line
the node sent, in order, whatever its pace; a client that takes nothing for [front]
stalled_client_timeout is cut off (its job runs on and keeps its whole output). Why the node's
lines and not the job's stored output: the store keeps the answer's text, not the node's lines
(their timings, tool calls as the node sent them, a /v1 stream's events), so a client fed from
it would get a different stream than the one it asked for. Only where the spool cannot be
written (a full disk, SPOOL_MAX_BYTES for one call) is the client told it fell behind and its
stream ended, with where its whole answer is."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
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
# Past it, a call's lines wait in its spool: at most this much per call, then its client is told
# it fell behind (a 60,000-token answer is about 10 MB of the node's lines).
SPOOL_MAX_BYTES = 256 << 20
SPOOL_WRITE_BYTES = 64 << 10  # lines gathered before a write to the spool's file
SPOOL_READ_BYTES = 64 << 10  # what a catching-up handler reads at a time

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


class Spool:
    """A call's node lines past what its inbox holds in memory, in order, in an unnamed file
    (tempfile.TemporaryFile: private, and gone with its handle or with the router, so a crash
    leaves nothing on disk). Lines are gathered in memory up to SPOOL_WRITE_BYTES, then written
    in one go; a read takes the file's unread lines first, then what is gathered. Everything
    runs on the event loop: a write or read of tens of KB to the page cache takes microseconds."""

    def __init__(self, directory: Path | None, max_bytes: int) -> None:
        self.file = tempfile.TemporaryFile(dir=directory, buffering=0)
        self.max_bytes = max_bytes
        self.gathered = bytearray()  # lines not written yet
        self.written = 0  # the file's length
        self.read_at = 0  # the next unread byte of the file
        self.total = 0  # every byte spooled: the call's bound

    def append(self, raw: bytes) -> None:
        """One line (OSError when it cannot be kept: the disk is full, or the call's bound)."""
        if self.total + len(raw) + 1 > self.max_bytes:
            raise OSError(f"a call's spool holds at most {self.max_bytes >> 20} MiB")
        self.gathered += raw
        self.gathered += b"\n"
        self.total += len(raw) + 1
        if len(self.gathered) >= SPOOL_WRITE_BYTES:
            self._write()

    def _write(self) -> None:
        view = memoryview(self.gathered)
        while view:  # a short write is not an error: write the rest
            n = os.pwrite(self.file.fileno(), view, self.written)
            self.written += n
            view = view[n:]
        self.gathered = bytearray()

    def read(self, size: int = SPOOL_READ_BYTES) -> list[bytes]:
        """The next unread lines, about `size` bytes of them ([] once all is read)."""
        if self.read_at < self.written:
            data = os.pread(self.file.fileno(), min(size, self.written - self.read_at), self.read_at)
            end = data.rfind(b"\n") + 1
            if end == 0:  # one line longer than `size`: read on to its end (the file holds whole lines)
                data = os.pread(self.file.fileno(), self.written - self.read_at, self.read_at)
                end = data.index(b"\n") + 1
            self.read_at += end
            return data[:end].splitlines()
        data, self.gathered = bytes(self.gathered), bytearray()
        return data.splitlines()

    def close(self) -> None:
        self.file.close()


class Inbox(asyncio.Queue[InboxItem]):
    """One call's queue, what it holds counted: once a chunk would take it past `limit` (None:
    no limit, a stream:false call holds its whole answer anyway), the call's chunks go to its
    Spool, and ("spooled",) tells its handler to read them from there (`rejoin` ends that once
    it has read them all). Where no spool can be kept, the call is `behind` and holds no more
    chunks; ("behind", bytes dropped) tells its handler, once, after what it holds."""

    def __init__(self, limit: int | None = None, spool_dir: Path | None = None, spool_max: int = 0) -> None:
        super().__init__()
        self.limit = limit
        self.held = 0
        self.behind = False
        self.dropped = 0  # the node's bytes not held for the client since it fell behind
        self.spool: Spool | None = None
        self.spool_dir = spool_dir
        self.spool_max = spool_max

    def put_nowait(self, item: InboxItem) -> None:
        super().put_nowait(item)
        self.held += held_bytes(item)

    def get_nowait(self) -> InboxItem:
        item = super().get_nowait()
        self.held -= held_bytes(item)
        return item

    def hold_chunk(self, raw: bytes, chunk: dict[str, Any]) -> None:
        """A chunk of the node's stream for the client: held, or spooled past the inbox's limit."""
        if self.behind:
            self.dropped += len(raw)
            return
        if self.spool is None and (self.limit is None or self.held + len(raw) + CHUNK_OVERHEAD <= self.limit):
            self.put_nowait(("chunk", raw, chunk))
            return
        try:
            if self.spool is None:
                self.spool = Spool(self.spool_dir, self.spool_max)
                self.put_nowait(("spooled",))
            self.spool.append(raw)
        except OSError as exc:
            log.warning("a call's spool could not keep its client's lines (%s): its stream ends behind", exc)
            self.behind = True
            self.put_nowait(("behind",))
            self.dropped += len(raw)

    def rejoin(self) -> None:
        """The handler has read all the spool holds: the next chunks come through memory again."""
        if self.spool is not None:
            self.spool.close()
            self.spool = None

    def close(self) -> None:
        self.rejoin()


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
        # Calls whose client left, by job id, with the reason, until their cancel is committed
        # (left): a worker that gets one of these jobs ends it without touching its node (gone).
        self.gone_calls: dict[str, str] = {}
        self.direct: dict[str, tuple[Callable[[bytes, dict[str, Any]], bool], Callable[[], None]]] = {}

    def open(
        self,
        job_id: str,
        direct: Callable[[bytes, dict[str, Any]], bool] | None = None,
        flush: Callable[[], None] | None = None,
        limit: int | None = None,
        spool_dir: Path | None = None,
    ) -> Inbox:
        """The call's inbox; `limit`: what it may hold in memory for a client that does not
        read, the rest spooled in `spool_dir` (None: the system's temporary directory) (Inbox)."""
        queue = self.waiting[job_id] = Inbox(limit, spool_dir, SPOOL_MAX_BYTES)
        if direct is not None and flush is not None:
            self.direct[job_id] = (direct, flush)
        return queue

    def close(self, job_id: str) -> None:
        inbox = self.waiting.pop(job_id, None)
        if inbox is not None:
            inbox.close()
        self.direct.pop(job_id, None)

    def tell(self, job_id: str, *item: Any) -> None:
        queue = self.waiting.get(job_id)
        if queue is not None:
            queue.put_nowait(item)

    def chunk(self, job_id: str, raw: bytes, chunk: dict[str, Any]) -> None:
        """A chunk of the node's stream: taken for its client now if it can be (written at the
        next `flush`), else held in its inbox (or its spool, past the inbox's limit)."""
        inbox = self.waiting.get(job_id)
        if inbox is None or inbox.behind:
            return
        if inbox.spool is not None:
            inbox.hold_chunk(raw, chunk)
            return
        direct = self.direct.get(job_id)
        if direct is None or not direct[0](raw, chunk):
            inbox.hold_chunk(raw, chunk)
            if inbox.spool is not None:
                log.info("job=%s client fell behind its stream: its lines are spooled for it", job_id)

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

    def left(self, job_id: str, reason: str | None) -> None:
        """The call's client left (`reason`), its cancel on its way to the store; None: that
        cancel was committed (or the job had ended), nothing more to do."""
        if reason is None:
            self.gone_calls.pop(job_id, None)
        else:
            self.gone_calls[job_id] = reason

    def gone(self, job_id: str) -> str | None:
        return self.gone_calls.pop(job_id, None)

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
