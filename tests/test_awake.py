"""A laptop that stays awake while its GPUs work: the router holds the platform's sleep inhibitor
(stand-in `systemd-inhibit` and `caffeinate` first on PATH) while a job runs, lets it go when the
lab is idle, says so on /health, and a missing tool fails no job."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import eventually, node_table

# Records its pid and argv, then becomes the command it was given (as systemd-inhibit runs it,
# holding the lock until it exits), or sleeps until killed (caffeinate -w waits for the pid).
STAND_IN = """#!/bin/sh
echo "$$ $(basename "$0") $*" >> "{record}"
if [ "$(basename "$0")" = systemd-inhibit ]; then
  while [ $# -gt 0 ] && [ "${{1#--}}" != "$1" ]; do shift; done
  exec "$@"
fi
exec sleep 600
"""


def stand_ins(tmp_path: Path) -> tuple[dict, Path]:
    bin_dir, record = tmp_path / "bin", tmp_path / "inhibitors.txt"
    bin_dir.mkdir()
    for name in ("systemd-inhibit", "caffeinate"):
        exe = bin_dir / name
        exe.write_text(STAND_IN.format(record=record))
        exe.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}, record


def no_systemd(tmp_path: Path) -> dict:
    """A `systemd-inhibit` as on a machine without systemd: it says why and exits 1 at once."""
    bin_dir = tmp_path / "nosystemd"
    bin_dir.mkdir()
    exe = bin_dir / "systemd-inhibit"
    exe.write_text("#!/bin/sh\necho 'Failed to inhibit: System has not been booted with systemd' >&2\nexit 1\n")
    exe.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def started(record: Path) -> list[tuple[int, list[str]]]:
    if not record.exists():
        return []
    return [
        (int(pid), argv.split())
        for pid, argv in (line.split(" ", 1) for line in record.read_text().splitlines() if line)
    ]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def slow_node(fakes, daemon_factory, env: dict, **router):
    fake = await fakes("qwen3-coder:30b", token_delay_s=0.05, tokens=2000)  # held until the test lets go
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], env=env, **router)
    return fake, daemon


async def test_inhibitor_held_while_a_job_runs_and_released_when_idle(fakes, daemon_factory, tmp_path):
    env, record = stand_ins(tmp_path)
    fake, d = await slow_node(fakes, daemon_factory, env)
    assert (await d.get("/health"))["awake"] is None  # idle: nothing held
    assert started(record) == []
    [job] = await d.submit(prompt="a long one")
    await d.wait_state(job["id"], "running")
    [(pid, argv)] = await eventually(lambda: started(record), what="the inhibitor to start")
    assert argv[0] == "systemd-inhibit" and "--what=idle:sleep" in argv and "--who=gpuq" in argv
    assert "--why=1" in argv  # "--why=1 job(s) running"
    assert alive(pid)
    awake = (await d.get("/health"))["awake"]
    assert awake["held"] is True and awake["by"] == "systemd-inhibit" and awake["since"]
    fake.script.token_delay_s = 0  # the job finishes
    await d.wait_state(job["id"], "done")
    await eventually(lambda: not alive(pid), what="the inhibitor to be released")

    async def idle():
        return (await d.get("/health"))["awake"] is None

    await eventually(idle, what="/health to say nothing is held")
    assert len(started(record)) == 1  # one busy spell, one inhibitor


async def test_keep_awake_false_holds_nothing(fakes, daemon_factory, tmp_path):
    env, record = stand_ins(tmp_path)
    fake, d = await slow_node(fakes, daemon_factory, env, keep_awake=False)
    [job] = await d.submit(prompt="a long one")
    await d.wait_state(job["id"], "running")
    await eventually(lambda: fake.in_flight, what="the node to be generating")
    assert (await d.get("/health"))["awake"] is None
    fake.script.token_delay_s = 0
    await d.wait_state(job["id"], "done")
    assert started(record) == []


async def test_a_missing_tool_is_logged_once_and_fails_no_job(fakes, daemon_factory, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    fake, d = await slow_node(fakes, daemon_factory, {"PATH": str(empty)})
    [job] = await d.submit(prompt="a long one")
    await d.wait_state(job["id"], "running")
    awake = (await d.get("/health"))["awake"]
    assert awake["held"] is False and "systemd-inhibit not found" in awake["error"]
    fake.script.token_delay_s = 0
    await d.wait_state(job["id"], "done")
    [second] = await d.submit(prompt="another")
    await d.wait_state(second["id"], "done")
    assert d.log.read_text().count("systemd-inhibit not found") == 1


async def test_no_systemd_is_said_once_a_warning_while_jobs_run_and_a_note_when_idle(fakes, daemon_factory, tmp_path):
    fake, d = await slow_node(fakes, daemon_factory, no_systemd(tmp_path))
    assert (await d.get("/health"))["awake"] is None  # nothing tried yet
    [job] = await d.submit(prompt="a long one")
    await d.wait_state(job["id"], "running")

    async def refused():
        awake = (await d.get("/health"))["awake"]
        return awake if awake and not awake["held"] else None

    awake = await eventually(refused, what="/health to say the inhibitor exited")
    assert awake["error"] == "systemd-inhibit exited with code 1" and awake["running"] is True
    fake.script.token_delay_s = 0
    await d.wait_state(job["id"], "done")

    async def idle_note():
        awake = (await d.get("/health"))["awake"]
        return awake if awake and not awake["running"] else None

    # Idle: still said (the page's quiet note), no longer while jobs run.
    awake = await eventually(idle_note, what="/health to say it quietly once idle")
    assert awake["held"] is False and awake["error"] == "systemd-inhibit exited with code 1"
    [second] = await d.submit(prompt="another")
    await d.wait_state(second["id"], "done")
    assert d.log.read_text().count("systemd-inhibit exited with code 1") == 1  # said once in the log
    assert (await d.get("/health"))["ok"] is True  # never a health problem


def test_keep_awake_is_a_boolean_setting(tmp_path):
    from gpuq.config import ConfigError, parse_config

    assert parse_config({"router": {}}, tmp_path).keep_awake is True
    assert parse_config({"router": {"keep_awake": False}}, tmp_path).keep_awake is False
    try:
        parse_config({"router": {"keep_awake": "no"}}, tmp_path)
    except ConfigError as exc:
        assert "router.keep_awake: expected bool" in str(exc)
    else:
        raise AssertionError('keep_awake = "no" was accepted')
