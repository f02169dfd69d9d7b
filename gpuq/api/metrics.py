"""GET /metrics for Prometheus, built with prometheus_client (its metric families and its
exposition). Never a prompt or an output.

Gauges come from the queue and the nodes at each scrape. The totals of finished jobs (counts,
tokens, duration and wait histograms) are summed by SQL over the store's event log, from the
event after the last one counted: the first scrape after a start sums the whole history in one
grouped query, later ones only what finished since. So they survive restarts and stay cheap."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from ..jobs import NodeCounts, parse_iso
from ..node.runtime import NodeRuntime
from ..store import Row, Store
from ..store.batches import LINE_STATES

BATCH_STATUSES = ("in_progress", "cancelling", "completed", "failed", "cancelled", "expired")

DURATION_BUCKETS_S = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
WAIT_BUCKETS_S = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 1800, 3600, 7200, 14400)


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last is +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * (len(self.bounds) + 1)

    def add(self, le_counts: list[int], n: int, total: float) -> None:
        """Add observations given as cumulative counts per bound (as SQL sums them)."""
        below = 0
        for i, cumulative in enumerate(le_counts):
            self.counts[i] += cumulative - below
            below = cumulative
        self.counts[-1] += n - below
        self.n += n
        self.total += total

    def buckets(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


@dataclass
class Snapshot:
    """What a scrape reports about now."""

    nodes: list[NodeRuntime] = field(default_factory=list)  # the dispatcher's
    active: dict[str, NodeCounts] = field(default_factory=dict)
    stale_heads: int = 0
    storage: dict[str, Any] | None = None  # StorageWatch.json()
    backup: dict[str, Any] = field(default_factory=dict)  # Backups.json()
    batches: dict[str, int] = field(default_factory=dict)  # by status
    batch_lines: dict[str, int] = field(default_factory=dict)  # the open batches' lines, by state
    retention: dict[str, Any] = field(default_factory=dict)  # RetentionReport.json()


class Metrics:
    def __init__(self) -> None:
        self.cursor = 0  # the last event id counted
        self.finished: dict[tuple[str, str, str], int] = defaultdict(int)
        self.tokens: dict[tuple[str, str], int] = defaultdict(int)
        # Per user (owner "" for jobs of no user): users are few and configured, so the labels stay few.
        self.by_owner: dict[tuple[str, str], int] = defaultdict(int)
        self.tokens_by_owner: dict[str, int] = defaultdict(int)
        self.duration: dict[tuple[str, str], Histogram] = {}
        self.wait: dict[str, Histogram] = {}
        self.now = Snapshot()
        self._counting = asyncio.Lock()  # two scrapes at once must not count one job twice
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def count(self, rows: list[Row]) -> None:
        """Add the grouped totals of Store.finished_totals."""
        for r in rows:
            self.finished[r["node"], r["kind"], r["state"]] += r["n"]
            self.by_owner[r["owner"], r["state"]] += r["n"]
            if r["tokens"]:
                self.tokens[r["node"], r["model"]] += r["tokens"]
                self.tokens_by_owner[r["owner"]] += r["tokens"]
            if r["d_n"]:
                self.duration.setdefault((r["node"], r["model"]), Histogram(DURATION_BUCKETS_S)).add(
                    [r[f"d_le_{i}"] for i in range(len(DURATION_BUCKETS_S))], r["d_n"], r["d_sum"]
                )
            if r["w_n"]:
                self.wait.setdefault(r["node"], Histogram(WAIT_BUCKETS_S)).add(
                    [r[f"w_le_{i}"] for i in range(len(WAIT_BUCKETS_S))], r["w_n"], r["w_sum"]
                )
            self.cursor = max(self.cursor, r["last_event"])

    async def catch_up(self, store: Store) -> None:
        """Count what finished since the last count (at start-up: the whole history)."""
        async with self._counting:
            self.count(await store.finished_totals(self.cursor, DURATION_BUCKETS_S, WAIT_BUCKETS_S))

    async def render(
        self,
        store: Store,
        nodes: list[NodeRuntime],
        stale_heads: int,
        storage: dict[str, Any] | None = None,
        backup: dict[str, Any] | None = None,
        retention: dict[str, Any] | None = None,
    ) -> bytes:
        await self.catch_up(store)
        batches, lines = await store.batch_totals()
        self.now = Snapshot(
            nodes, await store.active_by_node(), stale_heads, storage, backup or {}, batches, lines, retention or {}
        )
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        """prometheus_client's collector protocol: the families, from the last render."""
        gauges = {
            "gpuq_jobs_waiting": "Jobs waiting in a node's queue (held critiques included).",
            "gpuq_jobs_running": "Jobs running on a node (0 or 1).",
            "gpuq_node_up": "1 while the node's Ollama answers its health check.",
            "gpuq_node_vram_stuck": "1 while a model would not leave the node's VRAM.",
        }
        families = {name: GaugeMetricFamily(name, doc, labels=["node"]) for name, doc in gauges.items()}
        for rt in self.now.nodes:
            running, queued = self.now.active.get(rt.name, NodeCounts())
            families["gpuq_jobs_waiting"].add_metric([rt.name], queued)
            families["gpuq_jobs_running"].add_metric([rt.name], running)
            families["gpuq_node_up"].add_metric([rt.name], 1 if rt.up else 0)
            families["gpuq_node_vram_stuck"].add_metric([rt.name], 1 if rt.vram_stuck else 0)
        yield from families.values()
        warm = {
            "gpuq_warm_hits": ("Jobs that found their model still loaded (a load avoided).", "warm_hits"),
            "gpuq_warm_unloads": (
                "Models kept loaded between jobs, then unloaded (their time ran out, or a job wanted another model).",
                "warm_unloads",
            ),
        }
        for name, (doc, attr) in warm.items():
            counter = CounterMetricFamily(name, doc, labels=["node"])
            for rt in self.now.nodes:
                counter.add_metric([rt.name], getattr(rt, attr))
            yield counter
        batches = GaugeMetricFamily("gpuq_batches", "Batches, by status.", labels=["status"])
        for status in BATCH_STATUSES:
            batches.add_metric([status], self.now.batches.get(status, 0))
        yield batches
        lines = GaugeMetricFamily(
            "gpuq_batch_lines",
            "The lines of the batches in progress, by state (refused: never a job, e.g. an unknown model).",
            labels=["state"],
        )
        for state in LINE_STATES:
            lines.add_metric([state], self.now.batch_lines.get(state, 0))
        yield lines
        yield GaugeMetricFamily(
            "gpuq_stale_heads", "Running queue heads that are stale (see /api/stale).", value=self.now.stale_heads
        )
        yield from self._budget()
        finished = CounterMetricFamily(
            "gpuq_jobs_finished", "Jobs that ended, by node, kind and final state.", labels=["node", "kind", "state"]
        )
        for key, n in sorted(self.finished.items()):
            finished.add_metric(list(key), n)
        yield finished
        owners = CounterMetricFamily(
            "gpuq_user_jobs_finished",
            "Jobs that ended, by owner (the [[user]]; '' for no user) and final state.",
            labels=["owner", "state"],
        )
        for owner_state, n in sorted(self.by_owner.items()):
            owners.add_metric(list(owner_state), n)
        yield owners
        owner_tokens = CounterMetricFamily(
            "gpuq_user_tokens", "Tokens generated by finished runs, by owner.", labels=["owner"]
        )
        for owner, n in sorted(self.tokens_by_owner.items()):
            owner_tokens.add_metric([owner], n)
        yield owner_tokens
        tokens = CounterMetricFamily("gpuq_tokens", "Tokens generated by finished runs.", labels=["node", "model"])
        for node_model, n in sorted(self.tokens.items()):
            tokens.add_metric(list(node_model), n)
        yield tokens
        duration = HistogramMetricFamily(
            "gpuq_job_duration_seconds", "How long a finished run ran.", labels=["node", "model"]
        )
        for node_model, h in sorted(self.duration.items()):
            duration.add_metric(list(node_model), h.buckets(), h.total)
        yield duration
        wait = HistogramMetricFamily("gpuq_job_wait_seconds", "From submit to a job's first start.", labels=["node"])
        for node, h in sorted(self.wait.items()):
            wait.add_metric([node], h.buckets(), h.total)
        yield wait

    def _budget(self) -> Iterator[Metric]:
        """The storage budget and the last backup (absent while not known: no sample, no backup)."""
        storage = self.now.storage or {}
        gauges = {
            "gpuq_database_bytes": (
                "The database's size: SQLite's pages (page_count x page_size, what router.max_database_bytes"
                " counts; the WAL apart); PostgreSQL's pg_database_size.",
                "database_bytes",
            ),
            "gpuq_database_wal_bytes": ("The SQLite database's WAL file.", "wal_bytes"),
            "gpuq_database_growth_bytes_per_day": (
                "The database's growth per day, from the oldest sample of the last week to the newest.",
                "growth_bytes_per_day",
            ),
            "gpuq_disk_free_bytes": ("Free space on the database's disk.", "free_bytes"),
            "gpuq_database_max_bytes": ("router.max_database_bytes, when set.", "max_database_bytes"),
        }
        for name, (doc, key) in gauges.items():
            if storage.get(key) is not None:
                yield GaugeMetricFamily(name, doc, value=storage[key])
        last = self.now.backup.get("last")
        if last is not None:
            yield GaugeMetricFamily(
                "gpuq_backup_last_success_timestamp_seconds",
                "When the last backup (scheduled or `gpuq backup`) succeeded, in seconds since the epoch.",
                value=parse_iso(last["at"]),
            )
            yield GaugeMetricFamily("gpuq_backup_last_bytes", "The last successful backup's size.", value=last["bytes"])
        if self.now.backup:
            yield GaugeMetricFamily(
                "gpuq_backup_failing",
                "1 while the last scheduled backup failed or one is overdue (an alert fires).",
                value=int(bool(self.now.backup.get("last_failure")) or bool(self.now.backup.get("overdue"))),
            )
        yield from self._sweeps()

    def _sweeps(self) -> Iterator[Metric]:
        """The last retention sweep (any router's: they are on the record)."""
        sweep = self.now.retention
        if not sweep:
            return
        if sweep.get("last_success_at"):
            yield GaugeMetricFamily(
                "gpuq_retention_last_success_timestamp_seconds",
                "When the last retention sweep succeeded, in seconds since the epoch.",
                value=parse_iso(sweep["last_success_at"]),
            )
        last = sweep.get("last")
        if last is not None:
            yield GaugeMetricFamily(
                "gpuq_retention_last_hold_seconds",
                "The last retention sweep's longest hold of the database's writer by one batch.",
                value=last["swept"].get("longest_hold_ms", 0.0) / 1000,
            )
        yield GaugeMetricFamily(
            "gpuq_retention_failing",
            "1 while the last retention sweep failed or none has succeeded for 3 x every (an alert fires).",
            value=int(bool(sweep.get("failing")) or bool(sweep.get("overdue"))),
        )
