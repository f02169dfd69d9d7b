"""The wiring of the nodes: for each one a health monitor (gpuq/node/monitor.py) and a worker
(gpuq/node/worker.py), started and stopped together, woken by submits, told of aborts."""

from __future__ import annotations

import logging

import aiohttp

from ..awake import Awake
from ..bus import Bus
from ..config import Settings
from ..errors import GpuqError
from ..models import JobState, parse_iso
from .calls import Calls, NoCalls
from .monitor import NodeMonitor
from .runtime import Current, NodeRuntime
from .ollama import OllamaClient
from ..store import Interrupted, NewJob, NodeInfo, Row, Store
from .supervise import Loops
from .worker import Worker, keep_big_blocks_apart, put_back_unsent

__all__ = ["Dispatcher", "NodeRuntime"]

log = logging.getLogger("gpuq")


class Dispatcher:
    def __init__(self, settings: Settings, store: Store, bus: Bus, calls: Calls | None = None):
        self.settings = settings
        self.store = store
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

    async def start(self, stuck: list[dict] | None = None) -> None:
        """`stuck`: the models a previous router saw stuck in VRAM (open vram_stuck alerts, with
        node, model, message, since, job_id): each node stays flagged until /api/ps shows its
        model gone, as it would have without the restart."""
        keep_big_blocks_apart()  # a node's big reply must not leave the router's heap swollen
        self.session = aiohttp.ClientSession()
        for cfg in self.settings.nodes:
            client = OllamaClient(cfg.url, self.session, name=cfg.name,
                                  connect_timeout_s=self.settings.connect_timeout_s,
                                  stall_timeout_s=self.settings.stall_timeout_s,
                                  load_timeout_s=self.settings.load_timeout_s,
                                  max_reply_bytes=self.settings.max_reply_bytes)
            rt = self.nodes[cfg.name] = NodeRuntime(cfg, client)
            monitor = self.monitors[cfg.name] = NodeMonitor(rt, self.store, self.settings.health_interval_s,
                                                            self._changed, lambda name=cfg.name: self.wake(name))
            self.workers[cfg.name] = Worker(rt, monitor, self.settings, self.store, self.bus, self.calls,
                                            self._changed, self.wake)
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
            self.workers[name].orphan_models = [o["model"] for o in orphans if o["node"] == name]
            rt.loops = [self.loops.start("health loop", self.monitors[name].run, name),
                        self.loops.start("worker", self.workers[name].run, name)]

    def quiesce(self) -> None:
        """The router is told to stop: no worker claims or sends anything new from now on."""
        for worker in self.workers.values():
            worker.stopping = True

    async def stop(self) -> None:
        """Stop every loop (a request in flight is cut: its job fails at the next start, as it
        may have run), then put back what was claimed but never sent (claims a cancel cut off)."""
        self.quiesce()
        await self.loops.stop()
        if self.workers:
            try:
                await put_back_unsent(self.store, {name: w.sent_run for name, w in self.workers.items()})
            except GpuqError as exc:  # the next start fails them as orphans: loud, never lost
                log.error("claimed jobs not put back in their queues: %s", exc.message)
        self.awake.release()
        if self.session is not None:
            await self.session.close()

    def node_infos(self) -> list[NodeInfo]:
        return [NodeInfo(rt.name, rt.config.rank, rt.config.roles, rt.config.model, rt.claimable, rt.installed,
                         self.workers[name].idle and not self.workers[name].stopping)
                for name, rt in self.nodes.items()]

    async def submit(self, new: NewJob, actor: str) -> list[Row]:
        """Store a job (a critique: one per critique node) and start it as soon as it can: a node
        whose worker waits idle has its head claimed in the submit's own commit and handed to
        that worker after it (one fsync before the node's request, not two: bench/README, "claim
        at submit"); a node that is busy is woken for the job queued there. Every door submits
        through here."""
        jobs = await self.store.submit(new, self.node_infos(), actor, self._hand_over)
        for job in jobs:
            if job["state"] == JobState.QUEUED:  # (a job claimed in its submit went to its worker)
                self.wake(job["node"])  # only its node: the others have nothing new
        self.bus.publish("queue", {"submitted": [j["id"] for j in jobs]})
        return jobs

    def _hand_over(self, job: dict) -> None:
        """A job its submit claimed for an idle node's worker (Store.submit), to that worker."""
        self.workers[job["node"]].take(job)

    def wake(self, node: str | None = None) -> None:
        for name, worker in self.workers.items():
            if node is None or name == node:
                worker.wake.set()

    def abort(self, interrupted: Interrupted | None, reason: str) -> None:
        """Stop a running job's Ollama request (closing it stops Ollama's generation)."""
        worker = self.workers.get(interrupted.node) if interrupted is not None else None
        if worker is not None:
            worker.abort(interrupted.run_id, reason)

    def ended(self, job_ids: list[str], reason: str) -> None:
        """Jobs a person ended (deleted, cleared): their waiting front-door clients hear why."""
        self.calls.ended(job_ids, reason)

    def live(self, job_id: str) -> Current | None:
        """The running job's in-memory state (its output so far, one piece per token)."""
        for rt in self.nodes.values():
            if rt.current is not None and rt.current.job_id == job_id:
                return rt.current
        return None

    def _changed(self, **data) -> None:
        # Jobs running now: a worker says "running" just before its job becomes its current one.
        running = {name for name, rt in self.nodes.items() if rt.current is not None}
        if data.get("state") == JobState.RUNNING and data.get("node"):
            running.add(data["node"])
        self.awake.update(len(running))
        self.bus.publish("queue", data)
