"""`gpuq init --tailscale`: find the lab on the tailnet. Reads `tailscale status --json`, asks
each online peer's Ollama what it has (short timeouts), and writes a gpuq.toml with the router
on this machine's tailnet address and one [[node]] per peer whose Ollama answered."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..config import DEFAULT_LISTEN
from ..errors import GpuqError

MANUAL = (
    "write gpuq.toml by hand instead: `gpuq init`, then set listen to this machine's "
    "Tailscale address (`tailscale ip -4`) and one [[node]] per Ollama machine"
)
PROBE_TIMEOUT_S = 3.0
ROUTER_PORT = DEFAULT_LISTEN.rsplit(":", 1)[1]


@dataclass(frozen=True)
class Machine:
    host_name: str
    dns_name: str  # MagicDNS name without the trailing dot ('' when MagicDNS is off)
    ip: str  # its first IPv4 tailnet address
    online: bool

    @property
    def name(self) -> str:
        return self.dns_name or self.ip


@dataclass(frozen=True)
class Found:
    machine: Machine
    models: list[dict[str, Any]]  # /api/tags entries

    @property
    def largest(self) -> str:
        name: str = max(self.models, key=lambda m: m.get("size") or 0)["name"]  # probe() keeps str names only
        return name


def status(command: str = "tailscale") -> dict[str, Any]:
    """`tailscale status --json`, or a GpuqError saying what is wrong and the manual way."""
    path = shutil.which(command)
    if path is None:
        raise GpuqError(f"no `{command}` on PATH: install Tailscale and log in (`tailscale up`), or {MANUAL}")
    try:
        done = subprocess.run([path, "status", "--json"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        raise GpuqError(f"`tailscale status --json` did not answer within 15s; {MANUAL}") from None
    try:
        data = json.loads(done.stdout)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise GpuqError(f"`tailscale status --json` failed: {why[0]}; is tailscaled running? Or {MANUAL}")
    if data.get("BackendState") != "Running":
        raise GpuqError(
            f"Tailscale is not connected (BackendState {data.get('BackendState')!r}): run `tailscale up`, or {MANUAL}"
        )
    return data


def machine(node: dict[str, Any]) -> Machine | None:
    ips = [ip for ip in node.get("TailscaleIPs") or [] if ":" not in ip]
    if not ips:
        return None
    return Machine(
        host_name=str(node.get("HostName") or ips[0]),
        dns_name=str(node.get("DNSName") or "").rstrip("."),
        ip=ips[0],
        online=bool(node.get("Online")),
    )


def peers(data: dict[str, Any]) -> list[Machine]:
    """The tailnet's other machines, in the order tailscale lists them."""
    return [m for m in (machine(p) for p in (data.get("Peer") or {}).values()) if m is not None]


async def probe(machines: list[Machine], port: int, timeout_s: float = PROBE_TIMEOUT_S) -> list[Found]:
    """The online machines whose Ollama answers /api/version and then /api/tags, in order."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)

    async def ask(session: aiohttp.ClientSession, m: Machine) -> Found | None:
        base = f"http://{m.ip}:{port}"
        try:
            async with session.get(base + "/api/version") as resp:
                if resp.status != 200 or "version" not in await resp.json(content_type=None):
                    return None
            async with session.get(base + "/api/tags") as resp:
                models = (await resp.json(content_type=None)).get("models") or []
        except (TimeoutError, aiohttp.ClientError, ValueError, AttributeError):
            return None
        return Found(m, [x for x in models if isinstance(x, dict) and isinstance(x.get("name"), str)])

    async with aiohttp.ClientSession(timeout=timeout) as session:
        answers = await asyncio.gather(*(ask(session, m) for m in machines if m.online))
    return [a for a in answers if a is not None]


def lab_config(me: Machine, found: list[Found], port: int) -> str:
    """The gpuq.toml text: the router on this machine's tailnet address, a node per Ollama."""
    lines = [
        "# Written by `gpuq init --tailscale`: the router listens on this machine's tailnet address.",
        "# See gpuq.toml.example for every key.",
        "[router]",
        f'listen = "{me.ip}:{ROUTER_PORT}"',
        f'public_url = "http://{me.name}:{ROUTER_PORT}"',
        'database = "gpuq.db"',
        'stale_after = "10m"',
    ]
    for rank, f in enumerate(found, start=1):
        lines += [
            "",
            "[[node]]",
            f'name = "{f.machine.host_name}"',
            f'url = "http://{f.machine.name}:{port}"',
            f"rank = {rank}",
            'roles = ["task", "critique"]  # edit: "task" takes long work, "critique" reviews (fan-out)',
            f'model = "{f.largest}"  # its largest model; it also has: '
            + (", ".join(sorted(m["name"] for m in f.models if m["name"] != f.largest)) or "nothing else"),
            "# options = { num_ctx = 32768 }  # Ollama's default context is small; see gpuq.toml.example",
        ]
    return "\n".join(lines) + "\n"


def discover(port: int, command: str = "tailscale") -> tuple[str, Machine, list[Found], list[Machine]]:
    """The config text, this machine, the nodes found, and the online machines without Ollama."""
    data = status(command)
    me = machine(data.get("Self") or {})
    if me is None:
        raise GpuqError(f"`tailscale status --json` shows no IPv4 address for this machine; {MANUAL}")
    others = peers(data)
    found = asyncio.run(probe(others, port))
    if not any(f.models for f in found):
        raise GpuqError(
            f"no machine on the tailnet answered as Ollama with a model on port {port} "
            f"(asked {sum(m.online for m in others)} online peers); start Ollama with "
            f"OLLAMA_HOST=0.0.0.0 on each, or {MANUAL}"
        )
    found = [f for f in found if f.models]
    silent = [m for m in others if m.online and m not in {f.machine for f in found}]
    return lab_config(me, found, port), me, found, silent
