"""The router's HTTP face: thin views over the store and the dispatcher. Errors are raised as
GpuqError anywhere and rendered once, here, as {"error": {"status", "message"}}."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from typing import Any

from aiohttp import web

from .. import eta
from ..activity import activity
from ..node.alerts import Alerter
from ..bus import Bus, next_event
from ..config import ConfigError, Settings, load_config
from ..access.connections import body_deadline
from ..node.dispatcher import Dispatcher
from ..node.runtime import NodeRuntime
from ..node.stale import StaleMonitor
from ..errors import (BadRequest, Conflict, DoorWords, Forbidden, GpuqError, OverQuota, http_error, StoreUnavailable, UnknownNode, Unprocessable,
                     check_text, json_object, json_type)
from .metrics import Metrics
from ..jobs import (ACTIVE, FINAL, JobState, Kind, NewJob, NodeCounts, check_job_id, compact_json, iso, parse_iso,
                     preview_url)
from ..reload import REMOVED_REASON, plan, refusal
from ..access.identity import ANYONE, Caller
from ..access.lanes import Door, lane_for
from ..access.hosts import CALLER, access_middleware, host_middleware
from ..shipped import shipped_dir, shipped_files
from ..store import Row, Store

log = logging.getLogger("gpuq")

WEB_DIR = shipped_dir("web")
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

SETTINGS = web.AppKey("settings", Settings)
STORE = web.AppKey("store", Store)
DISPATCHER = web.AppKey("dispatcher", Dispatcher)
BUS = web.AppKey("bus", Bus)
METRICS = web.AppKey("metrics", Metrics)
ALERTER = web.AppKey("alerter", Alerter)
RELOADING = web.AppKey("reloading", asyncio.Lock)  # one reload of gpuq.toml at a time
ACTIVITY_WINDOW_S = 3600.0  # the busy strips and jobs per hour look this far back

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def json_response(body: Any, status: int = 200, **kwargs: Any) -> web.Response:
    return web.json_response(body, status=status, dumps=compact_json, **kwargs)


def job_json(row: Row, public_url: str) -> Row:
    """The API's shape of a job row: `prompt` (and `output`) only when the row is a job's detail."""
    out = {
        "id": row["id"], "kind": row["kind"], "state": row["state"], "node": row["node"],
        "model": row["model"], "prompt_excerpt": row["prompt_excerpt"], "prompt_bytes": row["prompt_bytes"],
        "parent": row.get("parent_id"),
        "group": row.get("group_id"), "placement": row.get("placement"), "error": row.get("error"),
        "created_at": row.get("created_at"), "started_at": row.get("started_at"),
        "finished_at": row.get("finished_at"), "progress_at": row.get("progress_at"),
        "work_done_at": row.get("work_done_at"), "eval_count": row.get("eval_count"),
        "eval_duration_ns": row.get("eval_duration_ns"), "done_reason": row.get("done_reason"),
        "preempted_runs": row.get("preempted_runs", 0), "timeout_s": row.get("timeout_s"),
        "run_id": row.get("run_id"), "preview_url": preview_url(public_url, row["id"]),
        "waiting_for": row.get("waiting_for"),  # a held critique: the parent it waits for
        # who sent it (None: the router knows no one), with what program, and its lane
        "owner": row.get("owner"), "client": row.get("client"), "lane": row.get("lane"),
    }
    if row.get("endpoint"):
        out["endpoint"] = row["endpoint"]
    for key in ("owner", "client"):  # who sent it (null: the router knew no one), and with what
        out[key] = row.get(key)
    for key in ("findings", "think", "options", "request"):  # JSON columns
        if row.get(key) is not None:
            out[key] = json.loads(row[key])
    for key in ("prompt", "output", "thinking", "runs", "events", "children", "queue_position"):
        if key in row:
            out[key] = row[key]
    return out


def error_response(status: int, message: str) -> web.Response:
    return json_response({"error": {"status": status, "message": message}}, status=status)


API_DOOR = DoorWords(no_route=lambda method, path: f"no route for {path}", wrong_method=None, too_large="",
                     internal="internal error in the router; see its log")


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except Exception as exc:
        error = http_error(exc, API_DOOR, request.method, request.path)
        if error is None:
            raise
        if error.unexpected and isinstance(exc, ConnectionResetError) and client_left(request):
            # A closed tab ends its event stream or job stream this way: normal, and nobody to answer.
            log.debug("client left during %s %s", request.method, request.path)
        elif error.unexpected:
            log.exception("unexpected error on %s %s", request.method, request.path)
        response = error_response(error.status, error.message)
        if error.retry_after_s is not None:
            response.headers["Retry-After"] = str(error.retry_after_s)
        return response


def client_left(request: web.Request) -> bool:
    return request.transport is None or request.transport.is_closing()


@web.middleware
async def headers_middleware(request: web.Request, handler):
    resp = await handler(request)
    resp.headers.setdefault("Content-Security-Policy", CSP)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "no-referrer")
    return resp


# -- input ------------------------------------------------------------------------------------

async def json_body(request: web.Request, allowed: set[str]) -> dict:
    body = json_object(await request.read(), "missing request body: expected a JSON object", "malformed JSON",
                       lambda value: f"a JSON {json_type(value)}")
    check_text(body)  # first: the messages below quote the body's text
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})")
    return body


def expected_type(kind: type | tuple) -> str:
    """What a JSON client calls the type a field wants, for messages: 'string', not Python's 'str'
    (a value's own type is errors.json_type's)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:
        return "number"
    names = {str: "string", int: "whole number", bool: "boolean", list: "array", dict: "object",
             type(None): "null"}
    return names.get(kinds[0], kinds[0].__name__)


def field_of(body: dict, key: str, kind: type, required: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(f"missing field '{key}'")
        return None
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):  # a bool is an int to Python
        raise BadRequest(f"field '{key}' must be a {expected_type(kind)}, got {json.dumps(value)[:80]}")
    return value


def job_id_of(request: web.Request, text: str | None = None) -> str:
    return check_job_id(text if text is not None else request.match_info["id"])


def caller_of(request: web.Request) -> Caller:
    """Who sent the request: set by security.access_middleware on every /api route."""
    return request.get(CALLER, ANYONE)


def actor_of(request: web.Request) -> str:
    """An event's actor: the user, then how and from where ('alice (cli 127.0.0.1)'; on an open
    router, as before, 'cli 127.0.0.1'). The address stays for forensics."""
    who = request.headers.get("X-Gpuq-Actor", "api")
    who = who if who in ("cli", "page", "api") else "api"
    door = f"{who} {request.remote or '?'}"
    name = caller_of(request).name
    return door if name is None else f"{name} ({door})"


def refuse_others(caller: Caller, job: Row) -> None:
    """A member acts on their own jobs only: 403 naming the job's owner."""
    if not caller.may_act_on(job.get("owner")):
        owner = job.get("owner")
        whose = f"belongs to {owner}" if owner else "belongs to no user (sent without a user's token)"
        raise Forbidden(f"job {job['id']} {whose}; a member acts only on their own jobs "
                        f"(you are {caller.name}, a member)")


async def own_job(request: web.Request) -> str:
    """The job id of the route, after checking the caller may act on it (its owner never changes)."""
    job_id = job_id_of(request)
    caller = caller_of(request)
    if not caller.admin:
        refuse_others(caller, await request.app[STORE].job(job_id))
    return job_id


def admin_only(request: web.Request, what: str) -> None:
    caller = caller_of(request)
    if not caller.admin:
        raise Forbidden(f"{what} is for an admin; {caller.name} is a member")


# -- start estimates --------------------------------------------------------------------------

def with_eta(job: dict, found: dict[str, eta.Estimate]) -> dict:
    """eta_start, eta_finish (ISO, or null with eta_reason) on a waiting or running job."""
    if job["state"] not in ACTIVE:
        return job
    e = found.get(job["id"]) or eta.Estimate(
        None, None, f"more than {eta.DEPTH} jobs wait ahead of it, or its node is not in the config")
    job["eta_start"] = None if e.start_s is None else iso(e.start_s)
    job["eta_finish"] = None if e.finish_s is None else iso(e.finish_s)
    job["eta_reason"] = e.reason
    return job


async def with_quota(app: web.Application, jobs: list[dict]) -> None:
    """A waiting job whose owner runs their max_running already waits for that, even on a free
    node: say so (held_by_quota), and its start estimate says it too."""
    limits = app[STORE].max_running
    owners = {j["owner"] for j in jobs if j["state"] == JobState.QUEUED and j.get("owner") in limits}
    if not owners:
        return
    running = await app[STORE].running_by_owner(owners)
    for job in jobs:
        owner = job.get("owner")
        if job["state"] == JobState.QUEUED and owner in owners and running.get(owner, 0) >= limits[owner]:
            n = running[owner]
            why = (f"user '{owner}' runs {n} job{'s' if n != 1 else ''} already, their max_running: it starts "
                   "once one ends; other users' jobs run meanwhile")
            job["held_by_quota"] = why
            job["eta_start"] = job["eta_finish"] = None
            job["eta_reason"] = why


# -- views ------------------------------------------------------------------------------------

HEALTH_READ_S = 0.5  # /health answers within about this, whatever the store does


# A read of the pages' and the CLI's that the store does not answer within this long is a 503
# naming the store's trouble: the page then still shows /health's truth (it fetches each part
# apart), where it would wait with a frozen disk (a reader's thread can be stuck for minutes).
READ_BOUND_S = 5.0


def bounded(handler):
    """A GET that reads the store, answered within READ_BOUND_S whatever the store does."""
    async def read_within_bound(request: web.Request) -> web.StreamResponse:
        try:
            async with asyncio.timeout(READ_BOUND_S):
                return await handler(request)
        except TimeoutError:
            trouble = request.app[STORE].trouble(slow_s=READ_BOUND_S)
            why = f": {trouble['problem']}" if trouble else ""
            raise StoreUnavailable(f"the database did not answer within {READ_BOUND_S:g}s{why}; "
                                   "GET /health says what the router knows") from None
    return read_within_bound


async def health(request: web.Request) -> web.Response:
    """The queue's truth: from memory first (nodes, loops, the store's own trouble), then two
    indexed reads bounded by HEALTH_READ_S; a store that does not answer them is named, not
    waited for."""
    store, dispatcher = request.app[STORE], request.app[DISPATCHER]
    trouble = store.trouble()
    active: dict[str, NodeCounts] | None = None
    stale: list[dict] = []
    leases: dict = {"routers": None, "holders": None}  # unknown while the store does not answer
    heads: dict[str, Row | None] = {}
    unclaimed_nodes = [w for w in dispatcher.workers.values() if w.claim_refused and w.rt.claimable]
    if trouble is None or "not answering" not in trouble["problem"]:  # don't queue behind a stuck read
        try:
            async with asyncio.timeout(HEALTH_READ_S):
                active = await store.active_by_node()
                stale = [{k: h[k] for k in ("id", "node", "state", "since", "reason")}
                         for h in await store.stale_heads()]
                for w in unclaimed_nodes:
                    heads[w.rt.name] = await store.next_ready(w.rt.name)
                leases = await store.routers(dispatcher.settings.lease_s)
        except TimeoutError:
            trouble = store.trouble(slow_s=HEALTH_READ_S) or {"problem": f"the database is not answering: /health's read took over "
                                                     f"{HEALTH_READ_S:g}s", "since": iso(time.time())}
        except GpuqError as exc:
            trouble = {"problem": f"the database cannot be read: {exc.message}", "since": iso(time.time())}
    down = [{"name": rt.name, "since": iso(rt.since), "error": rt.vram_stuck or rt.last_error,
             "waiting": None if active is None else active.get(rt.name, NodeCounts()).queued,
             **({"recorded": False} if rt.health_unrecorded else {})}  # the store refused to record it
            for rt in dispatcher.nodes.values() if rt.checked and not rt.claimable]
    # Waiting jobs on an up, idle node whose claims the store refuses: a stuck queue too.
    unclaimed = [{"node": w.rt.name, "job": heads[w.rt.name]["id"] if heads.get(w.rt.name) else None,
                  "since": iso(w.claim_refused[0]), "error": w.claim_refused[1]}
                 for w in unclaimed_nodes if active is None or active.get(w.rt.name, NodeCounts()).queued]
    crashed = [loop.json() for loop in dispatcher.loops.down()]  # a loop that is not running, for now
    lost = store.lost  # the database file deleted or replaced under the router: writes are refused
    ok = (trouble is None and lost is None and not stale and not any(d["waiting"] for d in down)
          and not crashed and not unclaimed)
    body = {"ok": ok, "queue_depth": None if active is None else sum(c.queued for c in active.values()),
            "running": None if active is None else sum(c.running for c in active.values()), "stale": stale,
            "nodes_down": down, "loops_down": crashed, "unclaimed": unclaimed, "store": trouble,
            "database_lost": lost, "awake": dispatcher.awake.json(),
            "draining": dispatcher.draining_json(),  # told to stop, waiting for its running jobs
            # This router, the routers alive (each with the nodes it holds) and each node's holder.
            "router": {"id": dispatcher.router.id, "nodes": dispatcher.leases.held()}, **leases}
    return json_response(body, status=200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus' text format (the token applies, as for /api)."""
    app = request.app
    stale = await app[STORE].stale_heads()
    body = await app[METRICS].render(app[STORE], list(app[DISPATCHER].nodes.values()), len(stale))
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def submit(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await json_body(request, {"kind", "prompt", "model", "node", "parent", "timeout", "think", "options",
                                     "priority"})
    # The JSON types here, in the API's words; every rule of the values is NewJob's.
    caller = caller_of(request)
    lane = lane_for(caller.user, field_of(body, "priority", str), Door.API)
    new = NewJob.checked(settings.max_prompt_bytes, kind=field_of(body, "kind", str, required=True),
                         prompt=field_of(body, "prompt", str), parent=field_of(body, "parent", str),
                         timeout_s=field_of(body, "timeout", (int, float)), model=field_of(body, "model", str),
                         node=field_of(body, "node", str), think=body.get("think"), options=body.get("options"),
                         lane=lane, owner=caller.name,
                         client=request.headers.get("User-Agent"))
    # No estimate here: it reads the node's whole queue, and a burst of submits would pay that
    # once per job. `gpuq task` asks GET /api/jobs/{id} for it.
    jobs = await request.app[DISPATCHER].submit(new, actor_of(request))
    for job in jobs:
        log.info("job=%s node=%s state=%s model=%s kind=%s placement=%r", job["id"], job["node"], job["state"],
                 job["model"], new.kind, job["reason"])
        job["preview_url"] = preview_url(settings.public_url, job["id"])
    return json_response({"jobs": jobs}, status=201)


async def get_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = job_id_of(request)
    job = await app[STORE].job_detail(job_id)
    found: dict = {}
    if job["state"] in ACTIVE:
        found = await app[DISPATCHER].estimates()
        if job_id not in found:  # it ended (or moved on) between the two reads: read it again
            job = await app[STORE].job_detail(job_id)
    out = with_eta(with_live(job_json(job, app[SETTINGS].public_url), app[DISPATCHER]), found)
    await with_quota(app, [out])
    return json_response(out)


def with_live(job: dict, dispatcher: Dispatcher) -> dict:
    """A running job's output and token count so far, from memory (the database lags by ~1 s)."""
    cur = dispatcher.live(job["id"])
    if cur is not None:
        job["tokens_so_far"] = cur.tokens  # Ollama streams one token per chunk
        job["thinking_tokens_so_far"] = cur.thinking_tokens
        if "output" in job:
            job["output"] = "".join(cur.output)
            job["thinking"] = "".join(cur.thinking) or None
    return job


async def list_jobs(request: web.Request) -> web.Response:
    q = request.query
    state = q.get("state")
    if state and state not in set(JobState):
        raise BadRequest(f"unknown state '{state[:40]}'")
    limit = int_param(q, "limit", 100, 1, 10_000)
    # The estimates first: a job still waiting or running in the listing read after was in them.
    found = await request.app[DISPATCHER].estimates() if not state or state in ACTIVE else {}
    rows = await request.app[STORE].jobs(q.get("node"), state, limit)
    url = request.app[SETTINGS].public_url
    return json_response({"jobs": [with_eta(job_json(r, url), found) for r in rows]})


def int_param(query, key: str, default: int, low: int, high: int) -> int:
    text = query.get(key)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise BadRequest(f"query parameter '{key}' must be a whole number from {low} to {high}, got '{text[:40]}'")
    return int(text)


def node_json(rt: NodeRuntime) -> dict:
    """The API's shape of a node: its config, its health, a crashed loop of its own."""
    return {
        "name": rt.name, "rank": rt.config.rank, "roles": list(rt.config.roles),
        "model": rt.config.model, "url": rt.config.url, "up": rt.up, "checked": rt.checked,
        "since": iso(rt.since), "last_error": rt.last_error, "model_installed": rt.model_installed,
        "vram_stuck": rt.vram_stuck, "health_recorded": not rt.health_unrecorded,
        "loop_error": "; ".join(loop.problem() for loop in rt.loops if not loop.alive) or None,
        # The model kept loaded between jobs, and until when (null: until the node goes idle).
        "warm": None if rt.warm_model is None else {
            "model": rt.warm_model, "until": None if rt.warm_until is None else iso(rt.warm_until)},
    }


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
    queues = {rt.name: await app[STORE].queue(rt.name, limit if i < columns else 0, offset)
              for i, rt in enumerate(runtimes)}
    if offset:
        # A page deep in a queue: its start estimates count the jobs ahead of it (eta.DEPTH at most).
        found = await app[DISPATCHER].estimates(await app[STORE].queue_plans([only], min(offset + limit, eta.DEPTH)))
    else:
        # The estimates of the jobs shown, from the rows just read (no second read of the queues).
        found = await app[DISPATCHER].estimates([j for running, queued, _ in queues.values() for j in [running, *queued] if j])
    nodes, depth = [], 0
    for rt in runtimes:
        running, queued, count = queues[rt.name]
        depth += count
        running = running and with_eta(with_live(job_json(running, url), app[DISPATCHER]), found)
        nodes.append(dict(node_json(rt), running=running,
                          queued=[with_eta(job_json(j, url), found) for j in queued], queued_count=count))
    await with_quota(app, [j for n in nodes for j in n["queued"]])
    return json_response({"queue_depth": depth, "nodes": nodes} if only is None else
                         {"nodes": nodes, "offset": offset})


async def nodes(request: web.Request) -> web.Response:
    active = await request.app[STORE].active_by_node()
    return json_response({"nodes": [dict(node_json(rt), waiting=active.get(rt.name, NodeCounts()).queued)
                                        for rt in request.app[DISPATCHER].nodes.values()]})


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
    job = await app[STORE].move(await own_job(request), app[DISPATCHER].node_infos(), actor_of(request),
                                position=position, before=before, after=after, node=node)
    app[DISPATCHER].wake(job["node"])
    app[BUS].publish("queue", {"moved": job["id"]})
    log.info("job=%s node=%s state=queued moved position=%s actor=%r", job["id"], job["node"], job["position"],
             actor_of(request))
    return json_response({"job": {"id": job["id"], "node": job["node"], "position": job["position"],
                                  "state": JobState.QUEUED}})


async def preempt(request: web.Request) -> web.Response:
    app = request.app
    caller = caller_of(request)
    job, interrupted = await app[STORE].preempt(await own_job(request), actor_of(request),
                                                only_owner=None if caller.admin else caller.name or "")
    app[DISPATCHER].abort(interrupted, f"preempted by {job['id']}")
    app[BUS].publish("queue", {"preempted": job["id"]})
    log.info("job=%s node=%s state=queued preempt position=1 actor=%r", job["id"], job["node"], actor_of(request))
    if interrupted:
        log.info("job=%s node=%s state=queued reason=%r", interrupted.job_id, job["node"], f"preempted by {job['id']}")
    return json_response({"job": {"id": job["id"], "node": job["node"], "position": 1, "state": JobState.QUEUED},
                          "interrupted": interrupted and interrupted.job_id})


async def delete(request: web.Request) -> web.Response:
    app = request.app
    actor = actor_of(request)
    reason = f"deleted by {actor}"
    job, interrupted = await app[STORE].delete(await own_job(request), actor, reason)
    app[DISPATCHER].abort(interrupted, reason)
    app[DISPATCHER].ended([job["id"]], reason)
    app[BUS].publish("queue", {"deleted": job["id"]})
    log.info("job=%s node=%s state=cancelled reason=%r", job["id"], job["node"], reason)
    return json_response({"job": {"id": job["id"], "node": job["node"], "state": JobState.CANCELLED,
                                  "was": JobState.RUNNING if interrupted else JobState.QUEUED}})


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
    ids, interrupted = await app[STORE].clear(name, actor_of(request), running=running, reason=reason,
                                              only_owner=None if caller.admin else caller.name or "")
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
        job = await app[STORE].retry(await own_job(request), actor_of(request),
                                     frozenset(dispatcher.nodes) - dispatcher.removing,
                                     dispatcher.settings.max_waiting)
    except OverQuota as exc:
        await dispatcher.when_one_starts(exc)
        raise
    app[DISPATCHER].wake(job["node"])
    app[BUS].publish("queue", {"retried": job["id"]})
    log.info("job=%s node=%s state=queued reason='retry requested' actor=%r", job["id"], job["node"], actor_of(request))
    return json_response({"job": {"id": job["id"], "node": job["node"], "state": JobState.QUEUED}})


async def history(request: web.Request) -> web.Response:
    """Finished jobs, newest first, paged and filtered by state, node, kind and text."""
    q = request.query
    state, kind, node, text = q.get("state") or None, q.get("kind") or None, q.get("node") or None, q.get("q") or None
    owner = q.get("owner") or None
    if owner and len(owner) > 200:
        raise BadRequest(f"query parameter 'owner' is {len(owner)} characters long; at most 200")
    if state and state not in FINAL:
        raise BadRequest(f"unknown state '{state[:40]}' (finished jobs are done, failed or cancelled)")
    if kind and kind not in {k.value for k in Kind}:
        raise BadRequest(f"unknown kind '{kind[:40]}' (expected {', '.join(repr(k.value) for k in Kind)})")
    if node and not NODE_NAME.fullmatch(node):
        raise BadRequest(f"'{node[:64]}' is not a node name")
    if text and len(text) > 200:
        raise BadRequest(f"query parameter 'q' is {len(text)} characters long; at most 200")
    limit = int_param(q, "limit", 50, 1, 500)
    offset = int_param(q, "offset", 0, 0, 10_000_000)
    rows, total = await request.app[STORE].history(state, node, kind, text, limit, offset, owner=owner)
    url = request.app[SETTINGS].public_url
    return json_response({"jobs": [job_json(r, url) for r in rows], "total": total, "limit": limit,
                          "offset": offset})


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
            raise BadRequest("query parameter 'since' must be a UTC time like 2026-11-29T00:00:00.000000Z, "
                             f"got '{request.query['since'][:40]}'") from None
    start = now - ACTIVITY_WINDOW_S
    spans = activity(await app[STORE].runs_since(start), start, now)
    counts = await app[STORE].finished_since(since)
    nodes = []
    for name in app[DISPATCHER].nodes:
        a = spans.get(name)
        nodes.append({"name": name, "busy": [[iso(b), iso(e)] for b, e in (a.busy if a else [])],
                      "busy_s": round(a.busy_s, 3) if a else 0.0, "jobs_per_hour": a.finished if a else 0})
    return json_response({"now": iso(now), "since": iso(since), "window_s": ACTIVITY_WINDOW_S,
                          "finished": {s: counts.get(s, 0) for s in FINAL}, "nodes": nodes})


async def alerts(request: web.Request) -> web.Response:
    """The latest firings and every try to deliver their notices."""
    limit = int_param(request.query, "limit", 50, 1, 1000)
    return json_response({"alert_url_set": request.app[DISPATCHER].settings.alert_url is not None,
                          "alerts": await request.app[STORE].alerts(limit)})


async def stream_job(request: web.Request) -> web.StreamResponse:
    """NDJSON: {"thinking"} and {"text"} pieces (the reasoning and the answer) as they are
    generated, then {"done", "job"}; the first of each kind, marked catch_up, is everything so
    far (with its `tokens` while the job runs). While the job waits, {"queued": {node, position,
    waiting_for}} whenever where it waits changes, and {"started": {node}} when it starts."""
    app = request.app
    job_id = job_id_of(request)
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})

    async def line(obj: dict) -> None:
        await resp.write(compact_json(obj).encode() + b"\n")

    with app[BUS].subscribe() as events:
        # A job running here needs no read before its first line (a read is a thread hop): its
        # output so far is in memory, and the store is read when it has ended.
        live = app[DISPATCHER].live(job_id) is not None
        job = {"id": job_id, "state": JobState.RUNNING} if live else await app[STORE].job(job_id)
        await resp.prepare(request)
        cur = app[DISPATCHER].live(job_id)
        if cur is None:  # not running: what it stored (one that starts meanwhile is live again)
            job = await app[STORE].job_detail(job_id)
            cur = app[DISPATCHER].live(job_id)
        sent = {"text": "".join(cur.output) if cur else job["output"],
                "thinking": "".join(cur.thinking) if cur else (job["thinking"] or "")}
        # A running job's catch-up says how many tokens (Ollama's chunks) it holds, counted at the
        # same moment: a follower counting on from it misses none and counts none twice.
        counts = {"thinking": cur.thinking_tokens, "text": cur.tokens - cur.thinking_tokens} if cur else {}
        while not events.empty():  # pieces published so far are already in `sent`
            events.get_nowait()
        for kind in ("thinking", "text"):  # what was generated before this follower joined
            if sent[kind]:
                await line({kind: sent[kind], "catch_up": True} | ({"tokens": counts[kind]} if counts else {}))
        where = None  # where the job was last said to wait

        async def say_where() -> None:
            nonlocal where
            if job["state"] == JobState.QUEUED:
                now = {"node": job["node"], "position": await app[STORE].queue_position(job),
                       "waiting_for": job.get("waiting_for")}
                if now != where:
                    await line({"queued": now})
            elif job["state"] == JobState.RUNNING and where is not None and "started" not in where:
                now = {"started": True}
                await line({"started": {"node": job["node"]}})
            else:
                return
            where = now
        async def caught_up_from_store(run_id: int) -> None:
            """What the router running the job stored since (its heartbeats, about each second)."""
            stored = (await app[STORE].run_texts([run_id]))[run_id]
            for kind, text in (("thinking", stored["thinking"] or ""), ("text", stored["output"])):
                if len(text) > len(sent[kind]) and text.startswith(sent[kind]):
                    await line({kind: text[len(sent[kind]):]})
                    sent[kind] = text

        await say_where()
        while job["state"] in ACTIVE:
            topic, data = await next_event(events, 1.0) or ("tick", {})
            if topic == "shutdown":  # the router is stopping: end without a final line
                return resp
            if topic == "tokens" and data["id"] == job_id:
                kind = "thinking" if "thinking" in data else "text"
                await line({kind: data[kind]})
                sent[kind] += data[kind]
            elif topic != "tokens":
                job = await app[STORE].job(job_id)  # its state; the whole detail once it is final
                if job["state"] == JobState.RUNNING and app[DISPATCHER].live(job_id) is None:
                    await caught_up_from_store(job["run_id"])  # another router runs it (PostgreSQL)
                await say_where()
        if "runs" not in job:
            job = await app[STORE].job_detail(job_id)
        # A job that ended while the follower was joining (its pieces were drained as if `sent`
        # held them, but it was no longer live): the lines still add up to what was stored.
        for kind, stored in (("thinking", job["thinking"] or ""), ("text", job["output"])):
            if stored != sent[kind] and stored.startswith(sent[kind]):
                await line({kind: stored[len(sent[kind]):]})
        final = job_json(job, app[SETTINGS].public_url)
        for key in ("prompt", "runs", "events"):  # the follower has its prompt: the excerpt is enough
            final.pop(key, None)
        await line({"done": True, "job": final})
    await resp.write_eof()
    return resp


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events for the page: one `change` per queue change, coalesced."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    with request.app[BUS].subscribe() as queue:
        await resp.prepare(request)
        await resp.write(b"retry: 1000\nevent: hello\ndata: {}\n\n")
        while True:
            event = await next_event(queue, 15.0)
            if event is None:
                await resp.write(b": keep-alive\n\n")
                continue
            topic, data = event
            if topic == "shutdown":
                return resp
            if topic == "tokens":
                await resp.write(f"event: tokens\ndata: {compact_json(data)}\n\n".encode())
            else:
                await resp.write(f"event: change\ndata: {compact_json(data)}\n\n".encode())


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "index.html")


async def history_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "history.html")


async def preview_page(request: web.Request) -> web.FileResponse:
    job_id_of(request)
    return web.FileResponse(WEB_DIR / "job.html")


# -- gpuq.toml, read again --------------------------------------------------------------------

async def reload_config(app: web.Application, actor: str, force: bool = False) -> dict:
    """Read gpuq.toml again and follow it (gpuq/reload.py says what changed). A file that cannot
    be read or is invalid changes nothing; removing a node where jobs wait or run is refused,
    naming them, unless `force` (its waiting jobs fail, its running one finishes). Every reload,
    refused or not, is a row of config_reload and a log line."""
    dispatcher, store = app[DISPATCHER], app[STORE]
    async with app[RELOADING]:
        old = dispatcher.settings
        if old.source is None:
            message = ("this router has no gpuq.toml to reload: it runs the demo's simulated nodes; "
                       "serve a config file (gpuq serve --config gpuq.toml) to change settings live")
            log.error("config not reloaded (asked by %s): %s", actor, message)
            raise Conflict(message)
        path = str(old.source)

        async def refused(message: str) -> None:
            log.error("config not reloaded from %s by %s: %s", path, actor, message)
            try:
                await store.record_reload(actor, path, None, message)
            except GpuqError as exc:
                log.error("config reload not recorded: %s", exc.message)

        try:
            new = await asyncio.to_thread(load_config, old.source)
        except ConfigError as exc:
            message = f"not reloaded, nothing changed: {exc.message}"
            await refused(message)
            raise Unprocessable(message) from None
        change = plan(old, new)
        dispatcher.leaving(change.removed)
        try:
            failed = await store.remove_nodes(list(change.removed), force, REMOVED_REASON, refusal)
            settings = change.settings
            await store.configure({"stale_after_s": settings.stale_after_s, "stale_grace_s": settings.stale_grace_s,
                                   "max_runtime_s": settings.max_runtime_s}, list(settings.nodes))
        except GpuqError as exc:
            dispatcher.restore(change.removed)
            await refused(exc.message)
            raise
        dispatcher.reconfigure(change)
        await app[ALERTER].reconfigure(change.settings)
        for job in failed:
            log.warning("job=%s node=%s state=failed reason=%r", job["id"], job["node"], REMOVED_REASON)
        dispatcher.ended([j["id"] for j in failed], REMOVED_REASON)
        answer = {"path": path, **change.json(), "failed": [{"id": j["id"], "node": j["node"]} for j in failed]}
        log.info("config reloaded from %s by %s: %s", path, actor, change.summary())
        try:
            await store.record_reload(actor, path, answer, None)
        except GpuqError as exc:  # in force all the same: the log line says what changed
            log.error("config reload not recorded: %s", exc.message)
        app[BUS].publish("queue", {"reloaded": True})
        return answer


async def whoami(request: web.Request) -> web.Response:
    """Who the router takes the caller for: `gpuq queue --mine` asks. name null: no identity."""
    caller = caller_of(request)
    return json_response({"name": caller.name, "role": caller.role, "via": caller.via})


async def reload_view(request: web.Request) -> web.Response:
    admin_only(request, "reloading gpuq.toml")
    body = await json_body(request, {"force"}) if request.body_exists else {}  # body_deadline read it
    force = field_of(body, "force", bool) or False
    return json_response(await reload_config(request.app, actor_of(request), force))


def reload_on_signal(app: web.Application) -> None:
    """SIGHUP: reload gpuq.toml as `gpuq reload` does; the outcome goes to the log."""
    async def reload() -> None:
        try:
            await reload_config(app, "signal SIGHUP")
        except GpuqError:
            pass  # logged by reload_config
        except Exception:
            log.exception("config reload on SIGHUP failed")
    task = asyncio.ensure_future(reload())
    app[DISPATCHER].retiring.add(task)  # kept until done, cancelled at the stop
    task.add_done_callback(app[DISPATCHER].retiring.discard)


# -- assembly ---------------------------------------------------------------------------------

async def _end_streams(app: web.Application) -> None:
    """Open streams (a page's events, a job's output) end first, or shutdown waits for them."""
    app[BUS].publish("shutdown", {})


async def _lifecycle(app: web.Application):
    settings = app[SETTINGS]
    store = app[STORE]
    await store.open()
    dispatcher = app[DISPATCHER]
    try:
        await store.configure({"stale_after_s": settings.stale_after_s, "stale_grace_s": settings.stale_grace_s,
                               "max_runtime_s": settings.max_runtime_s}, list(settings.nodes))
        # A model a previous router saw stuck in VRAM keeps its node flagged until it is gone.
        await dispatcher.start(stuck=[a for a in await store.open_alerts() if a["alert"] == "vram_stuck"])
        await app[ALERTER].start()
    except BaseException:  # the store's threads would keep a router that failed to start alive
        await dispatcher.stop()
        await app[ALERTER].stop()
        await store.close()
        raise
    dispatcher.loops.start("stale monitor", StaleMonitor(store, app[BUS]).run)  # stopped with the workers
    # Sum the history for /metrics now, so the first scrape after a start is not the slow one.
    warm = asyncio.create_task(app[METRICS].catch_up(store))
    yield
    warm.cancel()
    await asyncio.gather(warm, return_exceptions=True)
    await dispatcher.stop()  # its loops include the alerts'
    await app[ALERTER].stop()
    await store.close()


def create_app(settings: Settings, clock=time.time) -> web.Application:
    app = web.Application(middlewares=[headers_middleware, errors_middleware,
                                       body_deadline(settings.body_timeout_s, lambda _, *error: error_response(*error)),
                                       host_middleware(settings),
                                       access_middleware(lambda: app[DISPATCHER].settings)],
                          client_max_size=settings.max_prompt_bytes * 2 + 65536)
    bus = Bus()
    store = Store(settings.database, settings.busy_timeout_s, clock, max_bytes=settings.max_database_bytes,
                  submit_timeout_s=settings.submit_timeout_s)
    app[SETTINGS] = settings
    app[STORE] = store
    app[BUS] = bus
    app[METRICS] = Metrics()
    app[DISPATCHER] = Dispatcher(settings, store, bus)
    app[ALERTER] = Alerter(settings, store, app[DISPATCHER])
    app[RELOADING] = asyncio.Lock()
    app.cleanup_ctx.append(_lifecycle)
    app.on_shutdown.append(_end_streams)
    r = app.router
    r.add_get("/health", health)
    r.add_get("/metrics", metrics)
    r.add_get("/api/queue", bounded(queue))
    r.add_get("/api/nodes", bounded(nodes))
    r.add_get("/api/stale", bounded(stale))
    r.add_get("/api/history", bounded(history))
    r.add_get("/api/activity", bounded(activity_view))
    r.add_get("/api/alerts", bounded(alerts))
    r.add_get("/api/events", events)
    r.add_post("/api/jobs", submit)
    r.add_get("/api/jobs", bounded(list_jobs))
    r.add_get("/api/jobs/{id}", bounded(get_job))
    r.add_delete("/api/jobs/{id}", delete)
    r.add_get("/api/jobs/{id}/stream", stream_job)
    r.add_post("/api/jobs/{id}/move", move)
    r.add_post("/api/jobs/{id}/preempt", preempt)
    r.add_post("/api/jobs/{id}/retry", retry)
    r.add_post("/api/nodes/{name}/clear", clear)
    r.add_post("/api/reload", reload_view)
    r.add_get("/api/whoami", whoami)
    r.add_get("/", page)
    r.add_get("/jobs/{id}", preview_page)
    r.add_get("/history", history_page)
    shipped_files(WEB_DIR, "index.html", "pages")
    r.add_static("/static/", WEB_DIR, name="static")
    return app
