"""Jobs: submit one, read one, list them, the history of finished ones."""

from __future__ import annotations

import logging
import re

from aiohttp import web

from .. import eta
from ..access.lanes import Door, lane_for
from ..errors import BadRequest, NotFound
from ..jobs import ACTIVE, FINAL, JobState, Kind, NewJob, preview_url
from .callers import actor_of, as_seen, caller_of, private_for, reads_all, refuse_unreadable
from .gone import not_in_database
from .inputs import field_of, int_param, job_id_of, json_body
from .render import job_json, json_response, with_eta, with_live, with_quota
from .state import DISPATCHER, SETTINGS, STORE

log = logging.getLogger("gpuq")


async def submit(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await json_body(
        request, {"kind", "prompt", "model", "node", "parent", "timeout", "think", "options", "priority"}
    )
    # The JSON types here, in the API's words; every rule of the values is NewJob's.
    caller = caller_of(request)
    lane = lane_for(caller.user, field_of(body, "priority", str), Door.API)
    parent = field_of(body, "parent", str)
    if parent is not None and private_for(request):
        # A critique's prompt is its parent's prompt and output: on a private router, a member's
        # critique of another's job would be a copy of it, theirs to read.
        job_id_of(request, parent)
        refuse_unreadable(request, await request.app[STORE].job(parent), "critiquing it")
    new = NewJob.checked(
        settings.max_prompt_bytes,
        kind=field_of(body, "kind", str, required=True),
        prompt=field_of(body, "prompt", str),
        parent=parent,
        timeout_s=field_of(body, "timeout", (int, float)),
        model=field_of(body, "model", str),
        node=field_of(body, "node", str),
        think=body.get("think"),
        options=body.get("options"),
        lane=lane,
        owner=caller.name,
        client=request.headers.get("User-Agent"),
    )
    # No estimate here: it reads the node's whole queue, and a burst of submits would pay that
    # once per job. `gpuq task` asks GET /api/jobs/{id} for it.
    jobs = await request.app[DISPATCHER].submit(new, actor_of(request))
    for job in jobs:
        log.info(
            "job=%s node=%s state=%s model=%s kind=%s placement=%r",
            job["id"],
            job["node"],
            job["state"],
            job["model"],
            new.kind,
            job["reason"],
        )
        job["preview_url"] = preview_url(settings.public_url, job["id"])
    return json_response({"jobs": jobs}, status=201)


async def get_job(request: web.Request) -> web.Response:
    app = request.app
    job_id = job_id_of(request)
    try:
        job = await app[STORE].job_detail(job_id)
    except NotFound:
        raise await not_in_database(app[SETTINGS], job_id) from None  # retention may have deleted it
    found: dict[str, eta.Estimate] = {}
    if job["state"] in ACTIVE:
        found = await app[DISPATCHER].estimates()
        if job_id not in found:  # it ended (or moved on) between the two reads: read it again
            job = await app[STORE].job_detail(job_id)
    out = with_eta(with_live(job_json(job, app[SETTINGS].public_url), app[DISPATCHER]), found)
    await with_quota(app, [out])
    return json_response(as_seen(request, out))


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
    return json_response({"jobs": [as_seen(request, with_eta(job_json(r, url), found)) for r in rows]})


NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


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
    # On a private router a member's text search reads only their own prompts and errors (ids and
    # models: everyone's), or a search would tell, job by job, what others asked.
    own_text = None if reads_all(request) else caller_of(request).name or ""
    rows, total = await request.app[STORE].history(
        state, node, kind, text, limit, offset, owner=owner, text_owner=own_text
    )
    url = request.app[SETTINGS].public_url
    jobs = [job_json(r, url) for r in rows]
    batches = await request.app[STORE].batches_of_jobs([j["id"] for j in jobs])  # a batch's lines say whose
    for j in jobs:
        if j["id"] in batches:
            j["batch"] = batches[j["id"]]
    jobs = [as_seen(request, j) for j in jobs]  # last: a placeholder drops the batch's name and custom id
    return json_response({"jobs": jobs, "total": total, "limit": limit, "offset": offset})
