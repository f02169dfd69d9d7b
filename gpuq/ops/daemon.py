"""Running the router as a process: one per database (a lock), the listening port, logging, the demo
nodes, signals, a clean shutdown."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from ..access.connections import (
    BACKLOG,
    FRONT_PROBES,
    ROUTER_PROBES,
    ConnectionGuard,
    PortTaken,
    bind_sockets,
    connection_cap,
    raise_file_limit,
    throttle_accept_errors,
)
from ..batches import front_door_routes
from ..config import DEFAULT_LISTEN, DEFAULT_ROUTER, ConfigError, NodeConfig, Settings, check_database, check_listen
from ..demo import FakeOllama, Script
from ..errors import GpuqError, StartupError
from ..front.listener import bind_front_door, start_front_door
from ..front.relay import Relay
from ..jobs import parse_iso
from ..store.postgres import safe_dsn
from .dblock import lock_database, unlock_database
from .portcheck import next_free_port
from .service import config_error_exit

log = logging.getLogger("gpuq")

# The demo's lab: (name, roles, the node's own model, every model its Ollama has). demo-2 also holds
# the models Ollama's API docs name (llama3.2, llava, mistral, all-minilm in docs/api.md; gemma4,
# qwen3, gpt-oss, embeddinggemma in docs/api/*.mdx and docs/capabilities/*.mdx; gpt-oss:20b, qwen3:8b,
# qwen3-vl:8b in docs/api/openai-compatibility.mdx) and nomic-embed-text, so their examples and the
# clients' quick starts run unchanged through the front door. demo-2 has its own model untagged
# too (deepseek-r1, as the docs call it); demo-3 only critiques.
DOCS_MODELS = (
    "llama3.2:latest",
    "llama3.1:latest",
    "gemma4:latest",
    "qwen3:latest",
    "qwen3:8b",
    "qwen3-vl:8b",
    "gpt-oss:latest",
    "gpt-oss:20b",
    "mistral:latest",
    "llava:latest",
)
EMBEDDING_MODELS = ("all-minilm:latest", "nomic-embed-text:latest", "embeddinggemma:latest")
DEMO_NODES = (
    ("demo-1", ("task", "critique"), "qwen3-coder:30b", ("qwen3-coder:30b",)),
    (
        "demo-2",
        ("task", "critique"),
        "deepseek-r1:32b",
        ("deepseek-r1:32b", "deepseek-r1:latest", *DOCS_MODELS, *EMBEDDING_MODELS),
    ),
    ("demo-3", ("critique",), "llama3.2:latest", ("llama3.2:latest",)),
)


def invoked_as(argv0: str | None = None, cwd: str | None = None) -> str:
    """How to type gpuq again, as this process was started: `gpuq` when that is the same program
    on PATH (pipx, an activated venv), else its path (relative when under the current directory)."""
    path = os.path.abspath(argv0 or sys.argv[0])
    if os.path.basename(path) == "__main__.py":  # python -m gpuq.cli
        return f"{sys.executable} -m gpuq.cli"
    on_path = shutil.which("gpuq")
    if on_path and os.path.realpath(on_path) == os.path.realpath(path):
        return "gpuq"
    here = Path(cwd or os.getcwd())
    return str(Path(path).relative_to(here)) if here != here.parent and Path(path).is_relative_to(here) else path


async def start_demo_nodes() -> tuple[list[FakeOllama], list[NodeConfig]]:
    """Simulated Ollama nodes on loopback, streaming tokens at a realistic pace."""
    fakes, nodes = [], []
    for rank, (name, roles, model, models) in enumerate(DEMO_NODES, start=1):
        fake = FakeOllama(
            models=set(models),
            script=Script(token_delay_s=0.08, tokens=None, load_delay_s=0.4, unload="delay", unload_delay_s=0.3),
        )
        url = await fake.start()
        fakes.append(fake)
        nodes.append(NodeConfig(name=name, url=url, rank=rank, roles=roles, model=model))
    return fakes, nodes


def database_override(database: str | None) -> Path | str | None:
    """The database the command line or the environment names over the config's: --database, else
    $GPUQ_DATABASE (a DSN keeps its password out of gpuq.toml); None: neither (the config's is
    used). A file named there is relative to the working directory. `gpuq serve` and `gpuq
    restore` (gpuq/ops/restore.py) choose their database with it, so they choose the same one."""
    value = database or os.environ.get("GPUQ_DATABASE")
    if not value:
        return None
    return check_database(value, Path.cwd(), "--database" if database else "$GPUQ_DATABASE")


def database_name(database: Path | str) -> str:
    """The database as logs name it: its file, or its DSN without the password."""
    return safe_dsn(database) if isinstance(database, str) else str(database)


# The demo's front door: beside Ollama's own 11434 for a router on its usual 8750, and as far from
# the router's port otherwise (router 8751: front door 11436), so each demo keeps its own front
# door across restarts, whatever other demos run or start first (an exported OLLAMA_HOST keeps
# working); only when a program holds that port, the next free one above it.
DEMO_FRONT_DOOR_HOST = "127.0.0.1"
DEMO_FRONT_DOOR_PORT = 11435
DEMO_FRONT_DOOR_OFFSET = DEMO_FRONT_DOOR_PORT - int(DEFAULT_LISTEN.rsplit(":", 1)[1])


def demo_front_door(router_port: int) -> str:
    port = router_port + DEMO_FRONT_DOOR_OFFSET
    usable = router_port != 0 and 1024 <= port <= 65535  # (a router on port 0 takes any: no distance to keep)
    return f"{DEMO_FRONT_DOOR_HOST}:{port if usable else DEMO_FRONT_DOOR_PORT}"


async def serve(
    settings: Settings | None, listen: str | None, database: str | None, ollama_listen: str | None = None
) -> int:
    """Start-up order: the database's lock, the listening port, and only then the store (migrations,
    orphan recovery), so a router that cannot run exits 2 having changed nothing."""
    demo = settings is None
    settings = settings or Settings(database=Path("gpuq-demo.db").resolve(), stale_after_s=60)
    if listen:
        listen = check_listen(listen, "--listen")
        settings = replace(settings, listen=listen, public_url=f"http://{listen}")
    override = database_override(database)  # --database, else $GPUQ_DATABASE, else the config's
    if override is not None:
        settings = replace(settings, database=override)
    if ollama_listen or demo:  # the demo opens the front door too (gpuq/front/listener.py)
        settings = replace(
            settings,
            ollama_listen=check_listen(ollama_listen, "--ollama-listen")
            if ollama_listen
            else demo_front_door(settings.port),
        )
    # One router per SQLite file (its lock); on PostgreSQL any number share the queue, each node
    # driven by one of them at a time (its lease).
    lock = (
        None
        if isinstance(settings.database, str)
        else lock_database(settings.database, settings.listen, url=settings.public_url)
    )
    try:
        try:
            sockets = bind_sockets(settings.listen, settings.host, settings.port)
        except PortTaken as exc:
            raise StartupError(
                f"{exc.message}: another program has port {exc.port}, perhaps another gpuq "
                f"router. {listen_elsewhere(settings, demo)}"
            ) from None
        front_sockets: list[socket.socket] = []
        try:
            # The demo's front door takes the next free port when its own is taken.
            front_sockets = bind_front_door(settings, next_free_if_taken=demo and not ollama_listen)
            return await run_router(settings, sockets, demo, front_sockets)
        finally:
            for sock in sockets + front_sockets:
                sock.close()
    finally:
        if lock is not None:
            unlock_database(settings.database, lock)  # type: ignore[arg-type]


def listen_elsewhere(settings: Settings, demo: bool) -> str:
    """How to start this router on another port, a free one named: `make run PORT=`, the config's
    setting, or this very command with --listen."""
    host = settings.listen.rsplit(":", 1)[0]
    free = next_free_port(settings.host, settings.port)
    port = str(free) if free else "PORT"
    address = f"{host}:{port}"
    args = sys.argv[1:]
    for i, arg in enumerate(args):  # this command as typed, its --listen replaced
        if arg == "--listen" and i + 1 < len(args):
            args = args[:i] + args[i + 2 :]
            break
        if arg.startswith("--listen="):
            args = args[:i] + args[i + 1 :]
            break
    command = f"{invoked_as()} {shlex.join(args)} --listen {address}"
    ways = [f"run `{command}`"]
    if not demo:
        ways.insert(0, f'set `listen = "{address}"` under `[router]` in your gpuq.toml')
    if os.environ.get("GPUQ_MAKE_RUN"):
        ways.insert(0, f"run `make run PORT={port}`")
    return f"To listen on another port, {', or '.join(ways)}."


async def run_router(
    settings: Settings, sockets: list[socket.socket], demo: bool, front_sockets: Sequence[socket.socket] = ()
) -> int:
    from ..api.app import create_app
    from ..api.state import BATCHES, BUS, DISPATCHER, STORE

    loop = asyncio.get_running_loop()
    throttle_accept_errors(loop)
    file_limit = raise_file_limit()
    # Each listener has its own slots, so that clients hogging one cannot lock out the other; the
    # open-file limit is shared between them.
    cap = connection_cap(settings.max_connections, file_limit, listeners=2 if front_sockets else 1)
    guard = ConnectionGuard(
        cap,
        settings.header_timeout_s,
        settings.max_connections_per_peer,
        settings.keepalive_lifetime_s,
        ROUTER_PROBES,
        "the router",
    )
    front_guard = ConnectionGuard(
        cap,
        settings.header_timeout_s,
        settings.max_connections_per_peer,
        settings.keepalive_lifetime_s,
        FRONT_PROBES,
        "the front door",
    )
    fakes: list[FakeOllama] = []
    if demo:
        fakes, nodes = await start_demo_nodes()
        settings = replace(settings, nodes=tuple(nodes))
    app = create_app(settings)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, keepalive_timeout=settings.keepalive_timeout_s)
    try:
        await runner.setup()
    except GpuqError as exc:
        log.error("cannot start: %s", exc.message)
        await stop_fakes(fakes)
        return 2
    assert runner.server is not None  # setup() made it
    servers = [
        await loop.create_server(guard.protocol_factory(runner.server), sock=sock, backlog=BACKLOG) for sock in sockets
    ]
    # The Ollama/OpenAI front door, with slots of its own (gpuq/front/listener.py), its calls run
    # through the dispatcher's relay, and the batch routes of OpenAI's and Anthropic's APIs.
    relay = app[DISPATCHER].calls
    assert isinstance(relay, Relay)  # create_app wires the front door's relay
    front = await start_front_door(
        settings,
        app[STORE],
        app[DISPATCHER],
        app[BUS],
        relay,
        front_sockets,
        front_guard,
        more_routes=front_door_routes(app[BATCHES]),
    )
    from ..api.reload import reload_on_signal

    loop.add_signal_handler(signal.SIGHUP, reload_on_signal, runner.app)  # gpuq.toml read again, as `gpuq reload`
    stop = asyncio.Event()
    signals: list[int] = []  # those received, in order

    def on_signal(sig: int) -> None:
        signals.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    if demo:  # a demo node whose stream the stop cuts is no bug of the router's: no traceback
        logging.getLogger("aiohttp.server").addFilter(not_a_cut_stream)
    log.info(
        "gpuq router listening on http://%s (database %s, %d nodes, open-file limit %d, at most %d "
        "connections per listener)",
        settings.listen,
        database_name(settings.database),
        len(settings.nodes),
        file_limit,
        guard.max_connections,
    )
    print(f"gpuq router: {settings.public_url}   queue page: {settings.public_url}/", flush=True)
    if settings.public_url != DEFAULT_ROUTER:  # the CLI finds it from here (its lock); elsewhere, say where
        print(
            f"the CLI elsewhere:  export GPUQ_ROUTER={settings.public_url}   "
            "(gpuq run on this database finds this router by itself)",
            flush=True,
        )
    if front is not None:
        log.info("front door for Ollama and OpenAI clients on %s", front.url)
        print(
            f"front door for Ollama and OpenAI clients:  export OLLAMA_HOST={front.url}   "
            f'(OpenAI SDK: base_url="{front.url}/v1"; Anthropic SDK, Claude Code: '
            f"ANTHROPIC_BASE_URL={front.url})",
            flush=True,
        )
    if fakes:
        named = ", ".join(f"{n.name} ({n.model}, {n.url})" for n in settings.nodes)
        print(f"demo mode: simulated Ollama nodes {named}", flush=True)
        router = "" if settings.public_url == DEFAULT_ROUTER else f" --router {settings.public_url}"
        print(f'try:  {invoked_as()}{router} task "write a haiku about queues" --wait', flush=True)
    await stop.wait()
    runner.app[DISPATCHER].quiesce()  # first: nothing new starts while the rest shuts down
    await drain(runner.app, stop, signals)
    log.info("shutting down")
    if front is not None:  # first: its waiting calls end (their jobs cancelled) while the store is open
        await front.stop()
    for server in servers:
        server.close()  # no new connections; the runner's cleanup ends the open ones
    await runner.cleanup()
    await stop_fakes(fakes)
    return 0


DRAIN_POLL_S = 0.1  # how often a drain looks whether the running jobs have ended
# A running job's reason when a second Ctrl-C or shutdown_grace stops the router at once.
STOPPED_NOW = "the router was stopped before this job finished ({why}); its output so far is kept"


async def drain(app: web.Application, stop: asyncio.Event, signals: list[int]) -> None:
    """Told to stop (and starting nothing new), wait for the running jobs to end on their own:
    their clients get their answers, and waiting jobs stay queued for the next start. A second
    signal stops at once; so does a SIGTERM's shutdown_grace running out. Either way the jobs
    still running fail, saying so, as the stop cuts their requests."""
    from ..api.state import DISPATCHER

    dispatcher = app[DISPATCHER]
    if not dispatcher.running():
        return
    dispatcher.draining_since = time.time()
    first = signals[0] if signals else signal.SIGINT
    stop.clear()
    # As the config says now: a reload (SIGHUP, `gpuq reload`) may have changed it.
    grace = dispatcher.settings.shutdown_grace_s if first == signal.SIGTERM else None
    running = dispatcher.running()
    say(
        f"stopping: no new job starts; waiting for {len(running)} running job(s) to finish "
        "(waiting jobs stay queued for the next start):"
    )
    for line in await running_lines(app, running):
        say(f"  {line}")
    if grace is None:
        say("press Ctrl-C again to stop now (the running jobs then fail)")
    else:
        say(f"stopping now in {grace:g}s if they still run (shutdown_grace); a second signal stops at once")
    deadline = time.monotonic() + grace if grace is not None else None
    why = None
    while dispatcher.running():
        if stop.is_set() or len(signals) > 1:  # (a second signal may have come before the clear above)
            why = "a second Ctrl-C" if signals[-1] == signal.SIGINT else "a second SIGTERM"
            break
        if deadline is not None and time.monotonic() >= deadline:
            why = f"SIGTERM's shutdown_grace of {grace:g}s ran out"
            break
        try:
            async with asyncio.timeout(DRAIN_POLL_S):
                await stop.wait()
        except TimeoutError:
            pass
    if why is None:
        say("stopping: the running jobs have finished")
        return
    left = dispatcher.running()
    say(
        f"stopping now: {len(left)} job(s) will fail ({why}): " + ", ".join(f"{r['job']} on {r['node']}" for r in left),
        logging.WARNING,
    )
    await dispatcher.fail_running(STOPPED_NOW.format(why=why))


async def running_lines(app: web.Application, running: list[dict[str, Any]]) -> list[str]:
    """One line per running job: its id, node, model, how long it has run and, when its node's
    past runs tell, about how long it has left (gpuq/eta.py)."""
    from ..api.state import DISPATCHER, STORE

    rows: dict[str, dict[str, Any]] = {}
    found = {}
    try:
        plans = await app[STORE].queue_plans(sorted({r["node"] for r in running}), 1)
        rows = {r["id"]: r for r in plans if r["state"] == "running"}
        found = await app[DISPATCHER].estimates(plans)
    except GpuqError as exc:  # the database does not answer: the ids and nodes still say enough
        log.warning("the running jobs' details cannot be read: %s", exc.message)
    now = time.time()
    lines = []
    for r in running:
        row = rows.get(r["job"])
        line = f"{r['job']} on {r['node']}"
        if row is not None:
            line += f" ({row['model']}), running {span(now - parse_iso(row['started_at']))}"
        e = found.get(r["job"])
        if e is not None and e.finish_s is not None:
            line += f", about {span(max(e.finish_s - now, 0))} left"
        lines.append(line)
    return lines


def span(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def say(message: str, level: int = logging.INFO) -> None:
    """To the log, on stderr: a service manager's journal, and the terminal of a Ctrl-C."""
    log.log(level, "%s", message)


def not_a_cut_stream(record: logging.LogRecord) -> bool:
    """aiohttp's "Error handling request" for a demo node's stream the router cut: dropped."""
    return not (record.exc_info and isinstance(record.exc_info[1], ConnectionResetError))


async def stop_fakes(fakes: list[FakeOllama]) -> None:
    for fake in fakes:
        await fake.stop()


def run_daemon(
    settings: Settings | None, listen: str | None = None, database: str | None = None, ollama_listen: str | None = None
) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s gpuq %(levelname)s %(message)s")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        return asyncio.run(serve(settings, listen, database, ollama_listen))
    except ConfigError as exc:
        print(f"gpuq: config error: {exc.message}", file=sys.stderr)
        return config_error_exit()
    except GpuqError as exc:
        print(f"gpuq: {exc.message}", file=sys.stderr)
        return exc.exit_code
