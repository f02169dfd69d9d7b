"""One worker per node: claim the head of its queue, and run it in four steps: generate (stream
the reply from Ollama), record it, unload the model or keep it warm (gpuq/node/vram.py: /api/ps
confirms it left VRAM), finish the job. Nothing is retried: every failure ends the job, loudly."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..bus import Bus
from ..config import Settings
from ..critique import FINDINGS_SCHEMA, FindingsError, instruction, parse_findings
from ..errors import (
    Conflict,
    GpuqError,
    GuardMiss,
    NotFound,
    OllamaError,
    OllamaUnreachable,
    StoreUnavailable,
    described,
)
from ..jobs import JobState, Kind
from ..params import merged_options
from ..store import Row, Store
from .calls import CLIENT_LEFT, Calls, Policy
from .context_check import ContextCheck
from .monitor import NodeMonitor
from .runtime import Current, NodeRuntime
from .vram import Vram, idle_wait_s, same_model

log = logging.getLogger("gpuq")

T = TypeVar("T")

IDLE_POLL_S = 5.0  # the fallback poll; a submit wakes the worker at once
HEARTBEAT_S = 1.0  # progress is written at most this often while tokens stream
RECORD_RETRY_MAX_S = 5.0  # the longest wait between tries to record a job's outcome
# Why a claimed job goes back to the head of its queue when the router stops before sending it.
NOT_SENT = "back to the head of the queue: the router stopped before this run's request reached Ollama"


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)


def keep_big_blocks_apart() -> None:
    """Ask glibc to give every block of 256 KiB or more its own mapping, returned to the system
    when freed. By default the first such block freed raises that threshold (up to 32 MiB), and
    the joins of a big reply (an 8 MiB one: its text, each heartbeat's) then fragment the heap:
    the router stayed at 133 MB after such a job instead of 76 MB (47 MB before it)."""
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(M_MMAP_THRESHOLD, 256 << 10)
    except (OSError, AttributeError):  # not glibc (macOS, musl): its allocator does its own
        pass


async def put_back_unsent(store: Store, sent: dict[str, int | None]) -> None:
    """A job claimed on a node but never sent (`sent`: each node's last run that was) goes back
    to the head of its queue: it never reached Ollama, so it is no orphan of the stop."""
    for job in await store.requeue_unsent(sent, NOT_SENT):
        log.info("job=%s node=%s state=queued reason=%r", job["id"], job["node"], NOT_SENT)


class OutputCapped(Exception):
    """A job's output reached max_output_bytes: its request is cut, its output so far kept."""


class Worker:
    """Runs one node's queue, one job at a time. `changed` tells the pages what changed,
    `wake_all` wakes every node's worker (a finished task readies critiques held elsewhere)."""

    def __init__(
        self,
        rt: NodeRuntime,
        monitor: NodeMonitor,
        settings: Settings,
        store: Store,
        bus: Bus,
        calls: Calls,
        changed: Callable[..., None],
        wake_all: Callable[[], None],
    ):
        self.rt = rt
        self.monitor = monitor
        self.settings = settings
        self.store = store
        self.bus = bus
        self.calls = calls  # jobs a client called for, run as the front door prepares them
        self.changed = changed
        self.wake_all = wake_all
        self.wake = asyncio.Event()
        # What the node's VRAM holds between jobs: unloaded after each, or a model kept warm.
        self.vram = Vram(rt, monitor, settings, store, self.note, lambda: self.stopping)
        # Runs aborted before this worker took them up (a delete racing the claim's return).
        self.aborted_runs: dict[int, str] = {}
        self.context_check = ContextCheck(rt)  # a prompt Ollama cut, noted on its job
        self.sent_run: int | None = None  # the last run whose request went to Ollama
        self.stopping = False  # the router is stopping: nothing new is claimed or sent
        # Does this router hold the node's lease (gpuq/node/leases.py)? Nothing is claimed while not.
        self.leased: Callable[[], bool] = lambda: True
        self.lease_lapsed: Callable[[], None] = lambda: None  # the router's lease loop, asked to renew now
        # Waiting for work with nothing claimed: a submit to this node may claim its head in the
        # submit's own commit and hand it over (take), with no wake-up claim of this worker's.
        self.idle = False
        self.handed: Row | None = None  # such a job, not taken up yet
        self.polled = False  # the last idle wait ended by its timeout, not by a wake
        # Since when, and why, the store refuses this node's claims (None: the last one went
        # through): jobs waiting on an up, idle node that nothing claims are a stuck queue.
        self.claim_refused: tuple[float, str] | None = None

    # -- the loop -----------------------------------------------------------------------------

    async def run(self) -> None:
        if self.rt.asked_unload is None:  # (a restarted loop keeps what it showed)
            await self.vram.restore_asked()
        await self.vram.unload_orphans()  # a job of a dead router may still hold VRAM
        job = None  # a job claimed by the previous job's finish, else claimed here
        while True:
            try:
                handed = job is None and self.handed is not None
                if job is None:
                    job = await self._claim()
                    if job is None:
                        continue
                # A job claimed in its submit was logged running there; not again here, before
                # its request (a log line is ~0.1 ms on a router that was idle).
                if not handed:
                    log.info("job=%s node=%s state=running model=%s", job["id"], self.rt.name, job["model"])
                self.changed(job=job["id"], node=self.rt.name, state=JobState.RUNNING)
                running, job = job, None
                job = await self._run(running)
            except asyncio.CancelledError:
                raise
            except GpuqError as exc:  # the store refused (locked, disk full): say so, then go on
                log.error("node=%s worker error: %s", self.rt.name, exc.message)
                await self._wait(1.0)

    async def _claim(self) -> dict[str, Any] | None:
        """The head of the node's queue: handed over by its submit, or claimed here once the
        node answers (as its monitor last heard: a connection it refuses after all puts the job
        back, see _not_reached); None after a wait for a wake. Claiming is the check that
        something waits: an empty claim writes nothing, so its commit costs no fsync."""
        if self.handed is not None:  # claimed already: run it (or put it back) whatever changed since
            handed, self.handed = self.handed, None
            return handed
        if self.stopping:
            await self._wait(IDLE_POLL_S)
            return None
        if not self.leased():  # another router drives the node; a lease taken wakes this worker
            await self._wait(1.0)
            return None
        if not self.rt.claimable:
            await self._wait(1.0)
            return None
        # A poll that no wake asked for reads first: the claim is a write, and an idle node's
        # poll must not take the write lock every few seconds for nothing (nor fail while a
        # person holds it in the sqlite3 shell).
        polled, self.polled = self.polled, False
        try:
            nothing = polled and await self.store.next_ready_model(self.rt.name) is None
            job = None if nothing else await self.store.claim(self.rt.name)
        except GpuqError as exc:
            self.claim_refused = (self.claim_refused[0] if self.claim_refused else time.time(), exc.message)
            raise
        self.claim_refused = None
        if job is None:
            # The node went idle: a model kept for the next job ("when-idle") leaves now; one a
            # front-door call kept stays until its time runs out, then leaves, verified.
            if await self.vram.expire():
                self.changed(node=self.rt.name)  # the pages drop its "warm" line
            await self._wait_idle(idle_wait_s(self.rt.warm_until, time.time(), IDLE_POLL_S))
        return job

    def ask_unload(self, model: str, by: str) -> bool:
        """A client's unload of `model` (vram.py ask_unload): the idle worker, woken, unloads it;
        a running job of that model leaves it as it ends."""
        running = self.rt.current.model if self.rt.current is not None else None
        if not self.vram.ask_unload(model, by, self.idle, running):
            return False
        self.wake.set()
        return True

    def take(self, job: Row) -> None:
        """A job its submit claimed for this worker while it waited idle (Store.submit's
        hand_over): this worker runs it as a job it claimed itself."""
        self.handed, self.idle, self.polled = job, False, False
        self.wake.set()

    async def _wait_idle(self, timeout: float = IDLE_POLL_S) -> None:
        self.idle = self.handed is None
        try:
            self.polled = not await self._wait(timeout)
        finally:
            self.idle = False

    async def _wait(self, timeout: float) -> bool:
        """Wait for a wake or the timeout; True if woken."""
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that lands in
        # the same tick as a wake, and the worker then outlives stop() (a hung shutdown).
        try:
            async with asyncio.timeout(timeout):
                await self.wake.wait()
        except TimeoutError:
            return False
        finally:
            self.wake.clear()
        return True

    # -- one job ------------------------------------------------------------------------------

    def lose(self, reason: str) -> None:
        """Another router took the node: the job running here was failed by it. Stop relaying
        it, touching neither the store nor the node (the node is the other router's now)."""
        cur = self.rt.current
        if cur is not None and cur.task is not None:
            cur.abort_reason, cur.lost = reason, True
            cur.task.cancel()
        self.wake.set()

    def abort(self, run_id: int, reason: str) -> None:
        """Stop a running job's Ollama request (closing it stops Ollama's generation)."""
        cur = self.rt.current
        if cur is not None and cur.run_id == run_id and cur.task is not None:
            cur.abort_reason = reason
            cur.task.cancel()
        else:
            self.aborted_runs[run_id] = reason
        self.wake.set()

    async def _run(self, job: Row) -> dict[str, Any] | None:
        """Run a claimed job to its end; returns the next job if its finish claimed one."""
        early = self.aborted_runs.pop(job["run_id"], None)
        self.aborted_runs.clear()  # older entries belong to runs this worker will never see again
        if early is not None:
            log.info("job=%s node=%s aborted before it started: %s", job["id"], self.rt.name, early)
            return None
        gone = self.calls.gone(job["id"]) if job.get("endpoint") is not None else None
        if gone is not None:  # its client left before its claim: nothing is sent, loaded or unloaded
            await self._cancel_unsent(job, gone)
            return None
        cur = Current(job["id"], job["run_id"], job["model"])
        self.rt.current = cur
        cur.task = asyncio.create_task(self._execute(job, cur))
        try:
            await asyncio.shield(cur.task)
            return cur.next_job
        except asyncio.CancelledError:
            if cur.abort_reason is None:  # the router is shutting down
                cur.task.cancel()
                raise
            self.calls.ended([job["id"]], cur.abort_reason)
            if cur.lost:
                log.error("job=%s node=%s no longer relayed: %s", job["id"], self.rt.name, cur.abort_reason)
                self.vram.forget()  # (the node's models are the other router's business now)
                return None
            await self._after_abort(job, cur)
            return None
        except Exception as exc:  # a step outside the job's own error handling broke (finish, unload)
            await self._end_lost(job, cur, exc)
            raise  # the loop's crash is logged, /health names it, and it starts again
        finally:
            self.rt.current = None
            self.changed(job=job["id"], node=self.rt.name)

    async def _cancel_unsent(self, job: Row, reason: str) -> None:
        """A called job claimed after its client left (its cancel lost the race to the claim, or
        the store refused it): cancelled here with the client's reason; the node is not touched
        (its warm model stays). Its run row stays, never sent (no request in the node's log)."""
        try:
            await self._persist(job["id"], "cancel", lambda: self.store.delete(job["id"], "router", reason=reason))
        except (Conflict, NotFound):  # the front door's own cancel came first
            pass
        log.info("job=%s node=%s state=cancelled reason=%r (never sent)", job["id"], self.rt.name, reason)
        self.changed(job=job["id"], node=self.rt.name, state=JobState.CANCELLED)

    async def _end_lost(self, job: Row, cur: Current, exc: Exception) -> None:
        """The worker broke while ending a job: the job must not stay "running" with no one
        running it (a queue head that only the stale check would find). It fails naming the
        crash, its model is unloaded; a job its finish claimed never reached Ollama and goes back
        to the head of the queue."""
        crash = described(exc)
        try:
            try:
                output, thinking, _ = cur.unsaved()
                # Retried while the store refuses (the disk that broke the ending may be full):
                # given up, the job would stay half-closed until a restart.
                await self._persist(
                    job["id"],
                    "crash",
                    lambda: self.store.finish(
                        job["id"],
                        cur.run_id,
                        JobState.FAILED,
                        f"the node's worker crashed while ending the job: {crash}",
                        output,
                        thinking=thinking,
                        streamed=cur.tokens,
                    ),
                )
                await self.vram.unload(job["model"], job["id"])
            except GuardMiss:  # its finish was recorded before the crash
                pass
            await self._persist(
                job["id"],
                "put-back of the next job",
                lambda: self.store.requeue_unsent(
                    {self.rt.name: self.sent_run},
                    (
                        f"back to the head of the queue: the node's worker crashed after {job['id']} ended "
                        f"({crash}); the request never reached Ollama"
                    ),
                ),
            )
        except Exception:  # the store broke too: the stale check is the last net
            log.exception("job=%s node=%s could not record the crash", job["id"], self.rt.name)

    async def _execute(self, job: Row, cur: Current) -> None:
        """The job's steps, in order: generate, record, unload (or keep warm: self.vram), finish."""
        if not await self.vram.make_room(job):  # a kept model of another model would not leave
            message = f"not started: {self.rt.vram_stuck}"
            await self._persist(
                job["id"], "outcome", lambda: self.store.finish(job["id"], cur.run_id, JobState.FAILED, message)
            )
            return
        if self.stopping:  # claimed as the router was told to stop: it waits for the next start
            await put_back_unsent(self.store, {self.rt.name: self.sent_run})
            return
        findings = None
        try:
            cur.generating = True
            try:
                stats, error = await self._generate(job, cur)
            finally:
                cur.generating = False
            if stats is not None:  # (None: the run failed, with `error`)
                findings, error = await self._record(job, cur, stats)
        except OllamaUnreachable as exc:
            await self._not_reached(job, cur, exc)
            return
        except Exception as exc:  # a bug, or a reply no check foresaw: this job fails, the worker goes on
            error = f"unexpected error in the router: {described(exc)}"
            log.exception("job=%s node=%s %s", job["id"], self.rt.name, error)
            self.calls.failed(job["id"], 500, error)
        unloaded = await self.vram.after_job(job, error, cur.keep_s)
        await self._finish(job, cur, error, findings, unloaded)

    async def _not_reached(self, job: Row, cur: Current, exc: OllamaUnreachable) -> None:
        """The node refused the connection (or never completed it): the request never reached
        Ollama and nothing ran, so the job goes back to the head of its queue, with an event
        naming why (no retry of work that ran: none did), and the node is down until its
        monitor hears from it again. This, not a health check before each claim, is what keeps
        a job from failing on a node that went away since the monitor last asked."""
        await self.monitor.set_up(False, exc.message)
        reason = f"back to the head of the queue: {exc.message}; the request never reached Ollama"
        if await self._persist(job["id"], "event", lambda: self.store.put_back(job["id"], cur.run_id, reason)):
            log.warning("job=%s node=%s state=queued reason=%r", job["id"], self.rt.name, reason)
            self.changed(job=job["id"], node=self.rt.name, state=JobState.QUEUED)

    # -- step 1: generate ---------------------------------------------------------------------

    async def _generate(self, job: Row, cur: Current) -> tuple[dict[str, Any] | None, str | None]:
        """Stream the reply within the job's limit; returns Ollama's last chunk (its stats) or the
        error. A called job's waiting client hears of an error at once, with Ollama's status."""
        started = time.monotonic()
        limit_s, limit_name = self._limit_s(job)
        try:
            async with asyncio.timeout(limit_s):
                if job.get("endpoint") is not None:  # a call through the front door (node/calls.py)
                    return await self._call(job, cur), None
                return await self._chat(job, cur), None
        except TimeoutError:
            return None, self._told(
                job["id"],
                None,
                f"{limit_name} fired: the job ran "
                f"{time.monotonic() - started:.1f}s, over its {limit_s:g}s limit; request aborted",
            )
        except OllamaUnreachable:  # nothing reached Ollama: not this job's failure (see _execute)
            raise
        except OutputCapped as exc:
            return None, self._told(job["id"], 502, str(exc))
        except OllamaError as exc:
            if exc.status == 503:  # Ollama's pending queue is full: another client keeps it busy
                return None, self._told(
                    job["id"],
                    503,
                    (
                        f"{exc.message} (HTTP 503: node {self.rt.name}'s Ollama is busy with other clients' "
                        f"requests; this request never started, so `gpuq retry {job['id']}` is safe)"
                    ),
                )
            return None, self._told(job["id"], exc.status, exc.message)
        except GpuqError as exc:  # a stored request this gpuq cannot read (written by another version)
            return None, self._told(job["id"], 400, f"cannot run the stored request: {exc.message}")

    def _limit_s(self, job: Row) -> tuple[float, str]:
        runtime = self.settings.max_runtime_for(self.rt.config)
        timeout = job.get("timeout_s") or self.settings.job_timeout_s
        if timeout is not None and timeout < runtime:
            return timeout, "timeout"
        return runtime, "max_runtime"

    def _node_think(self, model: str) -> bool | str | None:
        """The node's `think` is for its own model: another one may not think at all, and Ollama
        refuses think for such a model (400). Its options (num_ctx: what the GPU holds) hold for all."""
        same = same_model(model, self.rt.config.model)
        return self.rt.config.think if same else None

    async def _chat(self, job: Row, cur: Current) -> dict[str, Any]:
        """gpuq's own job: its prompt (a critique's with the findings schema) as one chat."""
        config = self.rt.config
        critique = job["kind"] == Kind.CRITIQUE
        prompt = instruction(self.settings.critique_template, job["prompt"]) if critique else job["prompt"]
        think = json.loads(job["think"]) if job.get("think") is not None else self._node_think(job["model"])
        cur.options = merged_options(config.options, json.loads(job["options"]) if job.get("options") else None)
        chunks = self.rt.client.chat(
            job["model"], prompt, FINDINGS_SCHEMA if critique else None, think, cur.options, self.vram.keep_alive()
        )
        self.sent_run = cur.run_id  # the request leaves at the first iteration, below
        last_beat = time.monotonic()
        async for chunk in chunks:
            message = chunk.get("message") or {}
            # A thinking model's reasoning (on by default since Ollama 0.12.4), then its answer.
            self._keep(job, cur, message.get("thinking") or "", message.get("content") or "")
            if chunk.get("done"):
                return chunk
            last_beat = await self._beat(job, cur, last_beat)
        raise OllamaError("Ollama's stream ended without done: true")

    async def _call(self, job: Row, cur: Current) -> dict[str, Any]:
        """A job a client called for: its request as the front door prepares it under the node's
        policy, run on the node; its output kept as it comes."""
        call = self.calls.prepare(
            job,
            Policy(
                self._node_think(job["model"]),
                self.rt.config.options,
                self.vram.keep_alive(),
                self.settings.front_keep_alive_s,
                self.settings.front_max_keep_alive_s,
            ),
            self.rt.name,
        )
        cur.options = call.options
        cur.keep_s = getattr(call, "keep_s", 0.0)
        self.sent_run = cur.run_id  # the request leaves now
        return await call.run(self.rt.client, RunSink(self, job, cur))

    def _keep(self, job: Row, cur: Current, thought: str, text: str) -> None:
        """Keep a chunk's reasoning and answer apart, and show both to live followers; a piece
        past max_output_bytes is not kept and ends the job (an endless stream held 16-18 MB)."""
        if thought:
            self._keep_piece(job, cur, "thinking", thought, cur.thinking)
        if text:
            self._keep_piece(job, cur, "text", text, cur.output)

    def _keep_piece(self, job: Row, cur: Current, kind: str, piece: str, pieces: list[str]) -> None:
        size = cur.size + len(piece.encode())
        if size > (cap := self.settings.max_output_for(self.rt.config)):
            raise OutputCapped(f"the reply passed max_output_bytes ({cap} bytes): request aborted, output so far kept")
        cur.size = size
        pieces.append(piece)
        # Its owner too: the page's event stream shows a private job's pieces to whom may read it.
        self.bus.publish("tokens", {"id": job["id"], "run_id": cur.run_id, "owner": job.get("owner"), kind: piece})

    async def _beat(self, job: Row, cur: Current, last_beat: float) -> float:
        """Write the progress so far, at most every HEARTBEAT_S; returns when it last did."""
        if time.monotonic() - last_beat < HEARTBEAT_S:
            return last_beat
        if not self.leased():  # the lease ran out while this job ran (the machine slept?): renew
            self.lease_lapsed()  # now; if another router took the node, this worker loses the job
        try:
            output, thinking, upto = cur.unsaved()
            await self.store.heartbeat(cur.run_id, output, thinking)
            cur.saved = upto
            cur.compact()
        except StoreUnavailable as exc:  # progress is a hint; the tokens stay in memory
            log.warning("job=%s heartbeat not recorded: %s", job["id"], exc.message)
        return time.monotonic()

    def _told(self, job_id: str, status: int | None, error: str) -> str:
        """A run's error, passed to its waiting client (if any) first."""
        self.calls.failed(job_id, status, error)
        return error

    # -- step 2: record -----------------------------------------------------------------------

    async def _record(
        self, job: Row, cur: Current, stats: dict[str, Any]
    ) -> tuple[list[dict[str, Any]] | None, str | None]:
        """Write the reply and Ollama's stats; returns a critique's findings, and the error of a
        reply that cannot stand (cut at the token limit, findings that miss the schema)."""
        unsaved, thinking, upto = cur.unsaved()
        await self._persist(
            job["id"], "end of stream", lambda: self.store.work_done(cur.run_id, unsaved, stats, thinking)
        )
        cur.saved = upto
        output = "".join(cur.output)
        if job["kind"] != Kind.EMBED:  # an embedding's prompt_eval_count sums all its inputs
            warning = await self.context_check.warning(job, stats, cur.options)
            if warning is not None:
                log.warning("job=%s node=%s %s", job["id"], self.rt.name, warning)
                await self.note(job["id"], f"warning: {warning}")
        # A front-door client that set its limit is told done_reason "length", as Ollama tells it:
        # its job is done. gpuq's own jobs fail loudly instead.
        if stats.get("done_reason") == "length" and job.get("endpoint") is None:
            return (
                None,
                "reply cut off at the token limit (done_reason length); output kept, `gpuq retry` to run it again",
            )
        if job["kind"] != Kind.CRITIQUE:
            return None, None
        try:
            return parse_findings(output), None
        except FindingsError as exc:
            return None, f"the model's reply does not match the findings schema: {exc}; raw reply kept as output"

    async def _persist(self, job_id: str, what: str, write: Callable[[], Awaitable[T]]) -> T:
        """Write what a job did. While the database refuses (a person holds its lock, the disk
        is full), say so and try again: the outcome waits in memory and the job is never run
        again; if the router dies meanwhile, the restart fails the job like any orphan."""
        delay = 0.1
        while True:
            try:
                return await write()
            except StoreUnavailable as exc:
                log.error("job=%s %s not recorded yet, trying again in %gs: %s", job_id, what, delay, exc.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECORD_RETRY_MAX_S)

    async def _after_abort(self, job: Row, cur: Current) -> None:
        log.info("job=%s node=%s aborted: %s", job["id"], self.rt.name, cur.abort_reason)
        output, thinking, upto = cur.unsaved()
        if not (cur.abort_reason == CLIENT_LEFT and await self._cancel_cut(job, cur, output, thinking)):
            await self._persist(
                job["id"], "partial output", lambda: self.store.save_output(cur.run_id, output, thinking)
            )
        cur.saved = upto
        await self.vram.after_abort(job, cur.abort_reason, cur.keep_s, sent=self.sent_run == cur.run_id)

    async def _cancel_cut(self, job: Row, cur: Current, output: str, thinking: str | None) -> bool:
        """A called job cut as its client left (Dispatcher.cut): its cancel and its output so far,
        in one commit (an editor drops most of its autocompletes: one commit fewer each). False:
        it was no longer running (the front door's own delete came first): the output is kept apart."""
        try:
            await self._persist(
                job["id"],
                "cancel",
                lambda: self.store.finish(
                    job["id"],
                    cur.run_id,
                    JobState.CANCELLED,
                    CLIENT_LEFT,
                    output,
                    actor=cur.abort_actor,
                    thinking=thinking,
                ),
            )
        except GuardMiss:
            return False
        log.info("job=%s node=%s state=cancelled reason=%r", job["id"], self.rt.name, CLIENT_LEFT)
        return True

    async def note(self, job_id: str, message: str) -> None:
        """An event on the job, written as its outcome is (_persist)."""
        await self._persist(job_id, "event", lambda: self.store.note(job_id, message))

    # -- step 4: finish -----------------------------------------------------------------------

    async def _finish(
        self, job: Row, cur: Current, error: str | None, findings: list[dict[str, Any]] | None, unloaded: bool
    ) -> None:
        """Record the outcome. A node that just answered the unload check is reachable, so the
        finish may claim its next job in the same commit (cur.next_job)."""
        state = JobState.FAILED if error else JobState.DONE
        claim_node = self.rt.name if unloaded and self.rt.claimable and not self.stopping and self.leased() else None
        output, thinking, _ = cur.unsaved()
        try:
            cur.next_job = await self._persist(
                job["id"],
                "outcome",
                lambda: self.store.finish(
                    job["id"],
                    cur.run_id,
                    state,
                    error,
                    output,
                    findings=findings,
                    claim_node=claim_node,
                    thinking=thinking,
                    streamed=cur.tokens,
                ),
            )
        except GuardMiss as exc:
            if cur.abort_reason is None:
                log.error("job=%s node=%s finish refused: %s", job["id"], self.rt.name, exc.message)
                reason = f"finish refused: {exc.message}"
                await self.note(job["id"], reason)
            return
        log.info("job=%s node=%s state=%s%s", job["id"], self.rt.name, state, f" error={error!r}" if error else "")
        if job["kind"] == Kind.TASK:  # critiques held for this task are ready (or were cancelled)
            self.wake_all()  # (the page hears of the change from _run, as for every job)


class RunSink:
    """What a called job's run (node/calls.py) keeps through its worker: output, heartbeat, events."""

    def __init__(self, worker: Worker, job: Row, cur: Current):
        self.worker, self.job, self.cur = worker, job, cur
        self.last_beat = time.monotonic()
        self.not_due = asyncio.get_running_loop().create_future()  # awaited while no beat is due
        self.not_due.set_result(None)

    def keep(self, thinking: str, text: str) -> None:
        self.worker._keep(self.job, self.cur, thinking, text)

    def summary(self, text: str) -> None:
        self.cur.output.append(text)

    def beat(self) -> Awaitable[None]:
        """Sink.beat: a finished future while no beat is due (the chunk costs no coroutine)."""
        if time.monotonic() - self.last_beat < HEARTBEAT_S:
            return self.not_due
        return self._beat()

    async def _beat(self) -> None:
        self.last_beat = await self.worker._beat(self.job, self.cur, self.last_beat)

    async def note(self, message: str) -> None:
        await self.worker.note(self.job["id"], message)
