"""Who may see and change what: the one access policy for jobs, batches and batch files, on
every door (the router's API, the pages, the front door's OpenAI and Anthropic routes).

- Reading. On a router that is not private, everyone reads everything: every job whole, every
  batch with its name, metadata, errors and lines' custom ids, every batch file. With
  `[router] private` (Slurm's PrivateData=jobs), a member reads their own only: another user's
  job is a placeholder (where and when it runs, whose it is, never what it says), another user's
  batch in a listing the same (its counts and status, never its name, metadata, errors, files or
  custom ids), and another user's batch or file asked for by id does not exist (404). An admin
  reads everything; on an open router everyone is the anonymous admin.
- Changing. An admin changes everything; a member changes their own jobs, batches and files
  only, on any router (403 naming the owner, or 404 where the thing is not theirs to see)."""

from __future__ import annotations

from ..errors import Forbidden
from .identity import Caller


def sees_all(caller: Caller, private: bool) -> bool:
    """Does `caller` read every job in full? On a router not private, everyone; else an admin."""
    return not private or caller.admin


def visible(caller: Caller, owner: str | None, private: bool) -> bool:
    """May `caller` read the content (prompt, output, thinking, request, findings, error, events;
    a batch's name, metadata, errors, files and custom ids) of what `owner` sent? Always when the
    router is not private; else an admin's every one, and a member's own only: what no user sent
    (before users, or without a token) is not a member's."""
    return sees_all(caller, private) or (owner is not None and owner == caller.name)


def read_scope(caller: Caller, private: bool) -> str | None:
    """The owner whose batches and files a caller's reads by id are limited to: None (everyone's)
    when the caller sees all, else the caller's own name ("" when nameless: no one's)."""
    return None if sees_all(caller, private) else caller.name or ""


def usage_scope(caller: Caller) -> str | None:
    """The owner whose usage (GET /api/usage) a caller reads: None (everyone's) for an admin, on
    any router (an open router's anonymous caller is one), else the member's own name."""
    return None if caller.admin else caller.name or ""


def change_scope(caller: Caller) -> str | None:
    """The owner whose jobs, batches and files a caller may change: None (everyone's) for an
    admin, else the member's own name."""
    return None if caller.admin else caller.name or ""


def refuse_change(caller: Caller, owner: str | None, what: str, kind: str) -> None:
    """A member changes their own only: 403 naming the owner of `what` ("job 1760-..."), one of
    the member's `kind` ("jobs", "batches", "files") it is not."""
    if not caller.may_act_on(owner):
        whose = f"belongs to {owner}" if owner else "belongs to no user (sent without a user's token)"
        raise Forbidden(f"{what} {whose}; a member acts only on their own {kind} (you are {caller.name}, a member)")
