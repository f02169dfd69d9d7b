"""`gpuq service install|status|uninstall`: the real CLI as a subprocess, HOME a tmp dir, and
stand-in `systemctl`/`launchctl` first on PATH that record how they were called."""

from __future__ import annotations

import json
import os
import plistlib
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

from gpuq.config import starter_config

GPUQ = str(Path(sys.executable).parent / "gpuq")  # the venv's gpuq, beside the Python running the tests

STAND_IN = """\
#!/bin/sh
printf '%s\\n' "${0##*/} $*" >> "$CALLS"
case "$*" in
  *is-active*) echo "${ACTIVE:-active}";;
  *is-enabled*) echo enabled;;
  print*) [ -n "$LOADED" ] || exit 113; printf 'gui/501/local.gpuq.router = {\\n\\tstate = running\\n\\tpid = 4242\\n}\\n';;
esac
if [ -n "$FAIL_ON" ] && [ "${*#*$FAIL_ON}" != "$*" ]; then echo "Failed to connect to bus: No medium found" >&2; exit 1; fi
exit 0
"""


# Two users' tokens in the installing shell; alice's holds each character an EnvironmentFile (or a
# shell sourcing it) reads specially, and systemd's specifier.
SECRETS = {"GPUQ_ALICE_TOKEN": 'al"ice $HOME `id` \\n %h', "GPUQ_BOB_TOKEN": "bob-token-4567"}
USERS = """
[[user]]
name = "alice"
token_env = "GPUQ_ALICE_TOKEN"
role = "admin"

[[user]]
name = "bob"
token_env = "GPUQ_BOB_TOKEN"
"""


class Lab:
    def __init__(self, tmp_path: Path, tools: tuple[str, ...] = ("systemctl", "launchctl")):
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        for name in tools:
            (self.bin / name).write_text(STAND_IN)
            (self.bin / name).chmod(0o755)
        self.calls_file = tmp_path / "calls"
        self.cwd = tmp_path / "elsewhere"
        self.cwd.mkdir()
        # What the router reads from its environment: only what a test gives (the lab's tokens).
        steering = ("XDG_CONFIG_HOME", "GPUQ_CONFIG", "GPUQ_TOKEN", "GPUQ_DATABASE", *SECRETS)
        self.env = {k: v for k, v in os.environ.items() if k not in steering}
        self.env.update(HOME=str(self.home), PATH=str(self.bin), CALLS=str(self.calls_file))

    def config(self, where: str = "lab", extra: str = "") -> Path:
        path = self.cwd.parent / where / "gpuq.toml"
        path.parent.mkdir(parents=True)
        path.write_text(starter_config() + extra)
        return path

    def gpuq(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gpuq.cli", *args],
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=60,
            env={**self.env, **env},
        )

    def calls(self) -> list[str]:
        return self.calls_file.read_text().splitlines() if self.calls_file.exists() else []

    @property
    def unit(self) -> Path:
        return self.home / ".config" / "systemd" / "user" / "gpuq.service"

    @property
    def env_file(self) -> Path:
        return self.home / ".config" / "gpuq" / "router.env"


def sourced(env_file: Path, *names: str) -> list[str]:
    """The values a shell reads from the file (systemd reads double-quoted values the same way)."""
    script = f'set -a; . "{env_file}"; ' + "; ".join(f'printf "%s\\0" "${n}"' for n in names)
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env={}, check=True)
    return done.stdout.split("\0")[:-1]


def exec_start(unit: str) -> list[str]:
    [line] = [line for line in unit.splitlines() if line.startswith("ExecStart=")]
    return shlex.split(line.removeprefix("ExecStart="))


def test_install_writes_a_systemd_user_unit_after_the_network_and_starts_it(tmp_path):
    lab = Lab(tmp_path)
    config = lab.config()
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", "../lab/gpuq.toml")
    assert r.returncode == 0, r.stderr
    unit = lab.unit.read_text()
    # This very gpuq and the config, both by absolute path: the unit works from any directory, no venv active.
    assert exec_start(unit) == [GPUQ, "serve", "--config", str(config)]
    assert os.access(GPUQ, os.X_OK)
    lines = unit.splitlines()
    assert "After=network-online.target" in lines and "Wants=network-online.target" in lines
    assert "Restart=on-failure" in lines and "WantedBy=default.target" in lines
    assert f"WorkingDirectory={config.parent}" in lines
    assert lab.calls() == ["systemctl --user daemon-reload", "systemctl --user enable --now gpuq.service"]
    assert f"wrote {lab.unit}" in r.stdout and "journalctl --user -u gpuq.service" in r.stdout

    r = lab.gpuq("service", "status", "--platform", "linux")
    assert r.returncode == 0, r.stderr
    assert f"installed: {lab.unit}" in r.stdout and "running: yes (active)" in r.stdout
    assert lab.calls()[-2:] == ["systemctl --user is-active gpuq.service", "systemctl --user is-enabled gpuq.service"]
    r = lab.gpuq("service", "status", "--platform", "linux", ACTIVE="failed")
    assert r.returncode == 3 and "running: no (failed)" in r.stdout and "journalctl --user -u gpuq.service" in r.stdout

    # Installing again (a moved config, a new venv) rewrites the unit and restarts the router on it.
    before = len(lab.calls())
    assert lab.gpuq("service", "install", "--platform", "linux", "--config", str(config)).returncode == 0
    assert lab.calls()[before:] == [
        "systemctl --user daemon-reload",
        "systemctl --user enable --now gpuq.service",
        "systemctl --user restart gpuq.service",
    ]

    before = len(lab.calls())
    r = lab.gpuq("service", "uninstall", "--platform", "linux")
    assert r.returncode == 0, r.stderr
    assert not lab.unit.exists()
    assert lab.calls()[before:] == ["systemctl --user disable --now gpuq.service", "systemctl --user daemon-reload"]
    r = lab.gpuq("service", "status", "--platform", "linux", ACTIVE="inactive")
    assert r.returncode == 3 and "not installed" in r.stdout
    r = lab.gpuq("service", "uninstall", "--platform", "linux")
    assert r.returncode == 0 and "not installed" in r.stdout


def test_a_config_path_with_a_space_is_one_word_of_execstart(tmp_path):
    lab = Lab(tmp_path)
    config = lab.config("my lab")
    r = lab.gpuq("--config", str(config), "service", "install", "--platform", "linux")
    assert r.returncode == 0, r.stderr
    assert exec_start(lab.unit.read_text())[1:] == ["serve", "--config", str(config)]


def test_dry_run_prints_the_unit_and_the_commands_and_changes_nothing(tmp_path):
    lab = Lab(tmp_path)
    config = lab.config()
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", str(config), "--dry-run")
    assert r.returncode == 0, r.stderr
    assert f"ExecStart={GPUQ} serve --config {config}" in r.stdout.splitlines()
    assert "After=network-online.target" in r.stdout
    assert r.stdout.splitlines()[-2:] == [
        "systemctl --user daemon-reload",
        "systemctl --user enable --now gpuq.service",
    ]
    assert not lab.unit.exists() and lab.calls() == []


def test_macos_writes_a_launchd_agent_and_bootstraps_it(tmp_path):
    lab = Lab(tmp_path)
    config = lab.config()
    r = lab.gpuq("service", "install", "--platform", "macos", "--config", str(config))
    assert r.returncode == 0, r.stderr
    path = lab.home / "Library" / "LaunchAgents" / "local.gpuq.router.plist"
    plist = plistlib.loads(path.read_bytes())
    assert plist["Label"] == "local.gpuq.router"
    assert plist["ProgramArguments"] == [GPUQ, "serve", "--config", str(config)]
    assert plist["RunAtLoad"] is True and plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["WorkingDirectory"] == str(config.parent)
    assert plist["StandardErrorPath"] == str(lab.home / "Library" / "Logs" / "gpuq" / "router.log")
    uid = os.getuid()
    assert lab.calls() == [
        f"launchctl bootout gui/{uid}/local.gpuq.router",  # none loaded yet: its failure is fine
        f"launchctl enable gui/{uid}/local.gpuq.router",
        f"launchctl bootstrap gui/{uid} {path}",
    ]

    r = lab.gpuq("service", "status", "--platform", "macos", LOADED="1")
    assert r.returncode == 0 and "running: yes (running, pid 4242)" in r.stdout
    r = lab.gpuq("service", "status", "--platform", "macos")
    assert r.returncode == 3 and "running: no (not loaded)" in r.stdout

    r = lab.gpuq("service", "uninstall", "--platform", "macos")
    assert r.returncode == 0, r.stderr
    assert not path.exists() and lab.calls()[-1] == f"launchctl bootout gui/{uid}/local.gpuq.router"


def test_no_gpuq_toml_to_serve_is_an_error_and_writes_nothing(tmp_path):
    lab = Lab(tmp_path)
    r = lab.gpuq("service", "install", "--platform", "linux")
    assert r.returncode == 1
    assert r.stderr.startswith("error no gpuq.toml to serve") and "gpuq init" in r.stderr
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", "nowhere/gpuq.toml")
    assert r.returncode == 1 and "nowhere/gpuq.toml does not exist" in r.stderr
    bad = lab.config()
    bad.write_text('[router]\nlisten = "nonsense"\n')
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", str(bad))
    assert r.returncode == 1 and r.stderr.startswith(f"error {bad}: ")
    assert not lab.unit.exists() and lab.calls() == []


@pytest.mark.parametrize("verb", ["install", "status", "uninstall"])
def test_no_systemctl_is_an_error_and_writes_nothing(tmp_path, verb):
    lab = Lab(tmp_path, tools=())
    config = lab.config()
    if verb == "uninstall":
        lab.unit.parent.mkdir(parents=True)
        lab.unit.write_text("[Unit]\n")
    args = ["--config", str(config)] if verb == "install" else []
    r = lab.gpuq("service", verb, "--platform", "linux", *args)
    assert r.returncode == 1
    assert r.stderr.startswith("error systemctl not found on PATH")
    assert lab.unit.exists() == (verb == "uninstall")


def test_a_failing_systemctl_is_named_with_what_it_said(tmp_path):
    lab = Lab(tmp_path)
    config = lab.config()
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", str(config), FAIL_ON="enable")
    assert r.returncode == 1
    assert "error `systemctl --user enable --now gpuq.service` exited 1: Failed to connect to bus" in r.stderr
    assert f"({lab.unit} is written; `gpuq service uninstall` removes it)" in r.stderr


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_install_carries_the_routers_tokens_in_a_file_only_its_owner_reads(tmp_path):
    lab = Lab(tmp_path)
    config = lab.config(extra=USERS)
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", str(config), **SECRETS)
    assert r.returncode == 0, r.stderr
    assert mode(lab.env_file) == 0o600 and mode(lab.env_file.parent) == 0o700
    assert sourced(lab.env_file, *SECRETS) == list(SECRETS.values())
    assert f"in {lab.env_file} (0600): $GPUQ_ALICE_TOKEN, $GPUQ_BOB_TOKEN" in r.stdout
    assert not any(secret in r.stdout + r.stderr for secret in SECRETS.values())  # named, never shown
    lines = lab.unit.read_text().splitlines()
    assert f"EnvironmentFile={lab.env_file}" in lines
    # A config error (exit 78) is not restarted; anything else at most 20 times in 5 minutes.
    assert "Restart=on-failure" in lines and "RestartPreventExitStatus=78" in lines
    assert "StartLimitIntervalSec=300" in lines and "StartLimitBurst=20" in lines
    assert lines.index("StartLimitBurst=20") < lines.index("[Service]")  # [Unit]'s keys
    if shutil.which("systemd-analyze"):
        done = subprocess.run(["systemd-analyze", "verify", str(lab.unit)], capture_output=True, text=True)
        assert done.returncode == 0 and done.stderr == "", done.stderr
    # A dry run names what it would carry, never a value.
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", str(config), "--dry-run", **SECRETS)
    assert r.returncode == 0 and f"# and {lab.env_file} (0600): $GPUQ_ALICE_TOKEN, $GPUQ_BOB_TOKEN" in r.stdout
    assert SECRETS["GPUQ_BOB_TOKEN"] not in r.stdout
    # Installed again from a shell with another token: the file holds the new one, still 0600.
    lab.env_file.chmod(0o644)
    r = lab.gpuq(
        "service", "install", "--platform", "linux", "--config", str(config), **SECRETS | {"GPUQ_BOB_TOKEN": "b2"}
    )
    assert r.returncode == 0, r.stderr
    assert mode(lab.env_file) == 0o600 and sourced(lab.env_file, "GPUQ_BOB_TOKEN") == ["b2"]
    assert lab.gpuq("service", "uninstall", "--platform", "linux").returncode == 0
    assert not lab.env_file.exists() and not lab.unit.exists()  # no secret left behind


def test_install_refuses_a_token_env_its_shell_does_not_set_and_writes_nothing(tmp_path):
    lab = Lab(tmp_path)
    config = lab.config(extra=USERS)
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", str(config), GPUQ_ALICE_TOKEN="a")
    assert r.returncode == 1
    assert "user 'bob'.token_env: the environment variable $GPUQ_BOB_TOKEN is not set" in r.stderr
    assert "set $GPUQ_BOB_TOKEN here (export GPUQ_BOB_TOKEN=...) and install again; nothing was written" in r.stderr
    assert not lab.unit.exists() and not lab.env_file.exists() and lab.calls() == []


def test_macos_carries_the_tokens_in_a_plist_only_its_owner_reads(tmp_path):
    lab = Lab(tmp_path)
    config = lab.config(extra=USERS)
    r = lab.gpuq("service", "install", "--platform", "macos", "--config", str(config), **SECRETS)
    assert r.returncode == 0, r.stderr
    path = lab.home / "Library" / "LaunchAgents" / "local.gpuq.router.plist"
    assert mode(path) == 0o600
    env = plistlib.loads(path.read_bytes())["EnvironmentVariables"]
    # launchd restarts any failure: GPUQ_SERVICE=launchd makes a config error exit 0 instead.
    assert env == {**SECRETS, "PYTHONUNBUFFERED": "1", "GPUQ_SERVICE": "launchd"}
    r = lab.gpuq("service", "install", "--platform", "macos", "--config", str(config), "--dry-run", **SECRETS)
    assert r.returncode == 0 and "<string>(the value in this shell)</string>" in r.stdout
    assert SECRETS["GPUQ_BOB_TOKEN"] not in r.stdout


def test_the_units_router_starts_on_its_environment_and_a_config_error_is_not_restarted(tmp_path):
    """What the service manager runs: ExecStart with the EnvironmentFile, from a shell that holds
    no token. It starts and knows each user; a config gone wrong exits 78, the code the unit
    names not to restart on (and 0 under launchd, whose only rule is "restart unless it succeeded")."""
    lab = Lab(tmp_path)
    port = free_port()
    config = lab.config(extra=USERS)
    config.write_text(
        config.read_text()
        .replace("127.0.0.1:8750", f"127.0.0.1:{port}")
        .replace('ollama_listen = "127.0.0.1:11435"\n', "")
    )
    r = lab.gpuq("service", "install", "--platform", "linux", "--config", str(config), **SECRETS)
    assert r.returncode == 0, r.stderr
    command = shlex.join(exec_start(lab.unit.read_text()))
    service_env = {k: v for k, v in lab.env.items() if k not in SECRETS} | {"PATH": "/usr/bin:/bin"}
    log = tmp_path / "router.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", f'set -a; . "{lab.env_file}"; exec {command}'], env=service_env, stdout=out, stderr=out
        )
    try:
        whoami = wait_for_whoami(f"http://127.0.0.1:{port}", SECRETS["GPUQ_ALICE_TOKEN"], proc, log)
        assert whoami["name"] == "alice" and whoami["role"] == "admin"
    finally:
        proc.terminate()
        proc.wait(20)
    config.write_text(config.read_text() + '\n[[user]]\nname = "carol"\ntoken_env = "GPUQ_CAROL_TOKEN"\n')
    argv = exec_start(lab.unit.read_text())
    done = subprocess.run(argv, env=service_env | SECRETS, capture_output=True, text=True, timeout=60)
    assert done.returncode == 78, done.stderr
    assert "user 'carol'.token_env: the environment variable $GPUQ_CAROL_TOKEN is not set" in done.stderr
    done = subprocess.run(
        argv, env=service_env | SECRETS | {"GPUQ_SERVICE": "launchd"}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "GPUQ_CAROL_TOKEN is not set" in done.stderr, done.stderr


def wait_for_whoami(url: str, token: str, proc: subprocess.Popen, log: Path) -> dict:
    """GET /api/whoami as `token` once the router answers (polled, with a deadline)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the router exited {proc.returncode}:\n{log.read_text()}")
        request = urllib.request.Request(url + "/api/whoami", headers={"Authorization": f"Bearer {token}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)  # polling its port with a deadline, not a wait for time to pass
    raise AssertionError(f"the router did not answer within 30 s:\n{log.read_text()}")
