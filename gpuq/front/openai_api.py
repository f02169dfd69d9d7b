"""OpenAI's chat, completions, embeddings and models on the front door, as Ollama's OpenAI layer
serves them (openai/openai.go, middleware/openai.go): a /v1 request -> the Ollama body its node
gets, the node's chunks -> chat.completion(.chunk) and text_completion events, the one reply
of stream:false, the embeddings list, the model list, and OpenAI's error body. Pure, no I/O."""

from __future__ import annotations

import base64
import json
import struct
import time
from typing import Any

from ..errors import BadRequest, NotFound, json_type
from .shapes import (
    SSE_DONE,
    chunk_text,
    image_of,
    message,
    number,
    sse,
    think_from_effort,
    tool_calls_out,
    tools_of,
    unix_of,
    whole,
    wrong,
)


def openai_error(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """openai.NewError: the type follows the status; `code` is gpuq's own for its refusals."""
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    if status == 401:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def _openai_stop(stop: Any, strict: bool) -> list[str] | None:
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        if strict and not all(isinstance(s, str) for s in stop):
            bad = next(s for s in stop if not isinstance(s, str))
            raise BadRequest(f"invalid type for 'stop' field: {json_type(bad)}")
        return [s for s in stop if isinstance(s, str)]
    return None


def _tool_calls_in(calls: Any) -> list[dict[str, Any]]:
    """OpenAI tool calls (arguments as a JSON string) -> Ollama's (arguments as an object)."""
    if not isinstance(calls, list):
        raise BadRequest("invalid message format")
    out = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise BadRequest("invalid message format")
        try:
            arguments = json.loads(function.get("arguments") or "")
        except (TypeError, ValueError):
            raise BadRequest("invalid tool call arguments") from None
        item: dict[str, Any] = {"function": {"name": function.get("name", ""), "arguments": arguments}}
        if call.get("id"):
            item["id"] = call["id"]
        out.append(item)
    return out


def _tool_name(messages: list[Any], msg: dict[str, Any]) -> Any:
    """A tool message's tool: its `name`, else the name of the call it answers (by id), each as
    the client sent it; "" for a message that is no tool's."""
    if str(msg.get("role", "")).lower() != "tool":
        return ""
    if msg.get("name"):
        return msg["name"]
    for earlier in reversed(messages):  # the call this result answers (last one wins)
        for call in earlier.get("tool_calls") or [] if isinstance(earlier, dict) else []:
            if isinstance(call, dict) and call.get("id") == msg.get("tool_call_id"):
                return (call.get("function") or {}).get("name", "")
    return ""


def openai_messages(messages: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest("invalid message format")
        role, content = msg["role"], msg.get("content")
        name = _tool_name(messages, msg)
        calls = _tool_calls_in(msg["tool_calls"]) if msg.get("tool_calls") else []
        if isinstance(content, str):
            out.append(
                message(
                    role,
                    content,
                    thinking=msg.get("reasoning"),
                    tool_calls=calls,
                    tool_name=name,
                    tool_call_id=msg.get("tool_call_id"),
                )
            )
        elif isinstance(content, list):
            out += [_part_message(role, part) for part in content]  # a message each, as Ollama does
            if out and calls:
                out[-1].update(
                    message(
                        role,
                        out[-1].get("content", ""),
                        tool_calls=calls,
                        tool_name=name,
                        tool_call_id=msg.get("tool_call_id"),
                        thinking=msg.get("reasoning"),
                    )
                )
        elif calls:  # content is optional only beside tool calls
            out.append(
                message(role, thinking=msg.get("reasoning"), tool_calls=calls, tool_call_id=msg.get("tool_call_id"))
            )
        else:
            raise BadRequest(f"invalid message content type: {json_type(content)}")
    return out


def _part_message(role: str, part: Any) -> dict[str, Any]:
    """One part of a message's content (text, an image, audio) as a message of its own."""
    if not isinstance(part, dict):
        raise BadRequest("invalid message format")
    if part.get("type") == "text":
        if not isinstance(part.get("text"), str):
            raise BadRequest("invalid message format")
        return message(role, part["text"])
    if part.get("type") == "image_url":
        ref = part.get("image_url")
        return message(role, images=[image_of(ref.get("url") if isinstance(ref, dict) else ref)])
    if part.get("type") == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
            raise BadRequest("invalid input_audio format")
        return message(role, images=[audio["data"]])
    raise BadRequest("invalid message format")


def _openai_options(body: dict[str, Any], strict_stop: bool) -> dict[str, Any]:
    options: dict[str, Any] = {}
    stop = _openai_stop(body.get("stop"), strict_stop)
    if stop is not None:
        options["stop"] = stop
    max_tokens = whole(body, "max_tokens")
    if max_tokens is None:  # the newer name, which Ollama's layer does not read yet
        max_tokens = whole(body, "max_completion_tokens")
    if max_tokens is not None:
        options["num_predict"] = max_tokens
    temperature = number(body, "temperature")
    options["temperature"] = 1.0 if temperature is None else temperature
    for key in ("seed",):
        if (value := whole(body, key)) is not None:
            options[key] = value
    for key in ("frequency_penalty", "presence_penalty"):
        if (penalty := number(body, key)) is not None:
            options[key] = penalty
    top_p = number(body, "top_p")
    options["top_p"] = 1.0 if top_p is None or top_p == 0 else top_p
    return options


def openai_chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A /v1/chat/completions body as the /api/chat body Ollama's own layer makes of it."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise BadRequest("model is required")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise wrong("messages", "an array of messages", messages)
    if not messages:
        raise BadRequest("[] is too short - 'messages'")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise wrong("stream", "true or false", body["stream"])
    out: dict[str, Any] = {
        "model": body["model"],
        "messages": openai_messages(messages),
        "options": _openai_options(body, strict_stop=False),
        "stream": bool(body.get("stream")),
    }
    if (fmt := _format_of(body.get("response_format"))) is not None:
        out["format"] = fmt
    if body.get("tools") is not None:
        out["tools"] = tools_of(body)
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else body.get("reasoning_effort")
    think = think_from_effort(effort)
    if think is not None:
        out["think"] = think
    if body.get("logprobs"):
        out["logprobs"] = True
        if isinstance(body.get("top_logprobs"), int) and body["top_logprobs"]:
            out["top_logprobs"] = body["top_logprobs"]
    return out


def _format_of(response_format: Any) -> Any:
    """A chat's response_format as Ollama's format: "json", a JSON schema, or None (none asked,
    or a type Ollama's layer ignores)."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise wrong("response_format", "an object", response_format)
    kind = str(response_format.get("type", "")).strip().lower()
    if kind == "json_object":
        return "json"
    if kind == "json_schema" and isinstance(response_format.get("json_schema"), dict):
        return response_format["json_schema"].get("schema")
    return None


def openai_completion_request(body: dict[str, Any]) -> dict[str, Any]:
    """A /v1/completions body as /api/generate (openai.FromCompleteRequest)."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise NotFound(f"model '{body.get('model') or ''}' not found")
    if body.get("prompt") is not None and not isinstance(body["prompt"], str):
        raise wrong("prompt", "a string", body["prompt"])
    options = _openai_options(body, strict_stop=True)
    options.setdefault("frequency_penalty", 0)
    options.setdefault("presence_penalty", 0)
    out: dict[str, Any] = {
        "model": body["model"],
        "prompt": body.get("prompt") or "",
        "options": options,
        "stream": bool(body.get("stream")),
    }
    if body.get("suffix"):
        out["suffix"] = body["suffix"]
    if isinstance(body.get("logprobs"), int) and not isinstance(body["logprobs"], bool) and body["logprobs"] > 0:
        out["logprobs"] = True
        out["top_logprobs"] = body["logprobs"]
    return out


def openai_embed_request(body: dict[str, Any]) -> dict[str, Any]:
    """A /v1/embeddings body as /api/embed (middleware.EmbeddingsMiddleware)."""
    fmt = body.get("encoding_format")
    if fmt not in (None, "") and str(fmt).lower() not in ("float", "base64"):
        raise BadRequest(f"Invalid value for 'encoding_format' = {fmt}. Supported values: ['float', 'base64'].")
    given = body.get("input")
    if given == "":
        given = [""]
    if (
        given is None
        or given == []
        or not (isinstance(given, str) or (isinstance(given, list) and all(isinstance(i, str) for i in given)))
    ):
        raise BadRequest("invalid input")
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise NotFound(f"model '{body.get('model') or ''}' not found")
    out: dict[str, Any] = {"model": body["model"], "input": given}
    dims = body.get("dimensions")
    if isinstance(dims, int) and not isinstance(dims, bool) and dims > 0:
        out["dimensions"] = dims
    return out


def usage_of(chunk: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = chunk.get("prompt_eval_count") or 0, chunk.get("eval_count") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_completion(completion_id: str, reply: dict[str, Any]) -> dict[str, Any]:
    """A collected /api/chat reply as a chat.completion."""
    message = reply.get("message") or {}
    calls = tool_calls_out(message.get("tool_calls") or [])
    reason = reply.get("done_reason") or None
    if reason == "stop" and calls:
        reason = "tool_calls"
    out_message: dict[str, Any] = {"role": message.get("role", "assistant"), "content": message.get("content", "")}
    if message.get("thinking"):
        out_message["reasoning"] = message["thinking"]
    if calls:
        out_message["tool_calls"] = calls
    choice: dict[str, Any] = {"index": 0, "message": out_message, "finish_reason": reason}
    if reply.get("logprobs"):
        choice["logprobs"] = {"content": reply["logprobs"]}
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": unix_of(reply.get("created_at")),
        "model": reply.get("model", ""),
        "system_fingerprint": "fp_ollama",
        "choices": [choice],
        "usage": usage_of(reply),
    }


class ChatStream:
    """/api/chat chunks -> chat.completion.chunk events (middleware.ChatWriter): the role on the
    first, reasoning and content split when one chunk has both, the finish reason on a chunk of
    its own, usage when asked, then [DONE]."""

    def __init__(self, completion_id: str, include_usage: bool = False):
        self.id = completion_id
        self.include_usage = include_usage
        self.created: int | None = None
        self.first_sent = False
        self.tool_call_sent = False

    def _chunk(
        self, model: str, delta: dict[str, Any], finish_reason: str | None = None, logprobs: Any = None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        if logprobs:
            choice["logprobs"] = {"content": logprobs}
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": model,
            "system_fingerprint": "fp_ollama",
            "choices": [choice],
        }

    def feed(self, chunk: dict[str, Any]) -> bytes:
        if self.created is None:
            self.created = unix_of(chunk.get("created_at"))
        model = chunk.get("model", "")
        content, thinking, calls = chunk_text(chunk)
        logprobs = chunk.get("logprobs")
        done = bool(chunk.get("done"))
        out = []
        empty_trailer = done and self.first_sent and not (content or thinking or calls or logprobs)
        if not empty_trailer:
            role = {} if self.first_sent else {"role": "assistant"}
            tool_calls = tool_calls_out(calls)
            if thinking and (content or tool_calls):  # one chunk each, as OpenAI never mixes them
                out.append(self._chunk(model, {**role, "reasoning": thinking}, logprobs=logprobs))
                delta: dict[str, Any] = {"content": content}
                if tool_calls:
                    delta["tool_calls"] = tool_calls
                out.append(self._chunk(model, delta))
            else:
                delta = {**role, "content": content}
                if thinking:
                    delta["reasoning"] = thinking
                if tool_calls:
                    delta["tool_calls"] = tool_calls
                out.append(self._chunk(model, delta, logprobs=logprobs))
            self.tool_call_sent = self.tool_call_sent or bool(tool_calls)
            self.first_sent = True
        if done:
            reason = chunk.get("done_reason") or "stop"
            if reason == "stop" and self.tool_call_sent:
                reason = "tool_calls"
            finish = self._chunk(model, {}, reason)
            out.append(finish)
            if self.include_usage:
                out.append({**finish, "choices": [], "usage": usage_of(chunk)})
        data = b"".join(sse(c) for c in out)
        return data + SSE_DONE if done else data

    def error(self, status: int, message: str, code: str | None = None) -> bytes:
        """The stream ends with OpenAI's error object, which the OpenAI SDK raises."""
        return sse(openai_error(status, message, code))


def text_completion(completion_id: str, reply: dict[str, Any]) -> dict[str, Any]:
    """A collected /api/generate reply as a text_completion (openai.ToCompletion)."""
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": unix_of(reply.get("created_at")),
        "model": reply.get("model", ""),
        "system_fingerprint": "fp_ollama",
        "choices": [{"text": reply.get("response", ""), "index": 0, "finish_reason": reply.get("done_reason") or None}],
        "usage": usage_of(reply),
    }


class CompletionStream:
    """/api/generate chunks -> text_completion events (middleware.CompleteWriter)."""

    def __init__(self, completion_id: str, include_usage: bool = False):
        self.id = completion_id
        self.include_usage = include_usage

    def feed(self, chunk: dict[str, Any]) -> bytes:
        event: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": int(time.time()),
            "choices": [
                {"text": chunk.get("response", ""), "index": 0, "finish_reason": chunk.get("done_reason") or None}
            ],
            "model": chunk.get("model", ""),
            "system_fingerprint": "fp_ollama",
        }
        if self.include_usage:
            event["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        data = sse(event)
        if not chunk.get("done"):
            return data
        if self.include_usage:
            data += sse({**event, "choices": [], "usage": usage_of(chunk)})
        return data + SSE_DONE

    error = ChatStream.error


def _base64_floats(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def embedding_list(model: str, reply: dict[str, Any], encoding_format: Any = None) -> dict[str, Any]:
    """An /api/embed reply as /v1/embeddings' list (openai.ToEmbeddingList)."""
    as_base64 = str(encoding_format or "").lower() == "base64"
    data = [
        {"object": "embedding", "embedding": _base64_floats(e) if as_base64 else e, "index": i}
        for i, e in enumerate(reply.get("embeddings") or [])
    ]
    tokens = reply.get("prompt_eval_count") or 0
    return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def owned_by(name: str) -> str:
    """The namespace of a model name (types/model ParseName): 'library' for plain names."""
    if name.rfind(":") > name.rfind("/"):
        name = name[: name.rfind(":")]
    parts = name.split("/")
    return parts[-2] if len(parts) >= 2 else "library"


def model_list(tags: list[dict[str, Any]]) -> dict[str, Any]:
    """/api/tags as /v1/models (openai.ToListCompletion)."""
    data = []
    for m in tags:
        ident = m.get("model") or m.get("name") or ""
        data.append(
            {"id": ident, "object": "model", "created": unix_of(m.get("modified_at")), "owned_by": owned_by(ident)}
        )
    return {"object": "list", "data": data}


def model_card(name: str, show: dict[str, Any]) -> dict[str, Any]:
    """/api/show as /v1/models/{model} (openai.ToModel)."""
    return {"id": name, "object": "model", "created": unix_of(show.get("modified_at")), "owned_by": owned_by(name)}
