"""MkDocs hook: renders the configuration reference from gpuq.config.KEYS, the one declaration
of gpuq.toml's keys that the parser and gpuq/reload.py read too. docs/configuration.md holds the
prose; its marker line is replaced by the tables at every build, so the page cannot drift from
the code (and nothing generated is committed)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- gpuq:config-reference -->"
SECTIONS = (
    ("router", "[router]", "The router: its addresses, access, database, job limits, connections, alerts."),
    ("front", "[front]", "The front door's own limits, and the browser pages that may call it."),
    ("backup", "[backup]", "Scheduled backups of the SQLite database, taken by the router itself (not on PostgreSQL)."),
    ("storage", "[storage]", "The storage budget: when /health, the page and an alert warn of a filling disk."),
    (
        "retention",
        "[retention]",
        "What an ended job keeps, and for how long; where it is archived before it leaves the database "
        "(see [Retention and archive](operations.md#retention-and-archive)). A reload applies a change to the next sweep.",
    ),
    (
        "node",
        "[[node]]",
        "One table per machine running Ollama. A reload applies a node's changes to its next "
        "job; a node added is checked and claimed from at once, one removed must have no jobs "
        "(or `gpuq reload --force`).",
    ),
    ("user", "[[user]]", "One table per person or program. A reload applies a user's changes at both doors at once."),
)


def _keys():
    # This checkout's gpuq, not an installed one: the reference is of the code beside it.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from gpuq.config import KEYS

    return KEYS


def _toml(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The tables, one per table of gpuq.toml, each key in the order it is declared."""
    keys = _keys()
    out: list[str] = []
    for section, title, about in SECTIONS:
        out += [
            f"### {title}",
            "",
            about,
            "",
            "| key | default | what it does | `gpuq reload` |",
            "| --- | --- | --- | --- |",
        ]
        for k in (k for k in keys if k.section == section):
            default = k.shown if k.shown is not None else f"`{_cell(_toml(k.default))}`"
            kind = " (duration)" if k.duration else ""
            reload = "needs a restart" if k.restart else "live"
            out.append(f"| `{k.name}`{kind} | {_cell(default)} | {_cell(k.doc)} | {reload} |")
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
