"""The lab: run the router (`serve`), write its gpuq.toml (`init`), make it read that again
(`reload`), and look at its nodes and health (`nodes`, `health`)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from ..config import ConfigError, find_config, load_config, starter_config
from ..jobs import parse_iso
from ..speed import speed_text
from .common import ago, api_errors, fail, router_of
from .where import find_router, read_config


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpuq.toml to serve.")
@click.option("--demo", is_flag=True, help="Run simulated Ollama nodes on loopback (no gpuq.toml needed).")
@click.option("--listen", help="host:port to bind, overriding the config.")
@click.option(
    "--database",
    type=click.Path(dir_okay=False),
    help="SQLite file or postgresql:// URI (also $GPUQ_DATABASE), overriding the config.",
)
@click.option(
    "--ollama-listen",
    help="host:port of the Ollama/OpenAI front door, overriding the config (the demo's: 127.0.0.1:11435).",
)
@click.pass_context
def serve(
    ctx: click.Context,
    config_path: str | None,
    demo: bool,
    listen: str | None,
    database: str | None,
    ollama_listen: str | None,
) -> None:
    """Run the router.

    Example: gpuq serve --config ~/gpuq.toml
    """
    from ..ops.daemon import run_daemon

    path = find_config(config_path or ctx.obj["config"])
    if path is None and not demo:
        click.echo(
            "gpuq: no config: looked at --config, $GPUQ_CONFIG and ./gpuq.toml. "
            "Write one with `gpuq init`, or try `gpuq serve --demo`.",
            err=True,
        )
        sys.exit(2)
    try:
        settings = None if path is None else load_config(path)  # no path: --demo (else exited above)
    except ConfigError as exc:
        from ..ops.service import config_error_exit

        click.echo(f"gpuq: config error: {exc.message}", err=True)
        sys.exit(config_error_exit())  # EX_CONFIG: a service does not start it again (gpuq/ops/service.py)
    if settings is not None:  # what the command line sets, a reload of the file keeps
        pinned = {"listen", "public_url"} if listen else set()
        pinned |= {"database"} if database else set()
        pinned |= {"ollama_listen"} if ollama_listen else set()
        settings = replace(settings, pinned=frozenset(pinned))
    sys.exit(run_daemon(settings, listen=listen, database=database, ollama_listen=ollama_listen))


@click.command()
@click.argument("path", default="gpuq.toml", type=click.Path(dir_okay=False))
@click.option(
    "--tailscale",
    is_flag=True,
    help="Find the lab on your tailnet: every online peer whose Ollama answers becomes a node.",
)
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


def warm_text(warm: dict[str, Any]) -> str:
    """ "qwen3:8b until 14:32" (local time), or "... until the node is idle"."""
    if warm.get("until") is None:
        return f"{warm['model']} until the node is idle"
    return f"{warm['model']} until {time.strftime('%H:%M', time.localtime(parse_iso(warm['until'])))}"


def asked_unload_text(u: dict[str, Any]) -> str:
    """ "last asked unload: qwen3:8b at 14:32 by ollama 10.0.0.5, gone from /api/ps in 0.4 s"."""
    at = time.strftime("%Y-%m-%d %H:%M", time.localtime(parse_iso(u["at"])))
    how = f"gone from /api/ps in {u['took_s']:g} s" if u["verified"] else "still listed by /api/ps: node flagged"
    return f"last asked unload: {u['model']} at {at} by {u['by']}, {how}"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the API's answer as JSON.")
@click.pass_context
@api_errors
def nodes(ctx: click.Context, as_json: bool) -> None:
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
        click.echo(
            f"{n['name']:12} {n['rank']:>4} {status:8} {n['model']:22} {','.join(n['roles']):15} "
            f"{n['waiting']:>7}  {ago(n['since'])} ago {problem}".rstrip()
        )
        if n.get("speed", {}).get("runs"):  # measured on its model over its recent runs (gpuq/speed.py)
            click.echo(f"{'':12} speed: {speed_text(n['speed'])}")
        if n.get("warm"):  # a model kept loaded between jobs
            click.echo(f"{'':12} warm: {warm_text(n['warm'])}")
        if n.get("asked_unload"):  # the last `ollama stop` (or Open WebUI's unload) it was asked
            click.echo(f"{'':12} {asked_unload_text(n['asked_unload'])}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="The same JSON (accepted for symmetry with the other commands).")
@click.pass_context
@api_errors
def health(ctx: click.Context, as_json: bool) -> None:
    """The router's health as JSON; exit 1 while it is not ok (a stale head, a node down, a crashed loop).

    Example: gpuq health
    """
    data = router_of(ctx).call("GET", "/health", allow=(503,))
    click.echo(json.dumps(data))
    if not data.get("ok"):
        sys.exit(1)


@click.command()
@click.option("--force", is_flag=True, help="Remove nodes even where jobs wait (they fail) or run (it finishes).")
@click.pass_context
@api_errors
def reload(ctx: click.Context, force: bool) -> None:
    """Read the router's gpuq.toml again and follow it, without a restart (as SIGHUP does):
    nodes added, removed, re-ranked, new URLs and models, timeouts, alerts. Prints what changed,
    and what only a restart changes (listen, database, ollama_listen, token...).

    Example: gpuq reload
    """
    refuse_broken_config(ctx)
    data = router_of(ctx).call("POST", "/api/reload", {"force": force})
    lines = [f"added node {name}" for name in data["added"]]
    lines += [f"removed node {name}" for name in data["removed"]]
    lines += [f"node {name}: {change}" for name, changes in data["nodes"].items() for change in changes]
    lines += data["router"]
    lines += [f"{job['id']} failed on {job['node']}: node removed from gpuq.toml" for job in data["failed"]]
    click.echo(
        f"reloaded {data['path']}: "
        + ("nothing changed" if not data["changed"] else f"{len(lines)} change{'s' if len(lines) != 1 else ''}")
    )
    for line in lines:
        click.echo(f"  {line}")
    for change in data["needs_restart"]:
        click.echo(f"  needs a restart (kept as it was): {change}")


def refuse_broken_config(ctx: click.Context) -> None:
    """The gpuq.toml found here cannot be read: the router would refuse it too (422), so none is
    asked; a router found without it (another one on the default port) would answer about its own
    file instead. Given a router (--router, $GPUQ_ROUTER), the router judges its own file."""
    config = read_config(ctx.obj.get("config"))
    found = find_router(ctx.obj.get("router"), config)
    if config.error is None or found.given:
        return
    fail(422, f"not reloaded, nothing changed: {config.error} (no router was asked; this would have asked {found.url})")
