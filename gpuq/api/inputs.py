"""What a request brings, checked: a JSON body's fields, a job id, a query's numbers; and the
bound on a read of the store."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from ..errors import BadRequest, StoreUnavailable, check_text, json_object, json_type
from ..jobs import check_job_id
from .state import STORE


async def json_body(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    body = json_object(
        await request.read(),
        "missing request body: expected a JSON object",
        "malformed JSON",
        lambda value: f"a JSON {json_type(value)}",
    )
    check_text(body)  # first: the messages below quote the body's text
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field '{unknown[0]}' (allowed: {', '.join(sorted(allowed))})")
    return body


def expected_type(kind: type | tuple[type, ...]) -> str:
    """What a JSON client calls the type a field wants, for messages: 'string', not Python's 'str'
    (a value's own type is errors.json_type's)."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:
        return "number"
    names = {str: "string", int: "whole number", bool: "boolean", list: "array", dict: "object", type(None): "null"}
    return names.get(kinds[0], kinds[0].__name__)


def field_of(body: dict[str, Any], key: str, kind: type | tuple[type, ...], required: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        if required:
            raise BadRequest(f"missing field '{key}'")
        return None
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):  # a bool is an int to Python
        raise BadRequest(f"field '{key}' must be a {expected_type(kind)}, got {json.dumps(value)[:80]}")
    return value


def job_id_of(request: web.Request, text: str | None = None) -> str:
    return check_job_id(text if text is not None else request.match_info["id"])


def int_param(query: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    text = query.get(key)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise BadRequest(f"query parameter '{key}' must be a whole number from {low} to {high}, got '{text[:40]}'")
    return int(text)


# A read of the pages' and the CLI's that the store does not answer within this long is a 503
# naming the store's trouble: the page then still shows /health's truth (it fetches each part
# apart), where it would wait with a frozen disk (a reader's thread can be stuck for minutes).
READ_BOUND_S = 5.0


def bounded(handler: Handler) -> Handler:
    """A GET that reads the store, answered within READ_BOUND_S whatever the store does."""

    async def read_within_bound(request: web.Request) -> web.StreamResponse:
        try:
            async with asyncio.timeout(READ_BOUND_S):
                return await handler(request)
        except TimeoutError:
            trouble = request.app[STORE].trouble(slow_s=READ_BOUND_S)
            why = f": {trouble['problem']}" if trouble else ""
            raise StoreUnavailable(
                f"the database did not answer within {READ_BOUND_S:g}s{why}; GET /health says what the router knows"
            ) from None

    return read_within_bound
