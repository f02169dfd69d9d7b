"""`gpuq history`: finished jobs, newest first, paged from /api/history."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

import click

from ..config import ConfigError, parse_duration
from ..jobs import FINAL, parse_iso
from .client import Router
from .common import ago, api_errors, excerpt, owner_of, prompt_excerpt, router_of


def since_time(text: str) -> float:
    """--since: a time ago ('90s', '30m', '2h', '1h30m', '3d') or a local date or time
    ('2026-10-19', '2026-10-19 14:00')."""
    from datetime import datetime

    value = text.strip().lower()
    try:
        if value.endswith("d") and value[:-1].replace(".", "", 1).isdigit():
            return time.time() - float(value[:-1]) * 86400
        return time.time() - parse_duration(value, "--since")
    except ConfigError:
        pass
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise click.BadParameter(
            f"expected a time ago like 30m, 2h or 3d, or a date like 2026-10-19 or '2026-10-19 14:00', got {text!r}",
            param_hint="--since",
        ) from None


def history_jobs(
    router: Router, state: str | None, node: str | None, since: float | None, limit: int, owner: str | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The newest finished jobs (at most `limit`, none older than `since`), and whether there are
    more. /api/history pages newest first; `since` is where the paging stops."""
    jobs: list[dict[str, Any]] = []
    offset = 0
    while True:
        size = min(500, limit + 1 - len(jobs))
        query = urlencode(
            {
                k: v
                for k, v in (("state", state), ("node", node), ("owner", owner), ("limit", size), ("offset", offset))
                if v is not None
            }
        )
        page = router.call("GET", f"/api/history?{query}")["jobs"]
        for job in page:
            if since is not None and parse_iso(job["finished_at"]) < since:
                return jobs, False
            if len(jobs) == limit:
                return jobs, True
            jobs.append(job)
        if len(page) < size:
            return jobs, False
        offset += len(page)


@click.command()
@click.option("--state", type=click.Choice([s.value for s in FINAL]), help="Only jobs that ended so.")
@click.option("--node", help="Only jobs on this node.")
@click.option("--owner", help="Only jobs of this user (a [[user]]'s name).")
@click.option("--since", help="Only jobs that ended since: a time ago (30m, 2h, 3d) or a date (2026-10-19 14:00).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000), help="Jobs shown at most.")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...], "more": true|false} as JSON.')
@click.pass_context
@api_errors
def history(
    ctx: click.Context,
    state: str | None,
    node: str | None,
    owner: str | None,
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Finished jobs, newest first: how each ended, when, how long it ran, and why it failed.

    Example: gpuq history --state failed --since 2h
    """
    since_ts = since_time(since) if since is not None else None
    jobs, more = history_jobs(router_of(ctx), state, node, since_ts, limit, owner)
    if as_json:
        click.echo(json.dumps({"jobs": jobs, "more": more}))
        return
    if not jobs:
        click.echo("no finished jobs" + (" match" if state or node or owner or since else " yet"))
        return
    click.echo(f"{'JOB':19}  {'STATE':9} {'NODE':12} {'KIND':8} {'OWNER':10} {'ENDED':>9} {'RAN':>6}  PROMPT")
    for job in jobs:
        ran = ago(job["started_at"], job["finished_at"]) if job.get("started_at") else "-"
        line = (
            f"{job['id']:19}  {job['state']:9} {job['node']:12} {job['kind']:8} {owner_of(job):10} "
            f"{ago(job['finished_at']) + ' ago':>9} {ran:>6}  {prompt_excerpt(job, 40)}"
        )
        click.echo(line)
        if job.get("error"):
            click.echo(f"{'':21}{excerpt(job['error'], 100)}")
    if more:
        click.echo(f"… more: raise --limit (now {limit}), or narrow with --state, --node, --owner or --since")
