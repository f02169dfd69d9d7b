"""The router's own records, each a verb (a plain function of the writer's connection inside the
transaction its caller opened, see writer.py): the thresholds and nodes in force, each reload of
gpuq.toml, a node's health, and the alerts with their notices' deliveries (gpuq/upkeep/alerts.py).
They change no job: the jobs' verbs are gpuq/store/lifecycle.py and gpuq/store/control.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..config import NodeConfig
from .engine import Connection
from .steps import Row, dumps, iso

# -- the thresholds, the nodes, reloads -------------------------------------------------------


def configure(db: Connection, settings_s: dict[str, float], nodes: Sequence[NodeConfig]) -> None:
    """Record the thresholds (read by the view stale_heads, migration 012) and nodes in force."""
    db.executemany(
        "INSERT INTO router_setting (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        list(settings_s.items()),
    )
    for n in nodes:
        db.execute(
            "INSERT INTO node (name, url, rank, roles, model, max_runtime_s) VALUES (?,?,?,?,?,?)"
            " ON CONFLICT (name) DO UPDATE SET url = excluded.url, rank = excluded.rank,"
            " roles = excluded.roles, model = excluded.model, max_runtime_s = excluded.max_runtime_s",
            (n.name, n.url, n.rank, ",".join(n.roles), n.model, n.max_runtime_s),
        )


def record_reload(
    db: Connection, now: float, actor: str, path: str, changes: dict[str, Any] | None, error: str | None
) -> None:
    """One row per reload of gpuq.toml (migration 013): what changed, or why nothing did."""
    db.execute(
        "INSERT INTO config_reload (at, actor, path, ok, changes, error) VALUES (?,?,?,?,?,?)",
        (iso(now), actor, path, int(error is None), None if changes is None else dumps(changes), error),
    )


def set_node_health(db: Connection, now: float, name: str, up: bool, error: str | None) -> None:
    db.execute("UPDATE node SET up = ?, last_error = ?, since = ? WHERE name = ?", (int(up), error, iso(now), name))


def record_node_models(db: Connection, name: str, models: Sequence[str]) -> None:
    """The models the node's Ollama listed at its last health check (migration 023), as JSON:
    another router placing a batch's lines on this node reads them (leases.DRIVEN_ELSEWHERE_SQL)."""
    db.execute("UPDATE node SET models = ? WHERE name = ?", (dumps(sorted(models)), name))


def record_asked_unload(db: Connection, name: str, record: dict[str, Any]) -> None:
    """The node's last unload a client asked (`ollama stop`), kept across restarts as JSON
    (migration 022)."""
    db.execute("UPDATE node SET asked_unload = ? WHERE name = ?", (dumps(record), name))


# -- alerts (gpuq/upkeep/alerts.py) -----------------------------------------------------------------


def fire_alert(db: Connection, now: float, alert: dict[str, Any], deliver: bool) -> Row:
    return dict(
        db.execute(
            "INSERT INTO alert (alert, node, job_id, model, since, message, fix, fired_at, deliver)"
            " VALUES (?,?,?,?,?,?,?,?,?) RETURNING *",
            (
                alert["alert"],
                alert["node"],
                alert["job"],
                alert.get("model"),
                alert["since"],
                alert["message"],
                alert["fix"],
                iso(now),
                int(deliver),
            ),
        ).fetchone()
    )


def resolve_alert(db: Connection, now: float, alert_id: int, resolution: str) -> None:
    db.execute(
        "UPDATE alert SET resolved_at = ?, resolution = ? WHERE id = ? AND resolved_at IS NULL",
        (iso(now), resolution, alert_id),
    )


def owe_open_alerts(db: Connection) -> int:
    """At start-up with alert_url set: firings still open are owed their notices, even those
    seen while no alert_url was configured (they still fire)."""
    return db.execute("UPDATE alert SET deliver = 1 WHERE resolved_at IS NULL AND deliver = 0").rowcount


def record_delivery(
    db: Connection,
    now: float,
    alert_id: int,
    status: str,
    attempt: int,
    ok: bool,
    http_status: int | None,
    error: str | None,
) -> None:
    """One try to deliver a notice; a delivered one is marked sent in the same transaction."""
    sent_column = {"firing": "fired_sent_at", "resolved": "resolved_sent_at"}[status]
    db.execute(
        "INSERT INTO alert_delivery (alert_id, status, at, attempt, ok, http_status, error) VALUES (?,?,?,?,?,?,?)",
        (alert_id, status, iso(now), attempt, int(ok), http_status, error),
    )
    if ok:
        db.execute(f"UPDATE alert SET {sent_column} = ? WHERE id = ?", (iso(now), alert_id))


# -- backups and storage samples (gpuq/upkeep/backups.py, gpuq/upkeep/storage.py) -----------------------


def record_backup(
    db: Connection,
    now: float,
    path: str,
    scheduled: bool,
    started: float,
    made: dict[str, Any] | None,
    error: str | None,
) -> Row:
    """One row per backup taken (`made`: back_up's answer) or failed (`error`)."""
    return dict(
        db.execute(
            "INSERT INTO backup (path, scheduled, started_at, finished_at, ok, bytes, seconds, error)"
            " VALUES (?,?,?,?,?,?,?,?) RETURNING *",
            (
                path,
                int(scheduled),
                iso(started),
                iso(now),
                int(made is not None),
                None if made is None else made["bytes"],
                made["seconds"] if made is not None else round(now - started, 3),
                error,
            ),
        ).fetchone()
    )


def backups_removed(db: Connection, now: float, ids: list[int]) -> None:
    """Rotation deleted these backups' files."""
    db.executemany("UPDATE backup SET removed_at = ? WHERE id = ? AND removed_at IS NULL", [(iso(now), i) for i in ids])


SWEEPS_KEPT = 1000  # retention sweeps on the record: weeks of hourly ones, and always the newest success


def record_sweep(
    db: Connection,
    now: float,
    router: str | None,
    asked: bool,
    started: float,
    swept: dict[str, Any],
    error: str | None,
) -> Row:
    """One row per retention sweep that ran (gpuq/upkeep/retention.py), done or failed (`error`), with
    what it did (`swept`, as JSON); the oldest past SWEEPS_KEPT go, never the newest success."""
    row = dict(
        db.execute(
            "INSERT INTO retention_sweep (router, asked, started_at, finished_at, ok, swept, error)"
            " VALUES (?,?,?,?,?,?,?) RETURNING *",
            (router, int(asked), iso(started), iso(now), int(error is None), dumps(swept), error),
        ).fetchone()
    )
    db.execute(
        "DELETE FROM retention_sweep WHERE id <= ?"
        " AND id <> (SELECT COALESCE(MAX(id), 0) FROM retention_sweep WHERE ok = 1)",
        (row["id"] - SWEEPS_KEPT,),
    )
    return row


SAMPLES_KEPT_S = 90 * 86400.0  # growth is read over a week; a season of samples is plenty


def record_storage_sample(
    db: Connection, now: float, database_bytes: int, free_bytes: int | None, min_gap_s: float
) -> bool:
    """A sample of the database's size, unless one was recorded within `min_gap_s` (several
    routers on one PostgreSQL database sample it once between them); samples past 90 days go.
    True when this one was recorded."""
    recorded = db.execute(
        "INSERT INTO storage_sample (at, database_bytes, free_bytes) SELECT ?, ?, ?"
        " WHERE NOT EXISTS (SELECT 1 FROM storage_sample WHERE at > ?)",
        (iso(now), database_bytes, free_bytes, iso(now - min_gap_s)),
    ).rowcount
    db.execute("DELETE FROM storage_sample WHERE at < ?", (iso(now - SAMPLES_KEPT_S),))
    return recorded == 1
