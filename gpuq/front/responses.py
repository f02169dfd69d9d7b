"""OpenAI's Responses API (POST /v1/responses) on the front door, as Ollama serves it: pure
translations of a request to the /api/chat body its node gets, and of the node's chat chunks to
the Responses event stream or the one `response` object. No I/O.

Ollama's source is the reference: openai/responses.go (FromResponsesRequest, ToResponse,
ResponsesStreamConverter) and middleware/openai.go (ResponsesMiddleware, ResponsesWriter).
Ollama runs the built-in web_search tool through ollama.com; a lab has no ollama.com, so gpuq
leaves the tool out of what the model is offered (Codex sends it with every turn), and the turn
goes on without it."""

from __future__ import annotations

import json
import time
from typing import Any

from ..errors import BadRequest, json_object, json_type
from . import shapes
from .openai_api import openai_error

# -- the request -> /api/chat -------------------------------------------------------------------


def _content(parts: list[Any], where: str) -> tuple[str, list[str]]:
    """Input content parts as text and images (convertResponsesContent)."""
    text, images = "", []
    for i, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text"):
            if not isinstance(part.get("text", ""), str):
                raise shapes.wrong(f"{where}[{i}].text", "a string", part.get("text"))
            text += part.get("text") or ""
        elif kind == "input_image":
            if part.get("image_url"):  # a file_id alone is skipped, as Ollama does
                images.append(shapes.image_of(part["image_url"]))
        elif kind == "input_file":
            raise BadRequest("file inputs are not currently supported")
        else:
            raise BadRequest(f"{where}[{i}]: unknown content type: {kind or ''}")
    return text, images


def _parts(content: Any, where: str) -> list[Any]:
    """A message's content: a string is one input_text part (ResponsesInputMessage.UnmarshalJSON)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}: content must be a string or array")
    return content


def _kind(item: dict[str, Any]) -> str:
    """An input item's type; a bare {role, content} is a message (unmarshalResponsesInputItem)."""
    kind = item.get("type") or ("message" if item.get("role") else "")
    if not kind:
        raise BadRequest("input item missing required 'type' field")
    return kind


def _arguments(text: Any) -> dict[str, Any]:
    if text in (None, ""):
        return {}
    if not isinstance(text, str):
        raise shapes.wrong("arguments", "a string", text)
    return json_object(text.encode(), "", "failed to parse function call arguments", json_type)


def input_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Input items as chat messages (FromResponsesRequest): reasoning joins the next assistant
    message, function calls join the assistant message before them, outputs become tool messages."""
    messages: list[dict[str, Any]] = []
    pending_thinking = ""
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise shapes.wrong(where, "an object", item)
        kind = _kind(item)
        if kind == "reasoning":
            pending_thinking = item.get("encrypted_content") or ""
        elif kind == "message":
            text, images = _content(_parts(item.get("content"), where), f"{where}: content")
            msg = shapes.message(str(item.get("role") or ""), text, images=images)
            if msg["role"] == "assistant" and pending_thinking:
                msg["thinking"], pending_thinking = pending_thinking, ""
            if _merged_into_call(messages, msg, items, i):
                continue
            messages.append(msg)
        elif kind == "function_call":
            call = {
                "id": item.get("call_id") or "",
                "function": {"name": item.get("name") or "", "arguments": _arguments(item.get("arguments"))},
            }
            last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
            if last is None:
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
            if pending_thinking:
                last["thinking"], pending_thinking = pending_thinking, ""
        elif kind == "function_call_output":
            output = item.get("output")
            text, images = (
                (output or "", [])
                if isinstance(output, str) or output is None
                else _content(_parts(output, where), f"{where}: output")
            )
            messages.append(shapes.message("tool", text, images=images, tool_call_id=item.get("call_id")))
        elif kind == "web_search_call":
            continue  # history metadata; the assistant message after it carries the result
        else:
            raise BadRequest(f"{where}: unknown input item type: {json.dumps(kind)}")
    if pending_thinking:
        messages.append({"role": "assistant", "content": "", "thinking": pending_thinking})
    return messages


def _merged_into_call(messages: list[dict[str, Any]], msg: dict[str, Any], items: list[Any], i: int) -> bool:
    """An assistant message replayed between a function_call and its output joins the message
    that holds the call, so the tool result follows the call it answers."""
    following = items[i + 1] if i + 1 < len(items) else None
    call_id = (
        following.get("call_id")
        if isinstance(following, dict) and following.get("type") == "function_call_output"
        else None
    )
    if msg["role"] != "assistant" or not call_id or not messages:
        return False
    last = messages[-1]
    if last["role"] != "assistant" or not any(c.get("id") == call_id for c in last.get("tool_calls") or []):
        return False
    if last.get("content") and msg.get("content"):
        last["content"] += "\n"
    last["content"] = last.get("content", "") + msg.get("content", "")
    if msg.get("images"):
        last["images"] = last.get("images", []) + msg["images"]
    if msg.get("thinking"):
        last["thinking"] = msg["thinking"]
    return True


def _tool(tool: Any) -> list[dict[str, Any]]:
    """One Responses tool as Ollama's (convertTools): flat fields, a namespace expanded into its
    members with qualified names."""
    if not isinstance(tool, dict):
        raise shapes.wrong("tools[]", "an object", tool)
    if str(tool.get("type") or "").startswith("web_search"):  # web_search, web_search_preview
        return []  # a server tool: no server here runs it (module docstring)
    if tool.get("type") == "namespace":
        prefix = f"{tool['name']}." if tool.get("name") else ""
        out = [t for member in tool.get("tools") or [] for t in _tool(member)]
        for t in out:
            if prefix and not t["function"]["name"].startswith(prefix):
                t["function"]["name"] = prefix + t["function"]["name"]
        return out
    function: dict[str, Any] = {"name": tool.get("name") or "", "description": tool.get("description") or ""}
    if tool.get("parameters") is not None:
        function["parameters"] = tool["parameters"]
    return [{"type": tool.get("type") or "", "function": function}]


def responses_request(body: dict[str, Any]) -> dict[str, Any]:
    """A /v1/responses body as the /api/chat body Ollama makes of it (FromResponsesRequest)."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise BadRequest("model is required")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise shapes.wrong("stream", "true or false", body["stream"])
    out: dict[str, Any] = {
        "model": body["model"],
        "messages": _chat_messages(body),
        "options": _options(body),
        "stream": bool(body.get("stream")),
    }
    if offered := [t for tool in shapes.tools_of(body) for t in _tool(tool)]:
        out["tools"] = offered
    if (schema := _schema_of(body)) is not None:
        out["format"] = schema
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise shapes.wrong("reasoning", "an object", reasoning)
    think = shapes.think_from_effort((reasoning or {}).get("effort"))
    if think is not None:
        out["think"] = think
    return out


def _chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The instructions (if any) as the system message, then the input: a string is one user
    message, an array its items' (input_messages)."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise shapes.wrong("instructions", "a string", instructions)
    messages = [{"role": "system", "content": instructions}] if instructions else []
    given = body.get("input")
    if isinstance(given, str):
        if given:
            messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        messages += input_messages(given)
    elif given is not None:
        raise BadRequest("input must be a string or array")
    return messages


def _options(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields as Ollama's options (temperature 1.0 unless given, as Ollama's layer)."""
    options: dict[str, Any] = {}
    temperature = shapes.number(body, "temperature")
    options["temperature"] = 1.0 if temperature is None else temperature
    if (top_p := shapes.number(body, "top_p")) is not None:
        options["top_p"] = top_p
    if (limit := shapes.whole(body, "max_output_tokens")) is not None:
        options["num_predict"] = limit
    return options


def _schema_of(body: dict[str, Any]) -> Any:
    """text.format's JSON schema, Ollama's format; None when it asks for none."""
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and fmt.get("schema") is not None:
        return fmt["schema"]
    return None


# -- the node's chunks -> the response ------------------------------------------------------------


def _usage(chunk: dict[str, Any]) -> dict[str, Any]:
    prompt, completion = chunk.get("prompt_eval_count") or 0, chunk.get("eval_count") or 0
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": prompt + completion,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    }


def _echo_tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "type": t.get("type"),
            "name": t.get("name"),
            "description": t.get("description"),
            "strict": t.get("strict"),
            "parameters": t.get("parameters"),
        }
        for t in body.get("tools") or []
        if isinstance(t, dict)
    ]


def _text_format(body: dict[str, Any]) -> dict[str, Any]:
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if not isinstance(fmt, dict):
        return {"type": "text"}
    return {"type": fmt.get("type"), **{k: fmt[k] for k in ("name", "schema", "strict") if fmt.get(k) is not None}}


def _reasoning_echo(body: dict[str, Any]) -> dict[str, Any] | None:
    given = body.get("reasoning")
    reasoning = given if isinstance(given, dict) else {}
    if not (reasoning.get("effort") or reasoning.get("summary")):
        return None
    return {"effort": reasoning.get("effort") or None, "summary": reasoning.get("summary") or None}


def response_object(
    response_id: str,
    body: dict[str, Any],
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    created_at: int | None = None,
) -> dict[str, Any]:
    """The `response` object, the request's settings echoed (buildResponseObject, ToResponse)."""

    def number(key: str) -> Any:
        return 1.0 if body.get(key) is None else body[key]

    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at or int(time.time()),
        "completed_at": int(time.time()) if status == "completed" else None,
        "status": status,
        "incomplete_details": None,
        "model": body.get("model"),
        "previous_response_id": None,
        "instructions": body.get("instructions") or None,
        "output": output,
        "error": None,
        "tools": _echo_tools(body),
        "tool_choice": "auto",
        "truncation": body.get("truncation") or "disabled",
        "parallel_tool_calls": True,
        "text": {"format": _text_format(body)},
        "top_p": number("top_p"),
        "presence_penalty": 0,
        "frequency_penalty": 0,
        "top_logprobs": 0,
        "temperature": number("temperature"),
        "reasoning": _reasoning_echo(body),
        "usage": usage,
        "max_output_tokens": body.get("max_output_tokens"),
        "max_tool_calls": None,
        "store": False,
        "background": bool(body.get("background")),
        "service_tier": "default",
        "metadata": {},
        "safety_identifier": None,
        "prompt_cache_key": None,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [_text_part(text)] if status == "completed" else [],
    }


def _reasoning_item(item_id: str, thinking: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": thinking}],
        "encrypted_content": thinking,
    }


def _call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"] if status == "completed" else "",
    }


def whole_response(response_id: str, item_id: str, reply: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """stream:false: the collected chat reply as one `response` (ToResponse): reasoning, then the
    tool calls or else the message."""
    message = reply.get("message") or {}
    output = []
    if message.get("thinking"):
        output.append(_reasoning_item(f"rs_{response_id}", message["thinking"]))
    calls = shapes.tool_calls_out(message.get("tool_calls") or [])
    if calls:
        output += [_call_item(f"fc_{response_id}_{i}", c) for i, c in enumerate(calls)]
    else:
        output.append(_message_item(item_id, message.get("content") or ""))
    created = shapes.unix_of(reply.get("created_at"))
    return response_object(response_id, body, "completed", output, _usage(reply), created)


class ResponsesStream:
    """Chat chunks -> Responses events (ResponsesStreamConverter.Process): response.created and
    .in_progress first; reasoning as a reasoning item; tool calls as function_call items (text
    after them is dropped); text as one message item; response.completed with the usage."""

    def __init__(self, response_id: str, item_id: str, body: dict[str, Any]):
        self.id, self.item_id, self.body = response_id, item_id, body
        self.seq = 0
        self.started = False
        self.index = 0  # the next output item's index
        # The open reasoning and message items' text so far, in pieces (joined once, at the
        # item's end: `self.x += piece` would copy the whole text at every chunk)
        self.reasoning: list[str] | None = None
        self.text: list[str] | None = None
        self.calls_sent = False
        self.done_items: list[dict[str, Any]] = []

    def _event(self, kind: str, **data: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return shapes.sse_event(kind, data)

    def _start(self) -> list[bytes]:
        if self.started:
            return []
        self.started = True
        return [
            self._event(kind, response=response_object(self.id, self.body, "in_progress", [], None))
            for kind in ("response.created", "response.in_progress")
        ]

    def _think(self, thinking: str) -> list[bytes]:
        out = []
        if self.reasoning is None:
            self.reasoning = []
            out.append(
                self._event(
                    "response.output_item.added",
                    output_index=self.index,
                    item={"id": self._reasoning_id(), "type": "reasoning", "summary": []},
                )
            )
        self.reasoning.append(thinking)
        out.append(
            self._event(
                "response.reasoning_summary_text.delta",
                item_id=self._reasoning_id(),
                output_index=self.index,
                summary_index=0,
                delta=thinking,
            )
        )
        return out

    def _reasoning_id(self) -> str:
        return f"rs_{self.id}_{self.index}"

    def _end_reasoning(self) -> list[bytes]:
        if self.reasoning is None:
            return []
        thinking = "".join(self.reasoning)
        item = _reasoning_item(self._reasoning_id(), thinking)
        out = [
            self._event(
                "response.reasoning_summary_text.done",
                item_id=item["id"],
                output_index=self.index,
                summary_index=0,
                text=thinking,
            ),
            self._event("response.output_item.done", output_index=self.index, item=item),
        ]
        self.done_items.append(item)
        self.reasoning = None
        self.index += 1
        return out

    def _calls(self, calls: list[Any]) -> list[bytes]:
        out = self._end_reasoning()
        for _i, call in enumerate(shapes.tool_calls_out(calls)):
            item = _call_item(f"fc_{self.id}_{self.index}", call)
            arguments = item["arguments"]
            out += [
                self._event(
                    "response.output_item.added",
                    output_index=self.index,
                    item=_call_item(item["id"], call, "in_progress"),
                ),
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.index,
                    delta=arguments,
                ),
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=self.index,
                    arguments=arguments,
                ),
                self._event("response.output_item.done", output_index=self.index, item=item),
            ]
            self.done_items.append(item)
            self.index += 1
        self.calls_sent = True
        return out

    def _say(self, text: str) -> list[bytes]:
        out = self._end_reasoning()
        if self.text is None:
            self.text = []
            out += [
                self._event(
                    "response.output_item.added",
                    output_index=self.index,
                    item=_message_item(self.item_id, "", "in_progress"),
                ),
                self._event(
                    "response.content_part.added",
                    item_id=self.item_id,
                    output_index=self.index,
                    content_index=0,
                    part=_text_part(""),
                ),
            ]
        self.text.append(text)
        out.append(
            self._event(
                "response.output_text.delta",
                item_id=self.item_id,
                output_index=self.index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return out

    def _complete(self, chunk: dict[str, Any]) -> list[bytes]:
        out = self._end_reasoning()
        if self.text is not None and not self.calls_sent:
            text = "".join(self.text)
            item = _message_item(self.item_id, text)
            out += [
                self._event(
                    "response.output_text.done",
                    item_id=self.item_id,
                    output_index=self.index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done",
                    item_id=self.item_id,
                    output_index=self.index,
                    content_index=0,
                    part=_text_part(text),
                ),
                self._event("response.output_item.done", output_index=self.index, item=item),
            ]
            self.done_items.append(item)
        response = response_object(self.id, self.body, "completed", self.done_items, _usage(chunk))
        return out + [self._event("response.completed", response=response)]

    def feed(self, chunk: dict[str, Any]) -> bytes:
        content, thinking, calls = shapes.chunk_text(chunk)
        out = self._start()
        if thinking:
            out += self._think(thinking)
        if calls:
            out += self._calls(calls)
        elif content and not self.calls_sent:
            out += self._say(content)
        if chunk.get("done"):
            out += self._complete(chunk)
        return b"".join(out)

    def error(self, status: int, message: str, code: str | None = None) -> bytes:
        """The stream ends failed: response.failed with the error, as Ollama ends a Responses
        stream whose web search failed (middleware/openai.go writeWebSearchError). The event also
        carries OpenAI's error object at its top, which the OpenAI SDK raises as an APIError."""
        failed = response_object(self.id, self.body, "failed", self.done_items, None)
        failed["error"] = {"code": code or "api_error", "message": message}
        return b"".join(self._start()) + self._event(
            "response.failed", response=failed, error=openai_error(status, message, code)["error"]
        )
