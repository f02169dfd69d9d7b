"""`gpuq usage`: usage over time from /api/usage, a table per key (user, node, model, client or
lane): jobs, GPU time busy, model load time, tokens in and out, and the jobs' waits."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

import click

from ..config import ConfigError, parse_duration
from ..jobs import span
from .common import api_errors, router_of

KEYS = ("user", "node", "model", "client", "lane")
DAILY_AFTER_S = 60 * 86400  # a longer window's series goes by the day (the router takes 2,000 steps at most)


def default_step(since: str) -> str:
    """The series' step when none is given: by the hour, or by the day for a long window (a
    window the router refuses is refused there, by name)."""
    try:
        return "1d" if parse_duration(since, "--since") > DAILY_AFTER_S else "1h"
    except ConfigError:
        return "1h"


def _wait(seconds: float | None) -> str:
    return "-" if seconds is None else span(seconds)


def _line(row: dict[str, Any], width: int) -> str:
    key = "-" if row["key"] is None else str(row["key"])  # a user's '-': sent without a user's token
    return (
        f"{key[:width]:{width}} {row['jobs']:>6} {span(row['busy_s']):>9} {span(row['load_s']):>7}"
        f" {row['tokens_in']:>11} {row['tokens_out']:>11} {_wait(row['wait_p50_s']):>8} {_wait(row['wait_p95_s']):>8}"
    )


def table(body: dict[str, Any]) -> list[str]:
    """The answer as the table's lines: a heading that names the window, then one line per key."""
    rows = body["rows"]
    heading = f"usage by {body['by']} from {body['since'][:16].replace('T', ' ')} UTC to now"
    if body["scope"] == "own":
        heading += " (your own jobs)"
    if not rows:
        return [heading, "no jobs ran in this window"]
    width = max(12, *(len(str(r["key"])) for r in rows[:50]))
    width = min(width, 40)
    header = (
        f"{body['by'].upper():{width}} {'JOBS':>6} {'GPU TIME':>9} {'LOAD':>7}"
        f" {'TOKENS IN':>11} {'TOKENS OUT':>11} {'WAIT P50':>8} {'WAIT P95':>8}"
    )
    return [heading, header, *(_line(r, width) for r in rows)]


@click.command()
@click.option("--by", type=click.Choice(KEYS), default="user", show_default=True, help="What the rows are.")
@click.option("--since", default="7d", show_default=True, help="The window: a time ago (30m, 12h, 7d, 365d).")
@click.option("--step", help="The series' step (--json): 1h, 1d; by default 1h, or 1d past 60 days.")
@click.option("--json", "as_json", is_flag=True, help="Print /api/usage's answer, each row's series too.")
@click.pass_context
@api_errors
def usage(ctx: click.Context, by: str, since: str, step: str | None, as_json: bool) -> None:
    """Usage over time: jobs, GPU time, load time, tokens and waits by user, node, model, client
    or lane. A member sees their own jobs only; an admin everyone's.

    Example: gpuq usage --by node --since 30d
    """
    query = urlencode({"by": by, "since": since, "step": step or default_step(since)})
    body = router_of(ctx).call("GET", f"/api/usage?{query}")
    if as_json:
        click.echo(json.dumps(body))
        return
    for line in table(body):
        click.echo(line)
