"""Private prompts ([router] private, Slurm's PrivateData=jobs): whose jobs a caller may read in
full. The one statement of the rule; the API's routes ask it (gpuq/api/callers.py `as_seen`), and
what a job not visible shows is the API's placeholder (gpuq/api/render.py `placeholder`)."""

from __future__ import annotations

from .identity import Caller


def sees_all(caller: Caller, private: bool) -> bool:
    """Does `caller` read every job in full? On a router not private, everyone; else an admin."""
    return not private or caller.admin


def visible(caller: Caller, owner: str | None, private: bool) -> bool:
    """May `caller` read the content (prompt, output, thinking, request, findings, error, events)
    of a job sent by `owner`? Always when the router is not private; else an admin's every job,
    and a member's own only: a job of no user (sent before users, or without a token) is not
    a member's. On an open router every caller is the anonymous admin, so private changes nothing."""
    return sees_all(caller, private) or (owner is not None and owner == caller.name)
