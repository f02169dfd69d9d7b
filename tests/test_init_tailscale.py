"""`gpuq init --tailscale` against a stand-in `tailscale` that prints real-format status JSON
(ipnstate.Status: Self, Peer keyed by node key, BackendState, MagicDNSSuffix), with the peers'
Ollama simulators on loopback addresses (127.0.0.x stand in for 100.x.y.z)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
import tomllib

import pytest

from gpuq.config import load_config
from gpuq.demo import FakeOllama


def port_free_on(*hosts: str) -> int:
    """A port that is free on every one of these loopback addresses."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise AssertionError("no common free port")


def machine(host: str, ip: str, online: bool = True) -> dict:
    return {
        "ID": f"n{ip[-1]}",
        "PublicKey": f"nodekey:{ip[-1] * 8}",
        "HostName": host,
        "DNSName": f"{host}.tail1234.ts.net.",
        "OS": "linux",
        "TailscaleIPs": [ip, f"fd7a:115c:a1e0::{ip[-1]}"],
        "Online": online,
        "Active": online,
    }


def stand_in(tmp_path, status: dict | None, exit_code: int = 0, stderr: str = "") -> dict:
    """A `tailscale` executable on PATH that answers `status --json` like the real one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "tailscale"
    script.write_text(
        f"#!{sys.executable}\nimport sys\n"
        f"assert sys.argv[1:] == ['status', '--json'], sys.argv\n"
        f"sys.stdout.write({json.dumps(json.dumps(status)) if status is not None else repr('')})\n"
        f"sys.stderr.write({stderr!r})\nsys.exit({exit_code})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


async def run_init(daemon_cli_env: dict, tmp_path, *args: str):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuq.cli",
        "init",
        *args,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **daemon_cli_env},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    return proc.returncode, out.decode(), err.decode()


async def test_init_finds_each_ollama_on_the_tailnet_and_writes_a_config_that_serves(tmp_path):
    port = port_free_on("127.0.0.2", "127.0.0.3", "127.0.0.5")
    gpu1 = FakeOllama(models={"qwen3-coder:30b", "llama3.2:latest"}, host="127.0.0.2")
    gpu2 = FakeOllama(models={"deepseek-r1:32b"}, host="127.0.0.3")
    offline = FakeOllama(models={"mistral:latest"}, host="127.0.0.5")  # Online: false: never asked
    for fake in (gpu1, gpu2, offline):
        await fake.start(port=port)
    try:
        status = {
            "Version": "1.76.1",
            "BackendState": "Running",
            "TailscaleIPs": ["127.0.0.1"],
            "Self": machine("laptop", "127.0.0.1"),
            "MagicDNSSuffix": "tail1234.ts.net",
            "Peer": {
                "nodekey:2": machine("gpu-box-1", "127.0.0.2"),
                "nodekey:4": machine("nas", "127.0.0.4"),  # online, no Ollama
                "nodekey:3": machine("gpu-box-2", "127.0.0.3"),
                "nodekey:5": machine("old-box", "127.0.0.5", online=False),
            },
        }
        env = stand_in(tmp_path, status)
        code, out, err = await run_init(env, tmp_path, "--tailscale", "--ollama-port", str(port))
        assert code == 0, err
        assert out.splitlines() == [
            "wrote gpuq.toml: the router on 127.0.0.1 (laptop.tail1234.ts.net), 2 nodes:",
            "  gpu-box-1        gpu-box-1.tail1234.ts.net  qwen3-coder:30b  (2 models)",
            "  gpu-box-2        gpu-box-2.tail1234.ts.net  deepseek-r1:32b  (1 models)",
            f"  nas              online, but no Ollama answered on port {port}",
            "check each node's roles and model, then run `gpuq serve`",
        ]
        data = tomllib.loads((tmp_path / "gpuq.toml").read_text())
        assert data["router"]["listen"] == "127.0.0.1:8750"
        assert data["router"]["public_url"] == "http://laptop.tail1234.ts.net:8750"
        assert [(n["name"], n["url"], n["rank"], n["model"]) for n in data["node"]] == [
            ("gpu-box-1", f"http://gpu-box-1.tail1234.ts.net:{port}", 1, "qwen3-coder:30b"),
            ("gpu-box-2", f"http://gpu-box-2.tail1234.ts.net:{port}", 2, "deepseek-r1:32b"),
        ]
        assert '# edit: "task" takes long work' in (tmp_path / "gpuq.toml").read_text()
        assert [n.name for n in load_config(tmp_path / "gpuq.toml").nodes] == ["gpu-box-1", "gpu-box-2"]
        assert offline.requests == [] and offline.ps_calls == 0
    finally:
        for fake in (gpu1, gpu2, offline):
            await fake.stop()


@pytest.mark.parametrize(
    "case, status, code, stderr, message",
    [
        (
            "not logged in",
            {"BackendState": "NeedsLogin", "Self": {}, "Peer": None},
            0,
            "",
            "Tailscale is not connected (BackendState 'NeedsLogin'): run `tailscale up`",
        ),
        (
            "daemon not running",
            None,
            1,
            "failed to connect to local tailscaled; it doesn't appear to be running",
            "`tailscale status --json` failed: failed to connect to local tailscaled; it doesn't appear to be running",
        ),
    ],
)
async def test_init_says_what_is_wrong_with_tailscale_and_the_manual_way(tmp_path, case, status, code, stderr, message):
    env = stand_in(tmp_path, status, code, stderr)
    rc, out, err = await run_init(env, tmp_path, "--tailscale")
    assert rc == 1
    assert message in err and "write gpuq.toml by hand instead: `gpuq init`" in err
    assert not (tmp_path / "gpuq.toml").exists()


async def test_init_without_tailscale_on_path(tmp_path):
    rc, out, err = await run_init({"PATH": str(tmp_path)}, tmp_path, "--tailscale")
    assert rc == 1 and "no `tailscale` on PATH" in err and "`gpuq init`" in err
