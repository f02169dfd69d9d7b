"""Per-node leases: exactly one router drives a node at a time.

Each router process has a row of its own in `router` (a fresh id per start); it holds a node while
its row in `node_lease` has not expired, and renews its leases at each heartbeat. A router takes a
node only when its lease is free (no row: never taken, or released at a clean stop) or expired
(its router stopped answering); the jobs the previous router left running there fail loudly,
naming that router, through the same code as fail_orphans (never retried silently). On SQLite the
database is one router's (its lock file): every other router is dead, so a router starting takes
every node at once (`alone`), whatever the leases say.

The verbs are plain functions of a connection `db` run inside a write transaction (the writer's,
or a test's); portable SQL only (ON CONFLICT ... DO UPDATE ... WHERE and RETURNING serve both
engines), `?` placeholders. Lease times are the caller's clock `now`, seconds since the epoch,
stored as numbers. `routers` is a read (/health): its SQL is ROUTERS_SQL and LEASES_SQL, which
the store runs on its reader and gives to `alive`."""

from __future__ import annotations

import json
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..jobs import NodeInfo, iso
from .engine import Connection
from .lifecycle import fail_orphan
from .steps import Row

# Why a job still running on a node taken over fails (see orphan_reason).
RESTARTED = "router restarted while running"


@dataclass(frozen=True)
class Router:
    """This router process, as its row in `router` says it."""

    id: str
    listen: str
    public_url: str | None
    pid: int
    host: str
    started_at: float

    @classmethod
    def new(cls, listen: str, public_url: str | None, now: float) -> Router:
        """A fresh id for this process: host:pid:random (a restart with the same pid is another)."""
        host, pid = socket.gethostname(), os.getpid()
        return cls(f"{host}:{pid}:{secrets.token_hex(4)}", listen, public_url, pid, host, now)


class Taken(NamedTuple):
    held: list[str]  # the nodes this router holds now, in the order asked
    failed: list[Row]  # the jobs left running by the routers it took nodes from (id, node, model, run_id, error)


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _seen(db: Connection, router: Router, now: float) -> None:
    db.execute(
        "INSERT INTO router (id, listen, public_url, pid, host, started_at, seen_at) VALUES (?,?,?,?,?,?,?)"
        " ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at",
        (router.id, router.listen, router.public_url, router.pid, router.host, iso(router.started_at), now),
    )


def orphan_reason(run_router: str | None, node: str, lease: Row | None, alone: bool) -> str:
    """Why a job left running on `node` by `run_router` fails when this router takes the node
    (`lease`: the node's lease as it was, None if free)."""
    if run_router is None:  # a run of a router from before leases: as always
        return RESTARTED
    if alone:  # SQLite: the database's one router before this one
        return f"{RESTARTED} (the router {run_router} that ran this job had stopped)"
    if lease is not None and lease["router"] == run_router:
        return (
            f"the router {run_router} that ran this job stopped answering "
            f"(its lease on {node} expired at {iso(lease['expires_at'])})"
        )
    return f"the router {run_router} that ran this job stopped (its lease on {node} was released or lost)"


# The database's own clock, in seconds since the epoch: on PostgreSQL every router's lease is
# written and judged by the one clock of the server, whatever the routers' clocks say.
DB_NOW_SQL = "SELECT EXTRACT(EPOCH FROM clock_timestamp())"


def clock(db: Connection, now: float | None) -> float:
    """`now` as given (SQLite: one router, its clock), or the database's (None: PostgreSQL)."""
    return now if now is not None else float(db.execute(DB_NOW_SQL).fetchone()[0])


def take(
    db: Connection, router: Router, nodes: list[str], lease_s: float, now: float | None, alone: bool = False
) -> Taken:
    """Take (or renew) the leases of `nodes` this router may hold: free ones, expired ones, its
    own; with `alone` (SQLite: no other router lives) every one. Each node taken from another
    router (or found free) has the jobs still running there failed, naming the router that ran
    them; with `alone`, every job still running anywhere not run by this router. Returns the
    nodes held and the jobs failed."""
    now = clock(db, now)
    _seen(db, router, now)
    nodes = list(dict.fromkeys(nodes))  # one row each: an upsert may not touch a row twice
    held: list[str] = []
    before: dict[str, Row] = {}
    if alone:  # every other router is dead: its leases go (kept in `before` for the reasons)
        before |= {
            r["node"]: dict(r)
            for r in db.execute(
                "DELETE FROM node_lease WHERE router <> ? RETURNING node, router, expires_at", (router.id,)
            ).fetchall()
        }
        db.execute("UPDATE router SET stopped_at = ? WHERE id <> ? AND stopped_at IS NULL", (now, router.id))
    if nodes:
        before |= {
            r["node"]: dict(r)
            for r in db.execute(
                f"SELECT node, router, expires_at FROM node_lease WHERE node IN ({_marks(len(nodes))})", tuple(nodes)
            ).fetchall()
        }
        values = ",".join(["(?,?,?,?)"] * len(nodes))
        params: list[Any] = [p for node in nodes for p in (node, router.id, now + lease_s, now)]
        got = {
            r[0]
            for r in db.execute(
                f"INSERT INTO node_lease (node, router, expires_at, taken_at) VALUES {values}"
                " ON CONFLICT (node) DO UPDATE SET router = excluded.router, expires_at = excluded.expires_at,"
                "  taken_at = CASE WHEN node_lease.router = excluded.router THEN node_lease.taken_at"
                "  ELSE excluded.taken_at END"
                " WHERE node_lease.router = excluded.router OR node_lease.expires_at <= excluded.taken_at OR ? = 1"
                " RETURNING node",
                (*params, int(alone)),
            ).fetchall()
        }
        held = [n for n in nodes if n in got]
    taken = [n for n in held if before.get(n, {}).get("router") != router.id]
    args: tuple[str, ...]
    if alone:  # every job running is a dead router's (a node no longer configured too)
        where, args = "j.state = 'running' AND (r.router IS NULL OR r.router <> ?)", (router.id,)
    elif taken:
        where, args = f"j.state = 'running' AND j.node IN ({_marks(len(taken))})", tuple(taken)
    else:
        return Taken(held, [])
    running = db.execute(
        f"SELECT j.id, j.node, r.router FROM job j LEFT JOIN run r ON r.id = j.run_id WHERE {where} ORDER BY j.id", args
    ).fetchall()
    failed = []
    for job in running:
        reason = orphan_reason(job["router"], job["node"], before.get(job["node"]), alone)
        row = fail_orphan(db, job["id"], reason, now)
        if row is not None:
            failed.append(dict(row, error=reason))
    return Taken(held, failed)


def renew(db: Connection, router: Router | str, nodes: list[str], lease_s: float, now: float | None) -> list[str]:
    """Renew this router's leases on `nodes` (one statement); returns the nodes it still holds. A
    lease it let expire is renewed too, as long as no other router has taken it meanwhile."""
    router_id = router if isinstance(router, str) else router.id
    now = clock(db, now)
    db.execute("UPDATE router SET seen_at = ? WHERE id = ?", (now, router_id))
    if not nodes:
        return []
    got = {
        r[0]
        for r in db.execute(
            f"UPDATE node_lease SET expires_at = ? WHERE router = ? AND node IN ({_marks(len(nodes))}) RETURNING node",
            (now + lease_s, router_id, *nodes),
        ).fetchall()
    }
    return [n for n in nodes if n in got]


def take_service(db: Connection, router: Router, service: str, lease_s: float, now: float | None) -> bool:
    """Take (or renew) the lease of a maintenance service (the retention sweep): free, expired
    or this router's own. True when this router holds it now: with several routers on one
    PostgreSQL, only that one runs the service."""
    now = clock(db, now)
    _seen(db, router, now)
    got = db.execute(
        "INSERT INTO maintenance_lease (service, router, expires_at, taken_at) VALUES (?,?,?,?)"
        " ON CONFLICT (service) DO UPDATE SET router = excluded.router, expires_at = excluded.expires_at,"
        "  taken_at = CASE WHEN maintenance_lease.router = excluded.router THEN maintenance_lease.taken_at"
        "  ELSE excluded.taken_at END"
        " WHERE maintenance_lease.router = excluded.router OR maintenance_lease.expires_at <= excluded.taken_at"
        " RETURNING service",
        (service, router.id, now + lease_s, now),
    ).fetchall()
    return bool(got)


# The routers last seen on a host, for a router starting there to find its dead predecessors.
ON_HOST_SQL = "SELECT id, pid FROM router WHERE host = ? AND stopped_at IS NULL AND id <> ?"


def end_dead(db: Connection, router_ids: list[str], now: float | None) -> list[str]:
    """Routers known dead (their process is gone from this host): their leases run out now, so
    a router restarted on the same machine takes its nodes at once rather than after the lease.
    Returns the nodes whose leases ended."""
    if not router_ids:
        return []
    now = clock(db, now)
    marks = _marks(len(router_ids))
    db.execute(f"UPDATE router SET stopped_at = ? WHERE id IN ({marks})", (now, *router_ids))
    return sorted(
        r[0]
        for r in db.execute(
            f"UPDATE node_lease SET expires_at = ? WHERE router IN ({marks}) AND expires_at > ? RETURNING node",
            (now, *router_ids, now),
        ).fetchall()
    )


def release(db: Connection, router: Router | str, now: float | None = None) -> list[str]:
    """A clean stop: every lease of this router is freed (another router takes the nodes at once)
    and its row says it stopped. Returns the nodes released."""
    router_id = router if isinstance(router, str) else router.id
    freed = [
        r[0] for r in db.execute("DELETE FROM node_lease WHERE router = ? RETURNING node", (router_id,)).fetchall()
    ]
    db.execute("DELETE FROM maintenance_lease WHERE router = ?", (router_id,))
    if now is not None:
        db.execute("UPDATE router SET stopped_at = ? WHERE id = ?", (now, router_id))
    return sorted(freed)


# The nodes other routers drive now (their lease not run out at `now`): a batch's lines are
# placed on them too (no client waits on a line), each where its model is.
DRIVEN_ELSEWHERE_SQL = (
    "SELECT n.name, n.rank, n.roles, n.model, n.up, n.models FROM node n JOIN node_lease l ON l.node = n.name"
    " WHERE l.router <> ? AND l.expires_at > ? ORDER BY n.name"
)


def node_info(row: Row) -> NodeInfo:
    """A node as its row says it (another router's: never idle here, its models as last recorded)."""
    models = row["models"]
    return NodeInfo(
        row["name"],
        int(row["rank"]),
        tuple(row["roles"].split(",")),
        row["model"],
        bool(row["up"]),
        None if models is None else frozenset(json.loads(models)),
    )


# The reads of /health: the routers that may be alive, and every lease.
ROUTERS_SQL = (
    "SELECT id, listen, public_url, pid, host, started_at, seen_at FROM router"
    " WHERE stopped_at IS NULL AND seen_at > ? ORDER BY started_at, id"
)
LEASES_SQL = "SELECT node, router, expires_at, taken_at FROM node_lease ORDER BY node"
SEEN_EVER = float("-inf")  # SQLite: a router not stopped is alive, whenever it was last seen (see alive)


def held_sql(n: int) -> str:
    """The nodes of `n` whose lease names router ?, whatever its end (SQLite's check: a read)."""
    return f"SELECT node FROM node_lease WHERE router = ? AND node IN ({_marks(n)}) ORDER BY node"


def alive(router_rows: list[Any], lease_rows: list[Any], now: float, alone: bool = False) -> dict[str, Any]:
    """/health's view: the routers alive (each with the nodes whose lease it holds now) and each
    node's holder (None: no router holds it, its lease free or expired). `alone` (SQLite: one
    router per file, its lock file says so): the router rows read are alive, and a lease of
    theirs is held until that router stops, whatever its end says (a router alone does not
    renew: an idle one writes nothing)."""
    routers = [
        {k: r[k] for k in ("id", "listen", "public_url", "pid", "host", "started_at")}
        | {"seen_at": iso(r["seen_at"]), "nodes": []}
        for r in router_rows
    ]
    by_id = {r["id"]: r for r in routers}
    holders: dict[str, dict[str, Any] | None] = {}
    for lease in lease_rows:
        if lease["expires_at"] > now or (alone and lease["router"] in by_id):
            holders[lease["node"]] = {
                "router": lease["router"],
                "until": None if alone else iso(lease["expires_at"]),  # alone: until its router stops
                "since": iso(lease["taken_at"]),
            }
            if lease["router"] in by_id:
                by_id[lease["router"]]["nodes"].append(lease["node"])
        else:
            holders[lease["node"]] = None
    return {"routers": routers, "holders": holders}


def routers(db: Connection, now: float, lease_s: float) -> dict[str, Any]:
    """The routers seen within `lease_s` and not stopped, with the nodes each holds, and each
    node's holder (see alive)."""
    return alive(db.execute(ROUTERS_SQL, (now - lease_s,)).fetchall(), db.execute(LEASES_SQL).fetchall(), now)
