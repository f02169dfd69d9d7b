"""Live answers: a job's output as it is generated (NDJSON) and the page's events (SSE)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ..bus import Event, next_event
from ..jobs import ACTIVE, JobState, compact_json
from ..store import Row
from .callers import may_read, private_for, refuse_unreadable
from .inputs import job_id_of
from .render import job_json
from .state import BUS, DISPATCHER, SETTINGS, STORE


async def stream_job(request: web.Request) -> web.StreamResponse:
    """NDJSON: {"thinking"} and {"text"} pieces (the reasoning and the answer) as they are
    generated, then {"done", "job"}; the first of each kind, marked catch_up, is everything so
    far (with its `tokens` while the job runs). While the job waits, {"queued": {node, position,
    waiting_for}} whenever where it waits changes, and {"started": {node}} when it starts."""
    app = request.app
    job_id = job_id_of(request)
    if private_for(request):  # nothing but a job's text: another's is refused on a private router
        refuse_unreadable(request, await app[STORE].job(job_id), "its output")
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
    with app[BUS].subscribe() as events:
        follower = _Follower(app, resp, job_id)
        await follower.join(request, events)
        await follower.say_where()
        if not await follower.relay(events):  # the router is stopping: end without a final line
            return resp
        await follower.finish()
    await resp.write_eof()
    return resp


class _Follower:
    """One client following a job's stream (stream_job): the job as last read, what it has been
    sent of each kind, and where it was last told the job waits."""

    def __init__(self, app: web.Application, resp: web.StreamResponse, job_id: str) -> None:
        self.app = app
        self.resp = resp
        self.job_id = job_id
        self.job: Row = {}
        self.sent: dict[str, str] = {}
        self.where: Row | None = None  # where the job was last said to wait

    async def line(self, obj: Row) -> None:
        await self.resp.write(compact_json(obj).encode() + b"\n")

    async def join(self, request: web.Request, events: asyncio.Queue[Event]) -> None:
        """Start the answer with what was generated before this follower joined."""
        app, job_id = self.app, self.job_id
        # A job running here needs no read before its first line (a read is a thread hop): its
        # output so far is in memory, and the store is read when it has ended.
        live = app[DISPATCHER].live(job_id) is not None
        self.job = {"id": job_id, "state": JobState.RUNNING} if live else await app[STORE].job(job_id)
        await self.resp.prepare(request)
        cur = app[DISPATCHER].live(job_id)
        if cur is None:  # not running: what it stored (one that starts meanwhile is live again)
            self.job = await app[STORE].job_detail(job_id)
            cur = app[DISPATCHER].live(job_id)
        job = self.job
        self.sent = {
            "text": "".join(cur.output) if cur else job["output"],
            "thinking": "".join(cur.thinking) if cur else (job["thinking"] or ""),
        }
        # A running job's catch-up says how many tokens (Ollama's chunks) it holds, counted at the
        # same moment: a follower counting on from it misses none and counts none twice.
        counts = {"thinking": cur.thinking_tokens, "text": cur.tokens - cur.thinking_tokens} if cur else {}
        while not events.empty():  # pieces published so far are already in `sent`
            events.get_nowait()
        for kind in ("thinking", "text"):
            if self.sent[kind]:
                await self.line(
                    {kind: self.sent[kind], "catch_up": True} | ({"tokens": counts[kind]} if counts else {})
                )

    async def say_where(self) -> None:
        """Where a waiting job waits, when that changed; that it started, once."""
        job, where = self.job, self.where
        if job["state"] == JobState.QUEUED:
            now = {
                "node": job["node"],
                "position": await self.app[STORE].queue_position(job),
                "waiting_for": job.get("waiting_for"),
            }
            if now != where:
                await self.line({"queued": now})
        elif job["state"] == JobState.RUNNING and where is not None and "started" not in where:
            now = {"started": True}
            await self.line({"started": {"node": job["node"]}})
        else:
            return
        self.where = now

    async def relay(self, events: asyncio.Queue[Event]) -> bool:
        """The job's pieces as they come, and where it waits, until it has ended; False when the
        router is stopping first."""
        job_id = self.job_id
        while self.job["state"] in ACTIVE:
            topic, data = await next_event(events, 1.0) or ("tick", {})
            if topic == "shutdown":
                return False
            if topic == "tokens" and data["id"] == job_id:
                kind = "thinking" if "thinking" in data else "text"
                await self.line({kind: data[kind]})
                self.sent[kind] += data[kind]
            elif topic != "tokens":
                await self.reread()
        return True

    async def reread(self) -> None:
        """The job read again on a queue change: its state, and the whole detail once it is final."""
        self.job = await self.app[STORE].job(self.job_id)
        if self.job["state"] == JobState.RUNNING and self.app[DISPATCHER].live(self.job_id) is None:
            await self.caught_up_from_store(self.job["run_id"])  # another router runs it (PostgreSQL)
        await self.say_where()

    async def caught_up_from_store(self, run_id: int) -> None:
        """What the router running the job stored since (its heartbeats, about each second)."""
        stored = (await self.app[STORE].run_texts([run_id]))[run_id]
        for kind, text in (("thinking", stored["thinking"] or ""), ("text", stored["output"])):
            if len(text) > len(self.sent[kind]) and text.startswith(self.sent[kind]):
                await self.line({kind: text[len(self.sent[kind]) :]})
                self.sent[kind] = text

    async def finish(self) -> None:
        """The ended job: any text not sent yet, then {"done", "job"}."""
        job, sent = self.job, self.sent
        if "runs" not in job:
            job = await self.app[STORE].job_detail(self.job_id)
        # A job that ended while the follower was joining (its pieces were drained as if `sent`
        # held them, but it was no longer live): the lines still add up to what was stored.
        for kind, stored in (("thinking", job["thinking"] or ""), ("text", job["output"])):
            if stored != sent[kind] and stored.startswith(sent[kind]):
                await self.line({kind: stored[len(sent[kind]) :]})
        final = job_json(job, self.app[SETTINGS].public_url)
        if final.get("output_pruned"):  # its text is gone: said, not sent as nothing
            await self.line({"pruned": final["output_pruned"]})
        for key in ("prompt", "runs", "events"):  # the follower has its prompt: the excerpt is enough
            final.pop(key, None)
        await self.line({"done": True, "job": final})


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events for the page: one `change` per queue change, coalesced; one `tokens` per
    piece a running job makes (on a private router, another's piece with its text left out: the
    page counts its tokens, and reads no word of it)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    with request.app[BUS].subscribe() as queue:
        await resp.prepare(request)
        await resp.write(b"retry: 1000\nevent: hello\ndata: {}\n\n")
        while True:
            event = await next_event(queue, 15.0)
            if event is None:
                await resp.write(b": keep-alive\n\n")
                continue
            topic, data = event
            if topic == "shutdown":
                return resp
            if topic == "tokens":
                if not may_read(request, data.get("owner")):
                    data = {k: "" if k in ("text", "thinking") else v for k, v in data.items()}
                await resp.write(f"event: tokens\ndata: {compact_json(data)}\n\n".encode())
            else:
                await resp.write(f"event: change\ndata: {compact_json(data)}\n\n".encode())
