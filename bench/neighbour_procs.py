"""The three routers of the `neighbours` section as processes on loopback, each on the same
simulated nodes: gpuq (`gpuq serve` with its front door), LiteLLM's proxy, and ollama-herd (a
router and one agent per node). The peers live in a virtualenv of their own (`.venv/neighbours`,
bench/neighbours-requirements.txt): LiteLLM needs aiohttp >= 3.14.2, gpuq < 3.14, so they cannot
share gpuq's. Telemetry is off, HOME is a temporary directory, every wait is bounded and every
process is stopped by its own pid."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from .procs import ROOT, Router, free_port, node_table

PEER_VENV = ROOT / ".venv" / "neighbours"
REQUIREMENTS = Path(__file__).with_name("neighbours-requirements.txt")
MODEL = "llama3.2:latest"
MASTER_KEY = "sk-bench-0123456789abcdef"  # LiteLLM refuses to start without one
# herd advertises itself over mDNS and has no setting to stop it: its router is started with the
# advertiser's start and stop replaced by no-ops (loopback only).
HERD_LAUNCHER = (
    "import fleet_manager.common.discovery as d\n"
    "async def _quiet(self): return None\n"
    "d.FleetServiceAdvertiser.start = _quiet\n"
    "d.FleetServiceAdvertiser.stop = _quiet\n"
    "from fleet_manager.cli.server_cli import app\n"
    "app()\n"
)


def peer_venv_problem(install: bool = True, timeout_s: float = 900.0) -> str | None:
    """None when both peers' commands are installed; else why not (after one bounded attempt to
    install them with pip into .venv/neighbours, if `install`)."""
    wanted = [PEER_VENV / "bin" / name for name in ("litellm", "herd", "herd-node")]
    if all(p.exists() for p in wanted):
        return None
    if not install:
        return f"not installed: {', '.join(p.name for p in wanted if not p.exists())} in {PEER_VENV}"
    try:
        if not (PEER_VENV / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True, timeout=120)
        done = subprocess.run(
            [str(PEER_VENV / "bin" / "pip"), "install", "-q", "-r", str(REQUIREMENTS)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not install the peers into {PEER_VENV}: {exc}"
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        return f"pip could not install the peers into {PEER_VENV}: {' '.join(errors)[-400:] or done.returncode}"
    return peer_venv_problem(install=False)


def descendants(pid: int) -> list[int]:
    """A process and every process below it (LiteLLM's server may run workers as children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, []))
    return found


async def stop_process(proc: asyncio.subprocess.Process | None, sig: int = signal.SIGTERM) -> None:
    """The process and its children, by pid: SIGTERM (or `sig`), then SIGKILL after 15 s."""
    if proc is None or proc.returncode is not None:
        return
    for pid in reversed(descendants(proc.pid)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    try:
        await asyncio.wait_for(proc.wait(), 15)
    except TimeoutError:
        for pid in reversed(descendants(proc.pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await proc.wait()


class System:
    """One router under test: `start` spawns it (the clock of start-to-first-answer starts
    there), `kill` SIGKILLs its router process, `start` again restarts it on the same config and
    data. `pids` are the processes whose CPU is its cost; `rss_parts` names them."""

    name = ""
    headers: dict[str, str] = {}

    def __init__(self, workdir: Path, nodes: dict[str, str]):
        self.workdir = workdir / self.name
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.nodes = nodes  # simulated node name -> URL
        self.url = ""  # where its OpenAI /v1 answers
        self.spawned = 0.0

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def kill(self) -> None:
        raise NotImplementedError

    def router_pids(self) -> list[int]:
        raise NotImplementedError

    def router_proc(self) -> asyncio.subprocess.Process | None:
        raise NotImplementedError

    def exited(self) -> str | None:
        """Why its router is gone (its exit status and log's tail), or None while it runs."""
        proc = self.router_proc()
        if proc is None or proc.returncode is None:
            return None
        logs = sorted(self.workdir.glob("*.log"), key=lambda p: p.stat().st_mtime)
        tail = logs[-1].read_text(errors="replace")[-600:] if logs else ""
        return f"its router exited with status {proc.returncode}: {tail}"

    def pids(self) -> list[int]:
        return self.router_pids()

    def rss_parts(self) -> dict[str, list[int]]:
        return {"router": self.router_pids()}

    def peer_env(self) -> dict[str, str]:
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        return {**env, "HOME": str(home), "NO_PROXY": "127.0.0.1,localhost", "PYTHONUNBUFFERED": "1"}

    async def spawn(self, argv: list[str], env: dict[str, str], log_name: str) -> asyncio.subprocess.Process:
        with open(self.workdir / log_name, "ab") as log:
            return await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL, cwd=str(self.workdir), env=env
            )


class Gpuq(System):
    """`gpuq serve` with its front door (`router.ollama_listen`) on loopback, one node per
    simulated node, as a lab configures it (the defaults: a job at a time per node, unloaded
    after each)."""

    name = "gpuq"

    def __init__(self, workdir: Path, nodes: dict[str, str]):
        super().__init__(workdir, nodes)
        self.front_port = free_port()
        self.url = f"http://127.0.0.1:{self.front_port}"
        table = [node_table(n, u, rank, MODEL, roles=("task",)) for rank, (n, u) in enumerate(nodes.items(), 1)]
        self.router = Router(
            self.workdir, table, self.workdir / "gpuq.db", ollama_listen=f"127.0.0.1:{self.front_port}"
        )

    async def start(self) -> None:
        self.spawned = time.monotonic()
        await self.router.start()

    async def stop(self) -> None:
        await self.router.stop()

    async def kill(self) -> None:
        assert self.router.proc is not None
        self.router.proc.kill()
        await self.router.proc.wait()

    def router_pids(self) -> list[int]:
        return [self.router.pid]

    def router_proc(self) -> asyncio.subprocess.Process | None:
        return self.router.proc


class LiteLLM(System):
    """`litellm --config` (its proxy), one deployment per simulated node under one model name,
    no database (as the quick start runs it), telemetry off and the local cost map."""

    name = "litellm"
    headers = {"Authorization": f"Bearer {MASTER_KEY}"}

    def __init__(self, workdir: Path, nodes: dict[str, str]):
        super().__init__(workdir, nodes)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None
        lines = ["model_list:"]
        for url in nodes.values():
            lines += [
                f"  - model_name: {MODEL}",
                f'    litellm_params: {{model: "ollama_chat/{MODEL}", api_base: "{url}"}}',
            ]
        lines += ["litellm_settings: {telemetry: false}", f"general_settings: {{master_key: {MASTER_KEY}}}"]
        self.config = self.workdir / "litellm.yaml"
        self.config.write_text("\n".join(lines) + "\n")

    async def start(self) -> None:
        env = {
            **self.peer_env(),
            "LITELLM_TELEMETRY": "False",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "NO_DOCS": "True",
        }
        argv = [str(PEER_VENV / "bin" / "litellm"), "--config", str(self.config), "--host", "127.0.0.1"]
        self.spawned = time.monotonic()
        self.proc = await self.spawn([*argv, "--port", str(self.port)], env, "litellm.log")

    async def stop(self) -> None:
        await stop_process(self.proc)

    async def kill(self) -> None:
        await stop_process(self.proc, signal.SIGKILL)

    def router_pids(self) -> list[int]:
        assert self.proc is not None
        return descendants(self.proc.pid)

    def router_proc(self) -> asyncio.subprocess.Process | None:
        return self.proc


class Herd(System):
    """ollama-herd: its router (`herd`, through the launcher that keeps mDNS quiet) and one
    agent (`herd-node`) per simulated node, all on loopback, telemetry off, auto-pull off (the
    simulator pulls nothing). `kill` SIGKILLs the router; the agents stay, as on a real fleet."""

    name = "herd"

    def __init__(self, workdir: Path, nodes: dict[str, str]):
        super().__init__(workdir, nodes)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: asyncio.subprocess.Process | None = None
        self.agents: list[asyncio.subprocess.Process] = []

    def env(self) -> dict[str, str]:
        return {
            **self.peer_env(),
            "FLEET_TELEMETRY": "false",
            "FLEET_NODE_TELEMETRY": "false",
            "FLEET_HOST": "127.0.0.1",
            "FLEET_PORT": str(self.port),
            "FLEET_AUTO_PULL": "false",
            "FLEET_DATA_DIR": str(self.workdir / "router-data"),
            "FLEET_NODE_DATA_DIR": str(self.workdir / "agent-data"),
        }

    async def start(self) -> None:
        self.spawned = time.monotonic()
        python = str(PEER_VENV / "bin" / "python")
        self.proc = await self.spawn([python, "-c", HERD_LAUNCHER], self.env(), "herd.log")
        if self.agents:  # a restart after a kill: the agents are still running
            return
        for name, url in self.nodes.items():
            argv = [str(PEER_VENV / "bin" / "herd-node"), "--node-id", name, "--ollama-host", url]
            argv += ["--router-url", self.url]
            self.agents.append(await self.spawn(argv, self.env(), f"agent-{name}.log"))

    async def stop(self) -> None:
        for proc in [self.proc, *self.agents]:
            await stop_process(proc)
        self.agents = []

    async def kill(self) -> None:
        await stop_process(self.proc, signal.SIGKILL)

    def router_pids(self) -> list[int]:
        assert self.proc is not None
        return descendants(self.proc.pid)

    def router_proc(self) -> asyncio.subprocess.Process | None:
        return self.proc

    def pids(self) -> list[int]:
        return self.router_pids() + [p for a in self.agents for p in descendants(a.pid)]

    def rss_parts(self) -> dict[str, list[int]]:
        return {"router": self.router_pids(), "agent": [self.agents[0].pid]}


SYSTEMS: tuple[type[System], ...] = (Gpuq, LiteLLM, Herd)
LABELS = {"gpuq": "gpuq", "litellm": "LiteLLM", "herd": "ollama-herd", "neighbours": "the section"}
