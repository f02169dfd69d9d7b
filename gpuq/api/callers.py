"""Who sent a request and what they may do with a job: the Caller that access/ found, as an
event's actor, and the rules a member meets (their own jobs; admin-only actions; on a private
router, others' jobs as placeholders: access/privacy.py's rule, render.py's placeholder)."""

from __future__ import annotations

from aiohttp import web

from ..access.identity import ANYONE, Caller
from ..access.privacy import refuse_change, sees_all, visible
from ..access.tokens import CALLER
from ..errors import Forbidden
from ..store import Row
from .inputs import job_id_of
from .render import json_response, placeholder
from .state import DISPATCHER, STORE


def caller_of(request: web.Request) -> Caller:
    """Who sent the request: set by access/doors.py's api_access on every /api route."""
    caller: Caller = request.get(CALLER, ANYONE)
    return caller


def actor_of(request: web.Request) -> str:
    """An event's actor: the user, then how and from where ('alice (cli 127.0.0.1)'; on an open
    router, as before, 'cli 127.0.0.1'). The address stays for forensics."""
    who = request.headers.get("X-Gpuq-Actor", "api")
    return caller_of(request).actor(who if who in ("cli", "page", "api") else "api", request.remote)


def private_for(request: web.Request) -> bool:
    """Is the router private ([router] private, live: a reload changes it at once)?"""
    return request.app[DISPATCHER].settings.private


def may_read(request: web.Request, owner: str | None) -> bool:
    """May the caller read the content of a job sent by `owner` (gpuq/access/privacy.py)?"""
    return visible(caller_of(request), owner, private_for(request))


def reads_all(request: web.Request) -> bool:
    """Does the caller read every job in full (not a member of a private router)?"""
    return sees_all(caller_of(request), private_for(request))


def as_seen(request: web.Request, job: Row) -> Row:
    """A job in the API's shape as the caller may see it: whole, or the placeholder (render.py).
    Every route that answers jobs passes each one through here, last."""
    return job if may_read(request, job.get("owner")) else placeholder(job)


def refuse_unreadable(request: web.Request, job: Row, what: str) -> None:
    """A route whose whole answer is a job's content (its output stream; a critique, whose prompt
    copies its parent's prompt and output): 403 naming the owner, for a job the caller may not read."""
    owner = job.get("owner")
    if not may_read(request, owner):
        whose = f"belongs to {owner}" if owner else "belongs to no user"
        caller = caller_of(request)
        raise Forbidden(
            f"job {job['id']} {whose}; the router is private ([router] private): {what} is for its owner"
            f" and admins (you are {caller.name}, a member)"
        )


async def own_job(request: web.Request) -> str:
    """The job id of the route, after checking the caller may act on it (its owner never changes)."""
    job_id = job_id_of(request)
    caller = caller_of(request)
    if not caller.admin:
        job = await request.app[STORE].job(job_id)
        refuse_change(caller, job.get("owner"), f"job {job_id}", "jobs")
    return job_id


def admin_only(request: web.Request, what: str) -> None:
    caller = caller_of(request)
    if not caller.admin:
        raise Forbidden(f"{what} is for an admin; {caller.name} is a member")


async def whoami(request: web.Request) -> web.Response:
    """Who the router takes the caller for: `gpuq queue --mine` asks. name null: no identity."""
    caller = caller_of(request)
    return json_response({"name": caller.name, "role": caller.role, "via": caller.via})
