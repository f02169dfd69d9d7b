"""The queue: look at it (`queue`, `stale`) and control it (`move`, `preempt`, `delete`,
`clear`, `retry`)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ..errors import UnknownNode
from .client import ApiError, Router
from .common import ago, api_errors, in_about, owner_of, prompt_excerpt, router_of, seg


@click.command("queue")
@click.option("--limit", default=50, show_default=True, help="Waiting jobs shown per node.")
@click.option("--mine", is_flag=True, help="Only your own jobs (the user of your token), at their places.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def queue_cmd(ctx: click.Context, limit: int, mine: bool, as_json: bool) -> None:
    """Every node's running job and waiting jobs, in order (like squeue), and whose each is.

    Example: gpuq queue --mine
    """
    router = router_of(ctx)
    me = whoami(router) if mine else None
    data = router.call("GET", f"/api/queue?limit={limit}")
    if me is not None:
        keep_mine(data, me)
    if as_json:
        click.echo(json.dumps(data))
        return
    click.echo(f"queue depth {data['queue_depth']}" + (f"; yours ({me}) shown" if me else ""))
    for node in data["nodes"]:
        print_node(node, me)


def whoami(router: Router) -> str:
    """--mine: the user of this token, or a ClickException when the router knows no users."""
    me: str | None = router.call("GET", "/api/whoami")["name"]
    if me is None:
        raise click.ClickException(
            "--mine: this router knows no users (no token, no [[user]]), so no job is anyone's; leave out --mine"
        )
    return me


def keep_mine(data: dict[str, Any], me: str) -> None:
    """Only `me`'s jobs in the queue's answer, each with its place in its node's queue (POS); a
    node running someone else's job says only that."""
    for node in data["nodes"]:
        node["queued"] = [dict(j, position=i) for i, j in enumerate(node["queued"], start=1) if j.get("owner") == me]
        if node["running"] and node["running"].get("owner") != me:
            node["running"] = None
            node["others_running"] = True


def print_node(node: dict[str, Any], me: str | None) -> None:
    """One node's block: its state, then its running job and its waiting ones."""
    status = "up" if node["up"] else ("down" if node["checked"] else "checking")
    click.echo(
        f"\n{node['name']}  {status}  {node['model']}  [{','.join(node['roles'])}]  {node['queued_count']} waiting"
    )
    click.echo(f"  {'POS':>7}  {'JOB':19}  {'KIND':8} {'OWNER':10} {'AGE':>7} {'ESTIMATE':18}  PROMPT")
    print_running(node, status)
    for i, job in enumerate(node["queued"], start=1):
        i = job.get("position", i) if me is not None else i
        mark = " (preempted)" if job["preempted_runs"] else ""
        if job.get("waiting_for"):
            mark += f" (waiting for parent {job['waiting_for']})"
        click.echo(
            f"  {i:>7}  {job['id']}  {job['kind']:8} {owner_of(job):10} {ago(job['created_at']):>7} "
            f"{eta_column(job, 'eta_start', 'starts')}  {prompt_excerpt(job)}{mark}"
        )
    if me is None and node["queued_count"] > len(node["queued"]):
        click.echo(f"  … {node['queued_count'] - len(node['queued'])} more")


def print_running(node: dict[str, Any], status: str) -> None:
    """A node's running line: its job, someone else's (--mine), idle, or why nothing runs."""
    run = node["running"]
    if run:
        tokens = run.get("tokens_so_far") or 0
        click.echo(
            f"  running  {run['id']}  {run['kind']:8} {owner_of(run):10} {ago(run['started_at']):>7} "
            f"{eta_column(run, 'eta_finish', 'ends')}  "
            f"[ran {ago(run['started_at'])}, {tokens} token{'s' if tokens != 1 else ''}]  {prompt_excerpt(run)}"
        )
    elif node.get("others_running"):
        click.echo(f"  {'running':>7}  (someone else's job)")
    elif status == "up":
        click.echo(f"  {'idle':>7}")
    else:
        click.echo(f"  {'idle':>7}  (nothing runs while the node is {status})")


def eta_column(job: dict[str, Any], key: str, verb: str) -> str:
    """'starts in ~4 min' / 'ends now' / 'starts ?' (unknown: `gpuq show ID` says why), padded."""
    return f"{verb} {in_about(job[key]) if job.get(key) else '?'}".ljust(18)


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def stale(ctx: click.Context, as_json: bool) -> None:
    """Stale queue heads, how long and why, and the command that fixes each; exit 1 while any.

    Example: gpuq stale
    """
    heads = router_of(ctx).call("GET", "/api/stale")["stale"]
    if as_json:
        click.echo(json.dumps({"stale": heads}))
        sys.exit(1 if heads else 0)
    if not heads:
        click.echo("no stale heads")
        return
    for h in heads:
        click.echo(f"{h['id']} on {h['node']}: {h['reason']} for {ago(h['since'])}   fix: gpuq delete {h['id']}")
    sys.exit(1)


@click.command()
@click.argument("job_id")
@click.option("--to", "position", type=int, help="New position (1 = next to run).")
@click.option("--before", help="Put it just before this job.")
@click.option("--after", help="Put it just after this job.")
@click.option("--node", help="Move it to this node's queue.")
@click.pass_context
@api_errors
def move(
    ctx: click.Context, job_id: str, position: int | None, before: str | None, after: str | None, node: str | None
) -> None:
    """Reorder a waiting job, or move it to another node's queue.

    Example: gpuq move 1760883402-9f3a7c21 --to 1 --node node-2
    """
    if position is None and before is None and after is None and node is None:
        raise click.UsageError("say where to move it: --to N, --before ID, --after ID or --node NAME", ctx)
    if sum(x is not None for x in (position, before, after)) > 1:
        raise click.UsageError("give only one of --to, --before and --after", ctx)
    body = {"position": position, "before": before, "after": after, "node": node}
    job = router_of(ctx).call(
        "POST", f"/api/jobs/{seg(job_id)}/move", {k: v for k, v in body.items() if v is not None}
    )["job"]
    beyond = f" (the end of its queue: --to {position} is past it)" if position and job["position"] < position else ""
    click.echo(f"{job['id']} -> {job['node']} position {job['position']}{beyond}")


@click.command()
@click.argument("job_id")
@click.pass_context
@api_errors
def preempt(ctx: click.Context, job_id: str) -> None:
    """Run a waiting job next, now, interrupting its node's running job (which goes back behind it).

    Example: gpuq preempt 1760883402-9f3a7c21
    """
    data = router_of(ctx).call("POST", f"/api/jobs/{seg(job_id)}/preempt")
    job = data["job"]
    click.echo(f"{job['id']} -> {job['node']} position 1")
    if data.get("interrupted"):
        click.echo(f"{data['interrupted']} preempted -> {job['node']} position 2")


@click.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.pass_context
def delete(ctx: click.Context, job_ids: tuple[str, ...]) -> None:
    """Cancel jobs: waiting ones leave the queue, a running one is aborted. Rows stay for forensics.

    Example: gpuq delete 1760883402-9f3a7c21
    """
    router, failed = router_of(ctx), False
    for job_id in job_ids:
        try:
            job = router.call("DELETE", f"/api/jobs/{seg(job_id)}")["job"]
            click.echo(f"{job['id']} cancelled on {job['node']} (was {job['was']})")
        except ApiError as exc:
            click.echo(f"error {exc.status} {exc.message}", err=True)
            failed = True
    if failed:
        click.echo("not retried", err=True)
        sys.exit(1)


@click.command()
@click.argument("node")
@click.option("--running", is_flag=True, help="Abort the running job too.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@api_errors
def clear(ctx: click.Context, node: str, running: bool, yes: bool) -> None:
    """Cancel every waiting job on a node (and the running one with --running).

    Example: gpuq clear node-2 --yes
    """
    router = router_of(ctx)
    if not yes:
        queue = router.call("GET", "/api/queue?limit=0")
        found = next((n for n in queue["nodes"] if n["name"] == node), None)
        if found is None:
            raise click.UsageError(UnknownNode(node, (n["name"] for n in queue["nodes"])).message, ctx)
        count = found["queued_count"] + (1 if running and found["running"] else 0)
        what = f"{count} job{'s' if count != 1 else ''}" + (
            " (the running one included)" if running and found["running"] else ""
        )
        click.confirm(f"Cancel {what} on {node}?", abort=True)
    data = router.call("POST", f"/api/nodes/{seg(node)}/clear", {"running": running})
    count = len(data["cancelled"])
    click.echo(f"{count} job{'s' if count != 1 else ''} cancelled on {node}")
    for job_id in data["cancelled"]:
        click.echo(f"{job_id} cancelled")


@click.command()
@click.argument("job_id")
@click.pass_context
@api_errors
def retry(ctx: click.Context, job_id: str) -> None:
    """Put a failed or cancelled job back at the tail of its node's queue, as a new run.

    Example: gpuq retry 1760883402-9f3a7c21
    """
    job = router_of(ctx).call("POST", f"/api/jobs/{seg(job_id)}/retry")["job"]
    click.echo(f"{job['id']} -> {job['node']} queued")
