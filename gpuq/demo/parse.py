"""Ollama's request parsing, as its Go source does it: one JSON value per body (gin's
ShouldBindJSON), each field checked against the request struct's type (encoding/json's error
texts), keep_alive as a Go duration, think levels, and options checked like Options.FromMap
[api/types.go]."""

from __future__ import annotations

import json
import re
from typing import Any

DEFAULT_KEEP_ALIVE_S = 300.0  # OLLAMA_KEEP_ALIVE [envconfig/config.go]
THINK_LEVELS = ("high", "medium", "low", "max")  # api/types.go ThinkValue


def go_quote(text: str) -> str:
    """Go's %q for the names and values Ollama quotes in its messages."""
    return json.dumps(text, ensure_ascii=False)


class Reply(Exception):
    """An error answer: Ollama writes {"error": message} with this status."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


# -- durations ------------------------------------------------------------------------------

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _go_duration_s(text: str) -> float:
    """Go's time.ParseDuration, with its error texts."""
    rest = text[1:] if text[:1] in "+-" else text
    if rest == "0":
        return 0.0
    if not rest:
        raise ValueError(f"time: invalid duration {go_quote(text)}")
    total = 0.0
    while rest:
        found = re.match(r"\d*(?:\.\d*)?", rest)
        assert found is not None  # it matches the empty string too
        number = found.group(0)
        if number in ("", "."):
            raise ValueError(f"time: invalid duration {go_quote(text)}")
        rest = rest[len(number) :]
        found = re.match(r"[^\d.]*", rest)
        assert found is not None  # it matches the empty string too
        unit = found.group(0)
        if not unit:
            raise ValueError(f"time: missing unit in duration {go_quote(text)}")
        if unit not in _UNITS:
            raise ValueError(f"time: unknown unit {go_quote(unit)} in duration {go_quote(text)}")
        total += float(number) * _UNITS[unit]
        rest = rest[len(unit) :]
    return -total if text.startswith("-") else total


def parse_keep_alive(value: Any) -> float | None:
    """Ollama's Duration: number = seconds, string = Go duration; negative = forever (None)."""
    if value is None:
        return DEFAULT_KEEP_ALIVE_S
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"Unsupported type: '{_go_any_type(value)}'")
    seconds = _go_duration_s(value) if isinstance(value, str) else float(value)
    return None if seconds < 0 else seconds


# -- request bodies, decoded as Go's encoding/json does --------------------------------------


def _go_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    kinds: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return kinds.get(type(value), "null")


def _go_any_type(value: Any) -> str:
    """reflect.TypeOf of what json.Unmarshal put in an `any`."""
    if isinstance(value, dict):
        return "map[string]interface {}"
    if isinstance(value, list):
        return "[]interface {}"
    return {bool: "bool", str: "string"}.get(type(value), "float64")


# Field types of the request structs [api/types.go]; other keys are ignored, as Go ignores them.
OPTIONS = "map[string]interface {}"
GENERATE_FIELDS = {
    "model": "string",
    "prompt": "string",
    "suffix": "string",
    "system": "string",
    "template": "string",
    "context": "[]int",
    "stream": "bool",
    "raw": "bool",
    "format": "raw",
    "keep_alive": "duration",
    "images": "[]api.ImageData",
    "options": OPTIONS,
    "think": "think",
    "truncate": "bool",
    "shift": "bool",
    "logprobs": "bool",
    "top_logprobs": "int",
}
CHAT_FIELDS = {
    "model": "string",
    "messages": "[]api.Message",
    "stream": "bool",
    "format": "raw",
    "keep_alive": "duration",
    "tools": "api.Tools",
    "options": OPTIONS,
    "think": "think",
    "truncate": "bool",
    "shift": "bool",
    "logprobs": "bool",
    "top_logprobs": "int",
}
EMBED_FIELDS = {
    "model": "string",
    "input": "raw",
    "keep_alive": "duration",
    "truncate": "bool",
    "dimensions": "int",
    "options": OPTIONS,
}
EMBEDDINGS_FIELDS = {"model": "string", "prompt": "string", "keep_alive": "duration", "options": OPTIONS}
SHOW_FIELDS = {
    "model": "string",
    "system": "string",
    "template": "string",
    "verbose": "bool",
    "options": OPTIONS,
    "name": "string",
}
MESSAGE_FIELDS = {
    "role": "string",
    "content": "string",
    "thinking": "string",
    "images": "[]api.ImageData",
    "tool_name": "string",
    "tool_call_id": "string",
    "tool_calls": "[]api.ToolCall",
}


def _mismatch(gotype: str, value: Any) -> tuple[str, str, str] | None:
    """(what the JSON held, the sub-path, the Go type) when `value` cannot fill a `gotype`."""
    if value is None or gotype == "raw":
        return None
    if gotype in ("string", "bool"):
        return None if _go_kind(value) == gotype else (_go_kind(value), "", gotype)
    if gotype == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return None
        return (f"number {value}" if isinstance(value, float) else _go_kind(value)), "", "int"
    if gotype == OPTIONS:
        return None if isinstance(value, dict) else (_go_kind(value), "", gotype)
    if not isinstance(value, list):
        return _go_kind(value), "", gotype
    element = {"[]int": "int", "[]api.ImageData": "string"}.get(gotype)
    for item in value:
        if element and (bad := _mismatch(element, item)):
            return bad[0], "", gotype[2:] if element == "string" else element
        if not element and item is not None and not isinstance(item, dict):
            return _go_kind(item), "", gotype.removeprefix("[]").replace("Tools", "Tool")
        if gotype == "[]api.Message" and item:
            for key, sub in item.items():
                if (subtype := MESSAGE_FIELDS.get(key)) and (bad := _mismatch(subtype, sub)):
                    return bad[0], f".{key}", bad[2]
    return None


def _check_think(value: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if value not in THINK_LEVELS:
            raise Reply(
                400, f'invalid think value: {go_quote(value)} (must be "high", "medium", "low", "max", true, or false)'
            )
        return
    raise Reply(400, 'think must be a boolean or string ("high", "medium", "low", "max", true, or false)')


def _syntax_error(exc: json.JSONDecodeError, text: str) -> str:
    """encoding/json's text for a body that is not JSON."""
    if exc.pos >= len(text.rstrip()):
        return "unexpected EOF"
    char = text[exc.pos]
    quoted = "'\\''" if char == "'" else f"'{char}'"
    if exc.msg.startswith("Expecting property name"):
        return f"invalid character {quoted} looking for beginning of object key string"
    if exc.msg.startswith("Expecting ':'"):
        return f"invalid character {quoted} after object key"
    if exc.msg.startswith("Expecting ','"):
        where = "array element" if _innermost(text, exc.pos) == "[" else "object key:value pair"
        return f"invalid character {quoted} after {where}"
    return f"invalid character {quoted} looking for beginning of value"


def _innermost(text: str, pos: int) -> str:
    stack, in_string, escaped = [], False, False
    for char in text[:pos]:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            stack.append(char)
        elif char in "]}" and stack:
            stack.pop()
    return stack[-1] if stack else ""


def parse_body(raw: bytes, struct: str) -> dict[str, Any]:
    """gin's ShouldBindJSON: one JSON value (anything after it is never read)."""
    text = raw.decode("utf-8", "replace").lstrip()
    if not text:
        raise Reply(400, "missing request body")
    try:
        value, _ = json.JSONDecoder().raw_decode(text)
    except json.JSONDecodeError as exc:
        raise Reply(400, _syntax_error(exc, text)) from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Reply(400, f"json: cannot unmarshal {_go_kind(value)} into Go value of type api.{struct}")
    return value


def request_fields(body: dict[str, Any], struct: str, fields: dict[str, str]) -> dict[str, Any]:
    """The request's fields by their canonical names (Go matches keys case-insensitively).
    A custom decoder's error (think, keep_alive) stops at once; a type error is reported after
    the whole body was read, the first one found."""
    out: dict[str, Any] = {}
    first_error = None
    for key, value in body.items():
        name = key if key in fields else next((f for f in fields if f.lower() == key.lower()), None)
        if name is None:
            continue
        gotype = fields[name]
        if gotype == "think":
            _check_think(value)
        elif gotype == "duration":
            if value is not None:
                try:
                    parse_keep_alive(value)
                except ValueError as exc:
                    raise Reply(400, str(exc)) from None
        elif (bad := _mismatch(gotype, value)) is not None:
            first_error = first_error or (
                f"json: cannot unmarshal {bad[0]} into Go struct field {struct}.{name}{bad[1]} of type {bad[2]}"
            )
            continue
        out[name] = value
    if first_error:
        raise Reply(400, first_error)
    return out


# api/types.go Options: a known key of the wrong type fails the request; unknown keys only log.
_OPTION_TYPES = {
    **dict.fromkeys(
        (
            "num_keep",
            "seed",
            "num_predict",
            "top_k",
            "repeat_last_n",
            "num_ctx",
            "num_batch",
            "num_gpu",
            "num_thread",
            "draft_num_predict",
            "main_gpu",
        ),
        "integer",
    ),
    **dict.fromkeys(
        ("top_p", "min_p", "typical_p", "temperature", "repeat_penalty", "presence_penalty", "frequency_penalty"),
        "float32",
    ),
    "use_mmap": "boolean",
    "stop": "array",
}


def parse_options(raw: dict[str, Any] | None) -> dict[str, Any]:
    """The options Ollama understands, checked like Options.FromMap (an error here is a 500)."""
    out: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        kind = _OPTION_TYPES.get(key)
        if kind is None or value is None:
            continue  # "invalid option provided" is a log line, not an error
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind in ("integer", "float32") and not number or kind == "boolean" and not isinstance(value, bool):
            raise Reply(500, f"option {go_quote(key)} must be of type {kind}")
        if kind == "array":
            if not isinstance(value, list):
                raise Reply(500, f"option {go_quote(key)} must be of type array")
            if not all(isinstance(v, str) for v in value):
                raise Reply(500, f"option {go_quote(key)} must be of an array of strings")
        out[key] = int(value) if kind == "integer" else value
    return out
