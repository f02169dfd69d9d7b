"""One call that makes a model work, as a durable job: stored before any work (placed by its
model), its client's connection held while it waits, its node's chunks relayed as they come
(gpuq/front/relay.py), its answer in the shape of the caller's API (gpuq/front/endpoints.py).

A streaming client that stops reading costs the router a bounded amount: its inbox holds at
most relay.CLIENT_BACKLOG_BYTES of the answer (past that the call is behind, and its stream
ends with an error line naming the job that keeps the whole answer), and a write it does not
take within [front] stalled_client_timeout closes its connection. Either way its job runs on to
its end: the client's request was taken, and its output is stored."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from ..access.identity import ANYONE, Caller
from ..access.lanes import Door, lane_for
from ..access.tokens import CALLER
from ..errors import FrontError, IdTaken, ModelMissing, NotFound, StoreUnavailable
from ..jobs import ACTIVE, new_job_id, normalize_model
from ..node.calls import CLIENT_LEFT
from ..node.dispatcher import Dispatcher
from ..store import NewJob, Row
from .context import FRONT, Front, error_response, json_of
from .endpoints import Endpoint, StreamWriter, early_refusal, entries_of, front_nodes
from .listings import model_not_found
from .names import aliased, local_name
from .ollama_api import collected, is_load_or_unload, load_or_unload_reply, ollama_error, unloads
from .relay import CLIENT_BACKLOG_BYTES, Inbox, InboxItem
from .shapes import dumps
from .stored import StoredCall

log = logging.getLogger("gpuq")


STATE_CHECK_S = 1.0  # a waiting call rereads its job this often when nothing arrives (a safety net)


KEEPALIVE_S = 10.0  # an OpenAI stream that waits gets an SSE comment this often

FOLD_CHUNKS = 256  # a stream:false call folds the chunks it keeps for its reply this often


# A call whose job someone else ended (deleted, preempted) before anything was sent gets this
# status, not Ollama's 499: 499 means "the client closed the request", and clients treat it as
# their own abort and show nothing (Continue's streamResponse returns quietly on 499).
ENDED_STATUS = 410


def text_bytes(value: Any) -> int:
    """The UTF-8 bytes of a request's text, in Ollama's terms: every string in it but its images."""
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        return sum(text_bytes(v) for k, v in value.items() if k != "images")
    if isinstance(value, list):
        return sum(text_bytes(v) for v in value)
    return 0


def check_text_size(ollama: dict[str, Any], limit: int) -> None:
    """The front door takes images up to front.max_request_bytes; its text is held to the
    router's prompt limit, as every job's prompt is (413, as the router's API says it)."""
    size = text_bytes(ollama)
    if size > limit:
        raise FrontError(
            413,
            f"request text is {size} bytes (images not counted), over the limit of {limit} (router.max_prompt_bytes)",
        )


def actor_of(request: web.Request, api: str) -> str:
    """'alice (ollama 127.0.0.1)', as every event's actor is named (Caller.actor)."""
    caller: Caller = request.get(CALLER, ANYONE)
    return caller.actor(api, request.remote)


def model_to_run(front: Front, asked: str) -> str:
    """The model a call runs: the name as Ollama reads it (gpuq/front/names.py: `:local`
    dropped; cloud and unparsable names refused), or, when no node that runs front-door calls
    has it, the model [front] model_aliases give it (the settings in force: a reload changes them)."""
    return run_model(front.dispatcher, asked)


def run_model(dispatcher: Dispatcher, asked: str) -> str:
    """model_to_run for a caller with no Front (a batch's lines: gpuq/batches/parse.py)."""
    name = local_name(asked)
    nodes = list(dispatcher.nodes.values())
    return aliased(name, dispatcher.settings.front_model_aliases, lambda m: bool(entries_of(nodes, m)))


class StalledClient(ConnectionError):
    """A client took nothing of a write for [front] stalled_client_timeout: its connection was
    closed (Call.write), and its handler ends there (run_call) without an error of its own."""


class Call:
    """One front-door call from submit to its last byte."""

    def __init__(self, request: web.Request, ep: Endpoint, body: dict[str, Any]) -> None:
        self.request = request
        self.front: Front = request.app[FRONT]
        self.ep = ep
        self.endpoint = ep.path
        self.body = body  # as the client sent it
        self.ollama = dict(ep.to_ollama(body))  # in Ollama's terms (raises BadRequest)
        self.asked = self.ollama["model"]
        self.ollama["model"] = model_to_run(self.front, self.asked)
        check_text_size(self.ollama, self.front.settings.max_prompt_bytes)
        self.api = ep.api
        self.openai = self.api != "ollama"  # /v1: streams only when asked, as SSE
        self.stream = ep.streams(body)
        self.job_id = ""
        self.node = ""
        self.inbox = Inbox()  # what its run sends (gpuq/front/relay.py)
        self.resp: web.StreamResponse | None = None
        self.chunks: list[dict[str, Any]] = []
        self.delivered = False  # the client has its whole answer: a disconnect now cancels nothing
        self.started = False  # its run began on a node
        self.sse: StreamWriter | None = None  # a /v1 stream's translator, once the job has its id
        self.parked = False  # its handler waits on the inbox: a chunk may be written by the relay
        self.fed = False  # the relay wrote a chunk since the handler last looked (write_now)
        self.unsent: list[bytes] = []  # chunks write_now took, written together once the read is done
        # A waiting /v1 stream's keep-alive clock (on_quiet): set as it is followed, and again at
        # each comment and each quiet spell in which the relay wrote chunks itself
        self.alive_at = 0.0

    @property
    def caller(self) -> Caller:
        caller: Caller = self.request.get(CALLER, ANYONE)
        return caller

    @property
    def actor(self) -> str:
        return actor_of(self.request, self.api)

    def headers(self) -> dict[str, Any]:
        out = {"X-Gpuq-Job": self.job_id, "X-Gpuq-Preview": self.front.preview_url(self.job_id)}
        if self.node:
            out["X-Gpuq-Node"] = self.node
        return out

    # -- submit ---------------------------------------------------------------------------

    def new_job(self, job_id: str) -> NewJob:
        request = StoredCall(self.endpoint, self.body, self.request.headers.get("User-Agent"))
        return NewJob(
            kind=self.ep.kind,
            prompt=self.ep.prompt(self.body),
            model=self.ollama["model"].strip(),
            endpoint=self.endpoint,
            request=request.dumps(),
            job_id=job_id,
            owner=self.caller.name,
            client=self.request.headers.get("User-Agent"),
            lane=lane_for(self.caller.user, None, Door.FRONT),
        )

    async def submit(self) -> None:
        """Store the job (placed by its model) before any work; the relay is in place first, so
        the node's first chunk cannot come before its client listens."""
        front = self.front
        for _ in range(8):  # a chosen id taken by another job of the same second: choose again
            self.job_id = new_job_id()
            # a stream's client may stop reading: its inbox is bounded (stream:false holds its
            # whole answer for its one reply anyway)
            limit = CLIENT_BACKLOG_BYTES if self.stream else None
            self.inbox = front.relay.open(self.job_id, self.write_now, self.send_unsent, limit, front.spool_dir)
            submitting = asyncio.ensure_future(front.dispatcher.submit(self.new_job(self.job_id), self.actor))
            try:
                jobs = await asyncio.shield(submitting)
                break
            except IdTaken:
                front.relay.close(self.job_id)
            except ModelMissing:
                front.relay.close(self.job_id)
                message = model_not_found(front, self.ollama["model"])
                if normalize_model(self.asked) != normalize_model(self.ollama["model"]):
                    message += f" (asked as '{self.asked.strip()}', which front.model_aliases gives this model)"
                raise FrontError(404, message, "model_not_found") from None
            except asyncio.CancelledError:  # the client left while its job was being stored
                await self._cancel_when_stored(submitting)
                raise
            except BaseException:
                front.relay.close(self.job_id)
                raise
        else:
            raise FrontError(503, "could not choose a free job id; try again")
        job = jobs[0]
        self.node = job["node"]
        log.info(
            "job=%s node=%s state=%s model=%s%s kind=%s placement=%r via=%s actor=%r",
            self.job_id,
            self.node,
            job["state"],
            job["model"],
            f" asked={self.asked!r}" if self.asked.strip() != job["model"] else "",
            job["kind"],
            job["reason"],
            self.endpoint,
            self.actor,
        )
        if self.openai and self.stream:
            self.sse = self.stream_translator()

    def stream_translator(self) -> StreamWriter:
        """Chat or generate chunks -> the /v1 route's server-sent events."""
        assert self.ep.stream is not None  # every /v1 route that streams has its writer
        return self.ep.stream(self.ep.reply_id(self.job_id), self.job_id, self.body)

    async def _cancel_when_stored(self, submitting: asyncio.Future[list[Row]]) -> None:
        try:
            await submitting
        except BaseException:
            self.front.relay.close(self.job_id)
            return
        await self.front.cancel(self.job_id, CLIENT_LEFT, self.actor)
        self.front.relay.close(self.job_id)

    # -- follow -----------------------------------------------------------------------------

    async def follow(self) -> web.StreamResponse:
        """Relay the job's run to the client until its last byte, or its end. Chunks that
        arrived together go out in one write: a slow reader costs the relay no extra CPU."""
        if self.sse is not None:  # headers now, so that comments keep a long wait alive
            await self.prepare("text/event-stream")
        self.alive_at = time.monotonic()
        while True:
            items = await self.next_items()
            if items is None:
                resp = await self.on_quiet()
            else:
                resp = await self.deliver(items)
            if resp is not None:
                return resp

    async def next_items(self) -> list[InboxItem] | None:
        """What the inbox holds, once something arrives within STATE_CHECK_S (None: nothing
        did). While it waits, the handler is parked: the relay may write a chunk itself (write_now)."""
        self.parked = True
        try:
            async with asyncio.timeout(STATE_CHECK_S):
                items = [await self.inbox.get()]
        except TimeoutError:
            return None
        finally:
            self.parked = False
        while not self.inbox.empty():
            items.append(self.inbox.get_nowait())
        return items

    async def on_quiet(self) -> web.StreamResponse | None:
        """Nothing reached the handler for STATE_CHECK_S: the job may have ended unheard (its
        response then), and a waiting /v1 stream gets a comment every KEEPALIVE_S."""
        if self.fed:  # the relay wrote chunks meanwhile: the job runs, the stream is alive
            self.fed = False
            self.alive_at = time.monotonic()
            return None
        ended = await self.ended_meanwhile()
        if ended is not None:
            return await self.fail(*ended)
        if self.sse is not None and time.monotonic() - self.alive_at >= KEEPALIVE_S:
            self.alive_at = time.monotonic()
            await self.write(f": waiting for node {self.node} (gpuq job {self.job_id})\n\n".encode())
        return None

    async def deliver(self, items: list[InboxItem]) -> web.StreamResponse | None:
        """The inbox's items, in order: chunks' bytes gathered into one write, flushed before
        any other item; the response when one ends the call."""
        out, self.unsent = self.unsent, []  # chunks write_now took before these (not yet sent)
        for item in items:
            kind = item[0]
            if kind == "data":  # a chunk write_now had translated, but could not write
                out.append(item[1])
                continue
            if kind == "chunk":
                data, done = self.on_chunk(item[1], item[2])
                out.append(data)
                if done:
                    await self.flush(out, last=True)
                    assert self.resp is not None  # the last chunk made it (stream:false) or wrote to it
                    return self.resp
                continue
            await self.flush(out)
            out = []
            resp = await self.on_told(item)
            if resp is not None:
                return resp
        await self.flush(out)
        return None

    async def on_told(self, item: InboxItem) -> web.StreamResponse | None:
        """What the job's run told the call besides its chunks (Relay): its node, or its end."""
        kind = item[0]
        if kind == "start":
            self.node, self.started = item[1], True
        elif kind == "reply":
            return await self.on_reply(item[1])
        elif kind == "error":
            return await self.fail(item[1] or 500, item[2])
        elif kind == "ended":
            return await self.on_ended(item[1])
        elif kind == "spooled":
            return await self.catch_up()
        elif kind == "behind":
            return await self.on_behind()
        elif kind == "shutdown":  # a running job is failed at the next start, as any running then
            if not self.started:
                await self.front.cancel(self.job_id, "router shut down while its client waited", "router")
            return await self.fail(
                503, "the gpuq router is shutting down; this request was cancelled", "router_shutdown"
            )
        return None

    def write_now(self, raw: bytes, chunk: dict[str, Any]) -> bool:
        """A chunk from the node's reading task (Relay.chunk), taken at once when nothing stands
        before it: the handler waits with its inbox empty, the chunk is not the last, and the
        client reads (its response has begun and its connection's writing is not paused, so the
        write completes without waiting). Else it goes through the inbox as before, and the
        handler writes it (waiting for a slow client: back pressure as ever)."""
        if not self.parked or chunk.get("done") or not self.inbox.empty():
            return False
        if self.sse is None and not self.stream:  # stream:false: kept for the one reply
            self.keep_for_reply(chunk)
            self.fed = True
            return True
        if not self.writable():
            return False
        try:
            data, _ = self.on_chunk(raw, chunk)
        except Exception:  # the client's translation fails in its handler, as before, not in the node's run
            return False
        if data:  # the chunks of one read go out in one write, after it (Relay.flush)
            self.unsent.append(data)
        self.fed = True
        return True

    def writable(self) -> bool:
        resp, transport, protocol = self.resp, self.request.transport, self.request.protocol
        return not (
            resp is None
            or not resp.prepared
            or transport is None
            or transport.is_closing()
            or protocol is None
            or protocol.writing_paused
        )

    def send_unsent(self) -> None:
        """The chunks write_now took, in one write (unless the handler took them meanwhile):
        called by the node's reading task once a read's chunks are handled (Relay.flush)."""
        if not self.unsent:
            return
        data, self.unsent = b"".join(self.unsent), []
        resp = self.resp
        if resp is None or not self.parked or not self.writable():  # the handler writes them, as it would have
            self.inbox.put_nowait(("data", data))
            return
        writing = resp.write(data)
        try:
            writing.send(None)  # not paused: it returns without waiting
        except StopIteration:
            pass
        except Exception:  # nothing was written: the handler writes it, and hears the error
            self.inbox.put_nowait(("data", data))
        else:  # it waited for the client after writing: the next chunks queue behind
            writing.close()

    async def flush(self, out: list[bytes], last: bool = False) -> None:
        data = b"".join(out)
        if data:
            await self.prepare("text/event-stream" if self.sse is not None else "application/x-ndjson")
            await self.write(data)
        if last:
            self.delivered = True
            if self.resp is not None and self.resp.prepared:
                await self.write(b"", eof=True)

    async def write(self, data: bytes, eof: bool = False) -> None:
        """One write to the prepared response (its end too, with `eof`), which its client must
        take within [front] stalled_client_timeout (read live: a reload changes it): else its
        connection is closed (StalledClient). Its job runs on: the client had asked for it, and
        its output is stored."""
        assert self.resp is not None  # prepared
        limit = self.front.dispatcher.settings.front_stalled_client_s
        try:
            async with asyncio.timeout(limit):
                if data:
                    await self.resp.write(data)
                if eof:
                    await self.resp.write_eof()
        except TimeoutError:
            self.delivered = True  # nothing more reaches this client: its leaving cancels nothing
            log.warning(
                "job=%s client took nothing of its answer for %ss ([front] stalled_client_timeout):"
                " connection closed; the job runs on",
                self.job_id,
                f"{limit:g}",
            )
            if self.request.transport is not None:
                self.request.transport.abort()
            raise StalledClient(f"client of job {self.job_id} stalled") from None

    async def catch_up(self) -> web.StreamResponse | None:
        """The client fell further behind the node than its call holds in memory: the lines
        since then are read back from its spool (gpuq/front/relay.py), in order, as fast as the
        client takes them (each write waits for it, within [front] stalled_client_timeout), while
        the node's new lines join the spool's end. Once all the spool holds is read, the call
        rejoins the live tail; the response when the last line was in the spool."""
        spool = self.inbox.spool
        log.info("job=%s client fell behind its stream: catching it up from its spool", self.job_id)
        while spool is not None and spool is self.inbox.spool:
            lines = spool.read()
            if not lines:  # caught up, on this turn of the loop: the next chunk comes through memory
                self.inbox.rejoin()
                log.info("job=%s client caught up from its spool: it rejoins the live stream", self.job_id)
                return None
            out = []
            for raw in lines:
                data, done = self.on_chunk(raw, json.loads(raw))
                out.append(data)
                if done:
                    await self.flush(out, last=True)
                    assert self.resp is not None  # the last chunk made it (stream:false) or wrote to it
                    return self.resp
            await self.flush(out)
            await asyncio.sleep(0)  # a fast client's writes need not wait: let the loop's other work run
        return None

    async def on_behind(self) -> web.StreamResponse:
        """The client fell further behind the node than its call can keep for it (its spool
        could not be written: a full disk, or SPOOL_MAX_BYTES): its stream ends here with an
        error saying so, and where the whole answer is; the job runs on."""
        kib = CLIENT_BACKLOG_BYTES >> 10
        message = (
            f"this client read its stream too slowly: it fell more than {kib} KiB behind the node and"
            f" the gpuq router could not spool the rest for it, so its stream ends here. gpuq job {self.job_id}"
            f" runs on and keeps its whole answer: gpuq show {self.job_id}, or GET /api/jobs/{self.job_id}"
            " on the router"
        )
        log.warning("job=%s client fell %d KiB behind its stream: stream ended; the job runs on", self.job_id, kib)
        return await self.fail(503, message, "client_behind")

    async def ended_meanwhile(self) -> tuple[int, str, str] | None:
        """The job ended with nothing for this client (a path that did not tell it)."""
        if not self.inbox.empty():
            return None
        try:
            job = await self.front.store.job(self.job_id)
        except (NotFound, StoreUnavailable):
            return None
        if job["state"] in ACTIVE or not self.inbox.empty():
            return None
        message = f"gpuq job {self.job_id} is {job['state']}: {job['error'] or 'ended'}"
        return ENDED_STATUS, message, "job_" + job["state"]

    async def prepare(self, content_type: str) -> None:
        if self.resp is None:
            self.resp = web.StreamResponse(headers={"Content-Type": content_type, **self.headers()})
            if content_type == "text/event-stream":
                self.resp.headers["Cache-Control"] = "no-cache"
            await self.resp.prepare(self.request)

    def on_chunk(self, raw: bytes, chunk: dict[str, Any]) -> tuple[bytes, bool]:
        """One chunk from the node: the bytes for the client now, and whether it was the last.
        stream:false keeps them, and the last makes the one reply."""
        done = bool(chunk.get("done"))
        if self.sse is not None:
            return self.sse.feed(chunk), done
        if self.stream:  # Ollama's own stream: the node's line as it sent it
            return raw + b"\n", done
        self.keep_for_reply(chunk)
        if done:
            reply = self.whole_reply(collected(self.ep.node_route, self.chunks, self.ollama))
            self.resp = web.json_response(reply, headers=self.headers(), dumps=dumps)
            if not self.openai:
                self.resp.content_type, self.resp.charset = "application/json", "utf-8"
        return b"", done

    def keep_for_reply(self, chunk: dict[str, Any]) -> None:
        """stream:false: a chunk kept for the one reply. Every FOLD_CHUNKS they are folded into
        one (collected: their text joined, tool calls and logprobs gathered), so the call holds
        its answer's text, not a parsed chunk per token (about 1 KB each: 60 MB for a 60,000-token
        answer)."""
        self.chunks.append(chunk)
        if len(self.chunks) >= FOLD_CHUNKS and not chunk.get("done"):
            self.chunks = [collected(self.ep.node_route, self.chunks, self.ollama)]

    def whole_reply(self, reply: Any) -> Any:
        """stream:false (or an embedding): the node's reply in the route's shape (an Ollama
        route's as the node gave it)."""
        if self.ep.whole is None:
            return reply
        return self.ep.whole(self.ep.reply_id(self.job_id), self.job_id, self.body, reply)

    async def on_reply(self, reply: Any) -> web.StreamResponse:
        reply = self.whole_reply(reply)
        self.delivered = True
        return web.json_response(reply, headers=self.headers(), dumps=dumps)

    async def on_ended(self, reason: str) -> web.StreamResponse:
        """A person (or the router) ended the running job: the client hears why."""
        if reason.startswith("preempted by"):
            # Its run went back in the queue, but its client's request ends here: with no one to
            # answer, it would run for no one. It is cancelled; `gpuq retry` runs it again.
            await self.front.cancel(self.job_id, f"{reason}; its client's request ended with the run", "router")
            return await self.fail(
                ENDED_STATUS,
                f"gpuq job {self.job_id} was {reason}; its request ended (gpuq retry {self.job_id} runs it again)",
                "job_preempted",
            )
        if reason == CLIENT_LEFT:
            return await self.fail(499, "request canceled", "job_cancelled")
        return await self.fail(ENDED_STATUS, f"gpuq job {self.job_id} was {reason}: request canceled", "job_cancelled")

    async def fail(self, status: int, message: str, code: str | None = None) -> web.StreamResponse:
        """The call ends with an error: its status and body when nothing was sent yet, else one
        error line in its API's stream shape."""
        self.delivered = True  # the client has its answer: the error
        if self.resp is not None and self.resp.prepared:
            if self.sse is not None:
                await self.write(self.sse.error(status, message, code))
            else:
                await self.write(dumps(ollama_error(message)).encode() + b"\n")
            await self.write(b"", eof=True)
            return self.resp
        return error_response(self.request, status, message, code, headers=self.headers())


# A stopping router's answer to a new call: ask again then. Its drain may take the running jobs'
# whole length, but a service manager (or the person's Ctrl-C and `make run`) restarts it in
# seconds; the SDKs' own retries wait about this long anyway.
STOPPING_RETRY_AFTER_S = 5


def refuse_if_stopping(front: Front) -> None:
    """Told to stop, the router starts nothing new: a call arriving now (while the running jobs
    drain, or as the router shuts down) is answered at once, 503 with Retry-After, not held for
    the whole drain to get the same 503 at its end. Nothing is stored for it."""
    if front.closing:
        raise FrontError(503, "the gpuq router is shutting down", "router_shutdown", STOPPING_RETRY_AFTER_S)
    if front.dispatcher.quiesced:
        running = len(front.dispatcher.running())
        raise FrontError(
            503,
            f"the gpuq router is stopping: it starts no new job while its {running} running job(s) "
            f"finish; ask again in {STOPPING_RETRY_AFTER_S}s, once it is back",
            "router_shutdown",
            STOPPING_RETRY_AFTER_S,
        )


async def run_call(request: web.Request, ep: Endpoint) -> web.StreamResponse:
    """A call that makes a model work: a job, followed to its end by its client."""
    body = await json_of(request)
    if ep.check is not None:
        ep.check(body)
    front = request.app[FRONT]
    refuse_if_stopping(front)
    if is_load_or_unload(ep.path, body):
        # An empty call makes no job: a model loads with the jobs that use it, and stays loaded
        # after one as the node's unload policy and the calls' keep_alive say (gpuq/node/vram.py).
        # Answered at once as Ollama does, for a model some node has; an unload (Open WebUI's,
        # `ollama stop`) is passed on to the nodes that hold the model.
        model = model_to_run(front, body["model"])
        nodes = front_nodes(front.nodes_by_rank())
        if not any(normalize_model(model) in (rt.installed or ()) for rt in nodes):
            raise NotFound(f"model '{body['model']}' not found")
        if unloads(body):  # held warm on an idle node: it leaves now; a running job's: as it ends
            by = actor_of(request, ep.api)
            unloading = front.dispatcher.ask_unload(model, by, [rt.name for rt in nodes])
            log.info(
                "unload of %s asked by %s: %s",
                model,
                by,
                ", ".join(unloading) or "no node holds it warm or runs a job of it",
            )
        return web.json_response(load_or_unload_reply(ep.path, body), dumps=dumps)
    call = Call(request, ep, body)
    await early_refusal(ep, call.ollama, front.nodes_by_rank())  # what its node would refuse, before it waits
    try:
        await call.submit()
        return await call.follow()
    except asyncio.CancelledError:  # aiohttp cancels the handler when its client disconnects
        if call.job_id and not call.delivered and not front.closing:
            await asyncio.shield(front.cancel(call.job_id, CLIENT_LEFT, call.actor))
        raise
    except StalledClient:  # cut off (its connection closed); its job runs on, nothing to answer
        assert call.resp is not None  # it was being written to
        return call.resp
    except ConnectionError:  # the client left while a chunk was written
        if call.job_id and not call.delivered:
            await front.cancel(call.job_id, CLIENT_LEFT, call.actor)
        raise
    finally:
        if call.job_id:
            front.relay.close(call.job_id)


def call_handler(ep: Endpoint) -> Handler:
    """The handler of an endpoint's route (one per record of gpuq/front/endpoints.py)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await run_call(request, ep)

    return handler
