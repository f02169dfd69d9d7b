"""Usage over time (`GET /api/usage`): each ended run's figures, summed by one key (user, node,
model, client or lane) per step of a window, with the jobs' waits' p50 and p95, in one read.

The figures come from the runs still stored and from `usage_run` (migration 027), where
retention's delete copies a job's runs before it deletes them (`keep`, in the same transaction),
so deleting old jobs never changes past usage. A run counts in the step its start falls in; a
job counts (and its wait: created to its first run's start) in the step of its first run."""

from __future__ import annotations

from typing import Any

from ..jobs import iso
from .core import Core
from .engine import Connection, Engine
from .steps import Row

# The keys usage is summed by, each the column of a run's row (`u` below) it reads.
KEYS = {"user": "owner", "node": "node", "model": "model", "client": "client", "lane": "lane"}

# A run's figures, as usage_run keeps them: the live runs' (below) read in the same shape.
FIGURES = "owner, client, lane, node, model, started_at, busy_s, load_s, tokens_in, tokens_out, wait_s"


def _live_sql(engine: Engine) -> str:
    """The stored runs that ended, with their job's owner, client and lane, as usage_run's rows."""
    secs = engine.seconds_between
    first = "NOT EXISTS (SELECT 1 FROM run p WHERE p.job_id = r.job_id AND p.id < r.id)"
    return (
        "SELECT r.id, r.job_id, j.owner, j.client, j.lane, r.node, r.model, r.started_at, r.finished_at,"
        f" {secs('r.started_at', 'r.finished_at')} AS busy_s, r.load_duration_ns / 1e9 AS load_s,"
        " r.prompt_eval_count AS tokens_in, r.eval_count AS tokens_out,"
        f" CASE WHEN {first} THEN {secs('j.created_at', 'r.started_at')} END AS wait_s"
        " FROM run r JOIN job j ON j.id = r.job_id WHERE r.finished_at IS NOT NULL"
    )


def keep(db: Connection, engine: Engine, ids: list[str], marks: str) -> None:
    """Copy the runs of the jobs `ids` (about to be deleted; `marks` their placeholders) into
    usage_run, so their usage outlives them."""
    db.execute(
        f"INSERT INTO usage_run (id, job_id, {FIGURES}, finished_at)"
        f" SELECT id, job_id, {FIGURES}, finished_at FROM ({_live_sql(engine)} AND r.job_id IN ({marks})) k",
        tuple(ids),
    )


def _window_sql(engine: Engine, key: str, owner: str | None) -> str:
    """Each run in the window (:since to :until) with its step and its wait's ranks: within its
    key and step, and within its key (NULL waits ranked last, on both engines)."""
    scope = "" if owner is None else " AND owner = :owner"
    live = f"SELECT {FIGURES} FROM ({_live_sql(engine)} AND r.started_at >= :since AND r.started_at < :until) l"
    past = f"SELECT {FIGURES} FROM usage_run WHERE started_at >= :since AND started_at < :until"
    step = engine.whole(f"{engine.seconds_between(':since', 'started_at')} / :step")
    waits = "ORDER BY CASE WHEN wait_s IS NULL THEN 1 ELSE 0 END, wait_s"
    return (
        f"SELECT {KEYS[key]} AS key, {step} AS step, busy_s, load_s, tokens_in, tokens_out, wait_s,"
        f" ROW_NUMBER() OVER (PARTITION BY {KEYS[key]}, {step} {waits}) AS rs,"
        f" COUNT(wait_s) OVER (PARTITION BY {KEYS[key]}, {step}) AS ns,"
        f" ROW_NUMBER() OVER (PARTITION BY {KEYS[key]} {waits}) AS ra,"
        f" COUNT(wait_s) OVER (PARTITION BY {KEYS[key]}) AS na"
        f" FROM ({live} UNION ALL {past}) u WHERE 1 = 1{scope}"
    )


def _rank(n: str, p: int) -> str:
    """The nearest rank of the p-th percentile of n values: ceil(n * p / 100), in integers."""
    return f"({n} * {p} + 99) / 100"


def usage_sql(engine: Engine, key: str, owner: str | None) -> str:
    """One row per key and step: the sums, the step's wait p50 and p95, and the key's (on the
    step that holds them, NULL on the others)."""
    picks = ", ".join(
        f"MAX(CASE WHEN {r} = {_rank(n, p)} THEN wait_s END) AS {name}"
        for r, n, p, name in (
            ("rs", "ns", 50, "wait_p50_s"),
            ("rs", "ns", 95, "wait_p95_s"),
            ("ra", "na", 50, "all_p50_s"),
            ("ra", "na", 95, "all_p95_s"),
        )
    )
    return (
        "SELECT key, step, COUNT(wait_s) AS jobs, SUM(busy_s) AS busy_s, SUM(load_s) AS load_s,"
        f" SUM(tokens_in) AS tokens_in, SUM(tokens_out) AS tokens_out, {picks}"
        f" FROM ({_window_sql(engine, key, owner)}) w GROUP BY key, step ORDER BY key, step"
    )


SUMS = ("jobs", "busy_s", "load_s", "tokens_in", "tokens_out")


def _point(row: Row, start: float, step_s: float) -> Row:
    at = start + int(row["step"]) * step_s
    point: Row = {"at": iso(at), "step": int(row["step"])}
    point.update({k: _number(k, row[k]) for k in SUMS})
    point.update(wait_p50_s=row["wait_p50_s"], wait_p95_s=row["wait_p95_s"])
    return point


def _number(name: str, value: Any) -> float | int:
    """A sum as both engines answer it alike (PostgreSQL's SUM of integers is a Decimal)."""
    if value is None:
        return 0
    return float(value) if name.endswith("_s") else int(value)


def shaped(found: list[Row], start: float, step_s: float) -> list[Row]:
    """The read's rows as the API's: one per key (its sums, its wait p50 and p95, its series of
    steps that saw usage), the busiest first."""
    keyed: dict[Any, Row] = {}
    for r in found:
        row = keyed.setdefault(r["key"], {"key": r["key"], **dict.fromkeys(SUMS, 0), "series": []})
        for k in SUMS:
            row[k] += _number(k, r[k])
        for name in ("p50", "p95"):
            if r[f"all_{name}_s"] is not None:
                row[f"wait_{name}_s"] = float(r[f"all_{name}_s"])
        row["series"].append(_point(r, start, step_s))
    rows = list(keyed.values())
    for row in rows:
        row.setdefault("wait_p50_s", None)
        row.setdefault("wait_p95_s", None)
    return sorted(rows, key=lambda row: (-row["busy_s"], str(row["key"])))


class UsageReads(Core):
    """Usage over time, answered through `read` (Core's: the readers' connection)."""

    async def usage(self, by: str, start: float, until: float, step_s: int, owner: str | None = None) -> list[Row]:
        """Usage by `by` (a KEYS name) from `start` to `until` in steps of `step_s` seconds: one
        row per key (see `shaped`). `owner`: only that user's runs (a member's view)."""
        params: dict[str, Any] = {"since": iso(start), "until": iso(until), "step": step_s}
        if owner is not None:
            params["owner"] = owner
        found = await self.read(usage_sql(self.engine, by, owner), params)
        return shaped(found, start, step_s)
