"""The wiring of the nodes: for each one a health monitor (gpuq/node/monitor.py) and a worker
(gpuq/node/worker.py), started and stopped together, woken by submits, told of aborts."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import aiohttp

from .. import eta
from ..bus import Bus
from ..config import NodeConfig, Settings
from ..errors import GpuqError, GuardMiss, OverQuota
from ..jobs import FINAL, JobState, Kind, Lane, NodeCounts, iso, parse_iso
from ..placement import node_views, preempt_elsewhere, preempted_reason, preempts
from ..reload import Plan
from ..store import Interrupted, NewJob, NodeInfo, Row, Store
from ..store.batch_create import PIECE_LINES, pieces
from ..store.batches import NewBatch, NewLine
from ..store.leases import Router
from .awake import Awake
from .calls import Calls, NoCalls
from .leases import Leases
from .monitor import NodeMonitor
from .ollama import OllamaClient
from .runtime import Current, NodeRuntime
from .supervise import Loops
from .worker import Worker, keep_big_blocks_apart, put_back_unsent

__all__ = ["Dispatcher", "NodeRuntime"]

log = logging.getLogger("gpuq")

QUOTA_WAIT_MAX_S = 3600  # a Retry-After past an hour says nothing a person can act on


def node_blocked(rt: NodeRuntime) -> str | None:
    """Why nothing starts on the node now (eta.NodePlan.blocked), or None."""
    if rt.vram_stuck:
        return f"{rt.name} has a model stuck in VRAM: nothing starts there until it leaves"
    if rt.checked and not rt.up:
        return down_words(rt.name)
    return None


def down_words(node: str) -> str:
    return f"{node} is down: nothing starts there until it answers"


class Dispatcher:
    def __init__(self, settings: Settings, store: Store, bus: Bus, calls: Calls | None = None):
        self.settings = settings
        self.store = store
        self._limit_running(settings)
        self.bus = bus
        self.session: aiohttp.ClientSession | None = None
        self.nodes: dict[str, NodeRuntime] = {}
        self.monitors: dict[str, NodeMonitor] = {}
        self.workers: dict[str, Worker] = {}
        self.loops = Loops()  # every background loop, supervised: a crash is logged and restarted
        # How a job a client called for runs, and how its waiting client hears of its end: the
        # front door's (gpuq/front/relay.py), given by the daemon before start().
        self.calls: Calls = calls or NoCalls()
        self.awake = Awake(settings.keep_awake)  # a sleep inhibitor held while any job runs
        self.retiring: set[asyncio.Future[None]] = set()  # removed nodes whose loops end after their running job
        self.retired: dict[str, Worker] = {}  # their workers meanwhile (a running job can still be aborted)
        self.removing: set[str] = set()  # nodes a reload is taking out: no placement or move there
        self.creating: set[str] = set()  # the large batches this router is creating now, in pieces
        self.draining_since: float | None = None  # told to stop, waiting for the running jobs
        self.quiesced = False  # told to stop: no worker, a reload's new ones included, claims again
        # This router process (a fresh id per start) and its leases: a node's worker claims only
        # while this router holds the node's lease (gpuq/node/leases.py).
        self.router = Router.new(settings.listen, settings.public_url, time.time())
        self.leases = Leases(
            store, self.router, lambda: self.settings.lease_s, self._lease_nodes, gained=self.wake, lost=self._lost
        )

    def _limit_running(self, settings: Settings) -> None:
        """Users' max_running, which every claim of the store applies."""
        self.store.set_max_running(settings.max_running)

    async def start(self, stuck: list[dict[str, Any]] | None = None) -> None:
        """`stuck`: the models a previous router saw stuck in VRAM (open vram_stuck alerts, with
        node, model, message, since, job_id): each node stays flagged until /api/ps shows its
        model gone, as it would have without the restart."""
        keep_big_blocks_apart()  # a node's big reply must not leave the router's heap swollen
        # No cookie jar: no node sets one, and the jar's filter and update ran on every request
        # (20-40 us of each node request's setup, measured by bench/README's relay rows).
        self.session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        for cfg in self.settings.nodes:
            self._wire(cfg)
        for s in stuck or []:
            rt = self.nodes.get(s["node"])
            if rt is not None and s.get("model"):
                rt.vram_stuck, rt.stuck_model, rt.stuck_job = s["message"], s["model"], s.get("job_id")
                rt.stuck_since = parse_iso(s["since"])
        # The leases first: the jobs left running on the nodes taken from dead routers (on SQLite,
        # every job left running) fail, naming the router that ran them.
        log.info("router id %s", self.router.id)
        taken = await self.leases.start()
        orphans = taken.failed
        for o in orphans:
            log.warning("job=%s node=%s state=failed reason=%r", o["id"], o["node"], o["error"])
        for o in await self.store.cancel_clientless(taken.held):
            log.warning(
                "job=%s node=%s state=cancelled reason=%r",
                o["id"],
                o["node"],
                "client gone: the router restarted while it waited",
            )
        for name in self.nodes:
            self.workers[name].vram.orphans = [o["model"] for o in orphans if o["node"] == name]
            self._start_loops(name)
        self.loops.start("leases", self.leases.run)
        if self.store.dsn:  # PostgreSQL: other routers change the queue too
            self.loops.start("other routers' changes", lambda: self.store.watch(self.elsewhere))

    def _lease_nodes(self) -> list[str]:
        """The nodes this router drives: configured, and removed ones still finishing a job."""
        return [*self.nodes, *(n for n in self.retired if n not in self.nodes)]

    def _lost(self, node: str) -> None:
        """Another router took the node (this one's lease ran out): its worker stops relaying
        the job it ran, which the taker failed."""
        worker = self.workers.get(node) or self.retired.get(node)
        if worker is not None:
            worker.lose(f"this router lost its lease on {node} (another router took the node and failed the job)")

    def _client(self, cfg: NodeConfig) -> OllamaClient:
        assert self.session is not None
        return OllamaClient(
            cfg.url,
            self.session,
            name=cfg.name,
            connect_timeout_s=self.settings.connect_timeout_s,
            stall_timeout_s=self.settings.stall_timeout_s,
            load_timeout_s=self.settings.load_timeout_s,
            max_reply_bytes=self.settings.max_reply_bytes,
        )

    def _wire(self, cfg: NodeConfig) -> NodeRuntime:
        """A node's runtime, health monitor and worker (their loops are started apart)."""
        name = cfg.name
        rt = self.nodes[name] = NodeRuntime(cfg, self._client(cfg))
        monitor = self.monitors[name] = NodeMonitor(
            rt, self.store, self.settings.health_interval_s, self._changed, lambda: self.wake(name)
        )
        worker = self.workers[name] = Worker(
            rt, monitor, self.settings, self.store, self.bus, self.calls, self._changed, self.wake
        )
        worker.stopping = self.quiesced  # a node a reload adds while the router drains starts nothing
        worker.leased = lambda: self.leases.holds(name)
        worker.lease_lapsed = self.leases.wake.set  # renew now: the store says whether it is still ours
        return rt

    def _start_loops(self, name: str) -> None:
        self.nodes[name].loops = [
            self.loops.start("health loop", self.monitors[name].run, name),
            self.loops.start("worker", self.workers[name].run, name),
        ]

    def leaving(self, names: tuple[str, ...]) -> None:
        """Nodes a reload removes: nothing is placed, moved or claimed there from now on (a job
        running there finishes). reconfigure() then takes them out; restore() puts them back."""
        self.removing.update(names)
        for name in names:
            if name in self.workers:
                self.workers[name].stopping = True

    def restore(self, names: tuple[str, ...]) -> None:
        """The reload that was removing these nodes was refused: they work as before."""
        self.removing.difference_update(names)
        for name in names:
            if name in self.workers and not self.quiesced:  # a drain's stop stands
                self.workers[name].stopping = False
                self.workers[name].wake.set()

    def reconfigure(self, plan: Plan) -> None:
        """Follow a reload of gpuq.toml (gpuq/reload.py's plan): every part reads the new settings,
        added nodes start, removed ones stop (once their running job has finished), a kept node
        takes its new config (a new URL or client timeouts: a new Ollama client, which its next
        request uses) and is checked at once."""
        settings = self.settings = plan.settings
        self._limit_running(settings)
        for name in plan.removed:
            gone = self.nodes.pop(name)
            self.monitors.pop(name)
            worker = self.retired[name] = self.workers.pop(name)
            worker.stopping = True
            retiring = asyncio.ensure_future(self._retire(gone))
            self.retiring.add(retiring)
            retiring.add_done_callback(self.retiring.discard)
        self.removing.difference_update(plan.removed)
        self.leases.wake.set()  # added nodes are taken now
        for cfg in settings.nodes:
            rt = self.nodes.get(cfg.name)
            if rt is None:
                self._wire(cfg)
                self._start_loops(cfg.name)
                continue
            rt.config = cfg
            if cfg.name in plan.new_clients:
                rt.client = self._client(cfg)
            self.workers[cfg.name].settings = settings
            monitor = self.monitors[cfg.name]
            monitor.interval_s = settings.health_interval_s
            if cfg.name in plan.nodes or cfg.name in plan.new_clients:
                monitor.went_down.set()  # asked at once: a new URL or model is known up or not now
        self.wake()
        self._changed(reloaded=True)

    async def _retire(self, rt: NodeRuntime) -> None:
        """A removed node's loops end once its running job has (a reload lets it finish)."""
        current = rt.current
        if current is not None and current.task is not None:
            await asyncio.gather(current.task, return_exceptions=True)
        for loop in rt.loops:
            if loop.task is not None:
                loop.task.cancel()
        await asyncio.gather(*(loop.task for loop in rt.loops if loop.task is not None), return_exceptions=True)
        self.loops.all = [loop for loop in self.loops.all if loop not in rt.loops]
        if self.retired.get(rt.name) is not None and self.retired[rt.name].rt is rt:
            del self.retired[rt.name]
        log.info("node=%s removed: its loops have stopped", rt.name)

    def ask_unload(self, model: str, by: str, nodes: Iterable[str]) -> list[str]:
        """A client's unload (`ollama stop`): each of these nodes that holds `model` warm and idle
        unloads it now, one running a job of it as that job ends, verified and recorded
        (gpuq/node/vram.py). The nodes that will."""
        return [name for name in nodes if name in self.workers and self.workers[name].ask_unload(model, by)]

    def quiesce(self) -> None:
        """The router is told to stop: no worker claims or sends anything new from now on."""
        self.quiesced = True
        for worker in self.workers.values():
            worker.stopping = True

    def running(self) -> list[dict[str, Any]]:
        """The jobs whose request went to a node and that have not ended: what a drain waits for
        (a job claimed but never sent goes back to its queue at the stop)."""
        return [{"job": cur.job_id, "node": name} for name, cur in self._sent()]

    def _sent(self) -> list[tuple[str, Current]]:
        """Each node's running job whose request left, a node a reload is removing included."""
        workers = {**self.retired, **self.workers}
        return [
            (name, w.rt.current)
            for name, w in workers.items()
            if w.rt.current is not None and w.rt.current.run_id == w.sent_run
        ]

    def draining_json(self) -> dict[str, Any] | None:
        if self.draining_since is None:
            return None
        return {"since": iso(self.draining_since), "running": self.running()}

    async def fail_running(self, reason: str) -> list[dict[str, Any]]:
        """The router stops at once: its loops end (each running request is cut), then every job
        that was running fails with `reason`, its output so far kept, its waiting front-door
        client told. Returns the jobs failed."""
        running = self._sent()
        await self.loops.stop()
        failed = []
        for name, cur in running:
            output, thinking, _ = cur.unsaved()
            try:
                await self.store.finish(
                    cur.job_id, cur.run_id, JobState.FAILED, reason, output, thinking=thinking, streamed=cur.tokens
                )
            except GuardMiss:  # it ended on its own meanwhile
                continue
            except GpuqError as exc:  # the next start fails it as an orphan: loud, never lost
                log.error("job=%s node=%s not failed yet: %s", cur.job_id, name, exc.message)
                continue
            log.warning("job=%s node=%s state=failed reason=%r", cur.job_id, name, reason)
            self.calls.failed(cur.job_id, 503, reason)
            failed.append({"job": cur.job_id, "node": name})
        return failed

    async def stop(self) -> None:
        """Stop every loop (a request in flight is cut: its job fails at the next start, as it
        may have run), then put back what was claimed but never sent (claims a cancel cut off)."""
        self.quiesce()
        for retiring in self.retiring:
            retiring.cancel()
        self.workers.update({name: w for name, w in self.retired.items() if name not in self.workers})
        await self.loops.stop()
        if self.workers:
            try:
                await put_back_unsent(self.store, {name: w.sent_run for name, w in self.workers.items()})
            except GpuqError as exc:  # the next start fails them as orphans: loud, never lost
                log.error("claimed jobs not put back in their queues: %s", exc.message)
        await self.leases.release()  # the next router takes the nodes at once
        self.awake.release()
        if self.session is not None:
            await self.session.close()

    def node_infos(self) -> list[NodeInfo]:
        return [
            NodeInfo(
                rt.name,
                rt.config.rank,
                rt.config.roles,
                rt.config.model,
                rt.claimable,
                rt.installed,
                self.workers[name].idle and not self.workers[name].stopping and self.leases.holds(name),
            )
            for name, rt in self.nodes.items()
            if name not in self.removing
        ]

    async def submit(self, new: NewJob, actor: str) -> list[Row]:
        """Store a job (a critique: one per critique node) and start it as soon as it can: a node
        whose worker waits idle has its head claimed in the submit's own commit and handed to
        that worker after it (one fsync before the node's request, not two: bench/README, "claim
        at submit"); a node that is busy is woken for the job queued there. Every door submits
        through here."""
        nodes = self.node_infos()
        if new.endpoint is not None and not self.store.alone:
            # A front-door call's client waits on this router: it runs on a node this router drives.
            nodes = [n for n in nodes if self.leases.holds(n.name)]
            if not any(Kind.TASK in n.roles for n in nodes):
                raise await self._no_node_here()
        try:
            jobs = await self.store.submit(
                new,
                nodes,
                actor,
                self._hand_over,
                fair=self.settings.shares_fairly,
                max_waiting=self.settings.max_waiting.get(new.owner or ""),
            )
        except OverQuota as exc:
            await self.when_one_starts(exc)
            raise
        for i, job in enumerate(jobs):
            if job["state"] == JobState.QUEUED:  # (a job claimed in its submit went to its worker)
                jobs[i] = job = await self._preempt_for(job, call=new.endpoint is not None)
                self.wake(job["node"])  # only its node: the others have nothing new
        self.bus.publish("queue", {"submitted": [j["id"] for j in jobs]})
        return jobs

    async def batch_nodes(self) -> list[NodeInfo]:
        """Where a batch's lines may go: this router's nodes and, on PostgreSQL, every node another
        live router drives (no client waits on a line, so it may run on a node of any router; its
        driver hears of it by the job's NOTIFY). Another router's node is placed on by its row's
        health and models (the monitor of the router that lists it writes them)."""
        return [*self.node_infos(), *await self.nodes_elsewhere()]

    async def nodes_elsewhere(self) -> list[NodeInfo]:
        """The nodes other live routers drive that this router does not list (PostgreSQL; none
        on SQLite, whose router is alone)."""
        if self.store.alone:
            return []
        return [n for n in await self.store.nodes_driven_elsewhere(self.router.id) if n.name not in self.nodes]

    async def submit_batch(self, batch: NewBatch, lines: Sequence[NewLine], actor: str) -> Row:
        """Store a batch and queue its every line (gpuq/store/batch_create.py): placed on any node
        (no client waits on this router), fair share and the owner's max_waiting counting each
        line; idle nodes' heads claimed when it goes live go to their workers, busy nodes are
        woken (another router's, by the job's NOTIFY). A small batch is one commit; a large one
        goes in bounded pieces, its lines hidden until the last (`_create_in_pieces`)."""
        nodes = await self.batch_nodes()
        fair, max_waiting = self.settings.shares_fairly, self.settings.max_waiting.get(batch.owner or "")
        try:
            if batch.errors is not None or len(lines) <= PIECE_LINES:
                row = await self.store.create_batch(
                    batch, lines, nodes, actor, self._hand_over, fair=fair, max_waiting=max_waiting
                )
            else:
                row = await self._create_in_pieces(batch, lines, nodes, actor, fair, max_waiting)
        except OverQuota as exc:
            await self.when_one_starts(exc)
            raise
        self.wake()
        self.bus.publish("queue", {"batch": row["id"]})
        return row

    async def _create_in_pieces(
        self,
        batch: NewBatch,
        lines: Sequence[NewLine],
        nodes: list[NodeInfo],
        actor: str,
        fair: bool,
        max_waiting: int | None,
    ) -> Row:
        """A large batch in bounded writes, the writer free between them: begun `validating`,
        its lines added a piece at a time (hidden: no worker claims them), then made live in one
        short commit. A create that fails half-way is left to the batch upkeep, which drops it
        once it is no longer in `creating` (as it drops one whose router died)."""
        me = self.router.id
        self.creating.add(batch.id)  # before its first commit: the upkeep must never drop it meanwhile
        try:
            jobs = sum(1 for line in lines if line.job is not None)
            await self.store.begin_batch(batch, len(lines), jobs, me, max_waiting)
            placed: set[str] = set()
            for piece in pieces(lines):
                placed.update(await self.store.add_batch_lines(batch.id, me, piece, nodes, actor, fair))
            ready = [n for n in self.node_infos() if n.name in placed]  # idle now, not when it began
            return await self.store.open_batch(batch.id, me, ready, self._hand_over)
        finally:
            self.creating.discard(batch.id)

    async def when_one_starts(self, exc: OverQuota) -> None:
        """A refusal over max_waiting says when to ask again (Retry-After): when the first of the
        owner's waiting jobs is expected to start (eta.py), within [1 s, 1 h]; unknown (no past
        runs, a node down, the store not answering): the refusal's default."""
        try:
            found = await self.estimates()
        except GpuqError:
            return
        starts = [e.start_s for e in map(found.get, exc.waiting) if e is not None and e.start_s is not None]
        if starts:
            wait = min(max(math.ceil(min(starts) - time.time()), 1), QUOTA_WAIT_MAX_S)
            exc.retry_after_s = wait
            exc.message += f"; the first of them is expected to start in about {wait} s"

    # -- start estimates ----------------------------------------------------------------------

    async def estimates(
        self, rows: list[dict[str, Any]] | None = None, elsewhere: Sequence[NodeInfo] = ()
    ) -> dict[str, eta.Estimate]:
        """eta.estimate over the queues now: two reads (the plans, the recent run times). `rows`:
        the running and waiting jobs already read, in queue order (then only the run times are read).
        `elsewhere`: other routers' nodes to estimate too (a batch's lines run there), by their rows."""
        runtimes = self.nodes
        names = [*runtimes, *(n.name for n in elsewhere)]
        if rows is None:
            rows = await self.store.queue_plans(names, eta.DEPTH)
        durations = await self.store.recent_durations(
            {(r["node"], r["model"]) for r in rows}, set(names), eta.LAST_RUNS
        )
        history = eta.History()
        for d in durations:
            history.runs.setdefault((d["node"], d["model"]), []).append(d["seconds"])
            history.loads.setdefault((d["node"], d["model"]), []).append(float(d["load_s"]))
        running: dict[str, eta.Slot] = {}
        waiting: dict[str, list[eta.Slot]] = {name: [] for name in names}
        for r in rows:
            if r["state"] == JobState.RUNNING:
                running[r["node"]] = eta.Slot(r["id"], r["model"], parse_iso(r["started_at"]))
            elif r["node"] in waiting:
                waiting[r["node"]].append(eta.Slot(r["id"], r["model"], waiting_for=r["waiting_for"]))
        plans = [
            eta.NodePlan(
                name,
                running.get(name),
                tuple(waiting[name]),
                node_blocked(rt),
                keeps_warm=self.settings.unload_for(rt.config) == "when-idle",
                warm=rt.warm_model,
            )
            for name, rt in runtimes.items()
        ] + [
            eta.NodePlan(n.name, running.get(n.name), tuple(waiting[n.name]), None if n.up else down_words(n.name))
            for n in elsewhere
        ]
        return eta.estimate(plans, history, time.time())

    async def batch_estimates(self) -> dict[str, eta.Estimate]:
        """estimates() over every node a batch's lines may wait on: this router's and, on
        PostgreSQL, those other routers drive."""
        return await self.estimates(elsewhere=await self.nodes_elsewhere())

    async def _preempt_for(self, job: Row, call: bool) -> dict[str, Any]:
        """[router] interactive_preempts: a waiting interactive job interrupts a running batch
        job (as `gpuq preempt` does: to the head, the batch job back behind it, its run recorded
        preempted and its Ollama request aborted): on the node where it starts soonest
        (placement.preempt_elsewhere, moved there in the preempt's own transaction), else on
        its own. The store decides by the running job's lane in the same transaction
        (placement.preempts), so an interactive job is never interrupted, even by a race with
        the node's next claim. The job as it is now (where it waits)."""
        lane, enabled = job.get("lane", Lane.BATCH), self.settings.interactive_preempts
        if not preempts(lane, Lane.BATCH, enabled):  # (nothing to ask the store)
            return job
        reason = preempted_reason(job["id"], call)
        infos = [n for n in self.node_infos() if job.get("endpoint") is None or self.leases.holds(n.name)]
        interrupted = None
        for to in dict.fromkeys((await self._elsewhere_for(job, infos), None)):
            try:
                after, interrupted = await self.store.preempt(
                    job["id"],
                    "router",
                    rule=lambda running, before, done: preempts(lane, running, enabled, before, done),
                    reason=reason,
                    to=to,
                    nodes=infos,
                )
            except GpuqError as exc:  # the job stays first among the interactive ones: it runs next anyway
                log.warning(
                    "job=%s node=%s not preempting%s: %s",
                    job["id"],
                    job["node"],
                    f" on {to}" if to else "",
                    exc.message,
                )
                continue
            if interrupted is not None:
                if to is not None:
                    log.info(
                        "job=%s node=%s moved to %s: it starts sooner there (router.interactive_preempts)",
                        job["id"],
                        job["node"],
                        to,
                    )
                job = dict(job, node=after["node"], position=after["position"])
                break
        if interrupted is not None:
            self.abort(interrupted, f"preempted by {job['id']} (router.interactive_preempts)")
            log.info("job=%s node=%s state=queued reason=%r", interrupted.job_id, interrupted.node, reason)
        return job

    async def _elsewhere_for(self, job: Row, infos: list[NodeInfo]) -> str | None:
        """Another node where the job starts sooner (placement.preempt_elsewhere, read from the
        running jobs' lanes and models), or None."""
        try:
            rows = await self.store.lanes_in_play(job["id"])
        except GpuqError as exc:
            log.warning("job=%s node=%s not looking for another node: %s", job["id"], job["node"], exc.message)
            return None
        running = {r["node"]: (r["lane"], r["model"]) for r in rows if r["state"] == JobState.RUNNING}
        waiting = Counter(r["node"] for r in rows if r["state"] == JobState.QUEUED)
        views = node_views(infos, {name: NodeCounts(running=1) for name in running}, waiting, running)
        # A job that asked for no model runs the default model of the node it moves to.
        defaults = None if job.get("model_pinned", True) else {n.name: n.model for n in infos}
        return preempt_elsewhere(views, job["node"], job.get("model"), defaults)

    async def _no_node_here(self) -> GpuqError:
        """Why a front-door call cannot run on this router: the routers that drive task nodes."""
        alive = (await self.store.routers(self.settings.lease_s))["routers"]
        tasks = {c.name for c in self.settings.nodes if Kind.TASK in c.roles}
        there = [
            f"{r['public_url']} ({', '.join(sorted(tasks & set(r['nodes'])))})"
            for r in alive
            if r["id"] != self.router.id and tasks & set(r["nodes"])
        ]
        return GpuqError(
            "this router drives no task node now, and a front-door call runs on a node of the"
            " router its client called: "
            + (f"call {' or '.join(there)} instead" if there else "no router drives one (are the nodes up?)"),
            status=503,
        )

    def _hand_over(self, job: Row) -> None:
        """A job its submit claimed for an idle node's worker (Store.submit), to that worker."""
        self.workers[job["node"]].take(job)

    def wake(self, node: str | None = None) -> None:
        for name, worker in self.workers.items():
            if node is None or name == node:
                worker.wake.set()

    def elsewhere(self, change: dict[str, Any] | None) -> None:
        """A job another router changed ({id, node, state}; None: changes unknown, look at all):
        the node's worker looks for work, the pages and followers look again, and a job running
        here that another router took off its node (deleted, preempted, cleared) is aborted."""
        if change is None:
            self.wake()
        else:
            if change.get("node") in self.workers:
                self.wake(change["node"])
            for rt in self.runtimes():
                cur = rt.current
                if cur is not None and cur.job_id == change.get("id") and change.get("state") != JobState.RUNNING:
                    self.abort(Interrupted(cur.job_id, rt.name, cur.run_id), f"{change.get('state')} by another router")
            if change.get("state") in FINAL and self.calls.waits(change.get("id", "")):
                self.calls.ended([change["id"]], f"the job was {change['state']} on another router (see its page)")
        self.bus.publish("queue", {"elsewhere": change or True})

    def abort(self, interrupted: Interrupted | None, reason: str) -> None:
        """Stop a running job's Ollama request (closing it stops Ollama's generation)."""
        if interrupted is None:
            return
        worker = self.workers.get(interrupted.node) or self.retired.get(interrupted.node)
        if worker is not None:
            worker.abort(interrupted.run_id, reason)

    def cut(self, job_id: str, reason: str, actor: str = "router") -> bool:
        """A front-door call's client left: stop its job's request to its node now, before the
        job's cancel is committed, so the node frees at once (an editor abandons most of its
        autocompletes). Only while the job generates: once it is being recorded and finished,
        the cancel's commit comes first, as for any delete. True if it was cut."""
        for worker in (*self.workers.values(), *self.retired.values()):
            cur = worker.rt.current
            if cur is not None and cur.job_id == job_id and cur.generating:
                cur.abort_actor = actor
                worker.abort(cur.run_id, reason)
                return True
        return False

    def ended(self, job_ids: list[str], reason: str) -> None:
        """Jobs a person ended (deleted, cleared): their waiting front-door clients hear why."""
        self.calls.ended(job_ids, reason)

    def live(self, job_id: str) -> Current | None:
        """The running job's in-memory state (its output so far, one piece per token)."""
        for rt in self.runtimes():
            if rt.current is not None and rt.current.job_id == job_id:
                return rt.current
        return None

    def runtimes(self) -> list[NodeRuntime]:
        """Every node's runtime, a removed one still running its last job too."""
        return [*self.nodes.values(), *(w.rt for w in self.retired.values())]

    def _changed(self, **data: Any) -> None:
        # Jobs running now: a worker says "running" just before its job becomes its current one.
        running = {rt.name for rt in self.runtimes() if rt.current is not None}
        if data.get("state") == JobState.RUNNING and data.get("node"):
            running.add(data["node"])
        self.awake.update(len(running))
        self.bus.publish("queue", data)
