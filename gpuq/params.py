"""What a job asks of Ollama beyond its prompt: `think` and model `options`, each checked once
here for both gpuq.toml (a node's defaults) and the API (a job's own), merged job over node."""

from __future__ import annotations

import json
from typing import Any

# Ollama's think levels, in its order (api/types.go ThinkValue; "max" since Ollama 0.22, #15787),
# for models that take a level (gpt-oss). The one list: config, the router's API, the CLI's
# --think-level and the front door all take these.
THINK_LEVELS = ("high", "medium", "low", "max")
_THINK_VALUES = ", ".join(f'"{level}"' for level in THINK_LEVELS) + ", true, or false"

# Options whose type Ollama checks (api/types.go Options): a wrong type there is refused by
# Ollama only when the job runs; refuse it at submit instead. Other keys pass through as given
# (Ollama logs an unknown key and ignores it).
INT_OPTIONS = (
    "num_ctx",
    "num_predict",
    "seed",
    "top_k",
    "num_keep",
    "repeat_last_n",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "num_thread",
)
NUMBER_OPTIONS = (
    "temperature",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
)


def _shown(value: Any) -> str:
    return json.dumps(value)[:80]


def think_problem(value: Any) -> str | None:
    """None when `value` is a think value Ollama takes (None: unset), else Ollama's own words
    for it (api/types.go ThinkValue.UnmarshalJSON), which name the field: every door says what
    Ollama would, and a gpuq.toml key shows the same text after its place."""
    if value is None or isinstance(value, bool) or value in THINK_LEVELS:
        return None
    if isinstance(value, str):
        return f"invalid think value: {_shown(value)} (must be {_THINK_VALUES})"
    return f"think must be a boolean or string ({_THINK_VALUES})"


def options_problem(value: Any) -> str | None:
    """None when `value` is an object of model options Ollama can take, else what is wrong."""
    if not isinstance(value, dict):
        return f'expected an object of Ollama model options such as {{"num_ctx": 32768}}, got {_shown(value)}'
    for key, item in value.items():
        if item is None:  # unset, as Ollama reads it (Options.FromMap skips nil): LangChain sends these
            continue
        # A float where Ollama wants an integer is truncated there (JSON numbers are float64 to
        # Go), so 2048.0 is taken as Ollama takes it; anything else there Ollama refuses.
        is_number = isinstance(item, (int, float)) and not isinstance(item, bool)
        if key in INT_OPTIONS and not is_number:
            return f"option '{key}' must be a whole number, got {_shown(item)}"
        if key in NUMBER_OPTIONS and not is_number:
            return f"option '{key}' must be a number, got {_shown(item)}"
        if key == "num_ctx" and item < 1:
            return f"option 'num_ctx' must be at least 1, got {item}"
        if key == "stop" and not (isinstance(item, list) and all(isinstance(s, str) for s in item)):
            return f"option 'stop' must be a list of strings, got {_shown(item)}"
    return None


def merged_options(node: dict[str, Any] | None, job: dict[str, Any] | None) -> dict[str, Any] | None:
    """The options a run sends: the job's over the node's (a job's null leaves the node's value,
    as null leaves Ollama's default); None when neither has any."""
    merged = {**(node or {}), **{k: v for k, v in (job or {}).items() if v is not None}}
    return merged or None
