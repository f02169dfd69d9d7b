"""One error hierarchy: each class carries the HTTP status the server and the CLI show; the ones
that stop `gpuq serve` carry its process exit code apart (`exit_code`). `http_error` is the one
ladder from any exception to an HttpError: each door renders it in its own envelope."""

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# The schema's triggers raise exactly this (migration 010); gpuq/store/sqlite.py from_sqlite turns it
# into GuardRefused.
GUARD_MESSAGE = "a critique never runs on its parent task's node"


def described(exc: BaseException) -> str:
    """An exception as a reason a person reads: its class, and its text when it has any (a bare
    TimeoutError() or AssertionError() would otherwise end the reason in an empty colon)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class GpuqError(Exception):
    status = 500
    exit_code = 1  # `gpuq serve`'s exit code when this error stops it

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class BadRequest(GpuqError):
    status = 400


class NotFound(GpuqError):
    status = 404


class Unauthorized(GpuqError):
    status = 401


class Forbidden(GpuqError):
    status = 403


class Conflict(GpuqError):
    """The request is well formed but the queue's current state refuses it."""

    status = 409


class GuardRefused(Conflict):
    def __init__(self, message: str = GUARD_MESSAGE):
        super().__init__(message)


class IdTaken(Conflict):
    """A client-chosen job id collided with one in the table (its chooser picks another)."""


class NoResultToCritique(Conflict):
    """A critique of a task's result (submitted, or retried) whose task ended without one."""

    def __init__(self, parent_id: str, state: str):
        super().__init__(
            f"parent task {parent_id} is {state}: there is no result to critique; retry the parent "
            f"first (gpuq retry {parent_id}) or critique a file"
        )


class GuardMiss(Conflict):
    """A worker tried to finish a run that is no longer the job's running run."""


# How long a client over its max_waiting is told to wait before it asks again (Retry-After).
QUOTA_RETRY_AFTER_S = 30


class OverQuota(GpuqError):
    """A submit beyond the user's max_waiting: 429, with Retry-After (nothing is stored)."""

    status = 429

    def __init__(self, message: str, waiting: Sequence[str] = (), retry_after_s: int = QUOTA_RETRY_AFTER_S):
        super().__init__(message)
        self.waiting = list(waiting)  # the owner's waiting jobs: Retry-After is when the first starts
        self.retry_after_s = retry_after_s


class MisdirectedRequest(GpuqError):
    """The request names a host that is not this router's (see router.allowed_hosts)."""

    status = 421


class TooLarge(GpuqError):
    status = 413


class Unprocessable(GpuqError):
    """Well-formed JSON that names something that does not exist or cannot be used."""

    status = 422


class UnknownNode(Unprocessable):
    """A node name that gpuq.toml does not list: 422 on every path (a job's `node`, a move's
    `node`, /api/nodes/{name}/clear), never 404. The nodes are fixed by the configuration, so
    the name is a mistake in the request, to be fixed, not a thing that may appear later; and a
    404 from this router means "no such route" (an older router) or "no such job", which a
    client may take as already gone: a clear answered 404 reads as nothing left to clear."""

    def __init__(self, name: str, known: Iterable[str]):
        super().__init__(f"unknown node '{name[:64]}' (the nodes: {', '.join(sorted(known))})")


class ModelMissing(Unprocessable):
    """No node that may take the job has its model (the front door answers as Ollama: 404)."""

    def __init__(self, message: str, model: str):
        super().__init__(message)
        self.model = model


class FrontError(GpuqError):
    """A front-door refusal or failure with its own status and an OpenAI error `code`."""

    def __init__(self, status: int, message: str, code: str | None = None, retry_after_s: int | None = None):
        super().__init__(message, status)
        self.code = code
        self.retry_after_s = retry_after_s  # when to ask again (Retry-After), for a refusal that passes


class StoreUnavailable(GpuqError):
    """The database refused a write (locked past the busy timeout, disk full, read-only)."""

    status = 503


class SchemaViolated(GpuqError):
    """A write broke a rule of the schema (a CHECK, UNIQUE, NOT NULL or foreign key): a bug in
    gpuq, not a store that is unavailable, so retrying cannot help. `constraint` names the rule."""

    status = 500

    def __init__(self, message: str, constraint: str):
        super().__init__(message)
        self.constraint = constraint


class IncompleteInstall(GpuqError):
    """A file gpuq ships (the pages, the migrations) is missing from its installation."""

    exit_code = 2


# `gpuq serve`'s exit code for a config it cannot run on (sysexits.h EX_CONFIG), apart from 2
# (a port taken, a database in use: worth starting again): a service manager told not to restart
# on it (gpuq/ops/service.py) stops instead of looping on a file only a person can mend.
EX_CONFIG = 78


class ConfigError(GpuqError):
    exit_code = EX_CONFIG


class NewerSchema(GpuqError):
    """The database holds migrations this gpuq does not know (a newer gpuq wrote it): refused
    before anything is changed, on either engine."""

    def __init__(self, where: object, newer: list[int], known: int):
        super().__init__(
            f"{where} was written by a newer gpuq (schema version {max(newer)}; this gpuq "
            f"knows up to {known}); upgrade gpuq or use another database"
        )

    exit_code = 2


class StartupError(GpuqError):
    """`gpuq serve` cannot start: its database is in use by another router, its port is taken."""

    exit_code = 2


class DatabaseInUse(StartupError):
    """A router (or `gpuq restore`) holds the database's lock file (gpuq/ops/daemon.py
    lock_database): `holder` says who, as it wrote it (pid, address, start time)."""

    def __init__(self, database: object, holder: str):
        super().__init__(
            f"the database {database} is in use by {holder}: stop that one first, or give this one another database"
        )
        self.database = database
        self.holder = holder


@dataclass(frozen=True)
class DoorWords:
    """How one door words the refusals aiohttp makes itself (no route, a wrong method, a body
    over its limit) and a bug of its own."""

    no_route: Callable[[str, str], str]  # (method, path) -> the 404's message
    wrong_method: Callable[[str, str], str] | None  # (method, path) -> the 405's; None: aiohttp's reason
    too_large: str  # said after "request body too large: <aiohttp's text>"
    internal: str  # the 500's message


@dataclass(frozen=True)
class HttpError:
    status: int
    message: str
    code: str | None = None  # an OpenAI error code (the front door's own refusals)
    retry_after_s: int | None = None  # a quota (429): when to ask again
    unexpected: bool = False  # a bug: the door logs it with its traceback


def http_error(exc: Exception, door: DoorWords, method: str, path: str) -> HttpError | None:
    """The one ladder from an exception to the answer a client gets; None: not an error (an
    aiohttp redirect), raise it on."""
    if isinstance(exc, FrontError):
        return HttpError(exc.status, exc.message, code=exc.code, retry_after_s=exc.retry_after_s)
    if isinstance(exc, GpuqError):
        return HttpError(exc.status, exc.message, retry_after_s=getattr(exc, "retry_after_s", None))
    from aiohttp import web  # here, not above: the CLI imports this module and needs no aiohttp

    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return HttpError(413, f"request body too large: {exc.text}{door.too_large}")
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            return None
        if exc.status == 404:
            return HttpError(404, door.no_route(method, path))
        if exc.status == 405 and door.wrong_method is not None:
            return HttpError(405, door.wrong_method(method, path))
        return HttpError(exc.status, exc.reason)
    return HttpError(500, door.internal, unexpected=True)


class OllamaError(Exception):
    """Anything a node's Ollama said or did wrong; `message` is Ollama's text verbatim."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.status = status


class OllamaUnreachable(OllamaError):
    """The node cannot be connected to (refused, no such host, no answer to the connect): it is
    down, whatever the request was. The message names the node, its URL and the failure."""


def check_text(body: Any) -> None:
    """JSON may escape half a UTF-16 pair ("\\ud800"), which decodes to a Python str that no
    UTF-8 can hold: it could be neither stored nor sent on. BadRequest naming the first such
    string (a value or a key, at any depth: 'messages[0].content'). The one check of a request's
    text, for the router's API and every API of the front door."""
    todo: list[tuple[str, Any]] = [("", body)]
    while todo:  # a stack, not recursion: a body nested as deep as json.loads allows is fine
        where, value = todo.pop()
        if isinstance(value, str):
            if not value.isascii() and (half := _lone_surrogate(value)) is not None:
                raise BadRequest(f"field '{where[:200]}' is not valid text: it holds a lone surrogate (\\u{half:04x})")
        elif isinstance(value, dict):
            inner = []
            for key, item in value.items():
                if not key.isascii() and (half := _lone_surrogate(key)) is not None:
                    place = f"field '{where[:200]}'" if where else "the request body"
                    raise BadRequest(
                        f"{place} has a key that is not valid text: it holds a lone surrogate (\\u{half:04x})"
                    )
                inner.append((f"{where}.{key}" if where else key, item))
            todo.extend(reversed(inner))  # document order: the first bad string is the one named
        elif isinstance(value, list):
            todo.extend(reversed([(f"{where}[{i}]", item) for i, item in enumerate(value)]))


def _lone_surrogate(text: str) -> int | None:
    """The code point of the first half of a UTF-16 pair standing alone in `text`, if any."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return ord(text[exc.start])
    return None


def json_type(value: Any) -> str:
    """What JSON calls a value's type, for messages (the router's one namer: a wrong field at
    the front door, a node's reply of the wrong shape)."""
    if isinstance(value, bool):
        return "boolean"
    names = {dict: "object", list: "array", str: "string", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _no_constant(name: str) -> None:
    """NaN and Infinity are not JSON (Python's parser takes them; Ollama's, Go's, refuses them,
    and a node request would carry them on as null)."""
    raise ValueError(f"{name} is not a JSON value")


def _finite(text: str) -> float:
    """A JSON number that fits a float (1e400 would become inf, as Go's parser refuses it)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is out of range")
    return value


STRICT: dict[str, Any] = {"parse_constant": _no_constant, "parse_float": _finite}  # json.loads' hooks


def json_object(
    raw: bytes, missing: str, malformed: str, type_name: Callable[[Any], str], strict: bool = False
) -> dict[str, Any]:
    """A request body as a JSON object, else BadRequest naming what is wrong, in the words of the
    API that asks (gpuq's own, or Ollama's at the front door). `strict`: NaN, Infinity and
    numbers past a float refused, as Ollama's parser refuses them (the front door, whose bodies
    go on to the node; gpuq's own API checks each number field and names it)."""
    if not raw:
        raise BadRequest(missing)
    try:
        body = json.loads(raw.decode("utf-8"), **(STRICT if strict else {}))
    except UnicodeDecodeError:
        raise BadRequest("request body is not valid UTF-8") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    except ValueError as exc:
        raise BadRequest(f"{malformed}: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"expected a JSON object, got {type_name(body)}")
    return body
