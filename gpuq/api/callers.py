"""Who sent a request and what they may do with a job: the Caller that access/ found, as an
event's actor, and the rules a member meets (their own jobs; admin-only actions)."""

from __future__ import annotations

from aiohttp import web

from ..access.identity import ANYONE, Caller
from ..access.tokens import CALLER
from ..errors import Forbidden
from ..store import Row
from .inputs import job_id_of
from .render import json_response
from .state import STORE


def caller_of(request: web.Request) -> Caller:
    """Who sent the request: set by access/doors.py's api_access on every /api route."""
    caller: Caller = request.get(CALLER, ANYONE)
    return caller


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
        raise Forbidden(
            f"job {job['id']} {whose}; a member acts only on their own jobs (you are {caller.name}, a member)"
        )


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


async def whoami(request: web.Request) -> web.Response:
    """Who the router takes the caller for: `gpuq queue --mine` asks. name null: no identity."""
    caller = caller_of(request)
    return json_response({"name": caller.name, "role": caller.role, "via": caller.via})
