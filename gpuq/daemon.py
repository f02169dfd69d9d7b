"""Running the router as a process: logging, the demo nodes, signals, a clean shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import replace
from pathlib import Path

from aiohttp import web

from .config import ConfigError, NodeConfig, Settings, _check_listen
from .errors import GpuqError
from .fake_ollama import FakeOllama, Script

log = logging.getLogger("gpuq")

DEMO_NODES = (
    ("demo-1", ("task", "critique"), "qwen3-coder:30b"),
    ("demo-2", ("task", "critique"), "deepseek-r1:32b"),
    ("demo-3", ("critique",), "llama3.2:latest"),
)


async def start_demo_nodes() -> tuple[list[FakeOllama], list[NodeConfig]]:
    """Simulated Ollama nodes on loopback, streaming tokens at a realistic pace."""
    fakes, nodes = [], []
    for rank, (name, roles, model) in enumerate(DEMO_NODES, start=1):
        fake = FakeOllama(models={model}, script=Script(token_delay_s=0.08, tokens=None, load_delay_s=0.4,
                                                         unload="delay", unload_delay_s=0.3))
        url = await fake.start()
        fakes.append(fake)
        nodes.append(NodeConfig(name=name, url=url, rank=rank, roles=roles, model=model))
    return fakes, nodes


DEMO_FRONT_DOOR = "127.0.0.1:11435"  # beside Ollama's own 11434


async def serve(settings: Settings | None, listen: str | None, database: str | None,
                ollama_listen: str | None = None) -> int:
    from .front import start_front_door
    from .server import create_app

    fakes: list[FakeOllama] = []
    if settings is None:
        fakes, nodes = await start_demo_nodes()
        settings = Settings(database=Path("gpuq-demo.db").resolve(), stale_after_s=60, nodes=tuple(nodes),
                            ollama_listen=DEMO_FRONT_DOOR)
    if ollama_listen:
        settings = replace(settings, ollama_listen=_check_listen(ollama_listen, "--ollama-listen"))
    if listen:
        listen = _check_listen(listen, "--listen")
        settings = replace(settings, listen=listen, public_url=f"http://{listen}")
    if database:
        settings = replace(settings, database=Path(database).resolve())
    runner = web.AppRunner(create_app(settings), handle_signals=False, access_log=None)
    try:
        await runner.setup()
    except GpuqError as exc:
        log.error("cannot start: %s", exc.message)
        return 2
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot listen on %s: %s", settings.listen, exc)
        await runner.cleanup()
        return 2
    try:  # the Ollama/OpenAI front door, when router.ollama_listen is set (gpuq/front.py)
        front = await start_front_door(settings, runner.app, any_port_if_taken=bool(fakes) and not ollama_listen)
    except OSError as exc:
        log.error("cannot listen on %s (router.ollama_listen): %s", settings.ollama_listen, exc)
        await runner.cleanup()
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    log.info("gpuq router listening on http://%s (database %s, %d nodes)", settings.listen,
             settings.database, len(settings.nodes))
    print(f"gpuq router: {settings.public_url}   queue page: {settings.public_url}/", flush=True)
    if front is not None:
        log.info("front door for Ollama and OpenAI clients on %s", front.url)
        print(f"front door for Ollama and OpenAI clients:  export OLLAMA_HOST={front.url}   "
              f"(OpenAI SDK: base_url=\"{front.url}/v1\")", flush=True)
    if fakes:
        nodes = ", ".join(f"{n.name} ({n.model}, {n.url})" for n in settings.nodes)
        print(f"demo mode: simulated Ollama nodes {nodes}", flush=True)
        print(f'try:  .venv/bin/gpuq --router {settings.public_url} task "write a haiku about queues" --wait',
              flush=True)
    await stop.wait()
    log.info("shutting down")
    if front is not None:  # first: its waiting calls end while the store is open
        await front.runner.cleanup()
    await runner.cleanup()
    for fake in fakes:
        await fake.stop()
    return 0


def run_daemon(settings: Settings | None, listen: str | None = None, database: str | None = None,
               ollama_listen: str | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s gpuq %(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        return asyncio.run(serve(settings, listen, database, ollama_listen))
    except ConfigError as exc:
        print(f"gpuq: config error: {exc.message}", file=sys.stderr)
        return 2
    except GpuqError as exc:
        print(f"gpuq: {exc.message}", file=sys.stderr)
        return exc.status if exc.status < 10 else 1
