"""Summaries and the one table: median, p95 and min-max over repeated runs."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass
class Metric:
    """One row of the table.

    A throughput (`kind="rate"`) has one value per repeated run. A latency (`kind="ms"`) has
    many samples per run: median and p95 are over all samples pooled, min-max is the range of
    the per-run medians, so a noisy run shows up as a wide range rather than a shifted median.

    The p95 column is always the pessimistic end: the 5th percentile where higher is better
    (throughputs, most ratios), the 95th where lower is better (latencies, sizes). A ratio must
    say which it is (`better`): "same run / peer" is better high, "100,000 / 100 history" low."""

    key: str
    label: str
    unit: str
    kind: str = "rate"  # rate | ms | ratio | mb | count
    runs: list[list[float]] = field(default_factory=list)
    target: str = ""
    note: str = ""
    met: bool | None = None
    better: str = ""  # higher | lower; rates default to higher, ms and mb to lower, ratios must say

    def __post_init__(self) -> None:
        if not self.better:
            self.better = {"rate": "higher", "ms": "lower", "mb": "lower", "count": "lower"}.get(self.kind, "")
        if self.better not in ("higher", "lower"):
            raise ValueError(f"metric {self.key}: say whether higher or lower is better (better=...)")

    def add_run(self, samples: list[float] | float) -> None:
        self.runs.append(list(samples) if isinstance(samples, list) else [float(samples)])

    @property
    def pooled(self) -> list[float]:
        return [v for run in self.runs for v in run]

    @property
    def per_run(self) -> list[float]:
        return [statistics.median(r) for r in self.runs if r]

    def summary(self) -> dict:
        pooled = self.pooled
        if not pooled:
            return {"median": None, "p95": None, "min": None, "max": None, "runs": 0, "samples": 0}
        per_run = self.per_run
        if self.kind == "ms":
            low, high = min(per_run), max(per_run)
        else:
            low, high = min(pooled), max(pooled)
        p95 = percentile(pooled, 5 if self.better == "higher" else 95)  # the pessimistic end
        return {
            "median": statistics.median(pooled),
            "p95": p95,
            "min": low,
            "max": high,
            "runs": len(self.runs),
            "samples": len(pooled),
        }

    def as_json(self) -> dict:
        return {
            "key": self.key,
            "label": self.label,
            "unit": self.unit,
            "kind": self.kind,
            "better": self.better,
            **self.summary(),
            "target": self.target,
            "met": self.met,
            "note": self.note,
            "values": self.runs if self.kind != "ms" else None,
            "per_run_median": self.per_run,
        }


def fmt(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "rate":
        return f"{value:,.0f}"
    if kind == "ratio":
        return f"{value:.2f}x"
    if kind == "mb":
        return f"{value:.1f}"
    if kind == "count":
        return f"{value:,.2f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def table(metrics: list[Metric]) -> str:
    """A Markdown table, so it pastes straight into bench/README.md."""
    head = ["measure", "unit", "median", "p95", "min-max", "runs", "target", "met"]
    rows = [head, ["---"] * len(head)]
    for m in metrics:
        s = m.summary()
        span = "-" if s["min"] is None else f"{fmt(s['min'], m.kind)}-{fmt(s['max'], m.kind)}"
        met = "" if m.met is None else ("yes" if m.met else "NO")
        rows.append(
            [m.label, m.unit, fmt(s["median"], m.kind), fmt(s["p95"], m.kind), span, str(s["runs"]), m.target, met]
        )
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)
