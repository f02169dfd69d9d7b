"""What each node has, as `gpuq models` shows it (pure: the answers and rows come in).

A node's models are those /api/tags lists (installed), those /api/ps lists (loaded now) and the
one the config names for it, each once whatever name it is listed by ("m" is "m:latest").
Each with its size, family, parameter size and quantization (Ollama's `details`), whether it is
loaded now (None: /api/ps did not answer), whether the config names it for the node, its last
use and jobs in the last `USE_DAYS` days (the runs that ended), and its measured speed."""

from __future__ import annotations

from typing import Any

from .jobs import normalize_model
from .speed import Speed, speed_json

USE_DAYS = 30  # "jobs in the last 30 days"


def node_models(
    node: str,
    configured: str,
    tags: list[dict[str, Any]],
    ps: list[dict[str, Any]] | None,
    speeds: dict[tuple[str, str], Speed],
    use: dict[tuple[str, str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """The node's models, by name. `ps` None: /api/ps did not answer (loaded unknown); `use`:
    model_use's rows keyed by (node, normalized name), summed over the names asked."""
    described: dict[str, dict[str, Any]] = {}
    for m in [*(ps or []), *tags]:  # /api/tags' entry (with its lengths) over /api/ps'
        described[normalize_model(m["name"])] = m
    installed = {normalize_model(m["name"]) for m in tags}
    loaded = None if ps is None else {normalize_model(m["name"]) for m in ps}
    wanted = normalize_model(configured)
    out = []
    for key in sorted({*described, wanted}):
        entry = described.get(key, {})
        found = entry.get("details")
        details: dict[str, Any] = found if isinstance(found, dict) else {}
        speed = speeds.get((node, key))
        used = use.get((node, key), {})
        last = [t for t in (used.get("last_used"), speed and speed.last_used) if t]
        out.append(
            {
                "name": entry.get("name", configured),
                "size": entry.get("size") if isinstance(entry.get("size"), int) else None,
                "family": _text(details.get("family")),
                "parameter_size": _text(details.get("parameter_size")),
                "quantization": _text(details.get("quantization_level")),
                "installed": key in installed,
                "loaded": None if loaded is None else key in loaded,
                "configured": key == wanted,
                "last_used": max(last) if last else None,
                "jobs_30d": int(used.get("jobs", 0)),
                "speed": speed_json(speed),
            }
        )
    return out


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def use_by_model(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """model_use's rows keyed by (node, normalized name): the names one model was asked by, summed."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (r["node"], normalize_model(r["model"]))
        had = out.get(key, {"jobs": 0, "last_used": None})
        last = [t for t in (had["last_used"], r["last_used"]) if t]
        out[key] = {"jobs": had["jobs"] + int(r["jobs"]), "last_used": max(last) if last else None}
    return out


def size_text(size: int | None) -> str:
    """ "18.6 GB" (Ollama's decimal units, as `ollama list`), "-" unknown."""
    if size is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"
