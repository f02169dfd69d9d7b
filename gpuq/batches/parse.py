"""A batch's input read into its lines: an OpenAI Batch API input file (JSON Lines of
{custom_id, method, url, body}) or an Anthropic Message Batch's requests ({custom_id, params}),
each line checked as the hosted API checks it. Pure: no I/O.

Two kinds of trouble, as OpenAI tells them apart: a file whose lines are not requests (not JSON,
no custom_id, one used twice, another method or endpoint) fails the whole batch in its
validation, every such line named in the batch's `errors`, and nothing of it runs; a request
that is well formed but that its endpoint would refuse (a body the translation refuses, text
over the limit, a model no node has) is that line's error in the error file, and the others run."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import BadRequest, FrontError, GpuqError, check_text
from ..front.call import check_text_size
from ..front.endpoints import ENDPOINTS, Endpoint
from ..front.stored import StoredCall
from ..jobs import NewJob

# The endpoints a batch may call, as OpenAI's Batch API lists them (and Anthropic's Messages).
OPENAI_ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/completions")
ANTHROPIC_ENDPOINT = "/v1/messages"
MAX_LISTED_ERRORS = 1000  # a batch's `errors` names this many lines at most, then says how many more


@dataclass(frozen=True)
class Line:
    """One request of a batch: its place, its custom_id, its body; or its refusal."""

    line: int
    custom_id: str
    body: dict[str, Any] | None
    refused: dict[str, Any] | None = None  #: {status, code, message}: the endpoint's answer to it


@dataclass(frozen=True)
class Parsed:
    lines: list[Line]
    errors: list[dict[str, Any]]  #: validation errors ({code, line, message, param}); any: the batch fails


def _error(code: str, line: int, message: str, param: str | None = None) -> dict[str, Any]:
    return {"code": code, "line": line, "message": message, "param": param}


class OpenAIInput:
    """An input file's lines, each checked as OpenAI's validation checks it, fed a piece at a
    time (the file is read from the store chunk by chunk: never whole). Blank lines are skipped
    (a final newline is no request); line numbers count every line, from 1."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.lines: list[Line] = []
        self.errors: list[dict[str, Any]] = []
        self.seen: dict[str, int] = {}

    @property
    def total(self) -> int:
        return len(self.lines) + len(self.errors)

    def feed(self, numbered: list[tuple[int, bytes]]) -> None:
        for number, raw in numbered:
            if raw.strip():
                self.line(number, raw)

    def parsed(self) -> Parsed:
        return Parsed(self.lines, self.errors)

    def line(self, number: int, raw: bytes) -> None:
        try:
            request = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):  # (nested past what json reads)
            self.errors.append(_error("invalid_json_line", number, "This line is not parseable as valid JSON."))
            return
        refused = _request_error(request, number, self.endpoint, self.seen)
        if refused is not None:
            self.errors.append(refused)
            return
        self.seen[request["custom_id"]] = number
        self.lines.append(Line(number, request["custom_id"], request["body"]))


def _request_error(request: Any, number: int, endpoint: str, seen: dict[str, int]) -> dict[str, Any] | None:
    """Why a line's JSON is not a request of this batch (OpenAI's validation), or None."""
    if not isinstance(request, dict):
        return _error("invalid_json_line", number, "This line is not a JSON object.")
    try:
        check_text(request)  # a lone surrogate can be neither stored nor sent on
    except BadRequest as exc:
        return _error("invalid_text", number, f"This line is not valid text: {exc.message}.")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _error("missing_required_parameter", number, "Missing required parameter: 'custom_id'.", "custom_id")
    if custom_id in seen:
        return _error(
            "duplicate_custom_id",
            number,
            f"The custom_id '{custom_id[:64]}' is used on line {seen[custom_id]} already;"
            " each request's custom_id must be unique in its batch.",
            "custom_id",
        )
    method = request.get("method")
    if method != "POST":
        return _error(
            "invalid_method", number, f"Only the POST method is supported, got {str(method)[:20]!r}.", "method"
        )
    url = request.get("url")
    if url != endpoint:
        return _error(
            "mismatched_endpoint",
            number,
            f"The line's url {str(url)[:80]!r} is not the batch's endpoint '{endpoint}';"
            " a batch's requests all call its endpoint.",
            "url",
        )
    if not isinstance(request.get("body"), dict):
        return _error("missing_required_parameter", number, "Missing required parameter: 'body' (an object).", "body")
    return None


def parse_openai(content: bytes, endpoint: str) -> Parsed:
    """A whole input file's lines, checked (OpenAIInput fed at once)."""
    parser = OpenAIInput(endpoint)
    parser.feed(list(enumerate(content.split(b"\n"), 1)))
    return parser.parsed()


def parse_anthropic(requests: Any) -> list[Line]:
    """A Message Batch's requests; a malformed one refuses the whole create (400), as Anthropic's
    does, naming it by its place (`requests.3.custom_id`)."""
    if not isinstance(requests, list) or not requests:
        raise FrontError(400, "requests: a list of at least one request is required")
    lines, seen = [], set()
    for i, request in enumerate(requests):
        if not isinstance(request, dict):
            raise FrontError(400, f"requests.{i}: an object with custom_id and params is required")
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not 1 <= len(custom_id) <= 64:
            raise FrontError(400, f"requests.{i}.custom_id: a string of 1 to 64 characters is required")
        if custom_id in seen:
            raise FrontError(400, f"requests.{i}.custom_id: '{custom_id}' is used twice; each must be unique")
        seen.add(custom_id)
        params = request.get("params")
        if not isinstance(params, dict):
            raise FrontError(400, f"requests.{i}.params: an object (a Messages request) is required")
        lines.append(Line(i + 1, custom_id, params))
    return lines


def listed(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch's validation errors as it keeps them: the first MAX_LISTED_ERRORS, then one that
    says how many more lines were refused."""
    if len(errors) <= MAX_LISTED_ERRORS:
        return errors
    more = len(errors) - MAX_LISTED_ERRORS
    return errors[:MAX_LISTED_ERRORS] + [_error("too_many_errors", 0, f"and {more} more lines with errors")]


def line_job(
    line: Line,
    ep: Endpoint,
    batch_id: str,
    owner: str | None,
    client: str | None,
    lane: str,
    max_prompt_bytes: int,
    model_of: Callable[[str], str],
) -> tuple[NewJob | None, dict[str, Any] | None]:
    """A line's job, made as a front-door call's is (front/call.py's Call.new_job): the body in
    Ollama's terms, its model as a call's (`model_of`: front/call.py's run_model: `:local`
    dropped, cloud names refused, [front] model_aliases applied), its text within the router's
    limit; or the endpoint's refusal of it. The stored request names its batch and custom_id, so
    the run keeps its reply for the batch."""
    if line.refused is not None or line.body is None:
        return None, line.refused
    body = line.body
    try:
        if body.get("stream"):
            raise FrontError(400, "stream is not supported in a batch: its replies go to its output")
        ollama = ep.to_ollama(body)
        check_text_size(ollama, max_prompt_bytes)
        model = ollama.get("model")
        if not isinstance(model, str) or not model.strip():
            raise FrontError(400, "model is required")
        model = model_of(model)
        request = StoredCall(ep.path, body, client, batch_id, line.custom_id)
        job = NewJob(
            kind=ep.kind,
            prompt=ep.prompt(body),
            model=model,
            endpoint=ep.path,
            request=request.dumps(),
            owner=owner,
            client=client,
            lane=lane,
        )
    except GpuqError as exc:
        return None, {"status": exc.status, "code": getattr(exc, "code", None), "message": exc.message}
    return job, None


def endpoint_of(path: str) -> Endpoint:
    return ENDPOINTS[path]
