"""Critiques: the subject, the instruction, and the structured findings the model must return."""

from __future__ import annotations

import json
from typing import Any

SEVERITIES = ("low", "medium", "high")

# Sent as Ollama's `format`, so the model's reply is constrained to this shape.
FINDINGS_SCHEMA = {
    "type": "object",
    "properties": {
        "findings": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "title": {"type": "string"},
                    "detail": {"type": "string"},
                    "severity": {"type": "string", "enum": list(SEVERITIES)},
                    "where": {"type": "string"},
                },
                "required": ["title", "detail", "severity", "where"],
            },
        }
    },
    "required": ["findings"],
}


class FindingsError(ValueError):
    pass


def parent_subject(prompt: str, output: str) -> str:
    """What a critique of a task reviews: the task's prompt and its result."""
    return f"## Task\n{prompt}\n\n## Result\n{output}"


def instruction(template: str, subject: str) -> str:
    return template.replace("{subject}", subject)


def parse_findings(reply: str) -> list[dict[str, Any]]:
    """The findings in a model's reply, checked against FINDINGS_SCHEMA."""
    try:
        data = json.loads(reply)
    except ValueError as exc:
        raise FindingsError(f"the reply is not JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("findings"), list):
        raise FindingsError("the reply has no 'findings' list")
    findings = []
    for i, item in enumerate(data["findings"], start=1):
        if not isinstance(item, dict):
            raise FindingsError(f"finding {i} is not an object")
        for key in ("title", "detail", "severity", "where"):
            if not isinstance(item.get(key), str):
                raise FindingsError(f"finding {i} has no string '{key}'")
        if item["severity"] not in SEVERITIES:
            raise FindingsError(f"finding {i} has severity {item['severity']!r}, not one of {', '.join(SEVERITIES)}")
        findings.append({k: item[k] for k in ("title", "detail", "severity", "where")})
    return findings
