"""The lab's truth for people and monitors: /health, /metrics, the alerts, the activity."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from ..activity import activity
from ..errors import BadRequest, GpuqError
from ..jobs import FINAL, NodeCounts, iso, parse_iso
from ..store import Row
from .inputs import int_param
from .render import json_response
from .state import DISPATCHER, METRICS, STORE, UPKEEP

HEALTH_READ_S = 0.5  # /health answers within about this, whatever the store does


async def health(request: web.Request) -> web.Response:
    """The queue's truth: from memory first (nodes, loops, the store's own trouble), then two
    indexed reads bounded by HEALTH_READ_S; a store that does not answer them is named, not
    waited for."""
    store, dispatcher = request.app[STORE], request.app[DISPATCHER]
    trouble = store.trouble()
    active: dict[str, NodeCounts] | None = None
    stale: list[Row] = []
    leases: Row = {"routers": None, "holders": None}  # unknown while the store does not answer
    heads: dict[str, Row | None] = {}
    unclaimed_nodes = [w for w in dispatcher.workers.values() if w.claim_refused and w.rt.claimable]
    if trouble is None or "not answering" not in trouble["problem"]:  # don't queue behind a stuck read
        try:
            async with asyncio.timeout(HEALTH_READ_S):
                active = await store.active_by_node()
                stale = [
                    {k: h[k] for k in ("id", "node", "state", "since", "reason")} for h in await store.stale_heads()
                ]
                for w in unclaimed_nodes:
                    heads[w.rt.name] = await store.next_ready(w.rt.name)
                leases = await store.routers(dispatcher.settings.lease_s)
        except TimeoutError:
            trouble = store.trouble(slow_s=HEALTH_READ_S) or {
                "problem": f"the database is not answering: /health's read took over {HEALTH_READ_S:g}s",
                "since": iso(time.time()),
            }
        except GpuqError as exc:
            trouble = {"problem": f"the database cannot be read: {exc.message}", "since": iso(time.time())}
    down = [
        {
            "name": rt.name,
            "since": iso(rt.since),
            "error": rt.vram_stuck or rt.last_error,
            "waiting": None if active is None else active.get(rt.name, NodeCounts()).queued,
            **({"recorded": False} if rt.health_unrecorded else {}),
        }  # the store refused to record it
        for rt in dispatcher.nodes.values()
        if rt.checked and not rt.claimable
    ]
    # Waiting jobs on an up, idle node whose claims the store refuses: a stuck queue too.
    unclaimed = []
    for w in unclaimed_nodes:
        refused = w.claim_refused  # None again: a claim succeeded during the reads above, the queue moves
        if refused is not None and (active is None or active.get(w.rt.name, NodeCounts()).queued):
            head = heads.get(w.rt.name)
            unclaimed.append(
                {"node": w.rt.name, "job": head["id"] if head else None, "since": iso(refused[0]), "error": refused[1]}
            )
    crashed = [loop.json() for loop in (*dispatcher.loops.down(), *request.app[UPKEEP].down())]  # not running, for now
    lost = store.lost  # the database file deleted or replaced under the router: writes are refused
    ok = (
        trouble is None
        and lost is None
        and not stale
        and not any(d["waiting"] for d in down)
        and not crashed
        and not unclaimed
    )
    # A backup or a retention sweep failed or overdue, a disk filling: warned of and alerted on,
    # but /health stays ok. ok says the queue moves now (a monitor restarts a router on 503); none
    # is helped by a restart, and all leave every job flowing: the warnings and the alerts carry them.
    backups, storage, sweeps = (
        request.app[UPKEEP].backups,
        request.app[UPKEEP].storage,
        request.app[UPKEEP].sweeper.report,
    )
    warnings = [c.message for c in (*backups.conditions(), *storage.conditions(), *sweeps.conditions())]
    body = {
        "ok": ok,
        "warnings": warnings,
        "queue_depth": None if active is None else sum(c.queued for c in active.values()),
        "running": None if active is None else sum(c.running for c in active.values()),
        "stale": stale,
        "nodes_down": down,
        "loops_down": crashed,
        "unclaimed": unclaimed,
        "store": trouble,
        "database_lost": lost,
        "awake": dispatcher.awake.json(),
        "draining": dispatcher.draining_json(),  # told to stop, waiting for its running jobs
        # This router, the routers alive (each with the nodes it holds) and each node's holder.
        "router": {"id": dispatcher.router.id, "nodes": dispatcher.leases.held()},
        "backup": backups.json(),
        "storage": storage.json(),
        "retention": sweeps.json(),  # the last retention sweep (any router's) and the next here
        **leases,
    }
    return json_response(body, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus' text format (the token applies, as for /api)."""
    app = request.app
    stale = await app[STORE].stale_heads()
    body = await app[METRICS].render(
        app[STORE],
        list(app[DISPATCHER].nodes.values()),
        len(stale),
        app[UPKEEP].storage.json(),
        app[UPKEEP].backups.json(),
        app[UPKEEP].sweeper.report.json(),
    )
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def alerts(request: web.Request) -> web.Response:
    """The latest firings and every try to deliver their notices."""
    limit = int_param(request.query, "limit", 50, 1, 1000)
    return json_response(
        {
            "alert_url_set": request.app[DISPATCHER].settings.alert_url is not None,
            "alerts": await request.app[STORE].alerts(limit),
        }
    )


ACTIVITY_WINDOW_S = 3600.0  # the busy strips and jobs per hour look this far back


async def activity_view(request: web.Request) -> web.Response:
    """Counts of finished jobs since `since` (the page sends its local midnight; default: the
    last 24 hours), and per node over the last hour its busy spans and the jobs it finished."""
    app = request.app
    now = time.time()
    since = now - 86400
    if request.query.get("since"):
        try:
            since = parse_iso(request.query["since"])
        except ValueError:
            raise BadRequest(
                "query parameter 'since' must be a UTC time like 2026-11-29T00:00:00.000000Z, "
                f"got '{request.query['since'][:40]}'"
            ) from None
    start = now - ACTIVITY_WINDOW_S
    spans = activity(await app[STORE].runs_since(start), start, now)
    counts = await app[STORE].finished_since(since)
    nodes = []
    for name in app[DISPATCHER].nodes:
        a = spans.get(name)
        nodes.append(
            {
                "name": name,
                "busy": [[iso(b), iso(e)] for b, e in (a.busy if a else [])],
                "busy_s": round(a.busy_s, 3) if a else 0.0,
                "jobs_per_hour": a.finished if a else 0,
            }
        )
    return json_response(
        {
            "now": iso(now),
            "since": iso(since),
            "window_s": ACTIVITY_WINDOW_S,
            "finished": {s: counts.get(s, 0) for s in FINAL},
            "nodes": nodes,
        }
    )
