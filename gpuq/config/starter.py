"""The gpuq.toml `gpuq init` writes."""

from __future__ import annotations

from .settings import DEFAULT_LISTEN


def starter_config() -> str:
    """The file `gpuq init` writes: the settings a new lab changes first, each with a comment
    (gpuq.toml.example has every setting)."""
    return f'''# gpuq.toml, written by `gpuq init`. Every setting, with its default and its limits, is in
# gpuq.toml.example. Durations are strings like "90s", "10m", "1h30m".

[router]
# Where the router listens. Loopback: only this machine. To serve your tailnet, use this
# machine's Tailscale address (100.x.y.z:8750), and set a token below.
listen = "{DEFAULT_LISTEN}"
# Base of the preview links the router hands back (and the CLI's default router).
public_url = "http://{DEFAULT_LISTEN}"
# The SQLite file (relative to this file); `sqlite3 gpuq.db` for forensics.
database = "gpuq.db"
# A running job with no new token for this long makes /health red (a stale queue head).
stale_after = "10m"
# The front door: Ollama's and OpenAI's own HTTP API on this address, so `ollama`, `openai`,
# Open WebUI or an editor send their work through gpuq (OLLAMA_HOST=http://127.0.0.1:11435).
ollama_listen = "127.0.0.1:11435"
# A shared secret every client must send (the CLI reads $GPUQ_TOKEN; the front door takes it as
# a Bearer token). Set one before listening on anything but loopback, e.g. the output of
# `python3 -c "import secrets; print(secrets.token_urlsafe(32))"`.
# token = "..."

# One [[node]] per machine running Ollama. rank orders task placement (1 first); roles are
# "task" (long work, the first free node by rank) and "critique" (reviews, on every critique
# node at once, never on the reviewed task's node).
[[node]]
name = "node-1"
url = "http://node-1:11434"
rank = 1
roles = ["task", "critique"]
model = "qwen3-coder:30b"

[[node]]
name = "node-2"
url = "http://node-2:11434"
rank = 2
roles = ["critique"]
model = "deepseek-r1:32b"
'''
