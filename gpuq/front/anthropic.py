"""Anthropic's Messages API (POST /v1/messages) on the front door, as Ollama serves it: pure
translations of a request to the /api/chat body its node gets, and of the node's chat chunks to
the Messages event stream or the one `message`. No I/O.

Ollama's source is the reference: anthropic/anthropic.go (NewError, FromMessagesRequest,
convertMessage, ToMessagesResponse, StreamConverter, EstimateInputTokens) and
middleware/anthropic.go (AnthropicMessagesMiddleware, AnthropicWriter). Ollama runs the
web_search server tool through ollama.com; gpuq leaves Anthropic's server tools out (SERVER_TOOLS)."""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from typing import Any

from ..errors import BadRequest
from ..params import THINK_LEVELS
from . import shapes

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body, its type from the status (anthropic.NewError)."""
    return {
        "type": "error",
        "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message},
        "request_id": f"req_{secrets.token_hex(12)}",
    }


# -- the request -> /api/chat -------------------------------------------------------------------


def _image(source: Any) -> str:
    """A base64 image source's data (resolveImageSource); Ollama takes no URLs."""
    if not isinstance(source, dict):
        raise BadRequest("invalid image source")
    if source.get("type") != "base64":
        raise BadRequest(f"invalid image source type: {source.get('type') or ''}. Only base64 images are supported.")
    try:
        base64.b64decode(source.get("data") or "", validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"invalid base64 image data: {exc}") from None
    return source.get("data") or ""


def _tool_result(content: Any) -> tuple[str, list[str]]:
    """A tool_result's content as text and images (convertToolResultContent)."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        return "", []
    text, images = "", []
    for block in content:
        if not isinstance(block, dict):
            continue
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            text += block["text"]
        elif block.get("type") == "image":
            if not isinstance(block.get("source"), dict):
                raise BadRequest("invalid tool_result image source")
            images.append(_image(block["source"]))
    return text, images


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):  # a plain string is one text block (MessageParam.UnmarshalJSON)
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise shapes.wrong(f"{where}.content", "a string or an array of content blocks", content)
    return content


def convert_message(msg: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (convertMessage): its text, images, tool_use and
    thinking in one message; each tool_result a tool message, before it for a user's."""
    role = str(msg.get("role") or "").lower()
    text, images, calls, thinking, results = "", [], [], "", []
    for block in _blocks(msg.get("content"), where):
        kind = block.get("type")
        if kind == "text":
            text += block.get("text") or ""
        elif kind == "image":
            if block.get("source") is None:
                raise BadRequest("invalid image source")
            images.append(_image(block["source"]))
        elif kind in ("tool_use", "server_tool_use"):
            if kind == "tool_use" and not block.get("id"):
                raise BadRequest("tool_use block missing required 'id' field")
            if kind == "tool_use" and not block.get("name"):
                raise BadRequest("tool_use block missing required 'name' field")
            calls.append(
                {
                    "id": block.get("id") or "",
                    "function": {"name": block.get("name") or "", "arguments": block.get("input") or {}},
                }
            )
        elif kind == "tool_result":
            result, result_images = _tool_result(block.get("content"))
            results.append(shapes.message("tool", result, images=result_images, tool_call_id=block.get("tool_use_id")))
        elif kind == "thinking":
            thinking = block.get("thinking") or thinking
        # other blocks (redacted_thinking, documents, web search results) are skipped, as Ollama does
    out = results if role == "user" else []
    if text or images or calls or thinking:
        out.append(shapes.message(role, text, images=images, tool_calls=calls, thinking=thinking))
    return out if role == "user" else out + results


def _system(system: Any) -> str:
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "".join(
            b["text"]
            for b in system
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return ""


# Anthropic's server tools, which Anthropic's own servers run (Claude Code's WebSearch sends
# web_search_20250305): no server here runs them, so the model is not offered them (Ollama runs
# web search through ollama.com, which a lab does not have) and the turn goes on without them.
SERVER_TOOLS = ("web_search_", "web_fetch_", "code_execution_", "tool_search_tool_")


def is_server_tool(tool: dict[str, Any]) -> bool:
    return str(tool.get("type") or "").startswith(SERVER_TOOLS)


def _tool(tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise shapes.wrong("tools[]", "an object", tool)
    schema = tool.get("input_schema")
    if schema is not None and not isinstance(schema, dict):
        raise BadRequest(f"invalid input_schema for tool {json.dumps(tool.get('name'))}: must be an object")
    function: dict[str, Any] = {"name": tool.get("name") or "", "description": tool.get("description") or ""}
    if schema is not None:
        function["parameters"] = schema
    return {"type": "function", "function": function}


def _think(body: dict[str, Any]) -> bool | str | None:
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "disabled"):
        return bool(thinking["type"] == "enabled")
    config = body.get("output_config")
    effort = str(config.get("effort") or "").strip().lower() if isinstance(config, dict) else ""
    effort = "high" if effort == "xhigh" else effort
    return effort if effort in THINK_LEVELS else None


def messages_request(body: dict[str, Any]) -> dict[str, Any]:
    """A /v1/messages body as the /api/chat body Ollama makes of it (AnthropicMessagesMiddleware,
    FromMessagesRequest), with its checks and messages."""
    max_tokens, messages = _required(body)
    out: dict[str, Any] = {
        "model": body["model"],
        "messages": _chat_messages(body, messages),
        "options": _options(body, max_tokens),
        "stream": bool(body.get("stream")),
    }
    if offered := _offered_tools(body):
        out["tools"] = offered
    think = _think(body)
    if think is not None:
        out["think"] = think
    return out


def _required(body: dict[str, Any]) -> tuple[int, list[Any]]:
    """Check a Messages request's model, max_tokens, messages and stream, in the order Ollama
    checks them; returns its max_tokens and its messages."""
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise shapes.wrong("model", "a string", body["model"])
    if not body.get("model"):
        raise BadRequest("model is required")
    max_tokens = shapes.whole(body, "max_tokens")
    if max_tokens is None or max_tokens <= 0:
        raise BadRequest("max_tokens is required and must be positive")
    messages = body.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise shapes.wrong("messages", "an array of messages", messages)
    if not messages:
        raise BadRequest("messages is required")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise shapes.wrong("stream", "true or false", body["stream"])
    return max_tokens, messages


def _chat_messages(body: dict[str, Any], messages: list[Any]) -> list[dict[str, Any]]:
    """The system prompt (if any) as the first chat message, then each message's (convert_message)."""
    out = [{"role": "system", "content": system}] if (system := _system(body.get("system"))) else []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise shapes.wrong(f"messages[{i}]", "an object", msg)
        out += convert_message(msg, f"messages[{i}]")
    return out


def _options(body: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The sampling fields as Ollama's options."""
    options: dict[str, Any] = {"num_predict": max_tokens}
    for key, option in (("temperature", "temperature"), ("top_p", "top_p")):
        if (value := shapes.number(body, key)) is not None:
            options[option] = value
    if (top_k := shapes.whole(body, "top_k")) is not None:
        options["top_k"] = top_k
    stops = body.get("stop_sequences")
    if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
        raise shapes.wrong("stop_sequences", "an array of strings", stops)
    if stops:
        options["stop"] = stops
    return options


def _offered_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The tools the model is offered: the request's own, its server tools left out (SERVER_TOOLS)."""
    return [_tool(t) for t in shapes.tools_of(body) if not (isinstance(t, dict) and is_server_tool(t))]


def relaxes_thinking(endpoint: str, think: Any, status: int | None, message: str) -> bool:
    """Whether a node's refusal is one Ollama does not make for this API: asked to think, a model
    that cannot is answered without thinking on /v1/messages (routes.go ChatHandler relax_thinking)."""
    return (
        endpoint == "/v1/messages"
        and think not in (None, False)
        and status == 400
        and message.endswith("does not support thinking")
    )


def estimate_input_tokens(body: dict[str, Any]) -> int:
    """message_start's input tokens before the node has counted them: about 4 characters a token
    (EstimateCountTokens)."""

    def size(content: Any) -> int:
        if isinstance(content, str):
            return len(content)
        total = 0
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            total += len(block.get("text") or "") + len(block.get("thinking") or "")
            if block.get("type") in ("tool_use", "tool_result"):
                total += len(shapes.dumps(block))
        return total

    total = size(body.get("system"))
    for msg in body.get("messages") or []:
        if isinstance(msg, dict):
            total += len(str(msg.get("role") or "")) + size(msg.get("content"))
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            total += len(tool.get("name") or "") + len(tool.get("description") or "")
            total += len(shapes.dumps(tool["input_schema"])) if tool.get("input_schema") is not None else 0
    tokens = total // 4
    return tokens or (1 if body.get("messages") or body.get("system") is not None else 0)


# -- the node's chunks -> the message ---------------------------------------------------------------


def stop_reason(done_reason: str | None, has_tool_calls: bool) -> str | None:
    """Ollama's done_reason as a stop_reason (mapStopReason)."""
    if has_tool_calls:
        return "tool_use"
    if not done_reason:
        return None
    return {"stop": "end_turn", "length": "max_tokens"}.get(done_reason, "stop_sequence")


def _without_none(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if v is not None}


def whole_message(message_id: str, reply: dict[str, Any]) -> dict[str, Any]:
    """stream:false: the collected chat reply as one message (ToMessagesResponse)."""
    message = reply.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("thinking"):
        content.append({"type": "thinking", "thinking": message["thinking"]})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    calls = message.get("tool_calls") or []
    content += [_tool_use(c) for c in calls]
    return _without_none(
        {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": reply.get("model", ""),
            "content": content,
            "stop_reason": stop_reason(reply.get("done_reason"), bool(calls)),
            "usage": _usage(reply),
        }
    )


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    """An Ollama tool call as a tool_use block."""
    function = call.get("function") or {}
    return {
        "type": "tool_use",
        "id": call.get("id", ""),
        "name": function.get("name", ""),
        "input": function.get("arguments") or {},
    }


def _usage(reply: dict[str, Any]) -> dict[str, Any]:
    return {"input_tokens": reply.get("prompt_eval_count") or 0, "output_tokens": reply.get("eval_count") or 0}


class MessagesStream:
    """Chat chunks -> Messages events (StreamConverter.Process): message_start first, then
    content blocks in order (thinking, text, each tool_use whole), message_delta with the stop
    reason and usage, message_stop. Ollama sends no ping, so neither does gpuq."""

    def __init__(self, message_id: str, model: str, estimated_input_tokens: int):
        self.id, self.model, self.estimate = message_id, model, estimated_input_tokens
        self.started = False
        self.index = 0
        self.thinking = "no"  # no | open | closed
        self.text_open = False
        self.calls_sent: set[str] = set()

    def _start(self, chunk: dict[str, Any]) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        tokens = chunk.get("prompt_eval_count") or self.estimate
        return [
            shapes.sse_event(
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": self.id,
                        "type": "message",
                        "role": "assistant",
                        "model": self.model,
                        "content": [],
                        "usage": {"input_tokens": tokens, "output_tokens": 0},
                    },
                },
            )
        ]

    def _stop_block(self) -> bytes:
        data = shapes.sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index})
        self.index += 1
        return data

    def _block(self, block: dict[str, Any], delta: dict[str, Any]) -> list[bytes]:
        return [
            shapes.sse_event(
                "content_block_start", {"type": "content_block_start", "index": self.index, "content_block": block}
            ),
            self._delta(delta),
        ]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return shapes.sse_event(
            "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}
        )

    def _close_text(self) -> list[bytes]:
        if not self.text_open:
            return []
        self.text_open = False
        return [self._stop_block()]

    def _think(self, thinking: str) -> list[bytes]:
        out = self._close_text()
        delta = {"type": "thinking_delta", "thinking": thinking}
        if self.thinking == "no":
            self.thinking = "open"
            return out + self._block({"type": "thinking", "thinking": ""}, delta)
        return out + [self._delta(delta)]

    def _close_thinking(self) -> list[bytes]:
        if self.thinking != "open":
            return []
        self.thinking = "closed"
        return [self._stop_block()]

    def _say(self, text: str) -> list[bytes]:
        out = self._close_thinking()
        delta = {"type": "text_delta", "text": text}
        if not self.text_open:
            self.text_open = True
            return out + self._block({"type": "text", "text": ""}, delta)
        return out + [self._delta(delta)]

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        out = self._close_thinking() + self._close_text()
        block = _tool_use(call)
        out += self._block(
            dict(block, input={}), {"type": "input_json_delta", "partial_json": shapes.dumps(block["input"])}
        )
        out.append(self._stop_block())
        self.calls_sent.add(call.get("id", ""))
        return out

    def _finish(self, chunk: dict[str, Any]) -> list[bytes]:
        out = self._close_thinking() + self._close_text()
        reason = stop_reason(chunk.get("done_reason"), bool(self.calls_sent))
        out.append(
            shapes.sse_event(
                "message_delta",
                {"type": "message_delta", "delta": _without_none({"stop_reason": reason}), "usage": _usage(chunk)},
            )
        )
        out.append(shapes.sse_event("message_stop", {"type": "message_stop"}))
        return out

    def feed(self, chunk: dict[str, Any]) -> bytes:
        content, thinking, calls = shapes.chunk_text(chunk)
        out = self._start(chunk)
        if thinking and self.thinking != "closed":
            out += self._think(thinking)
        if content:
            out += self._say(content)
        for call in calls:
            if call.get("id", "") not in self.calls_sent:
                out += self._call(call)
        if chunk.get("done"):
            out += self._finish(chunk)
        return b"".join(out)

    def error(self, status: int, message: str, code: str | None = None) -> bytes:
        """The stream ends with Anthropic's error event, which its SDK raises."""
        body = anthropic_error(status, message)
        return shapes.sse_event("error", {"type": "error", "error": body["error"]})
