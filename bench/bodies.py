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


# The prober, in a process of its own (the bench's own loop is busy sending 60 MB): every 10 ms
# it asks the front door's `/` (answered from memory: the event loop alone) and the router's
# `/health` (its store reads too), each on a kept-alive connection, until its stdin closes; then
# prints the longest answer of each, in ms.
PROBE = """
import sys, threading, time, http.client
host, front, api = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
probes = [(http.client.HTTPConnection(host, port, timeout=60), path) for port, path in ((front, "/"), (api, "/health"))]
longest = [0.0, 0.0]
print("ready", flush=True)
while not done.is_set():
    for i, (conn, path) in enumerate(probes):
        began = time.perf_counter()
        conn.request("GET", path)
        conn.getresponse().read()
        longest[i] = max(longest[i], (time.perf_counter() - began) * 1000)
    time.sleep(0.01)
print(*longest, flush=True)
"""


class Watch:
    """The router's peak memory (VmHWM, its peak reset first through clear_refs), its event
    loop's longest answer and its longest /health (asked from another process) while a step runs."""

    def __init__(self, router: Router, front_port: int) -> None:
        self.router = router
        self.front_port = front_port
        self.before = rss_mb(router.pid)
        self.peak = self.before
        self.loop_ms = 0.0
        self.health_ms = 0.0

    async def during(self, step: Awaitable[None]) -> None:
        Path(f"/proc/{self.router.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        probe = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PROBE,
            "127.0.0.1",
            str(self.front_port),
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
        self.loop_ms, self.health_ms = (float(v) for v in out.decode().split()[-2:])


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

    def cut_off() -> int:
        return router.log.read_text(errors="replace").count("stalled_client_timeout")

    before = cut_off()  # (the rounds before this one's)
    socks = [stalled_download(port, f"/v1/files/{file_id}/content") for _ in range(DOWNLOADS)]
    deadline = time.monotonic() + STALLED_S + 60
    try:
        while cut_off() - before < DOWNLOADS:
            if time.monotonic() > deadline:
                raise RuntimeError("the stalled downloads were not cut off within a minute of their deadline")
            await asyncio.sleep(0.05)
    finally:
        for sock in socks:
            sock.close()


IDLE_S = 3.0
STEPS = {  # key: what the step is, as its rows name it
    "idle": f"nothing ({IDLE_S:g} s idle: the same probes' baseline)",
    "upload": f"a {UPLOAD_MB} MB upload to /v1/files",
    "create": "a batch made from that file (POST /v1/batches)",
    "stalled": f"{DOWNLOADS} downloads of a {DOWNLOAD_MB} MB file never read",
}


def rows(bench: Bench) -> dict[str, tuple[Metric, Metric, Metric]]:
    """Per step: the router's RSS growth at its peak, its event loop's longest answer, its
    longest /health."""
    out = {}
    for key, what in STEPS.items():
        out[key] = (
            bench.metric(f"bodies_{key}_rss", f"router RSS growth (peak), {what}", "MB", "mb", "<= 30 MB"),
            bench.metric(
                f"bodies_{key}_loop", "  the event loop's longest stall meanwhile (`/` answered)", "ms", "ms", "< 100"
            ),
            bench.metric(f"bodies_{key}_health", "  the longest /health meanwhile", "ms", "ms"),
        )
    return out


async def bodies_section(bench: Bench) -> None:
    measured = rows(bench)
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

    async def watched(key: str, step: Awaitable[None]) -> None:
        watch = Watch(router, port)
        await watch.during(step)
        for metric, value in zip(measured[key], (watch.peak - watch.before, watch.loop_ms, watch.health_ms)):
            metric.add_run(value)

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            await _wait_front(session, front, 1)
            await upload(session, front, b'{"warm": "up"}\n')  # what loads once is in `before`
            for _ in range(1 if bench.quick else 3):
                await watched("idle", asyncio.sleep(IDLE_S))
                holder: list[str] = []
                await watched("upload", _keep(holder, upload(session, front, big)))
                await watched("create", create(session, front, holder[0]))
                file_id = await upload(session, front, small)
                await watched("stalled", stalled_round(router, port, file_id))
                bench.say(
                    "bodies: "
                    + "; ".join(
                        f"{key} +{rss.runs[-1][0]:.1f} MB, loop <= {loop.runs[-1][0]:.0f} ms,"
                        f" /health <= {health.runs[-1][0]:.0f} ms"
                        for key, (rss, loop, health) in measured.items()
                    )
                )
    finally:
        await router.stop()
        await fakes.stop()


async def _keep(holder: list[str], upload_done: Awaitable[str]) -> None:
    holder.append(await upload_done)


def judge(metrics: dict[str, Metric]) -> None:
    """Each row against its target, on its median."""
    limits = {**{f"bodies_{key}_rss": 30.0 for key in STEPS}, **{f"bodies_{key}_loop": 100.0 for key in STEPS}}
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
