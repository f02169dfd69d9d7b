"""What every command shares: how it reaches the router (router_of, seg), how it fails
(`error <status> <message>`, then `not retried`, exit 1), and the pieces of a listing (spans,
estimates, excerpts, owners)."""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn, ParamSpec, TypeVar
from urllib.parse import quote

import click

from ..config import ConfigError, check_token, check_url
from ..jobs import ACTIVE, JobState, parse_iso, span
from .client import ApiError, Router
from .where import ConfigRead, find_router, notice, own_token, read_config

P = ParamSpec("P")
R = TypeVar("R")


def fail(status: int | str, message: str) -> NoReturn:
    click.echo(f"error {status} {message}", err=True)
    click.echo("not retried", err=True)
    sys.exit(1)


def api_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """A command that meets an ApiError fails the CLI's way (`error <status> <message>`, exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ApiError as exc:
            fail(exc.status, exc.message)

    return wrapper


def router_of(ctx: click.Context) -> Router:
    """The router this command talks to (gpuq/cli/where.py says which, in what order), named on
    stderr when it was found rather than given; $GPUQ_TOKEN, else the config's (where.py own_token).
    A config that cannot be read stops it, unless the router was given (then no token is taken
    from it, and stderr says so)."""
    opts = ctx.obj
    config = read_config(opts.get("config"))
    found = find_router(opts.get("router"), config)
    if config.problem is not None and not found.given:
        fail("-", config.problem)
    try:
        url = check_url(found.url, found.why if found.given else f"the router's address ({found.why})")
    except ConfigError as exc:
        raise click.UsageError(exc.message, ctx) from None
    token = caller_token(ctx, config)
    said = notice(found)
    if said is not None and not opts.get("told"):
        opts["told"] = True  # once per command, however many routers it asks for
        click.echo(said, err=True)
    return Router(url, token)


def caller_token(ctx: click.Context, config: ConfigRead) -> str | None:
    """$GPUQ_TOKEN (set but empty: as if unset), else the config's token for this caller."""
    given = os.environ.get("GPUQ_TOKEN") or None
    mine = (given, "$GPUQ_TOKEN") if given else own_token(config.settings)
    if mine is None:
        if config.problem is not None and not ctx.obj.get("told_config"):
            ctx.obj["told_config"] = True
            click.echo(f"gpuq: {config.problem}; no token taken from it", err=True)
        return None
    try:
        return check_token(*mine)
    except ConfigError as exc:
        raise click.UsageError(exc.message, ctx) from None


def seg(text: str) -> str:
    """A job id or node name as one URL path segment, exactly as typed: the router judges it."""
    return quote(text, safe="")


def ago(ts: str | None, end: str | None = None) -> str:
    if not ts:
        return "-"
    return span((parse_iso(end) if end else time.time()) - parse_iso(ts))


def about(seconds: float) -> str:
    """A rough span for an estimate: '~40 s', '~4 min', '~1 h 20 min'."""
    seconds = max(seconds, 0)
    if seconds < 60:
        return f"~{max(int(round(seconds)), 1)} s"
    minutes = int(round(seconds / 60))
    return f"~{minutes} min" if minutes < 60 else f"~{minutes // 60} h {minutes % 60:02d} min"


def in_about(ts: str) -> str:
    """'in ~4 min' to an estimated time, or 'now' when it is (about) here."""
    seconds = parse_iso(ts) - time.time()
    return "now" if seconds < 0.5 else f"in {about(seconds)}"


def eta_summary(job: dict[str, Any]) -> str | None:
    """'est. start in ~4 min, finish in ~9 min' (a waiting job), 'est. finish in ~2 min' (a
    running one), with the reason when a time is unknown. None for a finished job."""
    if job.get("state") not in ACTIVE or "eta_finish" not in job:
        return None
    finish = in_about(job["eta_finish"]) if job.get("eta_finish") else "unknown"
    if job["state"] == JobState.QUEUED:
        start = in_about(job["eta_start"]) if job.get("eta_start") else "unknown"
        text = f"est. start {start}" + (f", finish {finish}" if job.get("eta_start") else "")
    else:
        text = f"est. finish {finish}"
    return f"{text} ({job['eta_reason']})" if job.get("eta_reason") else text


def excerpt(text: str, width: int = 50, more: bool = False) -> str:
    """One line of at most `width` characters; `more`: the text goes on past what we hold."""
    flat = " ".join(text.split())
    if len(flat) > width:
        return flat[: width - 1] + "…"
    return flat + "…" if more else flat


def prompt_excerpt(job: dict[str, Any], width: int = 50) -> str:
    """A listed job's prompt: listings carry its first characters and its size in bytes."""
    if job.get("private"):
        return private_label(job)
    text = job["prompt_excerpt"]
    return excerpt(text, width, more=len(text.encode("utf-8")) < job["prompt_bytes"])


def private_label(job: dict[str, Any]) -> str:
    """Another user's job on a private router ([router] private) comes without its text: whose it is."""
    return f"private: {job['owner']}'s job" if job.get("owner") else "private: a job of no user"


def owner_of(job: dict[str, Any]) -> str:
    """A job's owner as a column shows it: '-' for a job of no user."""
    return excerpt(job.get("owner") or "-", 10)
