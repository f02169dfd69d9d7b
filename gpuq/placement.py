"""Where a job goes. Pure functions over a snapshot of the nodes: no I/O, no clock."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import Conflict, GuardRefused, Unprocessable

FIRST_FREE = "first free node by rank"
SHORTEST = "shortest queue; all busy"
ASKED = "asked"
FAN_OUT = "fan-out"


@dataclass(frozen=True)
class NodeView:
    name: str
    rank: int
    roles: tuple[str, ...]
    up: bool
    running: bool
    queued: int

    @property
    def free(self) -> bool:
        return self.up and not self.running and self.queued == 0


@dataclass(frozen=True)
class Placement:
    node: str
    reason: str


def _by_rank(nodes: list[NodeView]) -> list[NodeView]:
    return sorted(nodes, key=lambda n: n.rank)


def _asked(nodes: list[NodeView], name: str, role: str) -> NodeView:
    node = next((n for n in nodes if n.name == name), None)
    if node is None:
        raise Unprocessable(f"unknown node '{name}'")
    if role not in node.roles:
        raise Conflict(f"node '{name}' does not take {role} jobs (its roles: {', '.join(node.roles)})")
    return node


def place_task(nodes: list[NodeView], asked: str | None = None) -> Placement:
    """The first free task node by rank; else the shortest queue (up nodes first), ties by rank."""
    if asked is not None:
        return Placement(_asked(nodes, asked, "task").name, ASKED)
    candidates = _by_rank([n for n in nodes if "task" in n.roles])
    if not candidates:
        raise Conflict("no node takes task jobs")
    free = [n for n in candidates if n.free]
    if free:
        return Placement(free[0].name, FIRST_FREE)
    best = min(candidates, key=lambda n: (not n.up, n.queued, n.rank))
    return Placement(best.name, SHORTEST)


def place_critique(
    nodes: list[NodeView], parent_node: str | None = None, asked: str | None = None
) -> list[Placement]:
    """One placement per critique node (fan-out), never on the parent task's node."""
    if asked is not None:
        node = _asked(nodes, asked, "critique")
        if node.name == parent_node:
            raise GuardRefused()
        return [Placement(node.name, ASKED)]
    targets = [n for n in _by_rank(nodes) if "critique" in n.roles and n.name != parent_node]
    if not targets:
        if parent_node is not None:
            raise Conflict(
                f"no critique node is left for the fan-out: the only one is '{parent_node}', "
                "the parent task's node, and a critique never runs on its parent task's node"
            )
        raise Conflict("no node takes critique jobs")
    return [Placement(n.name, FAN_OUT) for n in targets]


def check_move(kind: str, target: NodeView | None, target_name: str, parent_node: str | None) -> None:
    """May a queued job of this kind move to that node's queue?"""
    if target is None:
        raise Unprocessable(f"unknown node '{target_name}'")
    if kind not in target.roles:
        raise Conflict(f"node '{target.name}' does not take {kind} jobs (its roles: {', '.join(target.roles)})")
    if kind == "critique" and target.name == parent_node:
        raise GuardRefused()


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
