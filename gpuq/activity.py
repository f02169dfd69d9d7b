"""Is the GPU ever idle? Each node's busy spans over a recent window, from its runs: pure, so
the page's strip and its numbers are tested without a clock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .jobs import JobState, parse_iso


@dataclass(frozen=True)
class NodeActivity:
    busy: list[tuple[float, float]]  # merged spans inside the window, oldest first
    busy_s: float
    finished: int  # runs that ended done or failed inside the window


def activity(runs: list[dict[str, Any]], start: float, end: float) -> dict[str, NodeActivity]:
    """Per node: when a run occupied it between `start` and `end` (a running run up to `end`),
    merged into spans, and how many runs finished there. `runs` are rows of node, state,
    started_at, finished_at (ISO; finished_at None while running)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    finished: dict[str, int] = {}
    for r in runs:
        began = parse_iso(r["started_at"])
        ended = parse_iso(r["finished_at"]) if r["finished_at"] else end
        if ended < start or began > end:
            continue
        spans.setdefault(r["node"], []).append((max(began, start), min(ended, end)))
        if r["state"] in (JobState.DONE, JobState.FAILED) and r["finished_at"] and start <= ended <= end:
            finished[r["node"]] = finished.get(r["node"], 0) + 1
    out = {}
    for node in spans.keys() | finished.keys():
        merged = merge(spans.get(node, []))
        out[node] = NodeActivity(merged, sum(b - a for a, b in merged), finished.get(node, 0))
    return out


def merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
