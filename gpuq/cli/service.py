"""`gpuq service`: start the router at login, as a launchd agent (macOS) or a systemd user unit
(Linux). The files and commands themselves are gpuq.ops.service's."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from ..config import ConfigError, find_config, load_config

if TYPE_CHECKING:
    from ..ops.service import Plan

F = TypeVar("F", bound=Callable[..., Any])
UNSET = re.compile(r"the environment variable \$(\w+) is not set")


def service_fail(message: str) -> NoReturn:
    click.echo(f"error {message}", err=True)
    sys.exit(1)


def platform_option(fn: F) -> F:
    from ..ops.service import PLATFORMS, this_platform

    return click.option(
        "--platform",
        type=click.Choice(PLATFORMS),
        default=this_platform,
        show_default="this machine's",
        help="Write macOS's launchd agent or Linux's systemd user unit.",
    )(fn)


def service_platform(platform: str | None) -> str:
    if platform is None:
        service_fail(
            f"gpuq service knows macOS (launchd) and Linux (systemd), not {sys.platform}; "
            "start `gpuq serve` at login your own way"
        )
    return platform


@click.group()
def service() -> None:
    """Start the router at login: a launchd agent (macOS) or a systemd user unit (Linux).

    Example: gpuq service install --config ~/lab/gpuq.toml
    """


@service.command("install")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="gpuq.toml to serve.")
@platform_option
@click.option("--dry-run", is_flag=True, help="Print the file and the commands; change nothing.")
@click.pass_context
def service_install(ctx: click.Context, config_path: str | None, platform: str | None, dry_run: bool) -> None:
    """Write the agent or unit that runs `gpuq serve --config <gpuq.toml>` at login, and start it.

    Example: gpuq service install --dry-run
    """
    from ..ops import service as svc

    platform = service_platform(platform)
    path = find_config(config_path or ctx.obj["config"])
    if path is None or not path.is_file():
        where = f"{path} does not exist" if path else "looked at --config, $GPUQ_CONFIG and ./gpuq.toml"
        service_fail(f"no gpuq.toml to serve ({where}); write one with `gpuq init`, or name it with --config")
    plan = svc.install_plan(platform, path.resolve(), svc.gpuq_command(), router_environment(path))
    if dry_run:
        click.echo(f"# would write {plan.path}:")
        click.echo(plan.shown or "", nl=False)
        if plan.env_path is not None:
            click.echo(f"# and {plan.env_path} (0600): {carried(plan)}")
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
    if plan.env:
        held = plan.env_path or plan.path
        click.echo(f"the router's environment, from this shell, in {held} (0600): {carried(plan)}")
    for argv in plan.commands:
        click.echo(f"ran {' '.join(argv)}")
    if platform == "macos":
        click.echo(f"the router starts now and at each login; its log: {svc.log_path()}")
    else:
        click.echo(f"the router starts now and at each login; its log: journalctl --user -u {svc.UNIT}")
        click.echo(f"to start it at boot, before any login: loginctl enable-linger {os.environ.get('USER', '$USER')}")
    click.echo("check it with `gpuq service status`")


def router_environment(path: Path) -> dict[str, str]:
    """What `gpuq serve` run here would read from its environment, to carry into the service: the
    config read as the router reads it (each token_env's value, $GPUQ_TOKEN), so a variable unset
    here is refused now, not by a service that would fail at each start."""
    try:
        settings = load_config(path)
    except ConfigError as exc:
        unset = UNSET.search(exc.message)
        if unset:
            service_fail(
                f"{path}: {exc.message}; the service carries the router's environment from this shell: "
                f"set ${unset[1]} here (export {unset[1]}=...) and install again; nothing was written"
            )
        service_fail(f"{path}: {exc.message}")
    from ..ops.service import CARRIED

    names = [u.token_env for u in settings.users if u.token_env] + [n for n in CARRIED if os.environ.get(n)]
    return {name: os.environ[name] for name in dict.fromkeys(names)}


def carried(plan: Plan) -> str:
    return ", ".join(f"${name}" for name in sorted(plan.env)) or "nothing (no variable to carry)"


@service.command("status")
@platform_option
def service_status(platform: str | None) -> None:
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
def service_uninstall(platform: str | None, dry_run: bool) -> None:
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
        click.echo(f"# and remove {plan.path}" + (f" and {plan.env_path}" if plan.env_path else ""))
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
