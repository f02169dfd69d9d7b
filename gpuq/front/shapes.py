"""What the front door's translations share (gpuq/front/ollama_api.py, openai_api.py,
responses.py, anthropic.py): Go's JSON as Ollama writes it, the wrong-type error, numbers,
images, chat messages and tool calls, the text of a node's chunk, and
server-sent events. Pure, no I/O.

Ollama's own server is the reference: server/routes.go for /api, and for /v1 its OpenAI layer
(openai/openai.go, middleware/openai.go), whose shapes, defaults and messages are followed."""

from __future__ import annotations

import base64
import binascii
import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from ..errors import BadRequest, json_type
from ..jobs import compact_json
from ..params import THINK_LEVELS

dumps = compact_json  # as Go's encoder writes it: compact, UTF-8 as is


def now_rfc3339() -> str:
    """Ollama's created_at: UTC, RFC 3339 with nanoseconds."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d)?$")


def unix_of(text: Any) -> int:
    """Seconds since the epoch of an RFC 3339 time (Ollama's created_at, modified_at); now when
    it is missing or unreadable."""
    match = _TIME.match(text) if isinstance(text, str) else None
    if not match:
        return int(time.time())
    zone = match.group(2) or "Z"
    stamp = datetime.fromisoformat(match.group(1) + ("+00:00" if zone == "Z" else zone))
    return int(stamp.timestamp())


# The statuses a client may simply send again: the router was busy or its store could not be
# written (503, nothing was stored), or the client was over a limit (429). Every other refusal
# would be refused again, and a 5xx after a job was stored must not run it twice.
RETRYABLE = frozenset({429, 503})


def should_retry(status: int) -> str:
    """The `x-should-retry` header of a /v1 error: the OpenAI and Anthropic SDKs obey it over
    their own rule (which retries every 5xx, 408 and 409)."""
    return "true" if status in RETRYABLE else "false"


def wrong(field: str, want: str, value: Any) -> BadRequest:
    return BadRequest(f"field '{field}' must be {want}, got {json_type(value)} {json.dumps(value)[:60]}")


def tools_of(body: dict[str, Any]) -> list[Any]:
    """The request's `tools`: an array (or none), as every API's middleware in Ollama checks it."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise wrong("tools", "an array of tools", tools)
    return tools or []


def number(body: dict[str, Any], key: str) -> float | int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong(key, "a number", value)
    return value


def whole(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong(key, "a whole number", value)
    return value


def think_from_effort(effort: Any) -> bool | str | None:
    """OpenAI's reasoning effort as Ollama's think (openai.thinkFromReasoningEffort)."""
    if effort in (None, ""):
        return None
    if effort == "none":
        return False
    if effort == "minimal":
        return "low"
    if isinstance(effort, str) and effort in THINK_LEVELS:
        return effort
    if effort in ("xhigh", "ultra"):
        return "max"
    raise BadRequest(
        f'invalid reasoning value: {json.dumps(effort)[:60]} (must be "minimal", "low", '
        '"medium", "high", "xhigh", "ultra", "max", or "none")'
    )


def image_of(url: Any) -> str:
    """A data: URL's base64 (Ollama takes images as base64 only)."""
    if not isinstance(url, str):
        raise BadRequest("invalid message format")
    if url.startswith(("http://", "https://")):
        raise BadRequest("image URLs are not currently supported, please use base64 encoded data instead")
    for prefix in ("data:;base64,", *(f"data:image/{t};base64," for t in ("jpeg", "jpg", "png", "webp"))):
        if url.startswith(prefix):
            data = url[len(prefix) :]
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                break
            return data
    raise BadRequest("invalid image input")


def message(role: str, content: str = "", **extra: Any) -> dict[str, Any]:
    """A chat message in Ollama's terms; empty extras left out."""
    out: dict[str, Any] = {"role": role, "content": content}
    out.update({k: v for k, v in extra.items() if v})
    return out


def chunk_text(chunk: dict[str, Any]) -> tuple[str, str, list[Any]]:
    """(answer, reasoning, tool calls) in one chunk of /api/chat or /api/generate."""
    message = chunk.get("message")
    if isinstance(message, dict):
        return message.get("content") or "", message.get("thinking") or "", message.get("tool_calls") or []
    return chunk.get("response") or "", chunk.get("thinking") or "", chunk.get("tool_calls") or []


def tool_calls_out(calls: list[Any]) -> list[dict[str, Any]]:
    """Ollama tool calls as OpenAI's (arguments as a JSON string)."""
    out = []
    for call in calls:
        function = call.get("function") or {}
        out.append(
            {
                "id": call.get("id", ""),
                "index": function.get("index", 0),
                "type": "function",
                "function": {"name": function.get("name", ""), "arguments": dumps(function.get("arguments", {}))},
            }
        )
    return out


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj).encode() + b"\n\n"


def sse_event(kind: str, obj: Any) -> bytes:
    """A named server-sent event (the Responses and Messages streams name each one)."""
    return f"event: {kind}\n".encode() + sse(obj)


SSE_DONE = b"data: [DONE]\n\n"
