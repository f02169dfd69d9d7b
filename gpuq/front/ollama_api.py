"""Ollama's own API on the front door: its request checks (as Ollama's server/routes.go makes
them), its answer to an empty call (load or unload), a stream collected into the one reply of
stream:false, its error body, and the listings merged across the nodes. Pure, no I/O."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import BadRequest, FrontError, NotFound
from ..params import options_problem, think_problem
from .shapes import chunk_text, now_rfc3339, tools_of, unix_of, wrong


def ollama_error(message: str) -> dict[str, Any]:
    return {"error": message}


def check_keep_alive(value: Any) -> None:
    """Ollama refuses a keep_alive it cannot parse (400): api/types.go Duration.UnmarshalJSON."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"[-+]?0", text) or re.fullmatch(r"[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+", text):
            return
        raise BadRequest(
            f'time: missing unit in duration "{value}"'
            if text.lstrip("-").replace(".", "").isdigit()
            else f'time: invalid duration "{value}"'
        )
    raise BadRequest("Unsupported type")


_GO_UNITS_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def keep_alive_s(value: Any) -> float | None:
    """A keep_alive that check_keep_alive let through, in seconds, as Ollama reads it
    (api/types.go Duration.UnmarshalJSON): a number is seconds, a string a Go duration, and a
    negative one means forever (None). Absent: None too, for the caller's default to apply."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return None if value < 0 else float(value)
    text = value.strip()
    sign, rest = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    seconds = sum(float(n) * _GO_UNITS_S[u] for n, u in _GO_PART.findall(rest))
    return None if sign < 0 and seconds > 0 else seconds


def _check_common(body: dict[str, Any]) -> None:
    for field in ("stream", "raw"):
        if body.get(field) is not None and not isinstance(body[field], bool):
            raise wrong(field, "true or false", body[field])
    if body.get("options") is not None:
        problem = options_problem(body["options"])
        if problem:
            raise BadRequest(f"field 'options': {problem}")
    problem = think_problem(body.get("think"))  # one check, in Ollama's words (gpuq/params.py)
    if problem:
        raise BadRequest(problem)
    check_keep_alive(body.get("keep_alive"))


def go_quote(text: str) -> str:
    """Go's %q of a string, as Ollama quotes names and values in its messages."""
    return json.dumps(text, ensure_ascii=False)


def check_top_logprobs(body: dict[str, Any]) -> None:
    """Ollama's first check of a chat or generate (server/routes.go ChatHandler, GenerateHandler)."""
    given = body.get("top_logprobs")
    if isinstance(given, (int, float)) and not isinstance(given, bool) and not 0 <= given <= 20:
        raise BadRequest("top_logprobs must be between 0 and 20")


def check_format(fmt: Any) -> None:
    """Nothing (null, ""), "json" or a JSON schema object; anything else Ollama refuses only once
    the model is loaded, with a 500 (llm/llama_server.go Completion: %q of the raw JSON)."""
    if fmt is None or fmt in ("", "json") or isinstance(fmt, dict):
        return
    raw = json.dumps(fmt, separators=(",", ":"), ensure_ascii=False)
    raise FrontError(500, f'invalid format: {go_quote(raw)}; expected "json" or a valid JSON Schema object')


def _check_images(images: Any, where: str) -> None:
    if images is None:
        return
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise wrong(where, "an array of base64 strings", images)
    for image in images:
        try:
            base64.b64decode(image, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"{where}: illegal base64 data in an image") from None


def check_chat(body: dict[str, Any]) -> None:
    """An /api/chat body Ollama would accept (types only; the model is checked by placement)."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise BadRequest("model is required")
    _check_common(body)
    messages = body.get("messages")
    if messages is None:
        return
    if not isinstance(messages, list):
        raise wrong("messages", "an array of messages", messages)
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise wrong(f"messages[{i}]", "an object", msg)
        if not isinstance(msg.get("role"), str):
            raise wrong(f"messages[{i}].role", "a string", msg.get("role"))
        if msg.get("content") is not None and not isinstance(msg["content"], str):
            raise wrong(f"messages[{i}].content", "a string", msg["content"])
        if msg.get("tool_calls") is not None and not isinstance(msg["tool_calls"], list):
            raise wrong(f"messages[{i}].tool_calls", "an array", msg["tool_calls"])
        _check_images(msg.get("images"), f"messages[{i}].images")
    tools_of(body)


def check_generate(body: dict[str, Any]) -> None:
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise NotFound(f"model '{body.get('model') or ''}' not found")
    _check_common(body)
    for field in ("prompt", "suffix", "system", "template"):
        if body.get(field) is not None and not isinstance(body[field], str):
            raise wrong(field, "a string", body[field])
    if body.get("context") is not None and not (
        isinstance(body["context"], list) and all(isinstance(t, int) for t in body["context"])
    ):
        raise wrong("context", "an array of token numbers", body["context"])
    _check_images(body.get("images"), "images")
    if body.get("raw") and (body.get("template") or body.get("system") or body.get("context")):
        raise BadRequest("raw mode does not support template, system, or context")


def check_embed(body: dict[str, Any], legacy: bool) -> None:
    """/api/embed (input: a string or strings) or the legacy /api/embeddings (prompt)."""
    if not isinstance(body.get("model"), str) or not body["model"].strip():
        raise (BadRequest("model is required") if legacy else NotFound(f"model '{body.get('model') or ''}' not found"))
    if body.get("options") is not None and (problem := options_problem(body["options"])):
        raise BadRequest(f"field 'options': {problem}")
    check_keep_alive(body.get("keep_alive"))
    if legacy:
        if body.get("prompt") is not None and not isinstance(body["prompt"], str):
            raise wrong("prompt", "a string", body["prompt"])
        return
    given = body.get("input")
    if (
        given is not None
        and not isinstance(given, str)
        and not (isinstance(given, list) and all(isinstance(i, str) for i in given))
    ):
        raise BadRequest("invalid input type")
    if body.get("dimensions") is not None and (
        isinstance(body["dimensions"], bool) or not isinstance(body["dimensions"], int)
    ):
        raise wrong("dimensions", "a whole number", body["dimensions"])


def is_load_or_unload(endpoint: str, body: dict[str, Any]) -> bool:
    """Ollama answers an empty call at once: it loads the model, or with keep_alive 0 unloads it.
    gpuq makes no job of one: a model loads with the jobs that use it and stays loaded after them
    only as the node's unload policy and the calls' keep_alive allow (gpuq/node/vram.py); an
    unload is passed on to the nodes that hold the model (gpuq/front/call.py run_call)."""
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


def unloads(body: dict[str, Any]) -> bool:
    """A keep_alive that is zero as Go reads it (0, "0", "-0", "0s", "0.0s", "0m0s"): the
    model leaves memory (routes.go: req.KeepAlive.Duration == 0). A negative one is forever."""
    keep_alive = body.get("keep_alive")
    return keep_alive is not None and keep_alive_s(keep_alive) == 0


def load_or_unload_reply(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """What Ollama answers to an empty call (one JSON object, whatever `stream` says)."""
    model = body["model"]
    if endpoint == "/api/embed":
        return {"model": model, "embeddings": []}
    if endpoint == "/api/embeddings":
        return {"embedding": []}
    reason = "unload" if unloads(body) else "load"
    out: dict[str, Any] = {"model": model, "created_at": now_rfc3339()}
    if endpoint == "/api/chat":
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    out["done"] = True
    out["done_reason"] = reason
    return out


def collected(endpoint: str, chunks: Iterable[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
    """stream:false: the last chunk, its text the whole reply (routes.go writeChatResponse and
    GenerateHandler): content and thinking concatenated, tool calls and logprobs gathered."""
    content, thinking, calls = [], [], []
    logprobs: list[Any] = []
    last: dict[str, Any] = {}
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


def merged_tags(per_node: Iterable[list[dict[str, Any]]], normalize: Callable[[str], str]) -> list[dict[str, Any]]:
    """Every node's /api/tags models, each once (the first node by rank that has it speaks for
    it), most recently modified first, as Ollama sorts its own list."""
    seen: dict[str, dict[str, Any]] = {}
    for models in per_node:
        for m in models:
            if not isinstance(m, dict) or not isinstance(m.get("name") or m.get("model"), str):
                continue
            seen.setdefault(normalize(m.get("model") or m["name"]), m)
    return sorted(seen.values(), key=lambda m: -unix_of(m.get("modified_at")))


def merged_ps(per_node: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every node's loaded models, longest time left first, as Ollama sorts /api/ps."""
    models = [m for node in per_node for m in node if isinstance(m, dict)]
    return sorted(models, key=lambda m: -unix_of(m.get("expires_at")))


# /api/pull: gpuq pulls nothing (a model is pulled on a node's own Ollama), but a script that
# pulls to "make sure a model is there" hears Ollama's success when a node that runs front-door
# calls has it.

# What Ollama streams for a model already pulled, each layer a cache hit (server/images.go
# PullModel: "pulling manifest", the layers, "verifying sha256 digest", "writing manifest",
# "success"), as api/types.go ProgressResponse objects.
PULL_STATUSES = ("pulling manifest", "verifying sha256 digest", "writing manifest", "success")


def pull_model_of(body: dict[str, Any]) -> str:
    """The model a pull names (`model`, or the older `name`: routes.go PullHandler's cmp.Or)."""
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("invalid model name")  # types/errtypes InvalidModelNameErrMsg
    for field in ("stream", "insecure"):
        if body.get(field) is not None and not isinstance(body[field], bool):
            raise wrong(field, "true or false", body[field])
    return model


def pull_progress(model: str, having: list[str], others: dict[str, list[str]]) -> list[dict[str, Any]]:
    """The progress objects of a pull of a model that the nodes in `having` have; else a 404
    naming the nodes that run front-door calls (`others`: each one's models) and how to pull
    it there."""
    if having:
        return [{"status": status} for status in PULL_STATUSES]
    if not others:
        raise NotFound(
            f"model '{model}' is not on any node: no node takes task jobs, and gpuq's front door does not pull models"
        )
    listed = "; ".join(f"{name}: {', '.join(models) or 'nothing'}" for name, models in others.items())
    raise NotFound(
        f"model '{model}' is not on any node that runs front-door calls ({listed}); gpuq's front door "
        f"does not pull models: run `ollama pull {model}` on one of them ({', '.join(others)})"
    )
