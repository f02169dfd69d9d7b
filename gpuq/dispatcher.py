"""One worker per node: claim the head, stream it through Ollama, unload the model, confirm it
left VRAM, finish the job. Nothing is retried: every failure ends the job, loudly."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

import aiohttp

from .bus import Bus
from .config import NodeConfig, Settings
from .critique import FINDINGS_SCHEMA, FindingsError, instruction, parse_findings
from .errors import GpuqError, OllamaError, StoreUnavailable
from .models import iso, normalize_model, parse_iso
from .params import merged_options
from .ollama import OllamaClient, prompt_was_cut
from .store import GuardMiss, Interrupted, NodeInfo, Store
from .supervise import Loop, Loops
from .translate import STREAMED_ROUTES, chunk_text, node_request

log = logging.getLogger("gpuq")

IDLE_POLL_S = 5.0  # the fallback poll; a submit wakes the worker at once
HEARTBEAT_S = 1.0  # progress is written at most this often while tokens stream
# A node that confirmed the last job's unload this recently is not health-checked again
# before the next claim: it has just answered, and a check costs two requests per job.
UNLOAD_FRESH_S = 0.25
RECORD_RETRY_MAX_S = 5.0  # the longest wait between tries to record a job's outcome
OLLAMA_DEFAULT_CONTEXT = 4096  # num_ctx when neither the job, the node nor the model sets one
MIN_REQUEST_S = 0.05  # the shortest limit given to one request to a node
# With unload = "when-idle", the model a job leaves loaded for the next one of the same model.
# Bounded, so a router that dies does not pin it forever; an idle node unloads it at once.
KEEP_WARM = "10m"
# A front-door generate's last chunk carries its whole token context (`context`), which may be
# far past the reader's buffer; still bounded, so a broken node cannot fill the router's memory.
FRONT_MAX_LINE = 16 << 20


@dataclass
class Current:
    """The job a node is running now."""

    job_id: str
    run_id: int
    task: asyncio.Task | None = None
    output: list[str] = field(default_factory=list)  # the answer, one piece per token
    thinking: list[str] = field(default_factory=list)  # the reasoning, apart from the answer
    abort_reason: str | None = None
    next_job: dict | None = None  # claimed in the same transaction that finished this one


@dataclass
class NodeRuntime:
    config: NodeConfig
    client: OllamaClient
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    up: bool = False
    checked: bool = False  # False until the first health check has answered
    last_error: str | None = None
    since: float = field(default_factory=time.time)
    model_installed: bool | None = None
    installed: frozenset[str] | None = None  # the models /api/tags listed at the last answer
    tags: list[dict] = field(default_factory=list)  # those models as /api/tags described them
    version: str | None = None  # /api/version's answer at the last check
    vram_stuck: str | None = None  # set when a model would not leave VRAM
    stuck_model: str | None = None  # which model (a job may have asked for another than the node's)
    stuck_since: float | None = None  # when it was flagged
    stuck_job: str | None = None  # the job after which it would not leave (None: a dead router's)
    health_unrecorded: bool = False  # the database refused the last health change
    unloaded_at: float = float("-inf")  # monotonic time the node last confirmed an unload
    current: Current | None = None
    orphan_models: list[str] = field(default_factory=list)  # a dead router's jobs' models, to unload
    loops: list[Loop] = field(default_factory=list)  # its worker and health loop
    # Runs aborted before their worker took them up (a delete racing the claim's return).
    aborted_runs: dict[int, str] = field(default_factory=dict)
    context_lengths: dict[str, int | None] = field(default_factory=dict)  # /api/show's num_ctx per model
    warm_model: str | None = None  # left loaded on purpose for the next job ("when-idle")

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def claimable(self) -> bool:
        return self.up and self.vram_stuck is None


class Dispatcher:
    def __init__(self, settings: Settings, store: Store, bus: Bus):
        self.settings = settings
        self.store = store
        self.bus = bus
        self.session: aiohttp.ClientSession | None = None
        self.nodes: dict[str, NodeRuntime] = {}
        self.loops = Loops()  # every background loop, supervised: a crash is logged and restarted
        # Front-door calls whose client waits (gpuq/front.py): what their run sends it, in order:
        # ("start", node), ("chunk", raw line, chunk), ("reply", object), ("error", status,
        # message), ("ended", reason). The client's handler puts the queue here before its submit.
        self.relays: dict[str, asyncio.Queue] = {}

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, stuck: list[dict] | None = None) -> None:
        """`stuck`: the models a previous router saw stuck in VRAM (open vram_stuck alerts, with
        node, model, message, since, job_id): each node stays flagged until /api/ps shows its
        model gone, as it would have without the restart."""
        self.session = aiohttp.ClientSession()
        for cfg in self.settings.nodes:
            client = OllamaClient(cfg.url, self.session, name=cfg.name,
                                  connect_timeout_s=self.settings.connect_timeout_s,
                                  stall_timeout_s=self.settings.stall_timeout_s,
                                  load_timeout_s=self.settings.load_timeout_s)
            self.nodes[cfg.name] = NodeRuntime(cfg, client)
        for s in stuck or []:
            rt = self.nodes.get(s["node"])
            if rt is not None and s.get("model"):
                rt.vram_stuck, rt.stuck_model, rt.stuck_job = s["message"], s["model"], s.get("job_id")
                rt.stuck_since = parse_iso(s["since"])
        orphans = await self.store.fail_orphans()
        for o in orphans:
            log.warning("job=%s node=%s state=failed reason=%r", o["id"], o["node"], "router restarted while running")
        for o in await self.store.cancel_clientless():
            log.warning("job=%s node=%s state=cancelled reason=%r", o["id"], o["node"],
                        "client gone: the router restarted while it waited")
        for name, rt in self.nodes.items():
            rt.orphan_models = [o["model"] for o in orphans if o["node"] == name]
            rt.loops = [self.loops.start("health loop", lambda rt=rt: self._health_loop(rt), name),
                        self.loops.start("worker", lambda rt=rt: self._worker(rt), name)]

    async def stop(self) -> None:
        await self.loops.stop()
        if self.session is not None:
            await self.session.close()

    def node_infos(self) -> list[NodeInfo]:
        return [NodeInfo(rt.name, rt.config.rank, rt.config.roles, rt.config.model, rt.claimable, rt.installed)
                for rt in self.nodes.values()]

    def wake(self, node: str | None = None) -> None:
        for rt in self.nodes.values():
            if node is None or rt.name == node:
                rt.wake.set()

    def abort(self, interrupted: Interrupted | None, reason: str) -> None:
        """Stop a running job's Ollama request (closing it stops Ollama's generation)."""
        if interrupted is None:
            return
        rt = self.nodes.get(interrupted.node)
        cur = rt.current if rt else None
        if cur is not None and cur.run_id == interrupted.run_id and cur.task is not None:
            cur.abort_reason = reason
            cur.task.cancel()
        elif rt is not None:
            rt.aborted_runs[interrupted.run_id] = reason
        self.wake(interrupted.node)


    def live(self, job_id: str) -> Current | None:
        """The running job's in-memory state (its output so far, one piece per token)."""
        for rt in self.nodes.values():
            if rt.current is not None and rt.current.job_id == job_id:
                return rt.current
        return None

    def _changed(self, **data) -> None:
        self.bus.publish("queue", data)

    # -- node health --------------------------------------------------------------------------

    async def check_node(self, rt: NodeRuntime) -> None:
        # Both questions at once: one round trip, not two, before a claim. A failure is
        # reported as the sequential check would: /api/version's first.
        answers = await asyncio.gather(rt.client.version(), rt.client.tags(), return_exceptions=True)
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is None:
            rt.version, rt.tags = answers[0], answers[1]
            installed, error = {normalize_model(m["name"]) for m in rt.tags}, None
        elif isinstance(failed, OllamaError):
            installed, error = None, failed.message
        else:
            raise failed
        was_up = rt.up
        rt.checked = True
        if installed is not None:
            rt.installed = frozenset(installed)
            rt.model_installed = normalize_model(rt.config.model) in installed
            if rt.vram_stuck and rt.current is None:
                try:
                    if normalize_model(rt.stuck_model or rt.config.model) not in await rt.client.loaded():
                        log.info("node=%s vram=clear", rt.name)
                        rt.vram_stuck = rt.stuck_model = rt.stuck_since = rt.stuck_job = None
                        self._changed(node=rt.name, vram_stuck=False)
                except OllamaError:
                    pass
        await self._set_up(rt, error is None, error)
        if rt.up != was_up and rt.up:
            rt.wake.set()

    async def _set_up(self, rt: NodeRuntime, up: bool, error: str | None) -> None:
        changed = up != rt.up or (not up and error != rt.last_error)
        if up != rt.up:
            rt.since = time.time()
            if up:
                log.info("node=%s health=up", rt.name)
            else:
                log.warning("node=%s health=down error=%r", rt.name, error)
            self._changed(node=rt.name, up=up)
        rt.up = up
        rt.last_error = error if not up else rt.last_error
        if changed or rt.health_unrecorded:
            try:
                await self.store.set_node_health(rt.name, up, rt.last_error)
                rt.health_unrecorded = False
            except StoreUnavailable as exc:  # claims follow the state in memory; the row catches up
                rt.health_unrecorded = True
                log.error("node=%s health not recorded: %s", rt.name, exc.message)

    async def _health_loop(self, rt: NodeRuntime) -> None:
        while True:
            await self.check_node(rt)
            await asyncio.sleep(self.settings.health_interval_s if rt.up else min(self.settings.health_interval_s, 2.0))

    # -- the worker ---------------------------------------------------------------------------

    async def _wait(self, rt: NodeRuntime, timeout: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that lands in
        # the same tick as a wake, and the worker then outlives stop() (a hung shutdown).
        try:
            async with asyncio.timeout(timeout):
                await rt.wake.wait()
        except TimeoutError:
            pass
        rt.wake.clear()

    async def _worker(self, rt: NodeRuntime) -> None:
        while rt.orphan_models:  # a job of a dead router may still hold VRAM
            await self._unload(rt, rt.orphan_models[0], job_id=None)
            rt.orphan_models.pop(0)
        job = None  # a job claimed by the previous job's finish, else claimed here
        while True:
            try:
                if job is None:
                    if not rt.claimable:
                        await self._wait(rt, 1.0)
                        continue
                    if not await self._ready_to_claim(rt):
                        if rt.warm_model is not None:  # "when-idle": the node went idle
                            await self._unload_warm(rt, None)
                        await self._wait(rt, IDLE_POLL_S)
                        continue
                    job = await self.store.claim(rt.name)
                    if job is None:
                        continue
                log.info("job=%s node=%s state=running model=%s", job["id"], rt.name, job["model"])
                self._changed(job=job["id"], node=rt.name, state="running")
                running, job = job, None
                job = await self._run(rt, running)
            except asyncio.CancelledError:
                raise
            except GpuqError as exc:  # the store refused (locked, disk full): say so, then go on
                log.error("node=%s worker error: %s", rt.name, exc.message)
                await self._wait(rt, 1.0)

    async def _ready_to_claim(self, rt: NodeRuntime) -> bool:
        """Something waits and the node answers: never claim onto a node that is unreachable.
        Right after a job, the node's answer to the unload check is that proof."""
        if not await self.store.has_waiting(rt.name):
            return False
        if time.monotonic() - rt.unloaded_at > UNLOAD_FRESH_S:
            await self.check_node(rt)
        return rt.claimable

    async def _run(self, rt: NodeRuntime, job: dict) -> dict | None:
        """Run a claimed job to its end; returns the next job if its finish claimed one."""
        early = rt.aborted_runs.pop(job["run_id"], None)
        rt.aborted_runs.clear()  # older entries belong to runs this worker will never see again
        if early is not None:
            log.info("job=%s node=%s aborted before it started: %s", job["id"], rt.name, early)
            return None
        cur = Current(job["id"], job["run_id"])
        rt.current = cur
        cur.task = asyncio.create_task(self._execute(rt, job, cur))
        try:
            await asyncio.shield(cur.task)
            return cur.next_job
        except asyncio.CancelledError:
            if cur.abort_reason is None:  # the router is shutting down
                cur.task.cancel()
                raise
            self._tell(job["id"], "ended", cur.abort_reason)
            await self._after_abort(rt, job, cur)
            return None
        finally:
            rt.current = None
            self._changed(job=job["id"], node=rt.name)

    def _limit_s(self, rt: NodeRuntime, job: dict) -> tuple[float, str]:
        runtime = self.settings.max_runtime_for(rt.config)
        timeout = job.get("timeout_s") or self.settings.job_timeout_s
        if timeout is not None and timeout < runtime:
            return timeout, "timeout"
        return runtime, "max_runtime"

    def ended(self, job_ids: list[str], reason: str) -> None:
        """Jobs a person ended (deleted, cleared): their waiting front-door clients hear why."""
        for job_id in job_ids:
            self._tell(job_id, "ended", reason)

    def _tell(self, job_id: str, *item) -> None:
        """Pass a front-door call's progress to its waiting client, if it still waits."""
        relay = self.relays.get(job_id)
        if relay is not None:
            relay.put_nowait(item)

    async def _unload_warm(self, rt: NodeRuntime, job_id: str | None) -> bool:
        model, rt.warm_model = rt.warm_model, None
        return model is None or await self._unload(rt, model, job_id)

    async def _keep_warm(self, rt: NodeRuntime, job: dict) -> bool:
        """With unload = "when-idle": does the next job on this node want the same model?"""
        if self.settings.unload_for(rt.config) != "when-idle" or not rt.claimable:
            return False
        nxt = await self.store.next_ready_model(rt.name)
        return nxt is not None and normalize_model(nxt) == normalize_model(job["model"])

    async def _execute(self, rt: NodeRuntime, job: dict, cur: Current) -> None:
        if rt.warm_model is not None and normalize_model(rt.warm_model) != normalize_model(job["model"]):
            # "when-idle" switching model: the one left loaded must leave VRAM first.
            if not await self._unload_warm(rt, job["id"]):
                message = f"not started: {rt.vram_stuck}"
                await self._record(job["id"], "outcome", lambda: self.store.finish(job["id"], cur.run_id, "failed", message))
                return
        try:
            findings, error = await self._work(rt, job, cur)
        except Exception as exc:  # a bug, or a reply no check foresaw: this job fails, the worker goes on
            error = f"unexpected error in the router: {type(exc).__name__}: {exc}"
            log.exception("job=%s node=%s %s", job["id"], rt.name, error)
            self._tell(job["id"], "error", 500, error)
            findings = None
        output, thinking = "".join(cur.output), "".join(cur.thinking) or None
        if error is None and await self._keep_warm(rt, job):
            rt.warm_model, unloaded = job["model"], True  # the node just answered: reachable
        else:
            rt.warm_model = None
            unloaded = await self._unload(rt, job["model"], job["id"])
        state = "failed" if error else "done"
        # The node just answered the unload check (or the stream): it is reachable, so the
        # finish may claim its next job in the same commit.
        claim_node = rt.name if unloaded and rt.claimable else None
        try:
            cur.next_job = await self._record(job["id"], "outcome", lambda: self.store.finish(
                job["id"], cur.run_id, state, error, output, findings=findings, claim_node=claim_node,
                thinking=thinking, streamed=len(cur.output) + len(cur.thinking)))
        except GuardMiss as exc:
            if cur.abort_reason is None:
                log.error("job=%s node=%s finish refused: %s", job["id"], rt.name, exc.message)
                reason = f"finish refused: {exc.message}"
                await self._record(job["id"], "event", lambda: self.store.note(job["id"], reason))
            return
        log.info("job=%s node=%s state=%s%s", job["id"], rt.name, state, f" error={error!r}" if error else "")
        if job["kind"] == "task":  # critiques held for this task are ready (or were cancelled)
            self.wake()  # (the page hears of the change from _run, as for every job)

    async def _work(self, rt: NodeRuntime, job: dict, cur: Current) -> tuple[list | None, str | None]:
        """Generate the reply and record it; returns the findings (of a critique) and the error.
        A front-door call's client hears of an error at once, with Ollama's status."""
        started = time.monotonic()
        limit_s, limit_name = self._limit_s(rt, job)
        critique = job["kind"] == "critique"
        front = job.get("endpoint") is not None  # a call through the front door (gpuq/front.py)
        prompt = instruction(self.settings.critique_template, job["prompt"]) if critique else job["prompt"]
        think = json.loads(job["think"]) if job.get("think") is not None else rt.config.think
        options = merged_options(rt.config.options, json.loads(job["options"]) if job.get("options") else None)
        keep_alive = KEEP_WARM if self.settings.unload_for(rt.config) == "when-idle" else 0
        try:
            async with asyncio.timeout(limit_s):
                if front:
                    self._tell(job["id"], "start", rt.name)
                    route, body = node_request(job["endpoint"], json.loads(job["request"])["body"],
                                               rt.config.think, rt.config.options, keep_alive)
                    options = body.get("options")
                    stats = await self._call(rt, job, cur, route, body)
                else:
                    stats = await self._generate(rt, job, cur, prompt, FINDINGS_SCHEMA if critique else None,
                                                 think, options, keep_alive)
        except TimeoutError:
            return None, self._told(job["id"], None, f"{limit_name} fired: the job ran "
                                    f"{time.monotonic() - started:.1f}s, over its {limit_s:g}s limit; request aborted")
        except OllamaError as exc:
            if exc.status is None and "cannot connect" in exc.message:
                await self._set_up(rt, False, exc.message)
            if exc.status == 503:  # Ollama's pending queue is full: another client keeps it busy
                return None, self._told(job["id"], 503, (
                    f"{exc.message} (HTTP 503: node {rt.name}'s Ollama is busy with other clients' "
                    f"requests; this request never started, so `gpuq retry {job['id']}` is safe)"))
            return None, self._told(job["id"], exc.status, exc.message)
        except GpuqError as exc:  # a stored request this gpuq cannot read (written by another version)
            return None, self._told(job["id"], 400, f"cannot run the stored request: {exc.message}")
        output, thinking = "".join(cur.output), "".join(cur.thinking) or None
        await self._record(job["id"], "end of stream",
                           lambda: self.store.work_done(cur.run_id, output, stats, thinking))
        if job["kind"] != "embed":  # an embedding's prompt_eval_count sums all its inputs
            await self._warn_if_prompt_filled_context(rt, job, stats, options)
        # A front-door client that set its limit is told done_reason "length", as Ollama tells it:
        # its job is done. gpuq's own jobs fail loudly instead.
        if stats.get("done_reason") == "length" and not front:
            return None, "reply cut off at the token limit (done_reason length); output kept, `gpuq retry` to run it again"
        if not critique:
            return None, None
        try:
            return parse_findings(output), None
        except FindingsError as exc:
            return None, f"the model's reply does not match the findings schema: {exc}; raw reply kept as output"

    def _told(self, job_id: str, status: int | None, error: str) -> str:
        """A run's error, passed to its waiting front-door client (if any) first."""
        self._tell(job_id, "error", status, error)
        return error

    async def _generate(self, rt: NodeRuntime, job: dict, cur: Current, prompt: str, fmt,
                        think: bool | str | None, options: dict | None, keep_alive: int | str) -> dict:
        last_beat = time.monotonic()
        async for chunk in rt.client.chat(job["model"], prompt, fmt, think, options, keep_alive):
            message = chunk.get("message") or {}
            # A thinking model's reasoning (on by default since Ollama 0.12.4), then its answer.
            self._keep(job, cur, message.get("thinking") or "", message.get("content") or "")
            if chunk.get("done"):
                return chunk
            last_beat = await self._beat(job, cur, last_beat)
        raise OllamaError("Ollama's stream ended without done: true")

    def _keep(self, job: dict, cur: Current, thought: str, text: str) -> None:
        """Keep a chunk's reasoning and answer apart, and show both to live followers."""
        for kind, piece, pieces in (("thinking", thought, cur.thinking), ("text", text, cur.output)):
            if piece:
                pieces.append(piece)
                self.bus.publish("tokens", {"id": job["id"], "run_id": cur.run_id, kind: piece})

    async def _beat(self, job: dict, cur: Current, last_beat: float) -> float:
        """Write the progress so far, at most every HEARTBEAT_S; returns when it last did."""
        if time.monotonic() - last_beat < HEARTBEAT_S:
            return last_beat
        try:
            await self.store.heartbeat(cur.run_id, "".join(cur.output), "".join(cur.thinking) or None)
        except StoreUnavailable as exc:  # progress is a hint; the tokens stay in memory
            log.warning("job=%s heartbeat not recorded: %s", job["id"], exc.message)
        return time.monotonic()

    async def _call(self, rt: NodeRuntime, job: dict, cur: Current, route: str, body: dict) -> dict:
        """Run a front-door call on the node and relay what it answers, chunk by chunk as Ollama
        sent it; keep the answer, the reasoning and any tool calls as the job's output."""
        if route not in STREAMED_ROUTES:  # an embedding: one answer
            reply = await rt.client.post(route, body)
            vectors = reply.get("embeddings") if isinstance(reply, dict) else None
            if vectors is None and isinstance(reply, dict) and "embedding" in reply:
                vectors = [reply["embedding"]]
            dims = len(vectors[0]) if vectors else 0
            cur.output.append(f"{len(vectors or [])} embedding(s) of {dims} dimensions (the vectors went to the client)")
            self._tell(job["id"], "reply", reply)
            return {k: reply.get(k) for k in ("prompt_eval_count", "total_duration", "load_duration")} \
                if isinstance(reply, dict) else {}
        last_beat = time.monotonic()
        async for raw, chunk in rt.client.stream(route, body, max_line=FRONT_MAX_LINE):
            self._tell(job["id"], "chunk", raw, chunk)
            text, thought, calls = chunk_text(chunk)
            for call in calls:  # shown with the answer on the job's page
                function = call.get("function") or {}
                text += f"\n[tool call {function.get('name')} {json.dumps(function.get('arguments'))}]"
            self._keep(job, cur, thought, text)
            if chunk.get("done"):
                return chunk
            last_beat = await self._beat(job, cur, last_beat)
        raise OllamaError("Ollama's stream ended without done: true")

    async def _record(self, job_id: str, what: str, write):
        """Write what a job did. While the database refuses (a person holds its lock, the disk
        is full), say so and try again: the outcome waits in memory and the job is never run
        again; if the router dies meanwhile, the restart fails the job like any orphan."""
        delay = 0.1
        while True:
            try:
                return await write()
            except StoreUnavailable as exc:
                log.error("job=%s %s not recorded yet, trying again in %gs: %s",
                          job_id, what, delay, exc.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECORD_RETRY_MAX_S)

    async def _warn_if_prompt_filled_context(self, rt: NodeRuntime, job: dict, stats: dict,
                                             options: dict | None) -> None:
        """Ollama cuts a prompt too long for the context window with only a line in its own log.
        When the prompt tokens it evaluated show a cut, say so on the job (num_ctx from the options, else
        from the model's /api/show parameters; unknown: no warning)."""
        used = stats.get("prompt_eval_count")
        if not isinstance(used, int):
            return
        num_ctx = (options or {}).get("num_ctx")
        if num_ctx is None:
            if job["model"] not in rt.context_lengths:
                try:
                    rt.context_lengths[job["model"]] = await rt.client.context_length(job["model"])
                except OllamaError as exc:
                    log.warning("job=%s node=%s cannot read num_ctx from /api/show: %s", job["id"], rt.name, exc.message)
                    return
            # No num_ctx in the model's parameters: the server's default context applies, 4096
            # unless its OLLAMA_CONTEXT_LENGTH says otherwise (which no API tells).
            num_ctx = rt.context_lengths[job["model"]] or OLLAMA_DEFAULT_CONTEXT
        if num_ctx and prompt_was_cut(used, num_ctx, (options or {}).get("num_keep", 4)):
            warning = (f"prompt may have been truncated: {used} tokens, num_ctx {num_ctx} "
                       "(set a larger num_ctx in the node's or the job's options)")
            log.warning("job=%s node=%s %s", job["id"], rt.name, warning)
            await self._record(job["id"], "event", lambda: self.store.note(job["id"], f"warning: {warning}"))

    async def _after_abort(self, rt: NodeRuntime, job: dict, cur: Current) -> None:
        log.info("job=%s node=%s aborted: %s", job["id"], rt.name, cur.abort_reason)
        output, thinking = "".join(cur.output), "".join(cur.thinking) or None
        await self._record(job["id"], "partial output", lambda: self.store.save_output(cur.run_id, output, thinking))
        rt.warm_model = None
        await self._unload(rt, job["model"], job["id"])

    async def _unload(self, rt: NodeRuntime, model: str, job_id: str | None) -> bool:
        """Confirm through /api/ps that the model left VRAM; ask for an unload if it lingers.
        Every request is bounded by the time left: a real /api/ps can block for seconds."""
        wanted = normalize_model(model)
        started = time.monotonic()
        deadline = started + self.settings.unload_timeout_s
        delay, asked = 0.02, False
        last_error = None
        while True:
            try:
                left = max(deadline - time.monotonic(), MIN_REQUEST_S)
                if wanted not in await rt.client.loaded(timeout_s=left):
                    rt.unloaded_at = time.monotonic()
                    return True
                if not asked:
                    await rt.client.unload(model, timeout_s=max(deadline - time.monotonic(), MIN_REQUEST_S))
                    asked = True
                last_error = f"{model} is still listed by /api/ps"
            except OllamaError as exc:
                last_error = exc.message
            except Exception as exc:  # a bug: the model may still hold VRAM, so the node is flagged
                log.exception("node=%s job=%s unexpected error while unloading %s", rt.name, job_id, model)
                last_error = f"unexpected error in the router: {type(exc).__name__}: {exc}"
                break
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 0.5)
        message = (f"unload failed: {model} did not leave VRAM within {time.monotonic() - started:.1f}s "
                   f"(unload_timeout {self.settings.unload_timeout_s:g}s; {last_error}); node {rt.name} flagged")
        rt.vram_stuck, rt.stuck_model, rt.stuck_since, rt.stuck_job = message, model, time.time(), job_id
        log.error("node=%s job=%s %s", rt.name, job_id, message)
        if job_id is not None:
            await self._record(job_id, "event", lambda: self.store.note(job_id, message))
        self._changed(node=rt.name, vram_stuck=True)
        return False


def node_json(rt: NodeRuntime) -> dict:
    return {
        "name": rt.name, "rank": rt.config.rank, "roles": list(rt.config.roles),
        "model": rt.config.model, "url": rt.config.url, "up": rt.up, "checked": rt.checked,
        "since": iso(rt.since), "last_error": rt.last_error, "model_installed": rt.model_installed,
        "vram_stuck": rt.vram_stuck,
        "loop_error": "; ".join(loop.problem() for loop in rt.loops if not loop.alive) or None,
    }
