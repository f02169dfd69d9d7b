"""`python -m gpuq.demo`: one simulated Ollama node from the command line, the same simulator as
`gpuq serve --demo` and the tests. Run two or three on different ports and point a gpuq.toml at
them for a pretend lab (README: "A pretend lab")."""

from __future__ import annotations

import asyncio
import errno
import signal
import sys

import click

from .catalogue import ModelName
from .server import FakeOllama, Script

# Not Ollama's own 11434 (a real Ollama may hold it), nor the demo front door's 11435.
DEFAULT_LISTEN = "127.0.0.1:11500"
DEFAULT_MODELS = ("llama3.2:latest",)


def _listen(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise click.BadParameter(f"expected host:port (a port from 0 to 65535; 0: any free port), got {value!r}")
    return host.strip("[]"), int(port)


def _models(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for name in value:
        if not ModelName.parse(name).valid:
            raise click.BadParameter(f"{name!r} is not a valid model name")
    return value or DEFAULT_MODELS


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--listen",
    default=DEFAULT_LISTEN,
    show_default=True,
    callback=_listen,
    metavar="HOST:PORT",
    help="Where to answer. Not 11434, which a real Ollama may hold; port 0 takes any free port.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    callback=_models,
    metavar="NAME",
    help="A model this node has, repeatable (default: llama3.2:latest). Its capabilities "
    "(thinking, tools, vision, embedding...) are the library model's, e.g. all-minilm embeds.",
)
@click.option(
    "--token-delay",
    type=click.FloatRange(min=0),
    default=0.08,
    show_default=True,
    metavar="SECONDS",
    help="Between streamed tokens.",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Words in each reply (default: 8 to 24, from the prompt).",
)
@click.option(
    "--thinking-tokens",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Words of a thinking model's reasoning (default: 6 to 16; 0: none).",
)
@click.option(
    "--load-delay",
    type=click.FloatRange(min=0),
    default=0.4,
    show_default=True,
    metavar="SECONDS",
    help="A cold model load, paid by a request whose model is not loaded.",
)
@click.option(
    "--unload-delay",
    type=click.FloatRange(min=0),
    default=0.3,
    show_default=True,
    metavar="SECONDS",
    help='How long an unloaded model stays in /api/ps as "Stopping...".',
)
@click.option("--stuck-unload", is_flag=True, help="Models never leave VRAM once unloaded (a router flags the node).")
@click.option(
    "--context-length",
    type=click.IntRange(min=4),
    default=4096,
    show_default=True,
    metavar="TOKENS",
    help="The server's default num_ctx (Ollama's OLLAMA_CONTEXT_LENGTH).",
)
def main(
    listen: tuple[str, int],
    models: tuple[str, ...],
    token_delay: float,
    tokens: int | None,
    thinking_tokens: int | None,
    load_delay: float,
    unload_delay: float,
    stuck_unload: bool,
    context_length: int,
) -> None:
    """Run one simulated Ollama node: Ollama's HTTP API as its source has it (chat, generate,
    embed, /api/tags, /api/ps, /api/show, load and unload), streaming made-up text at a realistic
    pace. Prints its URL; Ctrl-C stops it."""
    script = Script(
        token_delay_s=token_delay,
        tokens=tokens,
        thinking_tokens=thinking_tokens,
        load_delay_s=load_delay,
        unload="never" if stuck_unload else "delay",
        unload_delay_s=unload_delay,
    )
    fake = FakeOllama(models=set(models), script=script, host=listen[0], context_length=context_length)
    sys.exit(asyncio.run(_serve(fake, listen[1])))


async def _serve(fake: FakeOllama, port: int) -> int:
    try:
        url = await fake.start(port)
    except OSError as exc:
        await fake.stop()
        why = (
            "address already in use (choose another port with --listen)"
            if exc.errno == errno.EADDRINUSE
            else (exc.strerror or str(exc)).lower()
        )
        click.echo(f"cannot listen on {fake.host}:{port}: {why}", err=True)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    click.echo(f"simulated Ollama {fake.version} on {url} with {', '.join(sorted(fake.models))}", nl=True)
    click.echo(f"try:  OLLAMA_HOST={url} ollama list    (Ctrl-C stops it)")
    sys.stdout.flush()
    await stop.wait()
    await fake.stop()
    click.echo("stopped")
    return 0


if __name__ == "__main__":
    main(prog_name="python -m gpuq.demo")
