"""The queues and what a person does to them: each node's queue, the nodes, the stale heads;
move, preempt, delete, clear, retry (each one verb of the store, then the dispatcher told)."""

from __future__ import annotations

import logging

from aiohttp import web

from .. import eta, speed
from ..access.privacy import change_scope
from ..errors import BadRequest, OverQuota, UnknownNode
from ..jobs import JobState, NodeCounts, normalize_model
from ..node.runtime import NodeRuntime
from ..store import Row, Store
from .callers import actor_of, as_seen, caller_of, own_job
from .inputs import field_of, int_param, job_id_of, json_body
from .render import job_json, json_response, node_json, with_eta, with_live, with_quota
from .state import BUS, DISPATCHER, SETTINGS, STORE

log = logging.getLogger("gpuq")


async def queue(request: web.Request) -> web.Response:
    """Each node's running job, its first `limit` waiting jobs and how many wait. `node` and
    `offset`: one node's column only, its waiting jobs from the `offset`-th (0: the head), for a
    page that fetches the part of a long column scrolled into view. `columns`: the waiting jobs
    of the first `columns` nodes only (in rank order: a page's columns in view); the others
    come with their running job and count, their `queued` empty."""
    app = request.app
    limit = int_param(request.query, "limit", 1000, 0, 100_000)
    offset = int_param(request.query, "offset", 0, 0, 1_000_000_000)
    columns = int_param(request.query, "columns", 1_000_000, 0, 1_000_000)
    url = app[SETTINGS].public_url
    only = request.query.get("node")
    runtimes = list(app[DISPATCHER].nodes.values())
    if only is not None:
        runtimes = [rt for rt in runtimes if rt.name == only]
        if not runtimes:
            raise UnknownNode(only, app[DISPATCHER].nodes)
    elif offset:
        raise BadRequest("query parameter 'offset' needs 'node': it pages one node's waiting jobs")
    queues = {
        rt.name: await app[STORE].queue(rt.name, limit if i < columns else 0, offset) for i, rt in enumerate(runtimes)
    }
    if offset:
        assert only is not None  # an offset without a node is refused above
        # A page deep in a queue: its start estimates count the jobs ahead of it (eta.DEPTH at most).
        found = await app[DISPATCHER].estimates(await app[STORE].queue_plans([only], min(offset + limit, eta.DEPTH)))
    else:
        # The estimates of the jobs shown, from the rows just read (no second read of the queues).
        found = await app[DISPATCHER].estimates(
            [j for running, queued, _ in queues.values() for j in [running, *queued] if j]
        )
    nodes, depth = [], 0
    speeds = await model_speeds(app[STORE], runtimes)  # the node's head on the page shows it
    for rt in runtimes:
        running, queued, count = queues[rt.name]
        depth += count
        running = running and with_eta(with_live(job_json(running, url), app[DISPATCHER]), found)
        nodes.append(
            dict(
                node_json(rt),
                running=running,
                queued=[with_eta(job_json(j, url), found) for j in queued],
                queued_count=count,
                speed=speeds[rt.name],
            )
        )
    await with_quota(app, [j for n in nodes for j in n["queued"]])
    # A batch's waiting lines say whose (the page folds them under their batch's line; a
    # placeholder, below, drops it).
    lines = [j for n in nodes for j in n["queued"] if j.get("lane") == "batch" and j.get("endpoint")]
    if lines:
        batches = await app[STORE].batches_of_jobs([j["id"] for j in lines])
        for j in lines:
            if j["id"] in batches:
                j["batch"] = batches[j["id"]]
    for n in nodes:  # on a private router, others' jobs as placeholders (last: with_live filled them)
        n["running"] = n["running"] and as_seen(request, n["running"])
        n["queued"] = [as_seen(request, j) for j in n["queued"]]
    return json_response({"queue_depth": depth, "nodes": nodes} if only is None else {"nodes": nodes, "offset": offset})


async def nodes(request: web.Request) -> web.Response:
    """Each node as node_json, with its waiting jobs and its measured speed on its model (speed.py)."""
    store, runtimes = request.app[STORE], list(request.app[DISPATCHER].nodes.values())
    active = await store.active_by_node()
    speeds = await model_speeds(store, runtimes)
    return json_response(
        {
            "nodes": [
                dict(node_json(rt), waiting=active.get(rt.name, NodeCounts()).queued, speed=speeds[rt.name])
                for rt in runtimes
            ]
        }
    )


async def model_speeds(store: Store, runtimes: list[NodeRuntime]) -> dict[str, Row]:
    """Each node's measured speed on its configured model, in the API's shape (one read)."""
    asked = {(rt.name, name) for rt in runtimes for name in speed.asked_names(rt.config.model)}
    found = speed.from_rows(await store.speeds(asked, speed.LAST_RUNS))
    return {rt.name: speed.speed_json(found.get((rt.name, normalize_model(rt.config.model)))) for rt in runtimes}


async def stale(request: web.Request) -> web.Response:
    return json_response({"stale": await request.app[STORE].stale_heads()})


async def move(request: web.Request) -> web.Response:
    body = await json_body(request, {"position", "before", "after", "node"})
    before, after = field_of(body, "before", str), field_of(body, "after", str)
    for other in (before, after):
        if other is not None:
            job_id_of(request, other)
    position = field_of(body, "position", int)
    if position is not None and not 1 <= position <= 1_000_000_000:
        raise BadRequest(f"field 'position' must be from 1 to 1000000000, got {position}")
    node = field_of(body, "node", str)
    app = request.app
    job = await app[STORE].move(
        await own_job(request),
        app[DISPATCHER].node_infos(),
        actor_of(request),
        position=position,
        before=before,
        after=after,
        node=node,
    )
    app[DISPATCHER].wake(job["node"])
    app[BUS].publish("queue", {"moved": job["id"]})
    log.info(
        "job=%s node=%s state=queued moved position=%s actor=%r",
        job["id"],
        job["node"],
        job["position"],
        actor_of(request),
    )
    return json_response(
        {"job": {"id": job["id"], "node": job["node"], "position": job["position"], "state": JobState.QUEUED}}
    )


async def preempt(request: web.Request) -> web.Response:
    app = request.app
    caller = caller_of(request)
    job, interrupted = await app[STORE].preempt(
        await own_job(request), actor_of(request), only_owner=change_scope(caller)
    )
    app[DISPATCHER].abort(interrupted, f"preempted by {job['id']}")
    app[BUS].publish("queue", {"preempted": job["id"]})
    log.info("job=%s node=%s state=queued preempt position=1 actor=%r", job["id"], job["node"], actor_of(request))
    if interrupted:
        log.info("job=%s node=%s state=queued reason=%r", interrupted.job_id, job["node"], f"preempted by {job['id']}")
    return json_response(
        {
            "job": {"id": job["id"], "node": job["node"], "position": 1, "state": JobState.QUEUED},
            "interrupted": interrupted and interrupted.job_id,
        }
    )


async def delete(request: web.Request) -> web.Response:
    app = request.app
    actor = actor_of(request)
    reason = f"deleted by {actor}"
    job, interrupted = await app[STORE].delete(await own_job(request), actor, reason)
    app[DISPATCHER].abort(interrupted, reason)
    app[DISPATCHER].ended([job["id"]], reason)
    app[BUS].publish("queue", {"deleted": job["id"]})
    log.info("job=%s node=%s state=cancelled reason=%r", job["id"], job["node"], reason)
    return json_response(
        {
            "job": {
                "id": job["id"],
                "node": job["node"],
                "state": JobState.CANCELLED,
                "was": JobState.RUNNING if interrupted else JobState.QUEUED,
            }
        }
    )


async def clear(request: web.Request) -> web.Response:
    app = request.app
    name = request.match_info["name"]
    if name not in app[DISPATCHER].nodes:
        raise UnknownNode(name, app[DISPATCHER].nodes)
    body = await json_body(request, {"running"}) if request.body_exists else {}  # body_deadline read it
    running = field_of(body, "running", bool) or False
    reason = f"cleared by {actor_of(request)}"
    caller = caller_of(request)
    # A member clears only a queue of their own jobs: others' there refuse it all, named (the store
    # checks in the same transaction as it cancels).
    ids, interrupted = await app[STORE].clear(
        name, actor_of(request), running=running, reason=reason, only_owner=change_scope(caller)
    )
    app[DISPATCHER].abort(interrupted, reason)
    app[DISPATCHER].ended(ids, reason)
    app[BUS].publish("queue", {"cleared": name})
    for job_id in ids:
        log.info("job=%s node=%s state=cancelled reason=%r", job_id, name, reason)
    return json_response({"node": name, "cancelled": ids})


async def retry(request: web.Request) -> web.Response:
    app = request.app
    dispatcher = app[DISPATCHER]
    try:
        job = await app[STORE].retry(
            await own_job(request),
            actor_of(request),
            frozenset(dispatcher.nodes) - dispatcher.removing,
            dispatcher.settings.max_waiting,
        )
    except OverQuota as exc:
        await dispatcher.when_one_starts(exc)
        raise
    app[DISPATCHER].wake(job["node"])
    app[BUS].publish("queue", {"retried": job["id"]})
    log.info("job=%s node=%s state=queued reason='retry requested' actor=%r", job["id"], job["node"], actor_of(request))
    return json_response({"job": {"id": job["id"], "node": job["node"], "state": JobState.QUEUED}})
