"""When will a job start? Pure estimates over a snapshot of the queues: no I/O, no clock.

A job's expected run time on its node is measured from the node's last 20 done runs of the
job's model, else of the node's last 20 done runs of any model, else unknown: the median of
those runs' times without their loads, plus the node's measured load time (gpuq/speed.py: the
longest load among them) when the job will find its model cold. gpuq unloads a model after
each job, so a job is cold unless the job just before it on the node runs the same model and
the node keeps it loaded between them (unload = "when-idle"), or, first on an idle node, its
model is the one the node holds warm now. A running job is counted cold (whether it loaded
is not known here); a front-door call's own keep_alive is not known either (counted cold).
The running job ends at its start plus its expected time (never before now: an overdue job
ends "any moment"). A waiting job starts when every job ahead of it on its node has run, held
critiques included (each counted in its place: it may run there once its parent is done); a
held critique itself starts no earlier than its parent's estimated finish. A node that is
down or has a model stuck in VRAM starts nothing: its waiting jobs get no estimate, with the
reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median

from .jobs import normalize_model

LAST_RUNS = 20  # how many recent done runs the median is taken over
DEPTH = 1000  # waiting jobs per node that get an estimate; deeper ones say so


@dataclass(frozen=True)
class Slot:
    """One job of a node's plan."""

    id: str
    model: str
    started_s: float | None = None  # the running job: when its run started
    waiting_for: str | None = None  # a held critique: the parent task it waits for


@dataclass(frozen=True)
class NodePlan:
    name: str
    running: Slot | None = None
    waiting: tuple[Slot, ...] = ()  # in queue order
    blocked: str | None = None  # why nothing starts on the node now (down, VRAM stuck)
    keeps_warm: bool = False  # unload = "when-idle": back-to-back jobs of one model load it once
    warm: str | None = None  # the model it holds loaded now (an idle node's warm model)


@dataclass(frozen=True)
class Estimate:
    start_s: float | None  # None: unknown (see reason); a running job's is its real start
    finish_s: float | None
    reason: str | None = None  # why a time is unknown


@dataclass(frozen=True)
class History:
    """Recent done run times in seconds, newest first: per (node, model) and per (node, None);
    `loads`: each of those runs' load time, in the same order (missing: no load measured)."""

    runs: dict[tuple[str, str | None], list[float]] = field(default_factory=dict)
    loads: dict[tuple[str, str | None], list[float]] = field(default_factory=dict)
    # (node, model, cold) -> its expected run time, worked out once: a queue repeats its models
    _expected: dict[tuple[str, str, bool], float | None] = field(default_factory=dict, compare=False, repr=False)

    def expected_s(self, node: str, model: str, cold: bool = True) -> float | None:
        if (node, model, cold) not in self._expected:
            found = None
            for key in ((node, model), (node, None)):
                times = self.runs.get(key, [])[:LAST_RUNS]
                if times:
                    loads = (self.loads.get(key, []) + [0.0] * len(times))[: len(times)]
                    found = median(max(t - load, 0.0) for t, load in zip(times, loads))
                    found += max(loads) if cold else 0.0
                    break
            self._expected[node, model, cold] = found
        return self._expected[node, model, cold]


def warm_for(plan: NodePlan, before: str | None, model: str, first: bool) -> bool:
    """Does a waiting job find its model loaded: the job before it (`before`: its model; first
    on an idle node, the model held warm) runs the same model, and the node keeps it?"""
    if before is None or normalize_model(before) != normalize_model(model):
        return False
    return plan.keeps_warm or (first and plan.running is None)


def estimate(plans: list[NodePlan], history: History, now: float) -> dict[str, Estimate]:
    """An estimate for every job in `plans`, keyed by job id."""
    out: dict[str, Estimate] = {}
    for plan in plans:
        out.update(_node_estimates(plan, history, now))
    for plan in plans:  # a held critique waits for its parent, wherever the parent runs
        for slot in plan.waiting:
            if slot.waiting_for is not None and slot.id in out:
                out[slot.id] = _after_parent(out[slot.id], out.get(slot.waiting_for), slot, plan, history)
    return out


def _node_estimates(plan: NodePlan, history: History, now: float) -> dict[str, Estimate]:
    out: dict[str, Estimate] = {}
    free_at: float | None = now  # when the node is free for the next job
    why = None  # why free_at is unknown
    if plan.running is not None:
        run = plan.running
        expected = history.expected_s(plan.name, run.model)
        if expected is None:
            out[run.id] = Estimate(run.started_s, None, no_runs(plan.name))
            free_at, why = None, f"no finished run on {plan.name} yet to time the running job {run.id}"
        else:
            free_at = max((run.started_s or now) + expected, now)
            out[run.id] = Estimate(run.started_s, free_at)
    if plan.blocked is not None:
        free_at, why = None, plan.blocked
    before = plan.running.model if plan.running is not None else plan.warm
    for i, slot in enumerate(plan.waiting):
        expected = history.expected_s(plan.name, slot.model, not warm_for(plan, before, slot.model, i == 0))
        before = slot.model
        if free_at is None:
            out[slot.id] = Estimate(None, None, why)
            continue
        if expected is None:
            out[slot.id] = Estimate(free_at, None, no_runs(plan.name))
            free_at, why = None, f"no finished run on {plan.name} yet to time job {slot.id} ahead of it"
            continue
        out[slot.id] = Estimate(free_at, free_at + expected)
        free_at += expected
    return out


def _after_parent(own: Estimate, parent: Estimate | None, slot: Slot, plan: NodePlan, history: History) -> Estimate:
    if own.start_s is None:
        return own
    if parent is None or parent.finish_s is None:
        why = parent.reason if parent is not None and parent.reason else "its finish is not known"
        return Estimate(None, None, f"waits for parent {slot.waiting_for}: {why}")
    if parent.finish_s <= own.start_s:
        return own
    expected = history.expected_s(plan.name, slot.model)
    return Estimate(parent.finish_s, None if expected is None else parent.finish_s + expected, own.reason)


def no_runs(node: str) -> str:
    return f"no finished run on {node} yet: its run time is not known"


def batch_finish(found: dict[str, Estimate], active: list[str]) -> tuple[float | None, str | None]:
    """When a batch's last waiting or running line is expected to end: the latest finish of its
    active jobs; None with the reason when one of them has no estimate (too deep in its queue,
    no past runs, its node down), or none is active."""
    if not active:
        return None, "no line waits or runs"
    finishes = []
    for job_id in active:
        estimate = found.get(job_id)
        if estimate is None:
            return None, f"more than {DEPTH} jobs wait ahead on a node"
        if estimate.finish_s is None:
            return None, estimate.reason or "unknown"
        finishes.append(estimate.finish_s)
    return max(finishes), None
