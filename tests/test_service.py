"""`gpuq service install|status|uninstall`: the real CLI as a subprocess, HOME a tmp dir, and
stand-in `systemctl`/`launchctl` first on PATH that record how they were called."""

from __future__ import annotations

import os
import plistlib
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

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
        self.env = {k: v for k, v in os.environ.items() if k not in ("XDG_CONFIG_HOME", "GPUQ_CONFIG")}
        self.env.update(HOME=str(self.home), PATH=str(self.bin), CALLS=str(self.calls_file))

    def config(self, where: str = "lab") -> Path:
        path = self.cwd.parent / where / "gpuq.toml"
        path.parent.mkdir(parents=True)
        path.write_text(starter_config())
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
