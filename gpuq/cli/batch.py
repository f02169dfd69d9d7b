"""`gpuq batch`: batches from the command line, through the router's API
(/api/batches): submit a JSON Lines file (OpenAI's Batch API input: one request a line), list,
show (counts, ETA, the failed lines), cancel, results, and retry of the failed lines."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from .client import ApiError, Router
from .common import about, ago, api_errors, excerpt, fail, router_of, seg
from .jobs import read_text

ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/completions")
ENDED = ("completed", "failed", "cancelled", "expired")
POLL_S = 1.0  # --wait looks at the batch this often


@click.group()
def batch() -> None:
    """BatchService: many requests as one batch, each a job in the batch lane (as OpenAI's Batch API).

    Example: gpuq batch submit eval.jsonl --wait; gpuq batch results ID > out.jsonl
    """


def progress(b: dict[str, Any]) -> str:
    """'412 of 2,000 done, 3 failed' as the page says it."""
    counts = b["request_counts"]
    text = f"{counts['completed']:,} of {counts['total']:,} done"
    return text + (f", {counts['failed']:,} failed" if counts["failed"] else "")


def eta_text(b: dict[str, Any]) -> str:
    eta = b.get("eta") or {}
    if eta.get("finish_s"):
        return f"ETA {about(eta['finish_s'] - time.time())}"
    return f"ETA unknown ({eta['reason']})" if eta.get("reason") else ""


def print_batch(b: dict[str, Any]) -> None:
    click.echo(f"batch {b['id']}  {b['status']}  {b['name'] or ''}")
    click.echo(f"  {b['endpoint']} ({b['api']}), owner {b['owner'] or '-'}, created {ago(b['created_at'])} ago")
    line = f"  {progress(b)}"
    counts = b["counts"]
    line += f" ({counts['queued']} waiting, {counts['running']} running)"
    if b.get("eta") and b["status"] in ("in_progress", "cancelling"):
        line += f", {eta_text(b)}"
    click.echo(line)
    if b.get("output_file_id") or b.get("error_file_id"):
        click.echo(f"  output {b['output_file_id'] or '-'}, errors {b['error_file_id'] or '-'}")
    for error in b.get("errors") or []:
        click.echo(f"  line {error['line']}: {error['code']}: {error['message']}")
    failed = b.get("failed_lines") or []
    if failed:
        click.echo("  failed lines:")
        for f in failed:
            click.echo(
                f"    line {f['line']} {f['custom_id']} {f['job_id'] or '-'} {f['state'] or 'refused'}: {excerpt(f['error'] or '', 90)}"
            )
        if b.get("failed_more"):
            click.echo(f"    and {b['failed_more']} more")


@batch.command("submit")
@click.argument("path", metavar="FILE.jsonl")
@click.option("--endpoint", type=click.Choice(ENDPOINTS), default=ENDPOINTS[0], show_default=True)
@click.option("--name", help="What the page calls the batch (default: the file's name).")
@click.option("--wait", is_flag=True, help="Wait until it has ended, showing its progress; exit 1 if any line failed.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def submit(ctx: click.Context, path: str, endpoint: str, name: str | None, wait: bool, as_json: bool) -> None:
    """Submit FILE.jsonl (`-`: stdin) as one batch: each line {"custom_id", "method": "POST",
    "url": ENDPOINT, "body": {...}}, as OpenAI's Batch API reads it. Every line is queued in one
    commit; a file whose lines are not requests fails whole, each bad line named.

    Example: gpuq batch submit eval.jsonl --name eval-sweep --wait
    """
    router = router_of(ctx)
    text = read_text(path)
    body = {"input": text, "endpoint": endpoint, "name": name or (None if path == "-" else path.rsplit("/", 1)[-1])}
    try:
        b = router.call("POST", "/api/batches", body)["batch"]
    except ApiError as exc:
        if exc.status != 413:
            raise
        fail(
            413,
            f"{exc.message}; the router's API takes up to twice router.max_prompt_bytes in one request:"
            " upload a larger file through the front door (client.files.create, then client.batches.create;"
            " see the docs' BatchService page)",
        )
    if not wait:
        click.echo(json.dumps(b) if as_json else f"batch {b['id']} {b['status']}: {b['total']:,} lines ({progress(b)})")
        if b["status"] == "failed":
            for error in b.get("errors") or []:
                click.echo(f"  line {error['line']}: {error['code']}: {error['message']}", err=True)
            sys.exit(1)
        return
    waited(router, b["id"], as_json)


def waited(router: Router, batch_id: str, as_json: bool) -> None:
    shown = ""
    while True:
        b = router.call("GET", f"/api/batches/{seg(batch_id)}")["batch"]
        text = f"batch {b['id']} {b['status']}: {progress(b)}"
        if b["status"] not in ENDED and (eta := eta_text(b)):
            text += f", {eta}"
        if text != shown and not as_json:
            click.echo(text, err=True)
            shown = text
        if b["status"] in ENDED:
            break
        time.sleep(POLL_S)
    if as_json:
        click.echo(json.dumps(b))
    else:
        print_batch(b)
    if b["status"] != "completed" or b["request_counts"]["failed"]:
        sys.exit(1)


@batch.command("list")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def list_cmd(ctx: click.Context, limit: int, as_json: bool) -> None:
    """The batches, newest first (a member's own; an admin's: all).

    Example: gpuq batch list --limit 10
    """
    data = router_of(ctx).call("GET", f"/api/batches?limit={limit}")
    if as_json:
        click.echo(json.dumps(data))
        return
    if not data["batches"]:
        click.echo("no batches")
        return
    for b in data["batches"]:
        name = excerpt(b["name"] or "", 24)
        click.echo(f"{b['id']}  {b['status']:<11} {name:<24} {progress(b)}  {ago(b['created_at'])} ago")


@batch.command("show")
@click.argument("batch_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def show(ctx: click.Context, batch_id: str, as_json: bool) -> None:
    """A batch: its counts, its ETA from the nodes' recent runs, and its failed lines.

    Example: gpuq batch show batch_0123abcd
    """
    data = router_of(ctx).call("GET", f"/api/batches/{seg(batch_id)}")
    if as_json:
        click.echo(json.dumps(data))
        return
    print_batch(data["batch"])


@batch.command("cancel")
@click.argument("batch_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def cancel(ctx: click.Context, batch_id: str, as_json: bool) -> None:
    """Cancel a batch: its waiting lines now; a running line ends as it would, then the batch is
    cancelled (its output holds what ran).

    Example: gpuq batch cancel batch_0123abcd
    """
    data = router_of(ctx).call("POST", f"/api/batches/{seg(batch_id)}/cancel")
    b = data["batch"]
    click.echo(json.dumps(data) if as_json else f"batch {b['id']} {b['status']}: {progress(b)}")


@batch.command("results")
@click.argument("batch_id", metavar="ID")
@click.pass_context
@api_errors
def results(ctx: click.Context, batch_id: str) -> None:
    """Every line's result as JSON Lines, in input order, in its API's shape (OpenAI's output and
    error lines; Anthropic's results).

    Example: gpuq batch results batch_0123abcd > out.jsonl
    """
    router = router_of(ctx)
    b = router.call("GET", f"/api/batches/{seg(batch_id)}")["batch"]
    if b["status"] not in ENDED:
        fail(409, f"batch {b['id']} is {b['status']} ({progress(b)}): its results are ready once it has ended")
    for line in router.lines(f"/api/batches/{seg(batch_id)}/results"):
        click.echo(json.dumps(line, ensure_ascii=False))


@batch.command("retry")
@click.argument("batch_id", metavar="ID")
@click.option("--failed", is_flag=True, required=True, help="Run the failed and cancelled lines again.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def retry(ctx: click.Context, batch_id: str, failed: bool, as_json: bool) -> None:
    """Queue a batch's failed and cancelled lines again, on purpose (gpuq never retries silently).

    Example: gpuq batch retry batch_0123abcd --failed
    """
    data = router_of(ctx).call("POST", f"/api/batches/{seg(batch_id)}/retry", {"failed": True})
    b = data["batch"]
    click.echo(
        json.dumps(data) if as_json else f"batch {b['id']} {b['status']}: {len(data['retried'])} lines queued again"
    )
