"""Jobs: submit them (`task`, `critique`), follow one as it runs (`wait`), and look at one
(`show`)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..jobs import FINAL, JobState, parse_iso
from ..params import THINK_LEVELS
from .client import ApiError, Router
from .common import ago, api_errors, eta_summary, excerpt, fail, private_label, router_of, seg

F = TypeVar("F", bound=Callable[..., Any])


def read_text(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail("-", f"cannot read {'stdin' if path == '-' else path}: {exc}")
        raise  # unreachable


def ollama_params(fn: F) -> F:
    """--think/--no-think, --think-level and --option KEY=VALUE, for the commands that submit."""
    fn = click.option(
        "--option",
        "options",
        multiple=True,
        metavar="KEY=VALUE",
        help="An Ollama model option, e.g. num_ctx=32768 (repeatable; over the node's).",
    )(fn)
    fn = click.option(
        "--think-level",
        type=click.Choice(THINK_LEVELS),
        help="Think at this level (models that take one, e.g. gpt-oss).",
    )(fn)
    return click.option(
        "--think/--no-think",
        default=None,
        help="Turn the model's thinking on or off (default: the node's, else Ollama's).",
    )(fn)


def params_body(think: bool | None, think_level: str | None, options: tuple[str, ...]) -> dict[str, Any]:
    """The API fields for --think, --think-level and --option (values read as JSON when they are)."""
    if think is not None and think_level is not None:
        raise click.UsageError("give --think/--no-think or --think-level, not both")
    body: dict[str, Any] = {"think": think_level if think_level is not None else think}
    parsed: dict[str, Any] = {}
    for item in options:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--option")
        try:
            parsed[key.strip()] = json.loads(text)
        except ValueError:
            parsed[key.strip()] = text  # a plain string, e.g. stop words
    body["options"] = parsed or None
    return body


def after_submit(job: dict[str, Any]) -> str:
    """The line `gpuq task` prints after placing a job: when it should start (it may already
    have started, or even finished)."""
    if job["state"] == JobState.RUNNING:
        return "started; " + (eta_summary(job) or "")
    return eta_summary(job) or f"already {job['state']}"


def clock(ts: str) -> str:
    return time.strftime("%H:%M:%S", time.localtime(parse_iso(ts)))


@click.command()
@click.argument("prompt", required=False)
@click.option(
    "--file",
    "file_",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Read the prompt from a file (- for stdin).",
)
@click.option("--model", help="Use this model instead of the node's.")
@click.option("--node", help="Put the task on this node.")
@click.option("--timeout", type=float, help="Fail the job if it runs longer than this many seconds.")
@click.option(
    "--priority",
    type=click.Choice(["interactive", "batch"]),
    help="The lane: interactive waits ahead of every batch job on its node (default: batch).",
)
@click.option("--wait", is_flag=True, help="Stream the output as it is generated, then the final state.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the submitted job (with --wait: the finished job) as JSON."
)
@ollama_params
@click.pass_context
@api_errors
def task(
    ctx: click.Context,
    prompt: str | None,
    file_: str | None,
    model: str | None,
    node: str | None,
    timeout: float | None,
    priority: str | None,
    wait: bool,
    think: bool | None,
    think_level: str | None,
    options: tuple[str, ...],
    as_json: bool,
) -> None:
    """Submit a task: it goes to the first free task node by rank.

    Example: gpuq task "add a retry budget to the export job" --wait
    """
    if prompt is not None and file_ is not None:
        raise click.UsageError("give a PROMPT or --file, not both", ctx)
    if prompt is None and file_ is None:
        raise click.UsageError("give a PROMPT, or --file PATH (- for stdin)", ctx)
    if file_ is not None:
        prompt = read_text(file_)
    body = {
        "kind": "task",
        "prompt": prompt,
        "model": model,
        "node": node,
        "timeout": timeout,
        "priority": priority,
        **params_body(think, think_level, options),
    }
    router = router_of(ctx)
    job = router.call("POST", "/api/jobs", {k: v for k, v in body.items() if v is not None})["jobs"][0]
    if as_json and not wait:
        click.echo(json.dumps(job))
        return
    # With --json, stdout is the finished job alone: where it went and how it goes, on stderr.
    click.echo(f"{job['id']} -> {job['node']} ({job['reason']})", err=as_json)
    click.echo(f"preview {job['preview_url']}", err=as_json)
    try:
        click.echo(after_submit(router.call("GET", f"/api/jobs/{seg(job['id'])}")), err=as_json)
    except ApiError as exc:  # the job is placed: the estimate is only a nicety
        click.echo(f"est. start unknown (cannot ask the router: {exc.message})", err=as_json)
    if wait:
        follow(router, job["id"], as_json)
    else:  # a hint for the person, on stderr: stdout stays the three lines a script reads
        click.echo(
            f"not waiting: follow it with `gpuq wait {job['id']}` or the preview link; later, "
            f"`gpuq show {job['id']}` or `gpuq history` says how it ended",
            err=True,
        )


@click.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--parent", help="The task under critique: never critiqued on its own node.")
@click.option("--node", help="Critique on this node only.")
@click.option("--model", help="Use this model instead of each node's.")
@click.option("--timeout", type=float, help="Fail a child if it runs longer than this many seconds.")
@click.option(
    "--priority",
    type=click.Choice(["interactive", "batch"]),
    help="The lane: interactive waits ahead of every batch job on its node (default: batch).",
)
@click.option("--no-wait", is_flag=True, help="Return after submitting.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print one JSON document, {"jobs": [...]}: the finished children (with --no-wait: '
    "the submitted ones); progress goes to stderr.",
)
@ollama_params
@click.pass_context
@api_errors
def critique(
    ctx: click.Context,
    file: str | None,
    parent: str | None,
    node: str | None,
    model: str | None,
    timeout: float | None,
    priority: str | None,
    no_wait: bool,
    as_json: bool,
    think: bool | None,
    think_level: str | None,
    options: tuple[str, ...],
) -> None:
    """Fan a critique out to every critique node: each child's id, node and preview link at
    once, then each one's result as it finishes.

    Example: gpuq critique plan.md
    """
    if file is None and parent is None:
        raise click.UsageError("give a FILE to critique, or --parent ID", ctx)
    body = {
        "kind": "critique",
        "parent": parent,
        "node": node,
        "model": model,
        "timeout": timeout,
        "priority": priority,
        **params_body(think, think_level, options),
    }
    if file is not None:
        body["prompt"] = read_text(file)
    router = router_of(ctx)
    jobs = router.call("POST", "/api/jobs", {k: v for k, v in body.items() if v is not None})["jobs"]
    if as_json and no_wait:
        click.echo(json.dumps({"jobs": jobs}))
        return
    click.echo(f"fan-out {len(jobs)} critique node{'s' if len(jobs) != 1 else ''}", err=as_json)
    if jobs and jobs[0].get("waiting_for"):
        click.echo(f"waiting for parent {jobs[0]['waiting_for']} to finish; then each reviews its result", err=as_json)
    for job in jobs:
        held = f" (waiting for parent {job['waiting_for']})" if job.get("waiting_for") else ""
        line = f"{job['node']} {job['id']} {job['model']} {job['state']}{held}"
        # --no-wait: the listing is the answer; waiting, stdout is the results, this is progress.
        click.echo(line if no_wait else f"{line}  {job['preview_url']}", err=not no_wait)
    if no_wait:
        return
    finished = wait_all(router, jobs, as_json)
    if as_json:
        click.echo(json.dumps({"jobs": finished}))
    if any(j["state"] != JobState.DONE for j in finished):
        sys.exit(1)


def critique_line(job: dict[str, Any]) -> str:
    took = ago(job["created_at"], job["finished_at"])
    if job["state"] == JobState.DONE:
        count = len(job.get("findings") or [])
        return f"{job['node']} {job['id']} {job['model']} done {count} finding{'s' if count != 1 else ''} {took}"
    return f"{job['node']} {job['id']} {job['model']} {job['state']} {took}: {job.get('error') or ''}"


def wait_all(router: Router, jobs: list[dict[str, Any]], as_json: bool = False) -> list[dict[str, Any]]:
    """Say on stderr when each job starts, and print each one's result as it finishes (on
    stderr too with `as_json`, whose stdout is the finished jobs alone); poll with a gentle
    backoff. The finished jobs, in the order given."""
    seen = {j["id"]: j["state"] for j in jobs}
    pending, delay = list(seen), 0.05
    finished: dict[str, dict[str, Any]] = {}
    while pending:
        for job_id in list(pending):
            job = router.call("GET", f"/api/jobs/{seg(job_id)}")
            if job["state"] == JobState.RUNNING and seen[job_id] != JobState.RUNNING:
                click.echo(f"{job['node']} {job_id} started", err=True)
            seen[job_id] = job["state"]
            if job["state"] in FINAL:
                pending.remove(job_id)
                finished[job_id] = job
                click.echo(critique_line(job), err=as_json)
                for f in job.get("findings") or []:  # at a glance, without gpuq show per child
                    click.echo(f"    [{f['severity']}] {excerpt(f['title'], 100)}", err=as_json)
                click.echo(f"    {job['preview_url']}", err=as_json)
        if pending:
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)
    return [finished[i] for i in seen]


THINKING_HEADER = "-- thinking --"
ANSWER_HEADER = "-- answer --"


def follow(router: Router, job_id: str, as_json: bool = False) -> None:
    """Stream a job's output to the terminal; Ctrl-C stops following, the job goes on. With
    `as_json` stdout is only the finished job as JSON (the API's shape): no text, no summary;
    where it waits and when it starts go to stderr either way."""
    final: dict[str, Any] | None = None
    shown: str | None = None  # "thinking" or "text", the kind printed last
    try:
        for line in router.lines(f"/api/jobs/{seg(job_id)}/stream"):
            if not as_json:  # --json: the text is in the job's output
                shown = print_stream_text(line, shown)
            print_stream_notes(line, as_json)
            if line.get("done"):
                final = line["job"]
    except KeyboardInterrupt:
        click.echo(f"\nstopped following {job_id}; it goes on (gpuq wait {job_id})", err=True)
        sys.exit(130)
    if not as_json:
        click.echo()
    if final is None:
        fail("-", f"the stream of {job_id} ended early")
    click.echo(json.dumps(final) if as_json else summary(final))
    if final["state"] != JobState.DONE:
        sys.exit(1)


def print_stream_text(line: dict[str, Any], shown: str | None) -> str | None:
    """A stream line's reasoning and answer, as they come; the reasoning is marked and dimmed,
    apart from the answer. `shown` is the kind printed last ("thinking" or "text"); returns it
    after this line."""
    for kind in ("thinking", "text"):
        if kind not in line:
            continue
        if kind != shown:
            header = THINKING_HEADER if kind == "thinking" else ANSWER_HEADER if shown else None
            if header:
                click.echo(("\n" if shown else "") + click.style(header, dim=True))
            shown = kind
        click.echo(click.style(line[kind], dim=True) if kind == "thinking" else line[kind], nl=False)
        sys.stdout.flush()
    return shown


def print_stream_notes(line: dict[str, Any], as_json: bool) -> None:
    """What a stream line says about the job rather than its text: where it waits and where it
    started (on stderr: stdout stays the job's output), and that its output was pruned."""
    if "queued" in line:
        q = line["queued"]
        held = f", waiting for parent {q['waiting_for']}" if q.get("waiting_for") else ""
        click.echo(f"queued on {q['node']}, position {q['position']}{held}", err=True)
    if "started" in line:
        click.echo(f"started on {line['started']['node']}", err=True)
    if "pruned" in line and not as_json:  # its output is gone (retention), not empty
        click.echo(f"({line['pruned']})", nl=False)


def summary(job: dict[str, Any]) -> str:
    # A cancelled job's error is why it was cancelled ("deleted by cli 127.0.0.1"), not a failure.
    cancelled = job["state"] == JobState.CANCELLED and job.get("error")
    parts = [f"cancelled: {job['error']};" if cancelled else job["state"]]
    if job.get("eval_count"):
        parts.append(f"{job['eval_count']} token{'s' if job['eval_count'] != 1 else ''}")
    if job.get("started_at") and job.get("finished_at"):
        parts.append(ago(job["started_at"], job["finished_at"]))
    if job.get("eval_count") and job.get("eval_duration_ns"):
        parts.append(f"{job['eval_count'] / (job['eval_duration_ns'] / 1e9):.1f} tok/s")
    if job.get("error") and not cancelled:
        parts.append(f"error: {job['error']}")
    return " ".join(parts).rstrip(";")


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="End with the finished job as JSON instead of a summary.")
@click.pass_context
@api_errors
def wait(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Follow a job's output until it finishes.

    Example: gpuq wait 1760883402-9f3a7c21
    """
    follow(router_of(ctx), job_id, as_json)


# -- looking ----------------------------------------------------------------------------------


@click.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
@api_errors
def show(ctx: click.Context, job_id: str, as_json: bool) -> None:
    """Show a job: state, timings, prompt, output or findings, runs and events.

    Example: gpuq show 1760883402-9f3a7c21
    """
    job = router_of(ctx).call("GET", f"/api/jobs/{seg(job_id)}")
    if as_json:
        click.echo(json.dumps(job, indent=2))
        return
    print_placement(job)
    print_eta(job)
    click.echo(summary(job))
    if job.get("private"):
        click.echo(f"\n{private_label(job)}: its prompt, output, runs and events are for its owner and admins")
        return
    for ev in job.get("events", []):
        if (ev["reason"] or "").startswith("warning: "):
            click.echo(ev["reason"])
    print_request(job)
    print_result(job)
    print_runs(job)
    print_events(job)


def print_placement(job: dict[str, Any]) -> None:
    """Which job it is, where it went and why, whose it is, and where it waits."""
    click.echo(f"{job['id']}  {job['kind']}  {job['state']}  on {job['node']}  model {job['model']}")
    click.echo(f"placed: {job['placement']}   queued {job['created_at']}")
    click.echo(f"owner: {job.get('owner') or '(no user)'}   client: {job.get('client') or '(not said)'}")
    if job.get("endpoint"):  # a call through the front door; the whole request: --json
        agent = (job.get("request") or {}).get("user_agent")
        click.echo(f"via: {job['endpoint']} (front door){f', client {agent}' if agent else ''}")
    if job.get("parent"):
        click.echo(f"parent: {job['parent']}")
    for child in job.get("children", []):
        click.echo(f"critique: {child['id']} on {child['node']} {child['state']}")
    if job.get("queue_position"):
        click.echo(f"position {job['queue_position']} in {job['node']}'s queue")
    if job.get("waiting_for"):
        click.echo(f"waiting for parent {job['waiting_for']} to finish (held: it reviews the parent's result)")


def print_eta(job: dict[str, Any]) -> None:
    """When a job still to end should start and finish, with the clock times."""
    eta = eta_summary(job)
    if not eta:
        return
    times = [
        f"{k} {clock(job['eta_' + k])}"
        for k in ("start", "finish")
        if job.get("eta_" + k) and not (k == "start" and job["state"] == JobState.RUNNING)
    ]
    click.echo(eta + (f"   [{', '.join(times)}]" if times else ""))


def print_request(job: dict[str, Any]) -> None:
    """What was asked: the prompt (or where it went), and the thinking and options asked for."""
    click.echo("\n-- prompt --\n" + job["prompt"])
    if job.get("prompt_pruned"):  # the rest is in the archive
        click.echo(f"({job['prompt_pruned']})")
    if job.get("think") is not None or job.get("options"):
        asked = [f"think {json.dumps(job['think'])}"] if job.get("think") is not None else []
        asked += [f"{k}={json.dumps(v)}" for k, v in (job.get("options") or {}).items()]
        click.echo("asked: " + " ".join(asked))


def print_result(job: dict[str, Any]) -> None:
    """What came back: the reasoning, then the findings (a critique) or the output."""
    if job.get("thinking"):
        click.echo("\n-- thinking --\n" + click.style(job["thinking"], dim=True))
    if job.get("findings") is not None:
        click.echo(f"\n-- findings ({len(job['findings'])}) --")
        for i, f in enumerate(job["findings"], start=1):
            click.echo(f"{i}. [{f['severity']}] {f['title']} ({f['where']})\n   {f['detail']}")
    if job.get("output_pruned"):  # its text is gone: said, never shown as no output
        click.echo(f"\n-- output --\n({job['output_pruned']})")
    elif job.get("findings") is None and job.get("output"):
        click.echo("\n-- output --\n" + job["output"])


def print_runs(job: dict[str, Any]) -> None:
    click.echo("\n-- runs --")
    for run in job.get("runs", []):
        if run.get("finished_at"):
            when = f"started {run['started_at']}, ended {run['finished_at']} ({ago(run['started_at'], run['finished_at'])})"
        else:
            when = f"started {run['started_at']}, {ago(run['started_at'])} so far"
        click.echo(
            f"run {run['id']} on {run['node']}: {run['state']}, {when}{': ' + run['error'] if run.get('error') else ''}"
        )


def print_events(job: dict[str, Any]) -> None:
    click.echo("\n-- events --")
    for ev in job.get("events", []):
        why = f": {ev['reason']}" if ev["reason"] else ""
        click.echo(f"{ev['at']} {ev['from_state'] or '-'} -> {ev['to_state']} by {ev['actor']}{why}")
