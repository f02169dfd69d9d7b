"""The router against one hostile node (issue 22), measured: the router's RSS before, at its
peak and after a job that meets an endless stream, and the slowest /health answer while a node
sends a gzip bomb. Not part of `make bench` (no target, a before/after record).

Run: `python -m bench.hostile endless 0 [jobs]` or `python -m bench.hostile gzip [MiB] [jobs]`, with the router
of this checkout (`gpuq` on $PATH or .venv/bin/gpuq)."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

import aiohttp
import tomli_w
from aiohttp import web

from .procs import free_port

MODEL = "m:1"


def chunk(text: str, done: bool = False) -> bytes:
    return (
        json.dumps({"model": MODEL, "message": {"role": "assistant", "content": text}, "done": done}) + "\n"
    ).encode()


def rss_kib(pid: int) -> tuple[int, int]:
    """The process's resident set now and at its peak (VmHWM), in KiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def node_app(mode: str, bomb_mib: int) -> web.Application:
    async def version(request):
        return web.json_response({"version": "0.13.0"})

    async def tags(request):
        return web.json_response({"models": [{"name": MODEL}]})

    async def ps(request):
        return web.json_response({"models": []})

    async def chat(request):
        body = await request.json()
        if not body.get("messages"):
            return web.json_response({"model": MODEL, "done": True, "done_reason": "unload"})
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        if mode == "gzip":
            resp.headers["Content-Encoding"] = "gzip"
        await resp.prepare(request)
        try:
            if mode == "gzip":
                packer = zlib.compressobj(9, zlib.DEFLATED, 31)
                block = b"\n" * (1 << 20)
                for _ in range(bomb_mib):
                    await resp.write(packer.compress(block))
                await resp.write(packer.flush())
            else:
                while True:
                    await resp.write(chunk("word ") * 100)
                    await asyncio.sleep(0)
        except ConnectionError:
            pass
        return resp

    app = web.Application()
    app.router.add_get("/api/version", version)
    app.router.add_get("/api/tags", tags)
    app.router.add_get("/api/ps", ps)
    app.router.add_post("/api/chat", chat)
    return app


async def main(mode: str, bomb_mib: int, jobs: int) -> None:
    runner = web.AppRunner(node_app(mode, bomb_mib), handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    node_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gpuq = shutil.which("gpuq") or str(Path(sys.executable).parent / "gpuq")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "gpuq.toml"
        config.write_text(
            tomli_w.dumps(
                {
                    "router": {
                        "listen": f"127.0.0.1:{port}",
                        "database": "gpuq.db",
                        "health_interval": "1s",
                        "unload_timeout": "2s",
                    },
                    "node": [{"name": "node-1", "url": node_url, "rank": 1, "roles": ["task"], "model": MODEL}],
                }
            )
        )
        proc = await asyncio.create_subprocess_exec(
            gpuq,
            "serve",
            "--config",
            str(config),
            cwd=tmp,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            async with aiohttp.ClientSession() as session:
                await wait_up(session, url)
                for _ in range(jobs):
                    await measure(session, url, proc.pid, mode)
        finally:
            proc.terminate()
            await proc.wait()
    await runner.cleanup()


async def wait_up(session: aiohttp.ClientSession, url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/api/nodes") as resp:
                if (await resp.json())["nodes"][0]["up"]:
                    break
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    await asyncio.sleep(1)


async def measure(session: aiohttp.ClientSession, url: str, pid: int, mode: str) -> None:
    before = rss_kib(pid)[0]
    started = time.monotonic()
    async with session.post(url + "/api/jobs", json={"kind": "task", "prompt": "hi", "timeout": 40}) as resp:
        job_id = (await resp.json())["jobs"][0]["id"]
    worst, asked = 0.0, started
    while True:
        t = time.monotonic()
        try:
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=120)) as resp:
                await resp.read()
        except TimeoutError:
            pass
        worst = max(worst, time.monotonic() - t)
        if time.monotonic() - asked > 1:  # a running job's detail joins its whole output: not often
            asked = time.monotonic()
            async with session.get(f"{url}/api/jobs/{job_id}") as resp:
                job = await resp.json()
            if job["state"] in ("failed", "done"):
                break
        await asyncio.sleep(0.05)
    ended = time.monotonic() - started
    await asyncio.sleep(3)
    after, peak = rss_kib(pid)
    print(
        json.dumps(
            {
                "mode": mode,
                "job_s": round(ended, 2),
                "error": job["error"],
                "output_bytes": len((job["output"] or "").encode()),
                "worst_health_s": round(worst, 3),
                "rss_before_mib": round(before / 1024, 1),
                "rss_peak_mib": round(peak / 1024, 1),
                "rss_after_mib": round(after / 1024, 1),
            }
        )
    )


if __name__ == "__main__":
    mode, size, jobs = (sys.argv[1:] + ["1024", "1"])[:3]
    asyncio.run(main(mode, int(size), int(jobs)))
