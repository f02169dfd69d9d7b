"""The processes a bench run starts: the real router (`gpuq serve`) and the fake nodes. Every
wait is bounded; every process is stopped by its own pid."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import tomli_w

from .http import Conn

ROOT = Path(__file__).resolve().parent.parent
QUIET_S = 0.3  # a quiet lab before a first-token sample: the node idle a moment, as when a person submits


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident set size of a process (VmHWM: its peak so far), from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def cpu_s(pid: int) -> float:
    """A process's CPU time so far, from /proc: what the relay costs, whatever else the machine
    is doing (its rate depends on how often the router gets a core). The scheduler's nanoseconds
    on a CPU (`schedstat`) of each of its threads (the router's live for its whole run), not
    /proc/<pid>/stat's clock ticks: 10 ms each were 10% of a short run's count."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended; no schedstat
            pass
    if total:
        return total / 1e9
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # user + system ticks
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Fakes:
    """`python -m bench.fakes` in a subprocess; `control` drives hold/release/log."""

    def __init__(self, nodes: dict[str, str], log: Path):
        self.spec = nodes  # name -> model
        self.log_path = log
        self.proc: asyncio.subprocess.Process | None = None
        self.urls: dict[str, str] = {}
        self.control: Conn | None = None

    async def start(self) -> Fakes:
        with open(self.log_path, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench.fakes",
                *(f"{n}={m}" for n, m in self.spec.items()),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                cwd=str(ROOT),
            )
        line = await asyncio.wait_for(self.proc.stdout.readline(), 20)
        info = json.loads(line)
        self.urls = info["nodes"]
        host, port = info["control"].removeprefix("http://").split(":")
        self.control = await Conn(host, int(port)).open()
        return self

    async def call(self, action: str, node: str, **query) -> dict:
        q = "&".join(f"{k}={v}" for k, v in {"node": node, **query}.items())
        status, body = await self.control.request("POST", f"/{action}?{q}")
        assert status == 200, (status, body)
        return body

    async def log(self, node: str, since: float = 0.0) -> list[tuple[str, float, float, bool]]:
        return [tuple(e) for e in (await self.call("log", node, since=since))["log"]]

    async def stop(self) -> None:
        if self.control is not None:
            await self.control.close()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


class Router:
    """The real router as a subprocess, on its own config and database."""

    def __init__(self, workdir: Path, nodes: list[dict], database: Path, front: dict | None = None, **router):
        self.workdir = workdir
        self.nodes = nodes
        self.database = database
        self.front = front  # the config's [front] table, if any
        self.router = router
        self.proc: asyncio.subprocess.Process | None = None
        self._configure()

    def _configure(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = self.workdir / f"gpuq-{self.port}.toml"
        self.log = self.workdir / f"router-{self.port}.log"
        data = {
            "router": {
                "listen": f"127.0.0.1:{self.port}",
                "public_url": self.url,
                "database": str(self.database),
                "unload_timeout": "2s",
                **self.router,
            },
            "node": self.nodes,
        }
        if self.front:
            data["front"] = self.front
        self.config.write_text(tomli_w.dumps(data))

    async def start(self, timeout: float = 30.0) -> Router:
        for attempt in range(3):  # the free port may be taken by another process meanwhile
            try:
                return await self._start(timeout)
            except RuntimeError as exc:
                if "address already in use" not in str(exc).lower() or attempt == 2:
                    raise
                self._configure()
        raise AssertionError("unreachable")

    async def _start(self, timeout: float) -> Router:
        with open(self.log, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gpuq.cli",
                "serve",
                "--config",
                str(self.config),
                stdout=log,
                stderr=log,
                cwd=str(self.workdir),
                env={k: v for k, v in os.environ.items() if k != "GPUQ_TOKEN"},
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.returncode is not None:
                raise RuntimeError(f"router exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                conn = await Conn("127.0.0.1", self.port).open()
                try:
                    status, _ = await conn.request("GET", "/health")
                finally:
                    await conn.close()
                if status in (200, 503):
                    return self
            except OSError:
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError(f"router did not answer /health within {timeout}s:\n{self.log.read_text()[-3000:]}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def connect(self) -> Conn:
        return await Conn("127.0.0.1", self.port).open()

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def first_stream_line(resp, key: str) -> None:
    """Read a streamed NDJSON reply until the first line that carries `key` (its first token)."""
    async for raw in resp.content:
        line = raw.strip()
        if line and json.loads(line).get(key):
            return
    raise RuntimeError("stream ended before its first token")


async def clear_queues(router: Router, nodes) -> None:
    """Every waiting job of `nodes` cancelled through the router's API (between a bench's runs)."""
    conn = await router.connect()
    try:
        for name in nodes:
            status, body = await conn.request("POST", f"/api/nodes/{name}/clear")
            assert status == 200, (status, body)
    finally:
        await conn.close()


def node_table(name: str, url: str, rank: int, model: str, roles=("task", "critique")) -> dict:
    return {"name": name, "url": url, "rank": rank, "roles": list(roles), "model": model}
