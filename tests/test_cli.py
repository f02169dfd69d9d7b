"""The CLI's own behaviour: help everywhere, init, an unreachable or foreign router, the demo a
newcomer runs."""

from __future__ import annotations

import asyncio
import os
import shlex
import sys

import aiohttp
import pytest
from aiohttp import web
from click.testing import CliRunner
from conftest import eventually, free_port, run_cli

from gpuq.cli import main
from gpuq.ops.daemon import invoked_as


def test_every_command_has_help_with_an_example():
    runner = CliRunner()
    for name in main.commands:
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


async def test_a_closed_port_says_how_to_start_the_router():
    url = f"http://127.0.0.1:{free_port()}"
    res = await run_cli("--router", url, "queue")
    assert res.code == 1 and res.out == ""
    first, second = res.err.splitlines()
    assert first.startswith(f"error - cannot reach the router at {url}: ") and "Connection refused" in first
    assert first.endswith("; is it running? Start it with `gpuq serve` (or `make run` in a gpuq checkout)")
    assert second == "not retried"


# -- a --router that is not gpuq ---------------------------------------------------------------

JOB_ID = "1760883402-9f3a7c21"
PAGE = (
    "<!DOCTYPE html>\n<html><head><title>Welcome</title></head>\n<body>\n"
    + "<p>It works!</p>\n" * 40
    + "</body></html>\n"
)


@pytest.fixture
async def foreign():
    """Another web server on loopback: /html/... answers every request with an HTML page (200);
    any other path gets aiohttp's own plain-text 404; /proxy/ takes a submit like gpuq, then
    answers everything else with a 502 page (a reverse proxy whose router went away)."""

    async def html(request):
        return web.Response(text=PAGE, content_type="text/html")

    async def proxy_submit(request):
        job = {
            "id": JOB_ID,
            "node": "node-1",
            "reason": "first free node by rank",
            "preview_url": "-",
            "model": "m",
            "state": "queued",
        }
        return web.json_response({"jobs": [job]}, status=201)

    async def proxy_gone(request):
        return web.Response(text=PAGE, status=502, content_type="text/html")

    app = web.Application()
    app.router.add_route("*", "/html/{tail:.*}", html)
    app.router.add_post("/proxy/api/jobs", proxy_submit)
    app.router.add_route("*", "/proxy/{tail:.*}", proxy_gone)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


# Every way a command talks to the router: a JSON call, a read, the stream, a delete.
COMMANDS = [
    (["task", "x"], "/api/jobs"),
    (["critique", "{file}"], "/api/jobs"),
    (["queue"], "/api/queue?limit=50"),
    (["health"], "/health"),
    (["wait", JOB_ID], f"/api/jobs/{JOB_ID}/stream"),
    (["delete", JOB_ID], f"/api/jobs/{JOB_ID}"),
]


@pytest.mark.parametrize("prefix,status,what", [("/html", 200, "an HTML page"), ("", 404, '"404: Not Found"')])
async def test_a_router_url_that_is_another_server_is_one_clear_error(prefix, status, what, foreign, tmp_path):
    (tmp_path / "plan.md").write_text("a plan")
    base = foreign + prefix
    for args, path in COMMANDS:
        res = await run_cli("--router", base, *[a.replace("{file}", str(tmp_path / "plan.md")) for a in args])
        assert res.code == 1, (args, res)
        assert res.err.splitlines() == [
            f"error {status} {base}{path} answered {what}, not gpuq's JSON; is {base} the router's URL?",
            "not retried",
        ], (args, res.err)


async def test_a_foreign_answer_after_the_submit_is_one_clear_error(foreign, tmp_path):
    # The submit went through; then the router is gone and a proxy page answers the poll (critique
    # waits for its results) and the stream (task --wait).
    (tmp_path / "plan.md").write_text("a plan")
    base = foreign + "/proxy"
    res = await run_cli("--router", base, "critique", str(tmp_path / "plan.md"))
    assert (res.code, res.out) == (1, "fan-out 1 critique node\n")
    assert res.err.splitlines() == [
        f"node-1 {JOB_ID} m queued  -",  # the child, listed at once
        f"error 502 {base}/api/jobs/{JOB_ID} answered an HTML page, not gpuq's JSON; is {base} the router's URL?",
        "not retried",
    ]
    res = await run_cli("--router", base, "task", "x", "--wait")
    assert res.code == 1 and res.out.startswith(f"{JOB_ID} -> node-1")
    assert res.err.splitlines() == [
        f"error 502 {base}/api/jobs/{JOB_ID}/stream answered an HTML page, not gpuq's "
        f"JSON; is {base} the router's URL?",
        "not retried",
    ]


async def test_a_router_url_that_does_not_speak_http_is_one_clear_error():
    async def ssh_like(reader, writer):
        await reader.readuntil(b"\r\n\r\n")  # the whole request first: no race with its sending
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(ssh_like, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        res = await run_cli("--router", base, "queue")
    finally:
        server.close()
        await server.wait_closed()
    assert res.code == 1
    assert res.err.splitlines() == [
        f"error - {base}/api/queue?limit=50 did not answer like a gpuq router "
        f"(SSH-2.0-OpenSSH_9.6); is {base} the router's URL?",
        "not retried",
    ]


@pytest.mark.parametrize(
    "args,env,message",
    [
        (
            ["--router", "localhost:8750"],
            {},
            "Error: --router: expected an http:// or https:// URL, got 'localhost:8750'",
        ),
        (["--router", "http://127.0.0.1:8750/?x=1"], {}, "Error: --router: a URL with a query ('?') or fragment ('#')"),
        (
            [],
            {"GPUQ_ROUTER": "http://127.0.0.1:abc"},
            "Error: $GPUQ_ROUTER: the URL's port is not a number from 0 to 65535: 'http://127.0.0.1:abc'",
        ),
        (["--router", "http://127.0.0.1:8750"], {"GPUQ_TOKEN": "café"}, "Error: $GPUQ_TOKEN: use printable ASCII only"),
    ],
)
async def test_a_bad_router_url_or_token_is_a_usage_error(args, env, message):
    res = await run_cli(*args, "queue", env=env)
    assert res.code == 2 and res.out == "", res
    assert res.err.splitlines()[-1].startswith(message), res.err
    assert "Traceback" not in res.err


def test_serve_without_config_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUQ_CONFIG", raising=False)
    result = CliRunner().invoke(main, ["serve"])
    assert result.exit_code == 2 and "gpuq serve --demo" in result.output


async def test_demo_mode_runs_jobs_on_simulated_nodes(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("GPUQ_CONFIG", "GPUQ_ROUTER")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuq.cli",
        "serve",
        "--demo",
        "--listen",
        f"127.0.0.1:{port}",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        banner = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode()
        assert banner.startswith(f"gpuq router: http://127.0.0.1:{port}")
        url = f"http://127.0.0.1:{port}"
        lines = [(await asyncio.wait_for(proc.stdout.readline(), 20)).decode() for _ in range(4)]
        [example] = [line for line in lines if line.startswith("try:")]
        # Not on the default port: the line to export for the CLI in another directory.
        assert any(line.startswith(f"the CLI elsewhere:  export GPUQ_ROUTER={url} ") for line in lines), lines
        # The example is a command that works as printed, from where the user is.
        command = shlex.split(example.removeprefix("try:"))
        assert command[:5] == [sys.executable, "-m", "gpuq.cli", "--router", url]
        tried = await asyncio.create_subprocess_exec(
            *command, cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        out, err = await asyncio.wait_for(tried.communicate(), 60)
        assert tried.returncode == 0, err
        printed = out.decode().splitlines()
        assert printed[0].endswith("-> demo-1 (first free node by rank)") and printed[-1].startswith("done ")
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


def test_the_banner_names_gpuq_as_the_user_typed_it(tmp_path, monkeypatch):
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "gpuq"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    # Inside the project (make run): the path from here; elsewhere: the whole path.
    assert invoked_as(str(script), cwd=str(tmp_path)) == "venv/bin/gpuq"
    assert invoked_as(str(script), cwd="/") == str(script)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")  # pipx, or an activated venv
    assert invoked_as(str(script), cwd="/") == "gpuq"
