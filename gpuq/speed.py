"""Each node's measured speed for a model, from its own recent runs (pure: no I/O, no clock).

Over a node's last `LAST_RUNS` done runs of a model (the store sums them: Store.speeds):
prompt tokens per second = their prompt tokens / their prompt evaluation time, output tokens
per second = their output tokens / their generation time (Ollama's own counters and durations,
recorded with each run), and the load time: the longest load among them. gpuq unloads a model
after each job unless it is kept warm, and a run that found its model loaded reports a load of
next to nothing, so the longest is the cold load a job pays. Runs without a duration (an
embedding generates nothing; runs before migration 028 have no prompt time) count for the
other figures only: a figure no run measured is None ("not measured"), never a guess."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .jobs import normalize_model

LAST_RUNS = 20  # the recent done runs a speed is measured over (as eta.LAST_RUNS)


@dataclass(frozen=True)
class Speed:
    runs: int = 0  # the done runs measured (at most LAST_RUNS per name the model was asked by)
    prompt_tokens: int = 0
    prompt_ns: int = 0
    output_tokens: int = 0
    output_ns: int = 0
    load_ns: int | None = None
    last_used: str | None = None  # when the newest of them ended (ISO-8601)

    @property
    def prompt_tps(self) -> float | None:
        return self.prompt_tokens / (self.prompt_ns / 1e9) if self.prompt_ns > 0 else None

    @property
    def output_tps(self) -> float | None:
        return self.output_tokens / (self.output_ns / 1e9) if self.output_ns > 0 else None

    @property
    def load_s(self) -> float | None:
        return None if self.load_ns is None else self.load_ns / 1e9

    def plus(self, other: Speed) -> Speed:
        """Two names of one model ("m" and "m:latest"): their runs together."""
        loads = [n for n in (self.load_ns, other.load_ns) if n is not None]
        used = [u for u in (self.last_used, other.last_used) if u is not None]
        return Speed(
            self.runs + other.runs,
            self.prompt_tokens + other.prompt_tokens,
            self.prompt_ns + other.prompt_ns,
            self.output_tokens + other.output_tokens,
            self.output_ns + other.output_ns,
            max(loads) if loads else None,
            max(used) if used else None,
        )


def _int(value: Any) -> int:
    return int(value or 0)  # PostgreSQL sums bigints as numeric (Decimal); NULL: none measured


def from_rows(rows: list[dict[str, Any]]) -> dict[tuple[str, str], Speed]:
    """Store.speeds' rows, keyed by (node, the model's normalized name)."""
    out: dict[tuple[str, str], Speed] = {}
    for r in rows:
        found = Speed(
            _int(r["runs"]),
            _int(r["prompt_tokens"]),
            _int(r["prompt_ns"]),
            _int(r["output_tokens"]),
            _int(r["output_ns"]),
            None if r["load_ns"] is None else int(r["load_ns"]),
            r["last_used"],
        )
        key = (r["node"], normalize_model(r["model"]))
        out[key] = out[key].plus(found) if key in out else found
    return out


def asked_names(model: str) -> set[str]:
    """The names a job may have asked a model by that Ollama takes as the same: as listed, and
    without its ':latest' ("m" runs "m:latest")."""
    return {model, model.removesuffix(":latest")} - {""}


def speed_json(speed: Speed | None) -> dict[str, Any]:
    """The API's shape: rounded, None where not measured."""
    s = speed or Speed()
    return {
        "runs": s.runs,
        "prompt_tokens_per_s": _round(s.prompt_tps),
        "output_tokens_per_s": _round(s.output_tps),
        "load_s": _round(s.load_s, 2),
    }


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def speed_text(speed: dict[str, Any]) -> str:
    """ "prompt 812.4 tok/s, output 41.2 tok/s, load 3.21 s (20 runs)"."""
    parts = [
        f"prompt {_or_dash(speed['prompt_tokens_per_s'])} tok/s",
        f"output {_or_dash(speed['output_tokens_per_s'])} tok/s",
        f"load {_or_dash(speed['load_s'])} s",
    ]
    return f"{', '.join(parts)} ({speed['runs']} run{'s' if speed['runs'] != 1 else ''})"


def _or_dash(value: float | None) -> str:
    return "-" if value is None else num_text(value)


def num_text(value: float) -> str:
    """A rounded figure as the page's JavaScript writes it: 86, 41.2, 99509.1 (never 1e+05)."""
    return str(int(value)) if value == int(value) else str(value)
