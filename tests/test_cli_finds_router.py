"""A CLI and a demo that find each other: the CLI finds the router running on its database (the
lock file beside it records the router's URL) without --router and says which one it talks to;
`gpuq reload` with a broken gpuq.toml says so instead of asking whatever holds 8750; the demo's
front door keeps its port across restarts; `make run` says a taken port before installing."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomli_w
from conftest import ROOT, eventually, free_port, node_table, run_cli, write_config

from gpuq.ops.daemon import demo_front_door
from gpuq.ops.dblock import lock_path, running_router

# The CLI's own choices, not the test machine's: none of these may steer it.
STEERING = ("GPUQ_ROUTER", "GPUQ_CONFIG", "GPUQ_DATABASE", "GPUQ_TOKEN")


def clean(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in STEERING}
    return {**env, **extra}


async def cli_in(cwd: Path, *args: str, env: dict | None = None):
    """The real CLI run from `cwd`, with nothing in the environment naming a router."""
    return await run_cli(*args, cwd=cwd, env=env, command=(sys.executable, "-m", "gpuq.cli"))


class Served:
    """`gpuq serve ...` started from a directory, its printed lines kept; ready once it printed
    `ready` (the demo's last line is its "try:")."""

    def __init__(self, cwd: Path, *args: str, ready: str = "try:"):
        self.cwd, self.args, self.ready = cwd, args, ready
        self.proc: asyncio.subprocess.Process | None = None
        self.out = cwd / f"serve-{time.monotonic_ns()}.out"

    async def __aenter__(self) -> Served:
        with open(self.out, "wb") as out:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gpuq.cli", "serve", *self.args, cwd=self.cwd, env=clean(), stdout=out, stderr=out
            )
        await eventually(self.printed, 30, 0.05, f"gpuq serve to print {self.ready!r}")
        return self

    def printed(self) -> bool:
        assert self.proc is not None
        if self.proc.returncode is not None:
            raise AssertionError(f"gpuq serve exited {self.proc.returncode}:\n{self.text}")
        return self.ready in self.text

    @property
    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def front_door(self) -> str:
        found = re.search(r"export OLLAMA_HOST=(\S+)", self.text)
        assert found, self.text
        return found.group(1)

    async def __aexit__(self, *exc) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), 20)


async def test_the_cli_finds_the_demo_started_in_its_directory_and_says_so(tmp_path):
    port = free_port()
    async with Served(
        tmp_path, "--demo", "--listen", f"127.0.0.1:{port}", "--ollama-listen", f"127.0.0.1:{free_port()}"
    ):
        url = f"http://127.0.0.1:{port}"
        holder = running_router(tmp_path / "gpuq-demo.db")
        assert holder is not None and holder["url"] == url
        res = await cli_in(tmp_path, "nodes", env=clean())
        assert res.code == 0, res
        assert "demo-1" in res.out
        assert res.err.splitlines() == [f"gpuq: router {url} (the router running on gpuq-demo.db, pid {holder['pid']})"]
        # A job, start to end, on that router: the README's next command works as typed.
        res = await cli_in(tmp_path, "task", "write a haiku about queues", "--wait", env=clean())
        assert res.code == 0 and res.err.count("gpuq: router") == 1, res
        # Named: as named, and nothing said about it.
        res = await cli_in(tmp_path, "--router", url, "nodes", env=clean())
        assert res.code == 0 and "gpuq: router" not in res.err, res
        res = await cli_in(tmp_path, "nodes", env=clean(GPUQ_ROUTER=url))
        assert res.code == 0 and "gpuq: router" not in res.err, res
        assert lock_path(tmp_path / "gpuq-demo.db").exists()
    # Stopped: its lock went with it, and the CLI is back to the default.
    assert running_router(tmp_path / "gpuq-demo.db") is None
    res = await cli_in(tmp_path, "--router", "http://127.0.0.1:1", "nodes", env=clean())
    assert res.code == 1 and "cannot reach the router at http://127.0.0.1:1" in res.err


async def test_a_router_moved_off_its_configs_port_is_found_by_its_database(fakes, tmp_path):
    """`make run PORT=...` with a gpuq.toml: the config says one port, the router listens on
    another (--listen); the CLI reads the config's database's lock and goes there."""
    fake = await fakes("qwen3-coder:30b")
    config_port, moved = free_port(), free_port()
    write_config(tmp_path / "gpuq.toml", [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], config_port)
    async with Served(tmp_path, "--listen", f"127.0.0.1:{moved}", ready="export GPUQ_ROUTER=") as served:
        assert f"export GPUQ_ROUTER=http://127.0.0.1:{moved}" in served.text
        res = await cli_in(tmp_path, "task", "hello", "--wait", env=clean())
        assert res.code == 0, res
        assert f"gpuq: router http://127.0.0.1:{moved} (the router running on gpuq.db, pid" in res.err
        # From another directory, the config named: the same router, through the same lock.
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        res = await cli_in(elsewhere, "--config", str(tmp_path / "gpuq.toml"), "queue", env=clean())
        assert res.code == 0 and f"http://127.0.0.1:{moved}" in res.err, res


async def test_a_lock_left_by_a_dead_router_is_not_followed(fakes, tmp_path):
    fake = await fakes("qwen3-coder:30b")
    port = free_port()
    write_config(tmp_path / "gpuq.toml", [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], port)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    lock = {"pid": dead, "listen": "127.0.0.1:1", "url": "http://127.0.0.1:1", "started": "x", "holder": "router"}
    lock_path(tmp_path / "gpuq.db").write_text(json.dumps(lock))
    assert running_router(tmp_path / "gpuq.db") is None
    res = await cli_in(tmp_path, "queue", env=clean())
    # The config's public_url instead, said, and not reached (nothing runs there).
    assert res.code == 1, res
    assert f"gpuq: router http://127.0.0.1:{port} (public_url in gpuq.toml)" in res.err
    assert "127.0.0.1:1 " not in res.err
    # A restore's lock names no router either.
    lock_path(tmp_path / "gpuq.db").write_text(json.dumps({**lock, "pid": os.getpid(), "holder": "gpuq restore"}))
    assert running_router(tmp_path / "gpuq.db") is None


async def test_reload_with_a_broken_config_says_so_and_asks_no_router(daemon_factory, fakes, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    (here / "gpuq.toml").write_text('[router]\nlisten = "127.0.0.1:8750"\n[[node]\nname = "x"\n')
    res = await cli_in(here, "reload", env=clean())
    assert res.code == 1 and res.out == "", res
    first = res.err.splitlines()[0]
    assert first.startswith("error 422 not reloaded, nothing changed: gpuq.toml: not valid TOML: "), res.err
    assert first.endswith("(no router was asked; this would have asked http://127.0.0.1:8750)"), res.err
    # A router named: it reads its own gpuq.toml, whatever is broken here.
    fake = await fakes("qwen3-coder:30b")
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")])
    res = await cli_in(here, "--router", d.url, "reload", env=clean())
    assert res.code == 0 and res.out.startswith(f"reloaded {d.config}: nothing changed"), res


def test_the_demos_front_door_keeps_its_distance_from_the_routers_port():
    assert demo_front_door(8750) == "127.0.0.1:11435"  # beside Ollama's 11434, as ever
    assert demo_front_door(8751) == "127.0.0.1:11436"
    assert demo_front_door(0) == "127.0.0.1:11435"  # a router on any port: the usual one
    assert demo_front_door(64000) == "127.0.0.1:11435"  # past 65535: the usual one


def ports_with_free_front_doors() -> tuple[int, int]:
    """A free router port whose front door (and the port above that) are free too."""
    for _ in range(200):
        port = free_port()
        front = int(demo_front_door(port).rsplit(":", 1)[1])
        if front - port == 2685 and all(free(p) for p in (front, front + 1)):
            return port, front
    raise AssertionError("no free port pair found")


def free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


async def test_the_demos_front_door_is_the_same_port_at_each_restart(tmp_path):
    port, front = ports_with_free_front_doors()
    async with Served(tmp_path, "--demo", "--listen", f"127.0.0.1:{port}") as served:
        assert served.front_door() == f"http://127.0.0.1:{front}"
    # Its port held by another program: the next one above, and again at the next restart.
    with socket.socket() as other:
        other.bind(("127.0.0.1", front))
        other.listen()
        for _ in range(2):
            async with Served(tmp_path, "--demo", "--listen", f"127.0.0.1:{port}") as served:
                assert served.front_door() == f"http://127.0.0.1:{front + 1}"


def test_make_run_says_a_taken_port_before_installing(tmp_path):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        started = time.monotonic()
        res = subprocess.run(
            ["make", "--no-print-directory", "-C", str(ROOT), "run", f"PORT={port}", f"VENV={tmp_path / 'venv'}"],
            capture_output=True,
            text=True,
            env=clean(),
            timeout=60,
        )
        took = time.monotonic() - started
    assert res.returncode != 0, res
    assert f"gpuq: cannot listen on 127.0.0.1:{port}: address already in use" in res.stderr
    assert "run `make run PORT=" in res.stderr
    assert not (tmp_path / "venv").exists()  # nothing was installed first
    assert took < 30, took


@pytest.mark.parametrize("taken", [True, False])
def test_the_port_check_exits_2_only_for_a_taken_port(tmp_path, taken):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        port = other.getsockname()[1]
        if taken:
            other.listen()
        else:
            other.close()
        # A config that cannot be read is no reason to stop: the router's start words it.
        (tmp_path / "gpuq.toml").write_text(tomli_w.dumps({"router": {"listen": f"127.0.0.1:{port}"}}))
        res = subprocess.run(
            [sys.executable, "-m", "gpuq.ops.portcheck"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=clean(PYTHONPATH=str(ROOT)),
        )
        assert res.returncode == 0, res  # (no [[node]]: not read)
        res = subprocess.run(
            [sys.executable, "-m", "gpuq.ops.portcheck", "--listen", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=clean(PYTHONPATH=str(ROOT)),
        )
    assert res.returncode == (2 if taken else 0), res
    assert ("address already in use" in res.stderr) is taken
