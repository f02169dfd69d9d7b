"""Batch files' bodies, streamed and never held whole (issue 43): the router's memory and its
event loop while a 60 MB input file is uploaded to `/v1/files` (and a batch is made from it),
and while 10 clients download a 30 MB file and never read it. Memory: the router's resident
memory at its peak (VmHWM, reset before each step) less what it held before. The loop: `/health`
asked every 10 ms from a process of its own, on a connection of its own, the longest answer (a loop held by a parse or a
copy answers late; the target is under 100 ms). `[front] stalled_client_timeout` is 5s here: the
stalled downloads are cut off then, and the round ends when all ten are.

Before (issue 43, measured on the code of its report): a 51 MB upload grew the router by 440 MB;
four downloads of a 30 MB file never read, +224 MB, held for ever."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from .front import _wait_front
from .procs import Fakes, Router, free_port, node_table, rss_mb

if TYPE_CHECKING:
    from .core import Bench
    from .stats import Metric

MODEL = "qwen3-coder:30b"
MB = 1 << 20
UPLOAD_MB = 60
DOWNLOAD_MB = 30
DOWNLOADS = 10
STALLED_S = 5.0
EVERY_S = 0.01


def input_file(mb: int) -> bytes:
    """JSON Lines of chat requests of about 100 KB each (a padding field the batch ignores), the
    last line broken: a batch made of it fails its validation, naming that line, and runs nothing."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "q"}]}
    lines = []
    for i in range(mb * MB // 100_000):
        line = {"custom_id": f"q-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        lines.append(json.dumps(line | {"pad": "x" * 100_000}).encode() + b"\n")
    return b"".join(lines) + b'{"custom_id": "broken"\n'


# The /health prober, in a process of its own (the bench's own loop is busy sending 60 MB): asks
# every 10 ms until its stdin closes, then prints the longest answer in ms.
PROBE = """
import sys, threading, time, http.client
host, port = sys.argv[1], int(sys.argv[2])
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
conn, longest = http.client.HTTPConnection(host, port, timeout=60), 0.0
print("ready", flush=True)
while not done.is_set():
    began = time.perf_counter()
    conn.request("GET", "/health")
    conn.getresponse().read()
    longest = max(longest, (time.perf_counter() - began) * 1000)
    time.sleep(0.01)
print(longest, flush=True)
"""


class Watch:
    """The router's peak memory (VmHWM, its peak reset first through clear_refs) and its longest
    /health (asked from another process) while a step runs."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.before = rss_mb(router.pid)
        self.peak = self.before
        self.longest_ms = 0.0

    async def during(self, step: Awaitable[None]) -> None:
        Path(f"/proc/{self.router.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        probe = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PROBE,
            "127.0.0.1",
            str(self.router.port),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert probe.stdin is not None and probe.stdout is not None
        await probe.stdout.readline()  # ready: connected, asking
        try:
            await step
        finally:
            self.peak = rss_mb(self.router.pid, "VmHWM")
            probe.stdin.close()
            out = await probe.stdout.read()
            await probe.wait()
        self.longest_ms = float(out.decode().split()[-1])


def stalled_download(port: int, path: str) -> socket.socket:
    """A GET whose client never reads (a small receive buffer: the kernel takes little for it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return sock


async def upload(session: aiohttp.ClientSession, front: str, content: bytes) -> str:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", content, filename="sweep.jsonl", content_type="application/jsonl")
    async with session.post(front + "/v1/files", data=form) as resp:
        if resp.status != 200:
            raise RuntimeError(f"upload: {resp.status} {await resp.text()}")
        return str((await resp.json())["id"])


async def create(session: aiohttp.ClientSession, front: str, file_id: str) -> None:
    asked = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    async with session.post(front + "/v1/batches", json=asked) as resp:
        batch = await resp.json()
    if resp.status != 200 or batch.get("status") != "failed":  # its one broken line, named
        raise RuntimeError(f"batch create: {resp.status} {batch}")


async def stalled_round(router: Router, port: int, file_id: str) -> None:
    """DOWNLOADS clients ask for the file and never read; done once the router cut all off."""
    socks = [stalled_download(port, f"/v1/files/{file_id}/content") for _ in range(DOWNLOADS)]
    deadline = time.monotonic() + STALLED_S + 60
    try:
        while router.log.read_text(errors="replace").count("stalled_client_timeout") < DOWNLOADS:
            if time.monotonic() > deadline:
                raise RuntimeError("the stalled downloads were not cut off within a minute of their deadline")
            await asyncio.sleep(0.05)
    finally:
        for sock in socks:
            sock.close()


async def bodies_section(bench: Bench) -> None:
    up_rss = bench.metric(
        "bodies_upload_rss", f"router RSS growth, a {UPLOAD_MB} MB upload to /v1/files (peak)", "MB", "mb", "<= 30 MB"
    )
    up_loop = bench.metric(
        "bodies_upload_loop", "  the longest /health during it (the event loop's longest stall)", "ms", "ms", "< 100"
    )
    mk_rss = bench.metric("bodies_create_rss", "  a batch made from that file: RSS growth (peak)", "MB", "mb")
    mk_loop = bench.metric("bodies_create_loop", "  the longest /health during it", "ms", "ms", "< 100")
    dl_rss = bench.metric(
        "bodies_stalled_rss",
        f"router RSS growth, {DOWNLOADS} downloads of a {DOWNLOAD_MB} MB file never read (peak)",
        "MB",
        "mb",
        "<= 30 MB",
    )
    dl_loop = bench.metric("bodies_stalled_loop", "  the longest /health meanwhile", "ms", "ms", "< 100")
    fakes = await Fakes({"b1": MODEL}, bench.workdir / "bodies-fakes.log").start()
    port = free_port()
    router = await Router(
        bench.workdir,
        [node_table("b1", fakes.urls["b1"], 1, MODEL, roles=("task",))],
        bench.workdir / "bodies.db",
        front={"stalled_client_timeout": f"{STALLED_S:g}s"},
        ollama_listen=f"127.0.0.1:{port}",
    ).start()
    front = f"http://127.0.0.1:{port}"
    big, small = input_file(UPLOAD_MB), input_file(DOWNLOAD_MB)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            await _wait_front(session, front, 1)
            await upload(session, front, b'{"warm": "up"}\n')  # what loads once is in `before`
            for _ in range(1 if bench.quick else 3):
                watch = Watch(router)
                holder: list[str] = []
                await watch.during(_keep(holder, upload(session, front, big)))
                up_rss.add_run(watch.peak - watch.before)
                up_loop.add_run(watch.longest_ms)
                watch = Watch(router)
                await watch.during(create(session, front, holder[0]))
                mk_rss.add_run(watch.peak - watch.before)
                mk_loop.add_run(watch.longest_ms)
                file_id = await upload(session, front, small)
                watch = Watch(router)
                await watch.during(stalled_round(router, port, file_id))
                dl_rss.add_run(watch.peak - watch.before)
                dl_loop.add_run(watch.longest_ms)
                bench.say(
                    f"bodies: upload +{up_rss.runs[-1][0]:.1f} MB, /health <= {up_loop.runs[-1][0]:.0f} ms;"
                    f" create +{mk_rss.runs[-1][0]:.1f} MB, <= {mk_loop.runs[-1][0]:.0f} ms;"
                    f" {DOWNLOADS} stalled downloads +{dl_rss.runs[-1][0]:.1f} MB, <= {dl_loop.runs[-1][0]:.0f} ms"
                )
    finally:
        await router.stop()
        await fakes.stop()


async def _keep(holder: list[str], upload_done: Awaitable[str]) -> None:
    holder.append(await upload_done)


def judge(metrics: dict[str, Metric]) -> None:
    """Each row against its target, on its median."""
    limits = {
        "bodies_upload_rss": 30.0,
        "bodies_stalled_rss": 30.0,
        **{k: 100.0 for k in ("bodies_upload_loop", "bodies_create_loop", "bodies_stalled_loop")},
    }
    for key, most in limits.items():
        if key in metrics and metrics[key].pooled:
            value = metrics[key].summary()["median"]
            metrics[key].met = value < most if key.endswith("_loop") else value <= most


if __name__ == "__main__":  # `python -m bench.bodies [--quick]`: this section alone, its rows printed
    import shutil
    import tempfile

    from .core import Bench
    from .stats import table

    async def alone() -> None:
        workdir = Path(tempfile.mkdtemp(prefix=".work-bodies-", dir=Path(__file__).resolve().parent))
        bench = Bench("--quick" in sys.argv, {"bodies"}, workdir)
        try:
            await bodies_section(bench)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        judge(bench.metrics)
        print(table(list(bench.metrics.values())))

    asyncio.run(alone())
