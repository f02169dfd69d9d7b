"""Where a job goes. Pure functions over a snapshot of the nodes: no I/O, no clock.

Placement chooses; it never picks a critique's parent's node for it. Refusing a critique on its
parent's node (asked for, moved there, retried there) is the schema's job alone (migration 010).
Placement refuses only when it has nothing to choose: a fan-out whose one critique node is the
parent's says so, quoting the guard's words (errors.GUARD_MESSAGE) as the reason, not judging."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .errors import GUARD_MESSAGE, Conflict, ModelMissing, UnknownNode
from .jobs import Lane, NodeCounts, NodeInfo, normalize_model

FIRST_FREE = "first free node by rank"
SHORTEST = "shortest queue; all busy"
# A job that names a model: only the nodes with it were candidates, and others may be idle.
SHORTEST_WITH_MODEL = "shortest queue of the nodes with this model; all busy"
ASKED = "asked"
FAN_OUT = "fan-out"
# An interactive job (a person waits for it): the node where it starts soonest.
SOONEST = "interactive: the shortest interactive backlog; all busy"
SOONEST_WITH_MODEL = "interactive: the shortest interactive backlog of the nodes with this model; all busy"


@dataclass(frozen=True)
class NodeView:
    name: str
    rank: int
    roles: tuple[str, ...]
    up: bool
    running: bool
    queued: int
    models: frozenset[str] | None = None  # installed (normalized), as last seen; None: unknown
    interactive: int = 0  # waiting interactive jobs (what an interactive job waits behind)
    running_lane: str | None = None  # the running job's lane and model, when known (preempt_elsewhere)
    running_model: str | None = None

    @property
    def free(self) -> bool:
        return self.up and not self.running and self.queued == 0

    def may_have(self, model: str | None) -> bool:
        """No model asked, the node's list not known yet, or the model is on its list."""
        return model is None or self.models is None or normalize_model(model) in self.models


def node_views(
    nodes: list[NodeInfo],
    counts: dict[str, NodeCounts],
    interactive: dict[str, int] | None = None,
    running: dict[str, tuple[str, str]] | None = None,
) -> list[NodeView]:
    """The nodes as placement sees them: `counts` their running and queued jobs, `interactive`
    their waiting interactive jobs, `running` each running job's lane and model."""
    interactive, running = interactive or {}, running or {}
    return [
        NodeView(
            n.name,
            n.rank,
            tuple(n.roles),
            n.up,
            counts.get(n.name, NodeCounts()).running > 0,
            counts.get(n.name, NodeCounts()).queued,
            n.models,
            interactive.get(n.name, 0),
            *running.get(n.name, (None, None)),
        )
        for n in nodes
    ]


@dataclass(frozen=True)
class Placement:
    node: str
    reason: str


def _by_rank(nodes: list[NodeView]) -> list[NodeView]:
    return sorted(nodes, key=lambda n: n.rank)


def _listed(node: NodeView) -> str:
    return ", ".join(sorted(node.models or ())) or "nothing"


def _not_installed(model: str, node: NodeView) -> ModelMissing:
    return ModelMissing(
        f"model '{model}' is not installed on node {node.name} (its Ollama lists: "
        f"{_listed(node)}); pull it there or choose another model",
        model,
    )


def role_of(kind: str) -> str:
    """The node role that takes a job of this kind: an embedding runs where tasks run."""
    return "critique" if kind == "critique" else "task"


def _check_role(node: NodeView, role: str) -> None:
    """The role rule: a node takes only the jobs of its roles."""
    if role not in node.roles:
        raise Conflict(f"node '{node.name}' does not take {role} jobs (its roles: {', '.join(node.roles)})")


def _named(nodes: list[NodeView], name: str) -> NodeView:
    node = next((n for n in nodes if n.name == name), None)
    if node is None:
        raise UnknownNode(name, (n.name for n in nodes))
    return node


def _asked(nodes: list[NodeView], name: str, role: str, model: str | None = None) -> NodeView:
    node = _named(nodes, name)
    _check_role(node, role)
    if not node.may_have(model):
        raise _not_installed(model, node)  # type: ignore[arg-type]
    return node


def _having(candidates: list[NodeView], model: str | None, role: str) -> list[NodeView]:
    """The candidates whose Ollama lists the model (or has not been heard from yet); a 422
    naming what each one has when none does."""
    having = [n for n in candidates if n.may_have(model)]
    if candidates and not having:
        if len(candidates) == 1:
            raise _not_installed(model, candidates[0])  # type: ignore[arg-type]
        listed = "; ".join(f"{n.name}: {_listed(n)}" for n in candidates)
        raise ModelMissing(
            f"model '{model}' is not installed on any {role} node ({listed}); pull it on one or choose another model",
            model,  # type: ignore[arg-type]
        )
    return having


def place_task(
    nodes: list[NodeView], asked: str | None = None, model: str | None = None, lane: str = Lane.BATCH
) -> Placement:
    """The first free task node by rank; else the shortest queue (up nodes first), ties by rank.
    A job that names a model goes only to the nodes whose Ollama lists it. An interactive job
    waits only behind the running job and the interactive jobs (it enters ahead of every batch
    job): after the free nodes, the shortest interactive backlog, then an idle node, then rank."""
    if asked is not None:
        return Placement(_asked(nodes, asked, "task", model).name, ASKED)
    candidates = _having(_by_rank([n for n in nodes if "task" in n.roles]), model, "task")
    if not candidates:
        raise Conflict("no node takes task jobs")
    free = [n for n in candidates if n.free]
    if free:
        return Placement(free[0].name, FIRST_FREE)
    every_task_node = len(candidates) == sum("task" in n.roles for n in nodes)
    if lane == Lane.INTERACTIVE:
        best = min(candidates, key=lambda n: (not n.up, n.interactive, n.running, n.queued, n.rank))
        return Placement(best.name, SOONEST if every_task_node else SOONEST_WITH_MODEL)
    best = min(candidates, key=lambda n: (not n.up, n.queued, n.rank))
    return Placement(best.name, SHORTEST if every_task_node else SHORTEST_WITH_MODEL)


def place_batch(nodes: list[NodeView], models: list[str | None]) -> list[Placement | ModelMissing]:
    """place_task for many batch-lane jobs in a row (a batch's lines), each seeing the queues as
    the ones before it left them: the same choice, made without asking each time which nodes have
    its model. A job whose model no task node has gets place_task's ModelMissing instead."""
    views = {n.name: n for n in nodes}
    task_nodes = [n for n in nodes if "task" in n.roles]
    if not task_nodes:
        raise Conflict("no node takes task jobs")
    having: dict[str | None, list[str] | ModelMissing] = {}
    out: list[Placement | ModelMissing] = []
    for model in models:
        if model not in having:
            try:
                having[model] = [n.name for n in _having(_by_rank(task_nodes), model, "task")]
            except ModelMissing as exc:
                having[model] = exc
        names = having[model]
        if isinstance(names, ModelMissing):
            out.append(names)
            continue
        candidates = [views[name] for name in names]
        free = next((n for n in candidates if n.free), None)
        if free is not None:
            chosen, reason = free, FIRST_FREE
        else:
            chosen = min(candidates, key=lambda n: (not n.up, n.queued, n.rank))
            reason = SHORTEST if len(candidates) == len(task_nodes) else SHORTEST_WITH_MODEL
        views[chosen.name] = replace(chosen, queued=chosen.queued + 1)
        out.append(Placement(chosen.name, reason))
    return out


# A batch job interrupted this many times runs to its end: the most of its work a stream of
# interactive calls may throw away ([router] interactive_preempts), so it is never starved.
MAX_PREEMPTIONS = 2


def preempts(
    lane: str, running_lane: str | None, enabled: bool, preempted_before: int = 0, work_done: bool = False
) -> bool:
    """May a new waiting job interrupt its node's running job ([router] interactive_preempts)?
    Only an interactive job, only a running batch job (never an interactive one, never when the
    node runs nothing) interrupted fewer than MAX_PREEMPTIONS times before, and still
    generating (one whose answer is whole only waits for its model to leave VRAM: interrupting
    it would throw the whole answer away to save nothing), only with the setting on."""
    return (
        enabled
        and lane == Lane.INTERACTIVE
        and running_lane == Lane.BATCH
        and preempted_before < MAX_PREEMPTIONS
        and not work_done
    )


def preempt_elsewhere(
    nodes: list[NodeView], here: str, model: str | None, defaults: dict[str, str] | None = None
) -> str | None:
    """[router] interactive_preempts: where an interactive job placed on `here` starts soonest,
    when that is another node; None: it stays (and preempts here if it can). `model`: the model
    it asked for; `defaults` instead, for a job that asked for none (it runs the default model
    of the node it is on): each node's default model.

    An interactive job waits for a running interactive job (never interrupted); a running batch
    job of another model costs it that model's unload and its own load. A node running a batch
    job of the job's own model costs neither (under when-idle the model stays for it). So:

    - targets: up, take tasks, may have the model, no interactive job waiting (the job itself
      not counted), running a batch job (its running lane known);
    - a target whose batch job runs the job's own model first, then by rank;
    - from a node running an interactive job: moved to such a warm target, or to any target
      when the running interactive job has another model (the job loads its model either way);
      one of the same model ends into a warm model, and waiting for it is no worse;
    - from a node running a batch job of another model: to a warm target only (a load anywhere
      else too); from one running a batch job of its own model, or nothing: never.

    In the replayed day this halves an interactive call's p95 wait while batch work is queued
    (bench/README: the replayed day's interactive wait while batch work is queued)."""

    def wanted(n: NodeView) -> str | None:
        return defaults.get(n.name) if defaults is not None else model

    def warm(n: NodeView) -> bool:
        want = wanted(n)
        return (
            want is not None
            and n.running_model is not None
            and normalize_model(n.running_model) == normalize_model(want)
        )

    node = next((n for n in nodes if n.name == here), None)
    if node is None or wanted(node) is None or node.running_lane not in (Lane.INTERACTIVE, Lane.BATCH):
        return None
    if node.running_lane == Lane.BATCH and warm(node):
        return None
    targets = [
        n
        for n in nodes
        if n.name != here
        and n.up
        and "task" in n.roles
        and wanted(n) is not None
        and n.may_have(wanted(n))
        and not n.interactive
        and n.running_lane == Lane.BATCH
    ]
    ready = [n for n in targets if warm(n)]
    if ready:
        return _by_rank(ready)[0].name
    if targets and node.running_lane == Lane.INTERACTIVE and not warm(node):
        return _by_rank(targets)[0].name
    return None


def preempted_reason(job_id: str, call: bool) -> str:
    """Why a batch job went back in its queue: the event on it and on its run."""
    return f"preempted for interactive {'call' if call else 'job'} {job_id} (router.interactive_preempts)"


def place_critique(
    nodes: list[NodeView], parent_node: str | None = None, asked: str | None = None, model: str | None = None
) -> list[Placement]:
    """One placement per critique node (fan-out), never choosing the parent task's node. A
    critique that names a model fans out to the critique nodes whose Ollama lists it. A node
    asked for is taken as asked (the schema refuses the parent's node)."""
    if asked is not None:
        return [Placement(_asked(nodes, asked, "critique", model).name, ASKED)]
    targets = [n for n in _by_rank(nodes) if "critique" in n.roles and n.name != parent_node]
    targets = _having(targets, model, "critique")
    if not targets:
        if parent_node is not None:
            raise Conflict(
                f"no critique node is left for the fan-out: the only one is '{parent_node}', "
                f"the parent task's node, and {GUARD_MESSAGE}"
            )
        raise Conflict("no node takes critique jobs")
    return [Placement(n.name, FAN_OUT) for n in targets]


def check_move(kind: str, nodes: list[NodeView], target_name: str, model: str | None = None) -> None:
    """May a queued job of this kind (that asked for `model`) move to that node's queue? A node
    whose Ollama does not list the model refuses it (409: the job stays where it is)."""
    target = _named(nodes, target_name)
    _check_role(target, role_of(kind))
    if not target.may_have(model):
        raise Conflict(
            f"model '{model}' is not installed on node {target.name} (its Ollama lists: "
            f"{_listed(target)}); the job stays where it is"
        )


def position_between(before: int | None, after: int | None, gap: int) -> int | None:
    """An integer strictly between two neighbours' positions; None when no gap is left."""
    if before is None and after is None:
        return gap
    if before is None:
        return after - gap  # type: ignore[operator]
    if after is None:
        return before + gap
    if after - before < 2:
        return None
    return (before + after) // 2


@dataclass(frozen=True)
class Entry:
    """Where a new job enters its node's queue: `index` (0-based) among the jobs waiting there;
    `reason`: the decision in words when it is not simply the tail (its event says it)."""

    index: int
    reason: str | None = None


def _who(owner: str | None) -> str:
    return owner if owner is not None else "anonymous"


def reads_queue(lane: str, fair: bool) -> bool:
    """Does where a job enters depend on the jobs waiting there? Not for a batch job without fair
    share: it goes to the tail (its store need not read the queue)."""
    return lane == Lane.INTERACTIVE or fair


def entry(waiting: Sequence[tuple[str, str | None]], lane: str, owner: str | None, fair: bool) -> Entry:
    """Where a new job of `lane` and `owner` enters a node's queue, given its waiting jobs in
    order as (lane, owner). Never moves a waiting job: it only chooses the gap to enter.

    An interactive job enters right after the last waiting interactive job (a person's manual
    order among them stands), or at the head. A batch job enters at the tail; with fair share, at
    the place that interleaves users round-robin by submit order: a user's k-th waiting batch job
    goes before the first batch job that is some user's (k+1)-th, and never ahead of a waiting
    interactive job."""
    return entries(waiting, lane, owner, fair)[0]


def entries(
    waiting: Sequence[tuple[str, str | None]], lane: str, owner: str | None, fair: bool, n: int = 1
) -> list[Entry]:
    """Where `n` jobs of one `lane` and `owner` enter a node's queue one after another (a batch's
    lines), each where `entry` would put it with the ones before it already waiting. Each index
    counts among `waiting` alone: the jobs entering at one index go there in their order, and
    the position a reason names counts the ones entered before it."""
    last_interactive = max((i for i, (ln, _) in enumerate(waiting) if ln == Lane.INTERACTIVE), default=-1)
    if lane == Lane.INTERACTIVE:
        index = last_interactive + 1
        behind = sum(ln == Lane.BATCH for ln, _ in waiting[index:])
        if not behind:
            return [Entry(index)] * n
        jobs = f"job{'s' if behind != 1 else ''}"
        return [
            Entry(index, f"interactive: entered at position {index + 1 + j}, ahead of {behind} waiting batch {jobs}")
            for j in range(n)
        ]
    if not fair:
        return [Entry(len(waiting))] * n
    # first[m]: the index of the first waiting batch job that is its owner's m-th. The owner's k-th
    # enters before first[k + 1]. The jobs entering leave it be: they count only as their owner's,
    # whose next one looks for a (k + 2)-th, and it never falls as k rises.
    seen: dict[str | None, int] = {}
    first: dict[int, int] = {}
    for i, (ln, o) in enumerate(waiting):
        if ln == Lane.BATCH:
            seen[o] = seen.get(o, 0) + 1
            first.setdefault(seen[o], i)
    others = ", ".join(sorted({_who(o) for o in seen if o != owner}))
    out = []
    for j in range(n):
        k = seen.get(owner, 0) + 1 + j
        index = max(first.get(k + 1, len(waiting)), last_interactive + 1)
        if index == len(waiting):
            out.append(Entry(index))
        else:
            out.append(Entry(index, f"entered at position {index + 1 + j}: fair share with {others}"))
    return out
