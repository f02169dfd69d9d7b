"""`gpuq`: the command line. Commands parse, call the router over HTTP, and print; errors
print `error <status> <message>` then `not retried`, and exit non-zero."""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote, urlencode

import click

from .client import ApiError, Router
from ..config import (DEFAULT_ROUTER, ConfigError, check_token, check_url, find_config, load_config,
                     parse_duration, starter_config)
from ..errors import UnknownNode
from ..jobs import ACTIVE, FINAL, JobState, parse_iso, span
from ..params import THINK_LEVELS


def fail(status, message: str) -> None:
    click.echo(f"error {status} {message}", err=True)
    click.echo("not retried", err=True)
    sys.exit(1)


def api_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ApiError as exc:
            fail(exc.status, exc.message)
    return wrapper


def router_of(ctx: click.Context) -> Router:
    """--router or $GPUQ_ROUTER, else the config's public_url; $GPUQ_TOKEN, else its token."""
    opts = ctx.obj
    url, source = opts.get("router"), "--router"
    if not url and os.environ.get("GPUQ_ROUTER"):
        url, source = os.environ["GPUQ_ROUTER"], "$GPUQ_ROUTER"
    token = os.environ.get("GPUQ_TOKEN") or None  # set but empty: as if unset (the config's token is used)
    try:
        if url:
            url = check_url(url, source)
        if token:
            check_token(token, "$GPUQ_TOKEN")
    except ConfigError as exc:
        raise click.UsageError(exc.message, ctx) from None
    if not url or not token:
        try:
            path = find_config(opts.get("config"))
            settings = load_config(path, env_token=False) if path else None
        except ConfigError:
            settings = None
        if settings:
            url = url or settings.public_url
            token = token or settings.token
    return Router(url or DEFAULT_ROUTER, token)


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


def eta_summary(job: dict) -> str | None:
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


def after_submit(job: dict) -> str:
    """The line `gpuq task` prints after placing a job: when it should start (it may already
    have started, or even finished)."""
    if job["state"] == JobState.RUNNING:
        return "started; " + (eta_summary(job) or "")
    return eta_summary(job) or f"already {job['state']}"


def clock(ts: str) -> str:
    return time.strftime("%H:%M:%S", time.localtime(parse_iso(ts)))


def excerpt(text: str, width: int = 50, more: bool = False) -> str:
    """One line of at most `width` characters; `more`: the text goes on past what we hold."""
    flat = " ".join(text.split())
    if len(flat) > width:
        return flat[: width - 1] + "…"
    return flat + "…" if more else flat


def prompt_excerpt(job: dict, width: int = 50) -> str:
    """A listed job's prompt: listings carry its first characters and its size in bytes."""
    text = job["prompt_excerpt"]
    return excerpt(text, width, more=len(text.encode("utf-8")) < job["prompt_bytes"])


@click.group()
@click.version_option(package_name="gpuq", prog_name="gpuq", message="%(prog)s %(version)s")
@click.option("--router", help="Router URL (else $GPUQ_ROUTER, else the config's public_url).")
@click.option("--config", type=click.Path(dir_okay=False), help="gpuq.toml (else $GPUQ_CONFIG, else ./gpuq.toml).")
@click.pass_context
def main(ctx: click.Context, router: str | None, config: str | None) -> None:
    """gpuq: send AI jobs to your own GPU machines, one job per node, durably queued.

    Example: gpuq task "add a retry budget to the export job"
    """
    ctx.obj = {"router": router, "config": config}


# -- the router -----------------------------------------------------------------------------

@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpuq.toml to serve.")
@click.option("--demo", is_flag=True, help="Run simulated Ollama nodes on loopback (no gpuq.toml needed).")
@click.option("--listen", help="host:port to bind, overriding the config.")
@click.option("--database", type=click.Path(dir_okay=False), help="SQLite file or postgresql:// URI (also $GPUQ_DATABASE), overriding the config.")
@click.option("--ollama-listen", help="host:port of the Ollama/OpenAI front door, overriding the config "
                                      "(the demo's: 127.0.0.1:11435).")
@click.pass_context
def serve(ctx: click.Context, config_path: str | None, demo: bool, listen: str | None,
          database: str | None, ollama_listen: str | None) -> None:
    """Run the router.

    Example: gpuq serve --config ~/gpuq.toml
    """
    from ..ops.daemon import run_daemon

    path = find_config(config_path or ctx.obj["config"])
    if path is None and not demo:
        click.echo("gpuq: no config: looked at --config, $GPUQ_CONFIG and ./gpuq.toml. "
                   "Write one with `gpuq init`, or try `gpuq serve --demo`.", err=True)
        sys.exit(2)
    try:
        settings = None if demo and path is None else load_config(path)
    except ConfigError as exc:
        click.echo(f"gpuq: config error: {exc.message}", err=True)
        sys.exit(2)
    if settings is not None:  # what the command line sets, a reload of the file keeps
        pinned = {"listen", "public_url"} if listen else set()
        pinned |= {"database"} if database else set()
        pinned |= {"ollama_listen"} if ollama_listen else set()
        settings = replace(settings, pinned=frozenset(pinned))
    sys.exit(run_daemon(settings, listen=listen, database=database, ollama_listen=ollama_listen))


@main.command()
@click.argument("path", default="gpuq.toml", type=click.Path(dir_okay=False))
@click.option("--tailscale", is_flag=True,
              help="Find the lab on your tailnet: every online peer whose Ollama answers becomes a node.")
@click.option("--ollama-port", default=11434, show_default=True, help="The port Ollama listens on (with --tailscale).")
def init(path: str, tailscale: bool, ollama_port: int) -> None:
    """Write a starter gpuq.toml (never overwrites).

    Example: gpuq init --tailscale && $EDITOR gpuq.toml
    """
    target = Path(path)
    if target.exists():
        raise click.ClickException(f"{path} already exists; not overwritten")
    if not tailscale:
        target.write_text(starter_config(), encoding="utf-8")
        click.echo(f"wrote {path}: set each [[node]]'s url and model, then run `gpuq serve`")
        return
    from ..errors import GpuqError
    from .tailscale import discover
    try:
        text, me, found, silent = discover(ollama_port)
    except GpuqError as exc:
        raise click.ClickException(exc.message) from None
    target.write_text(text, encoding="utf-8")
    click.echo(f"wrote {path}: the router on {me.ip} ({me.name}), {len(found)} node{'s' if len(found) != 1 else ''}:")
    for f in found:
        click.echo(f"  {f.machine.host_name:16} {f.machine.name}  {f.largest}  ({len(f.models)} models)")
    for m in silent:
        click.echo(f"  {m.host_name:16} online, but no Ollama answered on port {ollama_port}")
    click.echo("check each node's roles and model, then run `gpuq serve`")


# -- starting at login ----------------------------------------------------------------------

def service_fail(message: str) -> None:
    click.echo(f"error {message}", err=True)
    sys.exit(1)


def platform_option(fn):
    from ..ops.service import PLATFORMS, this_platform
    return click.option("--platform", type=click.Choice(PLATFORMS), default=this_platform,
                        show_default="this machine's",
                        help="Write macOS's launchd agent or Linux's systemd user unit.")(fn)


def service_platform(platform: str | None) -> str:
    if platform is None:
        service_fail(f"gpuq service knows macOS (launchd) and Linux (systemd), not {sys.platform}; "
                     "start `gpuq serve` at login your own way")
    return platform


@main.group()
def service() -> None:
    """Start the router at login: a launchd agent (macOS) or a systemd user unit (Linux).

    Example: gpuq service install --config ~/lab/gpuq.toml
    """


@service.command("install")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpuq.toml to serve.")
@platform_option
@click.option("--dry-run", is_flag=True, help="Print the file and the commands; change nothing.")
@click.pass_context
def service_install(ctx, config_path, platform, dry_run) -> None:
    """Write the agent or unit that runs `gpuq serve --config <gpuq.toml>` at login, and start it.

    Example: gpuq service install --dry-run
    """
    from ..ops import service as svc
    platform = service_platform(platform)
    path = find_config(config_path or ctx.obj["config"])
    if path is None or not path.is_file():
        where = f"{path} does not exist" if path else "looked at --config, $GPUQ_CONFIG and ./gpuq.toml"
        service_fail(f"no gpuq.toml to serve ({where}); write one with `gpuq init`, "
                     "or name it with --config")
    try:
        load_config(path, env_token=False)
    except ConfigError as exc:
        service_fail(f"{path}: {exc.message}")
    plan = svc.install_plan(platform, path.resolve(), svc.gpuq_command())
    if dry_run:
        click.echo(f"# would write {plan.path}:")
        click.echo(plan.text, nl=False)
        click.echo("# then run:")
        for argv in plan.commands:
            click.echo(" ".join(argv))
        return
    try:
        svc.install(plan)
    except svc.ServiceError as exc:
        left = f" ({plan.path} is written; `gpuq service uninstall` removes it)" if plan.path.exists() else ""
        service_fail(exc.message + left)
    click.echo(f"wrote {plan.path}")
    for argv in plan.commands:
        click.echo(f"ran {' '.join(argv)}")
    if platform == "macos":
        click.echo(f"the router starts now and at each login; its log: {svc.log_path()}")
    else:
        click.echo(f"the router starts now and at each login; its log: journalctl --user -u {svc.UNIT}")
        click.echo(f"to start it at boot, before any login: loginctl enable-linger {os.environ.get('USER', '$USER')}")
    click.echo("check it with `gpuq service status`")


@service.command("status")
@platform_option
def service_status(platform) -> None:
    """Say whether the router's agent or unit is installed and running (exit 0 only when running).

    Example: gpuq service status
    """
    from ..ops import service as svc
    platform = service_platform(platform)
    try:
        st = svc.status(platform)
    except svc.ServiceError as exc:
        service_fail(exc.message)
    click.echo(f"installed: {st.path}" if st.installed else f"not installed (no {st.path}); `gpuq service install`")
    if st.enabled is not None:
        click.echo(f"enabled: {st.enabled}")
    click.echo(f"running: {'yes' if st.running else 'no'} ({st.state}" + (f", pid {st.pid})" if st.pid else ")"))
    if st.installed and not st.running:
        log = f"journalctl --user -u {svc.UNIT}" if platform == "linux" else str(svc.log_path())
        click.echo(f"why: see {log}")
    sys.exit(0 if st.running else 3)


@service.command("uninstall")
@platform_option
@click.option("--dry-run", is_flag=True, help="Print the file and the commands; change nothing.")
def service_uninstall(platform, dry_run) -> None:
    """Stop the router's agent or unit and remove its file.

    Example: gpuq service uninstall
    """
    from ..ops import service as svc
    platform = service_platform(platform)
    plan = svc.uninstall_plan(platform)
    if dry_run:
        click.echo("# would run:")
        for argv in plan.commands:
            click.echo(" ".join(argv))
        click.echo(f"# and remove {plan.path}")
        return
    try:
        removed = svc.uninstall(plan)
    except svc.ServiceError as exc:
        service_fail(exc.message)
    if not removed:
        click.echo(f"not installed (no {plan.path}); nothing to do")
        return
    for argv in plan.commands:
        click.echo(f"ran {' '.join(argv)}")
    click.echo(f"removed {plan.path}; the router no longer starts at login")


# -- submitting -----------------------------------------------------------------------------

def read_text(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.buffer.read().decode("utf-8")
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail("-", f"cannot read {'stdin' if path == '-' else path}: {exc}")
        raise  # unreachable


def ollama_params(fn):
    """--think/--no-think, --think-level and --option KEY=VALUE, for the commands that submit."""
    fn = click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
                      help="An Ollama model option, e.g. num_ctx=32768 (repeatable; over the node's).")(fn)
    fn = click.option("--think-level", type=click.Choice(THINK_LEVELS),
                      help="Think at this level (models that take one, e.g. gpt-oss).")(fn)
    return click.option("--think/--no-think", default=None,
                        help="Turn the model's thinking on or off (default: the node's, else Ollama's).")(fn)


def params_body(think: bool | None, think_level: str | None, options: tuple[str, ...]) -> dict:
    """The API fields for --think, --think-level and --option (values read as JSON when they are)."""
    if think is not None and think_level is not None:
        raise click.UsageError("give --think/--no-think or --think-level, not both")
    body: dict = {"think": think_level if think_level is not None else think}
    parsed = {}
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


@main.command()
@click.argument("prompt", required=False)
@click.option("--file", "file_", type=click.Path(dir_okay=False, allow_dash=True), help="Read the prompt from a file (- for stdin).")
@click.option("--model", help="Use this model instead of the node's.")
@click.option("--node", help="Put the task on this node.")
@click.option("--timeout", type=float, help="Fail the job if it runs longer than this many seconds.")
@click.option("--priority", type=click.Choice(["interactive", "batch"]),
              help="The lane: interactive waits ahead of every batch job on its node (default: batch).")
@click.option("--wait", is_flag=True, help="Stream the output as it is generated, then the final state.")
@click.option("--json", "as_json", is_flag=True, help="Print the submitted job (with --wait: the finished job) as JSON.")
@ollama_params
@click.pass_context
@api_errors
def task(ctx, prompt, file_, model, node, timeout, priority, wait, think, think_level, options, as_json) -> None:
    """Submit a task: it goes to the first free task node by rank.

    Example: gpuq task "add a retry budget to the export job" --wait
    """
    if prompt is not None and file_ is not None:
        raise click.UsageError("give a PROMPT or --file, not both", ctx)
    if prompt is None and file_ is None:
        raise click.UsageError("give a PROMPT, or --file PATH (- for stdin)", ctx)
    if file_ is not None:
        prompt = read_text(file_)
    body = {"kind": "task", "prompt": prompt, "model": model, "node": node, "timeout": timeout, "priority": priority,
            **params_body(think, think_level, options)}
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
        click.echo(f"not waiting: follow it with `gpuq wait {job['id']}` or the preview link; later, "
                   f"`gpuq show {job['id']}` or `gpuq history` says how it ended", err=True)


@main.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--parent", help="The task under critique: never critiqued on its own node.")
@click.option("--node", help="Critique on this node only.")
@click.option("--model", help="Use this model instead of each node's.")
@click.option("--timeout", type=float, help="Fail a child if it runs longer than this many seconds.")
@click.option("--priority", type=click.Choice(["interactive", "batch"]),
              help="The lane: interactive waits ahead of every batch job on its node (default: batch).")
@click.option("--no-wait", is_flag=True, help="Return after submitting.")
@click.option("--json", "as_json", is_flag=True,
              help='Print one JSON document, {"jobs": [...]}: the finished children (with --no-wait: '
                   'the submitted ones); progress goes to stderr.')
@ollama_params
@click.pass_context
@api_errors
def critique(ctx, file, parent, node, model, timeout, priority, no_wait, as_json, think, think_level, options) -> None:
    """Fan a critique out to every critique node: each child's id, node and preview link at
    once, then each one's result as it finishes.

    Example: gpuq critique plan.md
    """
    if file is None and parent is None:
        raise click.UsageError("give a FILE to critique, or --parent ID", ctx)
    body = {"kind": "critique", "parent": parent, "node": node, "model": model, "timeout": timeout,
            "priority": priority,
            **params_body(think, think_level, options)}
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


def critique_line(job: dict) -> str:
    took = ago(job["created_at"], job["finished_at"])
    if job["state"] == JobState.DONE:
        count = len(job.get("findings") or [])
        return f"{job['node']} {job['id']} {job['model']} done {count} finding{'s' if count != 1 else ''} {took}"
    return f"{job['node']} {job['id']} {job['model']} {job['state']} {took}: {job.get('error') or ''}"


def wait_all(router: Router, jobs: list[dict], as_json: bool = False) -> list[dict]:
    """Say on stderr when each job starts, and print each one's result as it finishes (on
    stderr too with `as_json`, whose stdout is the finished jobs alone); poll with a gentle
    backoff. The finished jobs, in the order given."""
    seen = {j["id"]: j["state"] for j in jobs}
    pending, finished, delay = list(seen), {}, 0.05
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
    final, shown = None, None  # shown: "thinking" or "text", the kind printed last
    try:
        for line in router.lines(f"/api/jobs/{seg(job_id)}/stream"):
            for kind in ("thinking", "text"):
                if kind not in line or as_json:  # --json: the text is in the job's output
                    continue
                if kind != shown:  # the reasoning is marked and dimmed, apart from the answer
                    header = THINKING_HEADER if kind == "thinking" else ANSWER_HEADER if shown else None
                    if header:
                        click.echo(("\n" if shown else "") + click.style(header, dim=True))
                    shown = kind
                click.echo(click.style(line[kind], dim=True) if kind == "thinking" else line[kind], nl=False)
                sys.stdout.flush()
            if "queued" in line:  # where it waits, on stderr: stdout stays the job's output
                q = line["queued"]
                held = f", waiting for parent {q['waiting_for']}" if q.get("waiting_for") else ""
                click.echo(f"queued on {q['node']}, position {q['position']}{held}", err=True)
            if "started" in line:
                click.echo(f"started on {line['started']['node']}", err=True)
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


def summary(job: dict) -> str:
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


@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="End with the finished job as JSON instead of a summary.")
@click.pass_context
@api_errors
def wait(ctx, job_id, as_json) -> None:
    """Follow a job's output until it finishes.

    Example: gpuq wait 1760883402-9f3a7c21
    """
    follow(router_of(ctx), job_id, as_json)


# -- looking ----------------------------------------------------------------------------------

@main.command()
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
@api_errors
def show(ctx, job_id, as_json) -> None:
    """Show a job: state, timings, prompt, output or findings, runs and events.

    Example: gpuq show 1760883402-9f3a7c21
    """
    job = router_of(ctx).call("GET", f"/api/jobs/{seg(job_id)}")
    if as_json:
        click.echo(json.dumps(job, indent=2))
        return
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
    if eta_summary(job):
        times = [f"{k} {clock(job['eta_' + k])}" for k in ("start", "finish")
                 if job.get("eta_" + k) and not (k == "start" and job["state"] == JobState.RUNNING)]
        click.echo(eta_summary(job) + (f"   [{', '.join(times)}]" if times else ""))
    click.echo(summary(job))
    for ev in job.get("events", []):
        if (ev["reason"] or "").startswith("warning: "):
            click.echo(ev["reason"])
    click.echo("\n-- prompt --\n" + job["prompt"])
    if job.get("think") is not None or job.get("options"):
        asked = [f"think {json.dumps(job['think'])}"] if job.get("think") is not None else []
        asked += [f"{k}={json.dumps(v)}" for k, v in (job.get("options") or {}).items()]
        click.echo("asked: " + " ".join(asked))
    if job.get("thinking"):
        click.echo("\n-- thinking --\n" + click.style(job["thinking"], dim=True))
    if job.get("findings") is not None:
        click.echo(f"\n-- findings ({len(job['findings'])}) --")
        for i, f in enumerate(job["findings"], start=1):
            click.echo(f"{i}. [{f['severity']}] {f['title']} ({f['where']})\n   {f['detail']}")
    if job.get("findings") is None and job.get("output"):
        click.echo("\n-- output --\n" + job["output"])
    click.echo("\n-- runs --")
    for run in job.get("runs", []):
        if run.get("finished_at"):
            when = f"started {run['started_at']}, ended {run['finished_at']} ({ago(run['started_at'], run['finished_at'])})"
        else:
            when = f"started {run['started_at']}, {ago(run['started_at'])} so far"
        click.echo(f"run {run['id']} on {run['node']}: {run['state']}, {when}"
                   f"{': ' + run['error'] if run.get('error') else ''}")
    click.echo("\n-- events --")
    for ev in job.get("events", []):
        why = f": {ev['reason']}" if ev["reason"] else ""
        click.echo(f"{ev['at']} {ev['from_state'] or '-'} -> {ev['to_state']} by {ev['actor']}{why}")


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
        raise click.BadParameter(f"expected a time ago like 30m, 2h or 3d, or a date like 2026-10-19 "
                                 f"or '2026-10-19 14:00', got {text!r}", param_hint="--since") from None


def history_jobs(router: Router, state: str | None, node: str | None, since: float | None,
                 limit: int, owner: str | None = None) -> tuple[list[dict], bool]:
    """The newest finished jobs (at most `limit`, none older than `since`), and whether there are
    more. /api/history pages newest first; `since` is where the paging stops."""
    jobs, offset = [], 0
    while True:
        size = min(500, limit + 1 - len(jobs))
        query = urlencode({k: v for k, v in (("state", state), ("node", node), ("owner", owner), ("limit", size),
                                             ("offset", offset)) if v is not None})
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


@main.command()
@click.option("--state", type=click.Choice([s.value for s in FINAL]), help="Only jobs that ended so.")
@click.option("--node", help="Only jobs on this node.")
@click.option("--owner", help="Only jobs of this user (a [[user]]'s name).")
@click.option("--since", help="Only jobs that ended since: a time ago (30m, 2h, 3d) or a date (2026-10-19 14:00).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000), help="Jobs shown at most.")
@click.option("--json", "as_json", is_flag=True, help='Print {"jobs": [...], "more": true|false} as JSON.')
@click.pass_context
@api_errors
def history(ctx, state, node, owner, since, limit, as_json) -> None:
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
        line = (f"{job['id']:19}  {job['state']:9} {job['node']:12} {job['kind']:8} {owner_of(job):10} "
                f"{ago(job['finished_at']) + ' ago':>9} {ran:>6}  {prompt_excerpt(job, 40)}")
        click.echo(line)
        if job.get("error"):
            click.echo(f"{'':21}{excerpt(job['error'], 100)}")
    if more:
        click.echo(f"… more: raise --limit (now {limit}), or narrow with --state, --node, --owner or --since")


@main.command("queue")
@click.option("--limit", default=50, show_default=True, help="Waiting jobs shown per node.")
@click.option("--mine", is_flag=True, help="Only your own jobs (the user of your token), at their places.")
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def queue_cmd(ctx, limit, mine, as_json) -> None:
    """Every node's running job and waiting jobs, in order (like squeue), and whose each is.

    Example: gpuq queue --mine
    """
    router = router_of(ctx)
    me = None
    if mine:
        me = router.call("GET", "/api/whoami")["name"]
        if me is None:
            raise click.ClickException("--mine: this router knows no users (no token, no [[user]]), so no job is "
                                       "anyone's; leave out --mine")
    data = router.call("GET", f"/api/queue?limit={limit}")
    if me is not None:  # only yours, each with its place in its node's queue (POS)
        for node in data["nodes"]:
            node["queued"] = [dict(j, position=i) for i, j in enumerate(node["queued"], start=1)
                              if j.get("owner") == me]
            if node["running"] and node["running"].get("owner") != me:
                node["running"] = None
                node["others_running"] = True
    if as_json:
        click.echo(json.dumps(data))
        return
    click.echo(f"queue depth {data['queue_depth']}" + (f"; yours ({me}) shown" if me else ""))
    for node in data["nodes"]:
        status = "up" if node["up"] else ("down" if node["checked"] else "checking")
        click.echo(f"\n{node['name']}  {status}  {node['model']}  [{','.join(node['roles'])}]"
                   f"  {node['queued_count']} waiting")
        click.echo(f"  {'POS':>7}  {'JOB':19}  {'KIND':8} {'OWNER':10} {'AGE':>7} {'ESTIMATE':18}  PROMPT")
        run = node["running"]
        if run:
            tokens = run.get("tokens_so_far") or 0
            click.echo(f"  running  {run['id']}  {run['kind']:8} {owner_of(run):10} {ago(run['started_at']):>7} "
                       f"{eta_column(run, 'eta_finish', 'ends')}  "
                       f"[ran {ago(run['started_at'])}, {tokens} token{'s' if tokens != 1 else ''}]  {prompt_excerpt(run)}")
        elif node.get("others_running"):
            click.echo(f"  {'running':>7}  (someone else's job)")
        elif status == "up":
            click.echo(f"  {'idle':>7}")
        else:
            click.echo(f"  {'idle':>7}  (nothing runs while the node is {status})")
        for i, job in enumerate(node["queued"], start=1):
            i = job.get("position", i) if me is not None else i
            mark = " (preempted)" if job["preempted_runs"] else ""
            if job.get("waiting_for"):
                mark += f" (waiting for parent {job['waiting_for']})"
            click.echo(f"  {i:>7}  {job['id']}  {job['kind']:8} {owner_of(job):10} {ago(job['created_at']):>7} "
                       f"{eta_column(job, 'eta_start', 'starts')}  {prompt_excerpt(job)}{mark}")
        if me is None and node["queued_count"] > len(node["queued"]):
            click.echo(f"  … {node['queued_count'] - len(node['queued'])} more")


def owner_of(job: dict) -> str:
    """A job's owner as a column shows it: '-' for a job of no user."""
    return excerpt(job.get("owner") or "-", 10)


def eta_column(job: dict, key: str, verb: str) -> str:
    """'starts in ~4 min' / 'ends now' / 'starts ?' (unknown: `gpuq show ID` says why), padded."""
    return f"{verb} {in_about(job[key]) if job.get(key) else '?'}".ljust(18)


def warm_text(warm: dict) -> str:
    """"qwen3:8b until 14:32" (local time), or "... until the node is idle"."""
    if warm.get("until") is None:
        return f"{warm['model']} until the node is idle"
    return f"{warm['model']} until {time.strftime('%H:%M', time.localtime(parse_iso(warm['until'])))}"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def nodes(ctx, as_json) -> None:
    """Each node's health, model and waiting jobs.

    Example: gpuq nodes
    """
    data = router_of(ctx).call("GET", "/api/nodes")
    if as_json:
        click.echo(json.dumps(data))
        return
    click.echo(f"{'NODE':12} {'RANK':>4} {'STATUS':8} {'MODEL':22} {'ROLES':15} {'WAITING':>7}  SINCE / PROBLEM")
    for n in data["nodes"]:
        status = "up" if n["up"] else ("down" if n["checked"] else "checking")
        if n["vram_stuck"]:
            status = "stuck"
        problem = n["vram_stuck"] or (n["last_error"] if not n["up"] else "")
        if n.get("loop_error"):  # a worker or health loop crashed and waits for its restart
            status, problem = "crashed", f"{n['loop_error']}; {problem}".rstrip("; ")
        if n["model_installed"] is False:
            problem = f"model {n['model']} is not installed; {problem}".rstrip("; ")
        click.echo(f"{n['name']:12} {n['rank']:>4} {status:8} {n['model']:22} {','.join(n['roles']):15} "
                   f"{n['waiting']:>7}  {ago(n['since'])} ago {problem}".rstrip())
        if n.get("warm"):  # a model kept loaded between jobs
            click.echo(f"{'':12} warm: {warm_text(n['warm'])}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="The same JSON (accepted for symmetry with the other commands).")
@click.pass_context
@api_errors
def health(ctx, as_json) -> None:
    """The router's health as JSON; exit 1 while it is not ok (a stale head, a node down, a crashed loop).

    Example: gpuq health
    """
    data = router_of(ctx).call("GET", "/health", allow=(503,))
    click.echo(json.dumps(data))
    if not data.get("ok"):
        sys.exit(1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def stale(ctx, as_json) -> None:
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


# -- controlling the queue -------------------------------------------------------------------

@main.command()
@click.argument("job_id")
@click.option("--to", "position", type=int, help="New position (1 = next to run).")
@click.option("--before", help="Put it just before this job.")
@click.option("--after", help="Put it just after this job.")
@click.option("--node", help="Move it to this node's queue.")
@click.pass_context
@api_errors
def move(ctx, job_id, position, before, after, node) -> None:
    """Reorder a waiting job, or move it to another node's queue.

    Example: gpuq move 1760883402-9f3a7c21 --to 1 --node node-2
    """
    if position is None and before is None and after is None and node is None:
        raise click.UsageError("say where to move it: --to N, --before ID, --after ID or --node NAME", ctx)
    if sum(x is not None for x in (position, before, after)) > 1:
        raise click.UsageError("give only one of --to, --before and --after", ctx)
    body = {"position": position, "before": before, "after": after, "node": node}
    job = router_of(ctx).call("POST", f"/api/jobs/{seg(job_id)}/move", {k: v for k, v in body.items() if v is not None})["job"]
    beyond = f" (the end of its queue: --to {position} is past it)" if position and job["position"] < position else ""
    click.echo(f"{job['id']} -> {job['node']} position {job['position']}{beyond}")


@main.command()
@click.argument("job_id")
@click.pass_context
@api_errors
def preempt(ctx, job_id) -> None:
    """Run a waiting job next, now, interrupting its node's running job (which goes back behind it).

    Example: gpuq preempt 1760883402-9f3a7c21
    """
    data = router_of(ctx).call("POST", f"/api/jobs/{seg(job_id)}/preempt")
    job = data["job"]
    click.echo(f"{job['id']} -> {job['node']} position 1")
    if data.get("interrupted"):
        click.echo(f"{data['interrupted']} preempted -> {job['node']} position 2")


@main.command()
@click.argument("job_ids", nargs=-1, required=True)
@click.pass_context
def delete(ctx, job_ids) -> None:
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


@main.command()
@click.argument("node")
@click.option("--running", is_flag=True, help="Abort the running job too.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_context
@api_errors
def clear(ctx, node, running, yes) -> None:
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
        what = f"{count} job{'s' if count != 1 else ''}" + (" (the running one included)" if running and found["running"] else "")
        click.confirm(f"Cancel {what} on {node}?", abort=True)
    data = router.call("POST", f"/api/nodes/{seg(node)}/clear", {"running": running})
    count = len(data["cancelled"])
    click.echo(f"{count} job{'s' if count != 1 else ''} cancelled on {node}")
    for job_id in data["cancelled"]:
        click.echo(f"{job_id} cancelled")


@main.command()
@click.option("--force", is_flag=True, help="Remove nodes even where jobs wait (they fail) or run (it finishes).")
@click.pass_context
@api_errors
def reload(ctx, force) -> None:
    """Read the router's gpuq.toml again and follow it, without a restart (as SIGHUP does):
    nodes added, removed, re-ranked, new URLs and models, timeouts, alerts. Prints what changed,
    and what only a restart changes (listen, database, ollama_listen, token...).

    Example: gpuq reload
    """
    data = router_of(ctx).call("POST", "/api/reload", {"force": force})
    lines = [f"added node {name}" for name in data["added"]]
    lines += [f"removed node {name}" for name in data["removed"]]
    lines += [f"node {name}: {change}" for name, changes in data["nodes"].items() for change in changes]
    lines += data["router"]
    lines += [f"{job['id']} failed on {job['node']}: node removed from gpuq.toml" for job in data["failed"]]
    click.echo(f"reloaded {data['path']}: " + ("nothing changed" if not data["changed"] else
                                               f"{len(lines)} change{'s' if len(lines) != 1 else ''}"))
    for line in lines:
        click.echo(f"  {line}")
    for change in data["needs_restart"]:
        click.echo(f"  needs a restart (kept as it was): {change}")


@main.command()
@click.argument("job_id")
@click.pass_context
@api_errors
def retry(ctx, job_id) -> None:
    """Put a failed or cancelled job back at the tail of its node's queue, as a new run.

    Example: gpuq retry 1760883402-9f3a7c21
    """
    job = router_of(ctx).call("POST", f"/api/jobs/{seg(job_id)}/retry")["job"]
    click.echo(f"{job['id']} -> {job['node']} queued")

