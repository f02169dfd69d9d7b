"""`gpuq service`: start the router at login, the platform's own way. macOS: a launchd agent
(~/Library/LaunchAgents/local.gpuq.router.plist, loaded with `launchctl bootstrap gui/<uid>`);
Linux: a systemd user unit (~/.config/systemd/user/gpuq.service, after network-online.target,
`systemctl --user enable --now`). The file runs this very gpuq, by absolute path, on an absolute
gpuq.toml, so it works without a venv activated or a PATH set up."""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

LABEL = "local.gpuq.router"  # the launchd agent's label (and its file's name)
UNIT = "gpuq.service"  # the systemd user unit
PLATFORMS = ("linux", "macos")


class ServiceError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def this_platform() -> str | None:
    return "macos" if sys.platform == "darwin" else "linux" if sys.platform.startswith("linux") else None


def gpuq_command(argv0: str | None = None, executable: str | None = None) -> list[str]:
    """This gpuq, by absolute path: the `gpuq` script that started us, else the one beside this
    Python (the venv's bin/), else this Python running the module."""
    python = os.path.abspath(executable or sys.executable)  # not resolved: a venv's python is a symlink
    path = os.path.abspath(argv0 or sys.argv[0])
    if os.path.basename(path) not in ("__main__.py", "cli.py") and os.path.isfile(path) and os.access(path, os.X_OK):
        return [path]
    beside = os.path.join(os.path.dirname(python), "gpuq")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return [beside]
    return [python, "-m", "gpuq.cli"]


def unit_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "systemd" / "user" / UNIT


def plist_path() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{LABEL}.plist"


def log_path() -> Path:
    return Path.home() / "Library" / "Logs" / "gpuq" / "router.log"


def systemd_quote(arg: str) -> str:
    """One ExecStart word: quoted when it holds a space or a quote; % and $ doubled (systemd
    would expand them as specifiers and variables)."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c.isspace() or c in "\"'\\;" for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_text(command: list[str], config: Path) -> str:
    exec_start = " ".join(systemd_quote(a) for a in [*command, "serve", "--config", str(config)])
    return f"""\
# Written by `gpuq service install`; remove with `gpuq service uninstall`.
[Unit]
Description=gpuq router ({config})
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
WorkingDirectory={systemd_quote(str(config.parent))}
ExecStart={exec_start}
Environment=PYTHONUNBUFFERED=1
# A Tailscale address not yet bindable, or a crash: try again in 5 s.
Restart=on-failure
RestartSec=5

[Install]
WantedBy=default.target
"""


def plist_text(command: list[str], config: Path) -> str:
    log = str(log_path())
    return plistlib.dumps(
        {
            "Label": LABEL,
            "ProgramArguments": [*command, "serve", "--config", str(config)],
            "WorkingDirectory": str(config.parent),
            "EnvironmentVariables": {"PYTHONUNBUFFERED": "1"},
            "RunAtLoad": True,  # at login
            # Started again when it fails (a network not yet up, a crash), not when it stopped cleanly.
            "KeepAlive": {"SuccessfulExit": False},
            "ThrottleInterval": 5,
            "StandardOutPath": log,
            "StandardErrorPath": log,
        }
    ).decode()


@dataclass
class Plan:
    """What `install` or `uninstall` does: the file (written or removed) and the commands run."""

    platform: str
    path: Path
    text: str | None  # None: the file is removed
    commands: list[list[str]]


def tool(platform: str) -> str:
    return "launchctl" if platform == "macos" else "systemctl"


def require_tool(platform: str) -> str:
    name = tool(platform)
    found = shutil.which(name)
    if not found:
        what = "a launchd agent" if platform == "macos" else "a systemd user unit"
        raise ServiceError(
            f"{name} not found on PATH: on {'macOS' if platform == 'macos' else 'Linux'} "
            f"gpuq service installs {what}, which {name} loads; on a system without it, "
            f"start `gpuq serve` at login your own way"
        )
    return name


def domain() -> str:
    return f"gui/{os.getuid()}"


def install_plan(platform: str, config: Path, command: list[str]) -> Plan:
    if platform == "macos":
        path = plist_path()
        return Plan(
            platform,
            path,
            plist_text(command, config),
            [
                ["launchctl", "bootout", f"{domain()}/{LABEL}"],  # a loaded older one (may fail: none)
                ["launchctl", "enable", f"{domain()}/{LABEL}"],
                ["launchctl", "bootstrap", domain(), str(path)],
            ],
        )
    path = unit_path()
    commands = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", UNIT]]
    if path.exists():  # a reinstall: the running router is started again on the new file
        commands.append(["systemctl", "--user", "restart", UNIT])
    return Plan(platform, path, unit_text(command, config), commands)


def uninstall_plan(platform: str) -> Plan:
    if platform == "macos":
        path = plist_path()
        return Plan(platform, path, None, [["launchctl", "bootout", f"{domain()}/{LABEL}"]])
    return Plan(
        platform,
        unit_path(),
        None,
        [["systemctl", "--user", "disable", "--now", UNIT], ["systemctl", "--user", "daemon-reload"]],
    )


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise ServiceError(f"`{' '.join(argv)}` exited {done.returncode}" + (f": {said}" if said else ""))
    return done


def install(plan: Plan) -> None:
    require_tool(plan.platform)
    plan.path.parent.mkdir(parents=True, exist_ok=True)
    if plan.platform == "macos":
        log_path().parent.mkdir(parents=True, exist_ok=True)
    assert plan.text is not None  # an install plan writes its file
    plan.path.write_text(plan.text, encoding="utf-8")
    for i, argv in enumerate(plan.commands):
        # launchd's bootout of an agent that is not loaded fails, and that is fine
        run(argv, check=not (plan.platform == "macos" and i == 0))


def uninstall(plan: Plan) -> bool:
    """Stop and remove; False when nothing was installed."""
    if not plan.path.exists():
        return False
    require_tool(plan.platform)
    if plan.platform == "macos":
        run(plan.commands[0], check=False)  # not loaded (stopped by hand) is fine: the file goes anyway
        plan.path.unlink()
    else:
        run(plan.commands[0])
        plan.path.unlink()
        run(plan.commands[1])
    return True


@dataclass
class Status:
    installed: bool
    path: Path
    running: bool
    state: str  # the service manager's word: active/inactive/failed, running/not running...
    enabled: str | None = None
    pid: str | None = None


def status(platform: str) -> Status:
    if platform == "macos":
        path = plist_path()
        require_tool(platform)
        done = run(["launchctl", "print", f"{domain()}/{LABEL}"], check=False)
        if done.returncode != 0:
            return Status(path.exists(), path, False, "not loaded")
        fields = {}
        for line in done.stdout.splitlines():
            key, sep, value = line.strip().partition(" = ")
            if sep and key not in fields:
                fields[key] = value.strip()
        state = fields.get("state", "unknown")
        return Status(path.exists(), path, state == "running", state, pid=fields.get("pid"))
    path = unit_path()
    require_tool(platform)

    def said(*argv: str) -> str:  # systemctl's one-word answer, else the first line of its complaint
        done = run(["systemctl", "--user", *argv, UNIT], check=False)
        return done.stdout.strip() or (done.stderr.strip().splitlines() or ["unknown"])[0]

    active, enabled = said("is-active"), said("is-enabled")
    return Status(path.exists(), path, active == "active", active, enabled=enabled)
