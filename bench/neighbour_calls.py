"""What the `neighbours` section sends and reads: one streamed chat call through a router's
OpenAI `/v1/chat/completions` (server-sent events) or Ollama's `/api/chat` (NDJSON), timed token
by token; and what it reads off the simulated node's request log (the most generations at once,
when a request ended)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import aiohttp

from .neighbour_procs import MODEL


@dataclass
class Call:
    """One streamed call as the client saw it."""

    sent: float  # monotonic
    tokens: list[float] = field(default_factory=list)  # each content chunk's arrival
    status: int = 0
    error: str = ""

    @property
    def first_ms(self) -> float:
        return (self.tokens[0] - self.sent) * 1000


def token_of(line: bytes, openai: bool) -> str | None:
    """The text a stream line carries ("" for none), or None at the stream's end marker. Raises
    on an error line: a failed call must not be counted as an answer."""
    text = line.strip().decode()
    if openai:
        if not text.startswith("data:"):
            return ""
        text = text[len("data:") :].strip()
        if text == "[DONE]":
            return None
    if not text:
        return ""
    chunk = json.loads(text)
    if "error" in chunk:
        raise RuntimeError(f"stream failed: {chunk['error']}")
    if openai:
        choices = chunk.get("choices") or [{}]
        return (choices[0].get("delta") or {}).get("content") or ""
    return (chunk.get("message") or {}).get("content") or ""


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    prompt: str,
    openai: bool = True,
    headers: dict[str, str] | None = None,
    stop_after: int | None = None,
) -> Call:
    """POST a streamed chat to `url` (a router's or the node's base URL) and read it to the end,
    or until `stop_after` tokens, then close the connection (a client that leaves)."""
    path = "/v1/chat/completions" if openai else "/api/chat"
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True}
    call = Call(time.monotonic())
    async with session.post(url + path, json=body, headers=headers or {}) as resp:
        call.status = resp.status
        if resp.status != 200:
            call.error = (await resp.text())[:300]
            return call
        async for raw in resp.content:
            token = token_of(raw, openai)
            if token is None:
                break
            if token:
                call.tokens.append(time.monotonic())
                if stop_after is not None and len(call.tokens) >= stop_after:
                    resp.close()  # the client leaves mid-stream
                    break
    return call


def most_at_once(log: list[tuple[str, float, float, bool]], since: float) -> int:
    """The most generation requests the node was serving at the same moment (from its log of
    arrival and end times), among those that arrived after `since`."""
    edges = []
    for _path, arrive, end, generation in log:
        if generation and arrive >= since:
            edges += [(arrive, 1), (end, -1)]
    best = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before an arrival at a tie
        now += step
        best = max(best, now)
    return best


def generations(log: list[tuple[str, float, float, bool]], since: float) -> list[tuple[float, float]]:
    """(arrival, end) of each generation request that arrived after `since`, in arrival order."""
    return sorted((e[1], e[2]) for e in log if e[3] and e[1] >= since)
