"""`gpuq service`: start the router at login, the platform's own way. macOS: a launchd agent
(~/Library/LaunchAgents/local.gpuq.router.plist, loaded with `launchctl bootstrap gui/<uid>`);
Linux: a systemd user unit (~/.config/systemd/user/gpuq.service, after network-online.target,
`systemctl --user enable --now`). The file runs this very gpuq, by absolute path, on an absolute
gpuq.toml, so it works without a venv activated or a PATH set up.

The router's environment goes with it: the [[user]] token_env variables its config names (and
$GPUQ_TOKEN, $GPUQ_DATABASE when the installing shell sets them, as `gpuq serve` there would
read them), their values from the installing shell, in a file only its owner reads (systemd: an
EnvironmentFile, 0600; launchd: the plist's EnvironmentVariables, the plist 0600). A config
`gpuq serve` cannot run on is not restarted for ever: systemd is told its exit code
(RestartPreventExitStatus, EX_CONFIG) and bounds every other restart (StartLimitBurst); launchd,
which restarts any failure, gets a serve that exits 0 on it (GPUQ_SERVICE=launchd)."""

from __future__ import annotations

import contextlib
import os
import plistlib
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EX_CONFIG

LABEL = "local.gpuq.router"  # the launchd agent's label (and its file's name)
UNIT = "gpuq.service"  # the systemd user unit
PLATFORMS = ("linux", "macos")
# Besides the token_env variables: what `gpuq serve` reads from its environment (a DSN's password).
CARRIED = ("GPUQ_TOKEN", "GPUQ_DATABASE")
SERVICE_VARIABLE = "GPUQ_SERVICE"  # "launchd": a config error exits 0, so launchd does not restart it
# systemd: at most this many starts in this many seconds (a port taken for good, a database in use).
START_LIMIT = (20, 300)


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


def env_path() -> Path:
    """The systemd unit's EnvironmentFile: the router's secrets, beside gpuq's other settings."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "gpuq" / "router.env"


def config_error_exit() -> int:
    """`gpuq serve`'s exit code for a config error: EX_CONFIG, but 0 under launchd, which can be
    told only "restart unless it succeeded" (a config only a person can mend is not retried)."""
    return 0 if os.environ.get(SERVICE_VARIABLE) == "launchd" else EX_CONFIG


def log_path() -> Path:
    return Path.home() / "Library" / "Logs" / "gpuq" / "router.log"


def systemd_quote(arg: str) -> str:
    """One ExecStart word: quoted when it holds a space or a quote; % and $ doubled (systemd
    would expand them as specifiers and variables)."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if arg and not any(c.isspace() or c in "\"'\\;" for c in arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def env_quote(value: str) -> str:
    """A value as an EnvironmentFile line holds it: in double quotes, with the characters that
    systemd (and a shell sourcing the file) read specially escaped."""
    if any(c in value for c in "\r\n\x00"):
        raise ServiceError("a value of the router's environment holds a newline; it cannot be carried")
    return '"' + "".join("\\" + c if c in '"\\$`' else c for c in value) + '"'


def env_text(env: dict[str, str]) -> str:
    lines = [f"{name}={env_quote(value)}\n" for name, value in sorted(env.items())]
    return "# Written by `gpuq service install` from its shell: the router's secrets (0600).\n" + "".join(lines)


def unit_text(command: list[str], config: Path, environment: Path | None = None) -> str:
    exec_start = " ".join(systemd_quote(a) for a in [*command, "serve", "--config", str(config)])
    env_line = f"EnvironmentFile={systemd_quote(str(environment))}\n" if environment else ""
    burst, interval = START_LIMIT
    return f"""\
# Written by `gpuq service install`; remove with `gpuq service uninstall`.
[Unit]
Description=gpuq router ({config})
After=network-online.target
Wants=network-online.target
# Started at most {burst} times in {interval} s, then left failed (`gpuq service status` says so).
StartLimitIntervalSec={interval}
StartLimitBurst={burst}

[Service]
Type=simple
WorkingDirectory={systemd_quote(str(config.parent))}
ExecStart={exec_start}
Environment=PYTHONUNBUFFERED=1
{env_line}# A Tailscale address not yet bindable, or a crash: try again in 5 s. A config gpuq serve
# cannot run on (exit {EX_CONFIG}, EX_CONFIG) is not: mend it, then `systemctl --user restart {UNIT}`.
Restart=on-failure
RestartSec=5
RestartPreventExitStatus={EX_CONFIG}

[Install]
WantedBy=default.target
"""


def plist_text(command: list[str], config: Path, env: dict[str, str] | None = None) -> str:
    log = str(log_path())
    return plistlib.dumps(
        {
            "Label": LABEL,
            "ProgramArguments": [*command, "serve", "--config", str(config)],
            "WorkingDirectory": str(config.parent),
            "EnvironmentVariables": {**(env or {}), "PYTHONUNBUFFERED": "1", SERVICE_VARIABLE: "launchd"},
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
    """What `install` or `uninstall` does: the file (written or removed) and the commands run;
    an install's secrets (`env`) go to `env_path` (systemd) or into the file itself (launchd)."""

    platform: str
    path: Path
    text: str | None  # None: the file is removed
    commands: list[list[str]]
    env: dict[str, str] = field(default_factory=dict, repr=False)
    env_path: Path | None = None
    shown: str | None = None  # the file as a dry run prints it: the secrets' names, not their values


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


def install_plan(platform: str, config: Path, command: list[str], env: dict[str, str] | None = None) -> Plan:
    env = env or {}
    masked = {name: "(the value in this shell)" for name in env}
    if platform == "macos":
        path = plist_path()
        commands = [
            ["launchctl", "bootout", f"{domain()}/{LABEL}"],  # a loaded older one (may fail: none)
            ["launchctl", "enable", f"{domain()}/{LABEL}"],
            ["launchctl", "bootstrap", domain(), str(path)],
        ]
        text = plist_text(command, config, env)
        return Plan(platform, path, text, commands, env, None, plist_text(command, config, masked))
    path = unit_path()
    commands = [["systemctl", "--user", "daemon-reload"], ["systemctl", "--user", "enable", "--now", UNIT]]
    if path.exists():  # a reinstall: the running router is started again on the new file
        commands.append(["systemctl", "--user", "restart", UNIT])
    text = unit_text(command, config, env_path())
    return Plan(platform, path, text, commands, env, env_path(), text)


def uninstall_plan(platform: str) -> Plan:
    if platform == "macos":
        path = plist_path()
        return Plan(platform, path, None, [["launchctl", "bootout", f"{domain()}/{LABEL}"]])
    return Plan(
        platform,
        unit_path(),
        None,
        [["systemctl", "--user", "disable", "--now", UNIT], ["systemctl", "--user", "daemon-reload"]],
        env_path=env_path(),  # removed with the unit: no secret is left behind
    )


def run(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True)
    if check and done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise ServiceError(f"`{' '.join(argv)}` exited {done.returncode}" + (f": {said}" if said else ""))
    return done


def write_private(path: Path, text: str) -> None:
    """`text` in `path`, readable by its owner only from its first byte (a new file renamed into
    place: an older one's wider mode, or a reader of a half-written file, sees no secret)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temp = path.with_name(f".{path.name}.partial")
    with contextlib.suppress(FileNotFoundError):
        temp.unlink()
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(temp, path)


def install(plan: Plan) -> None:
    require_tool(plan.platform)
    plan.path.parent.mkdir(parents=True, exist_ok=True)
    if plan.platform == "macos":
        log_path().parent.mkdir(parents=True, exist_ok=True)
    assert plan.text is not None  # an install plan writes its file
    if plan.env_path is not None:
        write_private(plan.env_path, env_text(plan.env))
    if plan.platform == "macos":
        write_private(plan.path, plan.text)  # it holds the secrets itself
    else:
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
        if plan.env_path is not None:
            plan.env_path.unlink(missing_ok=True)
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
