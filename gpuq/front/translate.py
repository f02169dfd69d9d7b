"""Pure translations for the front door (gpuq/front/listener.py): a client's Ollama or OpenAI request ->
the job it becomes -> the request its node gets -> the reply in the client's own API. No I/O.

Ollama's own server is the reference: server/routes.go for /api, and for /v1 its OpenAI layer
(openai/openai.go, middleware/openai.go), whose shapes, defaults and messages are followed here."""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
import time
from datetime import datetime, timezone
from typing import Any, Iterable

from ..errors import BadRequest, NotFound
from ..models import compact_json
from ..params import merged_options, options_problem

# The routes whose calls become jobs, and the Ollama route each one runs on its node.
NODE_ROUTE = {
    "/api/chat": "/api/chat",
    "/api/generate": "/api/generate",
    "/api/embed": "/api/embed",
    "/api/embeddings": "/api/embeddings",
    "/v1/chat/completions": "/api/chat",
    "/v1/completions": "/api/generate",
    "/v1/embeddings": "/api/embed",
    "/v1/responses": "/api/chat",  # OpenAI's Responses API (gpuq/front/responses.py)
    "/v1/messages": "/api/chat",  # Anthropic's Messages API (gpuq/front/anthropic.py)
}
CHAT_SHAPED = ("/v1/responses", "/v1/messages")  # their own shapes of a chat, translated to one
EMBED_ROUTES = ("/api/embed", "/api/embeddings", "/v1/embeddings")
STREAMED_ROUTES = ("/api/chat", "/api/generate")  # on the node: the others answer one object


def kind_of(endpoint: str) -> str:
    """The job kind a front-door call becomes."""
    return "embed" if endpoint in EMBED_ROUTES else "task"


dumps = compact_json  # as Go's encoder writes it: compact, UTF-8 as is


def now_rfc3339() -> str:
    """Ollama's created_at: UTC, RFC 3339 with nanoseconds."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


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


# -- errors in each API's shape ---------------------------------------------------------------

def ollama_error(message: str) -> dict:
    return {"error": message}


def openai_error(status: int, message: str, code: str | None = None) -> dict:
    """openai.NewError: the type follows the status; `code` is gpuq's own for its refusals."""
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    if status == 401:
        kind = "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# -- checking a request before it becomes a job ----------------------------------------------

def _go_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _wrong(field: str, want: str, value: Any) -> BadRequest:
    return BadRequest(f"field '{field}' must be {want}, got {_go_type(value)} {json.dumps(value)[:60]}")


def tools_of(body: dict) -> list:
    """The request's `tools`: an array (or none), as every API's middleware in Ollama checks it."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise _wrong("tools", "an array of tools", tools)
    return tools or []


def check_keep_alive(value: Any) -> None:
    """Ollama refuses a keep_alive it cannot parse (400), even though gpuq ignores the value."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return
    if isinstance(value, str):
        text = value.strip()
        if text == "0" or re.fullmatch(r"[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+", text):
            return
        raise BadRequest(f'time: missing unit in duration "{value}"' if text.lstrip("-").replace(".", "").isdigit()
                         else f'time: invalid duration "{value}"')
    raise BadRequest("Unsupported type")


def _check_common(body: dict) -> None:
    for field in ("stream", "raw"):
        if body.get(field) is not None and not isinstance(body[field], bool):
            raise _wrong(field, "true or false", body[field])
    if body.get("options") is not None:
        wrong = options_problem(body["options"])
        if wrong:
            raise BadRequest(f"field 'options': {wrong}")
    think = body.get("think")
    if think is not None and not isinstance(think, bool) and think not in ("low", "medium", "high", "max"):
        raise BadRequest(f"invalid think value: {json.dumps(think)[:60]} (must be \"high\", \"medium\", "
                         "\"low\", true, or false)")
    fmt = body.get("format")
    if fmt is not None and not isinstance(fmt, (str, dict)):
        raise _wrong("format", "\"json\" or a JSON schema object", fmt)
    check_keep_alive(body.get("keep_alive"))


def _check_images(images: Any, where: str) -> None:
    if images is None:
        return
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise _wrong(where, "an array of base64 strings", images)
    for image in images:
        try:
            base64.b64decode(image, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"{where}: illegal base64 data in an image") from None


def check_chat(body: dict) -> None:
    """An /api/chat body Ollama would accept (types only; the model is checked by placement)."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise BadRequest("model is required")
    _check_common(body)
    messages = body.get("messages")
    if messages is None:
        return
    if not isinstance(messages, list):
        raise _wrong("messages", "an array of messages", messages)
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise _wrong(f"messages[{i}]", "an object", msg)
        if not isinstance(msg.get("role"), str):
            raise _wrong(f"messages[{i}].role", "a string", msg.get("role"))
        if msg.get("content") is not None and not isinstance(msg["content"], str):
            raise _wrong(f"messages[{i}].content", "a string", msg["content"])
        if msg.get("tool_calls") is not None and not isinstance(msg["tool_calls"], list):
            raise _wrong(f"messages[{i}].tool_calls", "an array", msg["tool_calls"])
        _check_images(msg.get("images"), f"messages[{i}].images")
    tools_of(body)


def check_generate(body: dict) -> None:
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise NotFound(f"model '{body.get('model') or ''}' not found")
    _check_common(body)
    for field in ("prompt", "suffix", "system", "template"):
        if body.get(field) is not None and not isinstance(body[field], str):
            raise _wrong(field, "a string", body[field])
    if body.get("context") is not None and not (isinstance(body["context"], list)
                                                and all(isinstance(t, int) for t in body["context"])):
        raise _wrong("context", "an array of token numbers", body["context"])
    _check_images(body.get("images"), "images")
    if body.get("raw") and (body.get("template") or body.get("system") or body.get("context")):
        raise BadRequest("raw mode does not support template, system, or context")


def check_embed(body: dict, legacy: bool) -> None:
    """/api/embed (input: a string or strings) or the legacy /api/embeddings (prompt)."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise (BadRequest("model is required") if legacy else NotFound(f"model '{body.get('model') or ''}' not found"))
    if body.get("options") is not None and (wrong := options_problem(body["options"])):
        raise BadRequest(f"field 'options': {wrong}")
    check_keep_alive(body.get("keep_alive"))
    if legacy:
        if body.get("prompt") is not None and not isinstance(body["prompt"], str):
            raise _wrong("prompt", "a string", body["prompt"])
        return
    given = body.get("input")
    if given is not None and not isinstance(given, str) and not (
            isinstance(given, list) and all(isinstance(i, str) for i in given)):
        raise BadRequest("invalid input type")
    if body.get("dimensions") is not None and (isinstance(body["dimensions"], bool)
                                               or not isinstance(body["dimensions"], int)):
        raise _wrong("dimensions", "a whole number", body["dimensions"])


def is_load_or_unload(endpoint: str, body: dict) -> bool:
    """Ollama answers an empty call at once: it loads the model, or with keep_alive 0 unloads it.
    gpuq loads a model for each job and unloads it after, so such a call has nothing to do."""
    if endpoint == "/api/chat":
        return not body.get("messages")
    if endpoint == "/api/generate":
        return not body.get("prompt")
    if endpoint == "/api/embed":
        given = body.get("input")
        return given is None or given == "" or given == []
    if endpoint == "/api/embeddings":
        return not body.get("prompt")
    return False


def _unloads(body: dict) -> bool:
    keep_alive = body.get("keep_alive")
    return keep_alive is not None and keep_alive in (0, 0.0, "0", "0s", "0m", "0h", "0ms")


def load_or_unload_reply(endpoint: str, body: dict) -> dict:
    """What Ollama answers to an empty call (one JSON object, whatever `stream` says)."""
    model = body["model"]
    if endpoint == "/api/embed":
        return {"model": model, "embeddings": []}
    if endpoint == "/api/embeddings":
        return {"embedding": []}
    reason = "unload" if _unloads(body) else "load"
    out: dict[str, Any] = {"model": model, "created_at": now_rfc3339()}
    if endpoint == "/api/chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out["done"] = True
    out["done_reason"] = reason
    return out


# -- the job's prompt ------------------------------------------------------------------------

def _with_images(text: str, images: Any) -> str:
    count = len(images) if isinstance(images, list) else 0
    if not count:
        return text
    note = f"[{count} image{'s' if count > 1 else ''}]"
    return f"{text} {note}" if text else note


def prompt_of(endpoint: str, body: dict) -> str:
    """What the queue and the page show as the job's prompt: the last user message of a chat,
    the prompt of a generate, the input of an embedding (the whole request is kept too). A
    Responses or Messages call is shown from its translation to /api/chat (CHAT_SHAPED)."""
    if endpoint in ("/api/chat", "/v1/chat/completions"):
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        users = [m for m in messages if m.get("role") == "user"] or messages
        if not users:
            return ""
        last = users[-1]
        content = last.get("content")
        if isinstance(content, list):  # OpenAI's parts
            texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
            images = [p for p in content if isinstance(p, dict) and p.get("type") in ("image_url", "input_audio")]
            return _with_images("\n".join(texts), images)
        return _with_images(content if isinstance(content, str) else "", last.get("images"))
    if endpoint in ("/api/generate", "/v1/completions"):
        prompt = body.get("prompt")
        return _with_images(prompt if isinstance(prompt, str) else "", body.get("images"))
    given = body.get("input") if endpoint != "/api/embeddings" else body.get("prompt")
    if isinstance(given, list):
        return "\n".join(str(i) for i in given)
    return given if isinstance(given, str) else ""


# -- OpenAI requests -> Ollama requests (openai.FromChatRequest and friends) ------------------

def _openai_stop(stop: Any, strict: bool) -> list[str] | None:
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list):
        if strict and not all(isinstance(s, str) for s in stop):
            bad = next(s for s in stop if not isinstance(s, str))
            raise BadRequest(f"invalid type for 'stop' field: {_go_type(bad)}")
        return [s for s in stop if isinstance(s, str)]
    return None


def _number(body: dict, key: str) -> float | int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _wrong(key, "a number", value)
    return value


def _whole(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _wrong(key, "a whole number", value)
    return value


def think_from_effort(effort: Any) -> bool | str | None:
    """OpenAI's reasoning effort as Ollama's think (openai.thinkFromReasoningEffort)."""
    if effort in (None, ""):
        return None
    if effort == "none":
        return False
    if effort == "minimal":
        return "low"
    if effort in ("low", "medium", "high", "max"):
        return effort
    if effort in ("xhigh", "ultra"):
        return "max"
    raise BadRequest(f"invalid reasoning value: {json.dumps(effort)[:60]} (must be \"minimal\", \"low\", "
                     "\"medium\", \"high\", \"xhigh\", \"ultra\", \"max\", or \"none\")")


def _image_of(url: Any) -> str:
    """A data: URL's base64 (Ollama takes images as base64 only)."""
    if not isinstance(url, str):
        raise BadRequest("invalid message format")
    if url.startswith(("http://", "https://")):
        raise BadRequest("image URLs are not currently supported, please use base64 encoded data instead")
    for prefix in ("data:;base64,", *(f"data:image/{t};base64," for t in ("jpeg", "jpg", "png", "webp"))):
        if url.startswith(prefix):
            data = url[len(prefix):]
            try:
                base64.b64decode(data, validate=True)
            except (binascii.Error, ValueError):
                break
            return data
    raise BadRequest("invalid image input")


def _tool_calls_in(calls: Any) -> list[dict]:
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


def _tool_name(messages: list, msg: dict) -> str:
    if str(msg.get("role", "")).lower() != "tool":
        return ""
    if msg.get("name"):
        return msg["name"]
    for earlier in reversed(messages):  # the call this result answers (last one wins)
        for call in earlier.get("tool_calls") or [] if isinstance(earlier, dict) else []:
            if isinstance(call, dict) and call.get("id") == msg.get("tool_call_id"):
                return (call.get("function") or {}).get("name", "")
    return ""


def _message(role: str, content: str = "", **extra: Any) -> dict:
    out: dict[str, Any] = {"role": role, "content": content}
    out.update({k: v for k, v in extra.items() if v})
    return out


def openai_messages(messages: list) -> list[dict]:
    out: list[dict] = []
    for msg in messages:
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRequest("invalid message format")
        role, content = msg["role"], msg.get("content")
        name = _tool_name(messages, msg)
        calls = _tool_calls_in(msg["tool_calls"]) if msg.get("tool_calls") else []
        if isinstance(content, str):
            out.append(_message(role, content, thinking=msg.get("reasoning"), tool_calls=calls, tool_name=name,
                                tool_call_id=msg.get("tool_call_id")))
        elif isinstance(content, list):
            for part in content:  # each part becomes a message of its own, as Ollama does
                if not isinstance(part, dict):
                    raise BadRequest("invalid message format")
                if part.get("type") == "text":
                    if not isinstance(part.get("text"), str):
                        raise BadRequest("invalid message format")
                    out.append(_message(role, part["text"]))
                elif part.get("type") == "image_url":
                    ref = part.get("image_url")
                    out.append(_message(role, images=[_image_of(ref.get("url") if isinstance(ref, dict) else ref)]))
                elif part.get("type") == "input_audio":
                    audio = part.get("input_audio")
                    if not isinstance(audio, dict) or not isinstance(audio.get("data"), str):
                        raise BadRequest("invalid input_audio format")
                    out.append(_message(role, images=[audio["data"]]))
                else:
                    raise BadRequest("invalid message format")
            if out and calls:
                out[-1].update(_message(role, out[-1].get("content", ""), tool_calls=calls, tool_name=name,
                                        tool_call_id=msg.get("tool_call_id"), thinking=msg.get("reasoning")))
        elif calls:  # content is optional only beside tool calls
            out.append(_message(role, thinking=msg.get("reasoning"), tool_calls=calls,
                                tool_call_id=msg.get("tool_call_id")))
        else:
            raise BadRequest(f"invalid message content type: {_go_type(content)}")
    return out


def _openai_options(body: dict, strict_stop: bool) -> dict:
    options: dict[str, Any] = {}
    stop = _openai_stop(body.get("stop"), strict_stop)
    if stop is not None:
        options["stop"] = stop
    max_tokens = _whole(body, "max_tokens")
    if max_tokens is None:  # the newer name, which Ollama's layer does not read yet
        max_tokens = _whole(body, "max_completion_tokens")
    if max_tokens is not None:
        options["num_predict"] = max_tokens
    temperature = _number(body, "temperature")
    options["temperature"] = 1.0 if temperature is None else temperature
    for key in ("seed",):
        if (value := _whole(body, key)) is not None:
            options[key] = value
    for key in ("frequency_penalty", "presence_penalty"):
        if (value := _number(body, key)) is not None:
            options[key] = value
    top_p = _number(body, "top_p")
    options["top_p"] = 1.0 if top_p is None or top_p == 0 else top_p
    return options


def openai_chat_request(body: dict) -> dict:
    """A /v1/chat/completions body as the /api/chat body Ollama's own layer makes of it."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise BadRequest("model is required")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _wrong("messages", "an array of messages", messages)
    if not messages:
        raise BadRequest("[] is too short - 'messages'")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise _wrong("stream", "true or false", body["stream"])
    out: dict[str, Any] = {"model": body["model"], "messages": openai_messages(messages),
                           "options": _openai_options(body, strict_stop=False),
                           "stream": bool(body.get("stream"))}
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise _wrong("response_format", "an object", fmt)
        kind = str(fmt.get("type", "")).strip().lower()
        if kind == "json_object":
            out["format"] = "json"
        elif kind == "json_schema" and isinstance(fmt.get("json_schema"), dict):
            schema = fmt["json_schema"].get("schema")
            if schema is not None:
                out["format"] = schema
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


def openai_completion_request(body: dict) -> dict:
    """A /v1/completions body as /api/generate (openai.FromCompleteRequest)."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise NotFound(f"model '{body.get('model') or ''}' not found")
    if body.get("prompt") is not None and not isinstance(body["prompt"], str):
        raise _wrong("prompt", "a string", body["prompt"])
    options = _openai_options(body, strict_stop=True)
    options.setdefault("frequency_penalty", 0)
    options.setdefault("presence_penalty", 0)
    out: dict[str, Any] = {"model": body["model"], "prompt": body.get("prompt") or "", "options": options,
                           "stream": bool(body.get("stream"))}
    if body.get("suffix"):
        out["suffix"] = body["suffix"]
    if isinstance(body.get("logprobs"), int) and not isinstance(body["logprobs"], bool) and body["logprobs"] > 0:
        out["logprobs"] = True
        out["top_logprobs"] = body["logprobs"]
    return out


def openai_embed_request(body: dict) -> dict:
    """A /v1/embeddings body as /api/embed (middleware.EmbeddingsMiddleware)."""
    fmt = body.get("encoding_format")
    if fmt not in (None, "") and str(fmt).lower() not in ("float", "base64"):
        raise BadRequest(f"Invalid value for 'encoding_format' = {fmt}. Supported values: ['float', 'base64'].")
    given = body.get("input")
    if given == "":
        given = [""]
    if given is None or given == [] or not (isinstance(given, str) or (
            isinstance(given, list) and all(isinstance(i, str) for i in given))):
        raise BadRequest("invalid input")
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise NotFound(f"model '{body.get('model') or ''}' not found")
    out: dict[str, Any] = {"model": body["model"], "input": given}
    dims = body.get("dimensions")
    if isinstance(dims, int) and not isinstance(dims, bool) and dims > 0:
        out["dimensions"] = dims
    return out


def ollama_request(endpoint: str, body: dict) -> dict:
    """The client's request in Ollama's terms (the same body for /api routes)."""
    if endpoint == "/v1/chat/completions":
        return openai_chat_request(body)
    if endpoint == "/v1/completions":
        return openai_completion_request(body)
    if endpoint == "/v1/embeddings":
        return openai_embed_request(body)
    if endpoint == "/v1/responses":
        from .responses import responses_request  # it builds on this module
        return responses_request(body)
    if endpoint == "/v1/messages":
        from .anthropic import messages_request
        return messages_request(body)
    return body


def node_request(endpoint: str, body: dict, node_think: bool | str | None = None,
                 node_options: dict | None = None, keep_alive: int | str = 0) -> tuple[str, dict]:
    """The Ollama route and body a front-door job sends its node: the client's own request, with
    the node's policy over it: the node's keep_alive, whatever the client asked (0: the model
    leaves VRAM after the job), chat and generate streamed (gpuq relays each chunk as it
    comes), the node's options under the client's, and the node's `think` when the client set
    none."""
    out = dict(ollama_request(endpoint, body))
    out["keep_alive"] = keep_alive
    route = NODE_ROUTE[endpoint]
    if route in STREAMED_ROUTES:
        out["stream"] = True
        if out.get("think") is None and node_think is not None:
            out["think"] = node_think
    else:
        out.pop("stream", None)
    options = merged_options(node_options, out.get("options") if isinstance(out.get("options"), dict) else None)
    if options:
        out["options"] = options
    return route, out


# -- Ollama replies ---------------------------------------------------------------------------

def chunk_text(chunk: dict) -> tuple[str, str, list]:
    """(answer, reasoning, tool calls) in one chunk of /api/chat or /api/generate."""
    message = chunk.get("message")
    if isinstance(message, dict):
        return message.get("content") or "", message.get("thinking") or "", message.get("tool_calls") or []
    return chunk.get("response") or "", chunk.get("thinking") or "", chunk.get("tool_calls") or []


def collected(endpoint: str, chunks: Iterable[dict], body: dict) -> dict:
    """stream:false: the last chunk, its text the whole reply (routes.go writeChatResponse and
    GenerateHandler): content and thinking concatenated, tool calls and logprobs gathered."""
    content, thinking, calls, logprobs = [], [], [], []
    last: dict = {}
    for chunk in chunks:
        text, thought, tool_calls = chunk_text(chunk)
        content.append(text)
        thinking.append(thought)
        calls.extend(tool_calls)
        logprobs.extend(chunk.get("logprobs") or [])
        last = chunk
    out = dict(last)
    if isinstance(last.get("message"), dict) or endpoint.endswith("chat"):
        message = dict(last.get("message") or {"role": "assistant"})
        message["content"] = "".join(content)
        message.pop("thinking", None)
        message.pop("tool_calls", None)
        if "".join(thinking):
            message["thinking"] = "".join(thinking)
        tools_asked = bool(body.get("tools"))
        final_calls = calls if tools_asked else (last.get("message") or {}).get("tool_calls")
        if final_calls:
            message["tool_calls"] = final_calls
        out["message"] = message
    else:
        out["response"] = "".join(content)
        out.pop("thinking", None)
        if "".join(thinking):
            out["thinking"] = "".join(thinking)
        if calls:
            out["tool_calls"] = calls
    if logprobs:
        out["logprobs"] = logprobs
    else:
        out.pop("logprobs", None)
    return out


# -- Ollama replies -> OpenAI replies (openai.ToChatCompletion and friends) ------------------

def _tool_calls_out(calls: list) -> list[dict]:
    out = []
    for call in calls:
        function = call.get("function") or {}
        out.append({"id": call.get("id", ""), "index": function.get("index", 0), "type": "function",
                    "function": {"name": function.get("name", ""),
                                 "arguments": dumps(function.get("arguments", {}))}})
    return out


def usage_of(chunk: dict) -> dict:
    prompt, completion = chunk.get("prompt_eval_count") or 0, chunk.get("eval_count") or 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_completion(completion_id: str, reply: dict) -> dict:
    """A collected /api/chat reply as a chat.completion."""
    message = reply.get("message") or {}
    calls = _tool_calls_out(message.get("tool_calls") or [])
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
    return {"id": completion_id, "object": "chat.completion", "created": unix_of(reply.get("created_at")),
            "model": reply.get("model", ""), "system_fingerprint": "fp_ollama", "choices": [choice],
            "usage": usage_of(reply)}


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj).encode() + b"\n\n"


def sse_event(kind: str, obj: Any) -> bytes:
    """A named server-sent event (the Responses and Messages streams name each one)."""
    return f"event: {kind}\n".encode() + sse(obj)


SSE_DONE = b"data: [DONE]\n\n"


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

    def _chunk(self, model: str, delta: dict, finish_reason: str | None = None, logprobs: Any = None) -> dict:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        if logprobs:
            choice["logprobs"] = {"content": logprobs}
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": model,
                "system_fingerprint": "fp_ollama", "choices": [choice]}

    def feed(self, chunk: dict) -> bytes:
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
            tool_calls = _tool_calls_out(calls)
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


def text_completion(completion_id: str, reply: dict) -> dict:
    """A collected /api/generate reply as a text_completion (openai.ToCompletion)."""
    return {"id": completion_id, "object": "text_completion", "created": unix_of(reply.get("created_at")),
            "model": reply.get("model", ""), "system_fingerprint": "fp_ollama",
            "choices": [{"text": reply.get("response", ""), "index": 0,
                         "finish_reason": reply.get("done_reason") or None}],
            "usage": usage_of(reply)}


class CompletionStream:
    """/api/generate chunks -> text_completion events (middleware.CompleteWriter)."""

    def __init__(self, completion_id: str, include_usage: bool = False):
        self.id = completion_id
        self.include_usage = include_usage

    def feed(self, chunk: dict) -> bytes:
        event: dict[str, Any] = {
            "id": self.id, "object": "text_completion", "created": int(time.time()),
            "choices": [{"text": chunk.get("response", ""), "index": 0,
                         "finish_reason": chunk.get("done_reason") or None}],
            "model": chunk.get("model", ""), "system_fingerprint": "fp_ollama"}
        if self.include_usage:
            event["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        data = sse(event)
        if not chunk.get("done"):
            return data
        if self.include_usage:
            data += sse({**event, "choices": [], "usage": usage_of(chunk)})
        return data + SSE_DONE

    error = ChatStream.error


def _base64_floats(vector: list) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()


def embedding_list(model: str, reply: dict, encoding_format: Any = None) -> dict:
    """An /api/embed reply as /v1/embeddings' list (openai.ToEmbeddingList)."""
    as_base64 = str(encoding_format or "").lower() == "base64"
    data = [{"object": "embedding", "embedding": _base64_floats(e) if as_base64 else e, "index": i}
            for i, e in enumerate(reply.get("embeddings") or [])]
    tokens = reply.get("prompt_eval_count") or 0
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def owned_by(name: str) -> str:
    """The namespace of a model name (types/model ParseName): 'library' for plain names."""
    if name.rfind(":") > name.rfind("/"):
        name = name[:name.rfind(":")]
    parts = name.split("/")
    return parts[-2] if len(parts) >= 2 else "library"


def model_list(tags: list[dict]) -> dict:
    """/api/tags as /v1/models (openai.ToListCompletion)."""
    data = []
    for m in tags:
        ident = m.get("model") or m.get("name") or ""
        data.append({"id": ident, "object": "model", "created": unix_of(m.get("modified_at")),
                     "owned_by": owned_by(ident)})
    return {"object": "list", "data": data}


def model_card(name: str, show: dict) -> dict:
    """/api/show as /v1/models/{model} (openai.ToModel)."""
    return {"id": name, "object": "model", "created": unix_of(show.get("modified_at")), "owned_by": owned_by(name)}


# -- listings across the nodes ---------------------------------------------------------------

def merged_tags(per_node: Iterable[list[dict]], normalize) -> list[dict]:
    """Every node's /api/tags models, each once (the first node by rank that has it speaks for
    it), most recently modified first, as Ollama sorts its own list."""
    seen: dict[str, dict] = {}
    for models in per_node:
        for m in models:
            if not isinstance(m, dict) or not isinstance(m.get("name") or m.get("model"), str):
                continue
            seen.setdefault(normalize(m.get("model") or m["name"]), m)
    return sorted(seen.values(), key=lambda m: -unix_of(m.get("modified_at")))


def merged_ps(per_node: Iterable[list[dict]]) -> list[dict]:
    """Every node's loaded models, longest time left first, as Ollama sorts /api/ps."""
    models = [m for node in per_node for m in node if isinstance(m, dict)]
    return sorted(models, key=lambda m: -unix_of(m.get("expires_at")))
