"""The CLI's own behaviour: help everywhere, init, unreachable router, the demo a newcomer runs."""

from __future__ import annotations

import asyncio
import os
import sys

import aiohttp
from click.testing import CliRunner

from conftest import eventually, free_port
from gpuq.cli import main


def test_every_command_has_help_with_an_example():
    runner = CliRunner()
    for name, command in main.commands.items():
        result = runner.invoke(main, [name, "--help"])
        assert result.exit_code == 0, name
        assert "Example:" in result.output, f"{name} help has no example"


def test_init_writes_a_starter_and_never_overwrites(tmp_path):
    runner = CliRunner()
    target = tmp_path / "gpuq.toml"
    first = runner.invoke(main, ["init", str(target)])
    assert first.exit_code == 0 and "wrote" in first.output
    text = target.read_text()
    assert "[[node]]" in text and 'stale_after = "10m"' in text
    second = runner.invoke(main, ["init", str(target)])
    assert second.exit_code == 1 and "already exists" in second.output
    assert target.read_text() == text


def test_unreachable_router_is_a_clear_error():
    port = free_port()
    result = CliRunner().invoke(main, ["--router", f"http://127.0.0.1:{port}", "queue"])
    assert result.exit_code == 1
    assert result.output.splitlines()[0].startswith(f"error - cannot reach the router at http://127.0.0.1:{port}")
    assert result.output.splitlines()[1] == "not retried"


def test_serve_without_config_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUQ_CONFIG", raising=False)
    result = CliRunner().invoke(main, ["serve"])
    assert result.exit_code == 2 and "gpuq serve --demo" in result.output


async def test_demo_mode_runs_jobs_on_simulated_nodes(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUQ_CONFIG", "GPUQ_ROUTER")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuq.cli", "serve", "--demo", "--listen", f"127.0.0.1:{port}",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    try:
        banner = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        assert banner.startswith(f"gpuq router: http://127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s:
            async def submitted():
                async with s.post(f"{url}/api/jobs", json={"kind": "task", "prompt": "hello demo"}) as r:
                    return (await r.json())["jobs"][0] if r.status == 201 else None
            job = await eventually(submitted, 20, 0.1, "the demo router to take a job")
            assert job["node"] == "demo-1"

            async def done():
                async with s.get(f"{url}/api/jobs/{job['id']}") as r:
                    body = await r.json()
                    return body if body["state"] == "done" else None
            finished = await eventually(done, 30, 0.1, "the demo job to finish")
            assert finished["output"].strip()
        assert (tmp_path / "gpuq-demo.db").exists()
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 15) == 0  # a clean shutdown on SIGTERM
