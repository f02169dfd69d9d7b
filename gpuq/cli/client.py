"""The CLI's HTTP client: a few clear lines of urllib, errors carried with their status. An
answer that is not gpuq's JSON (another server on the port, a proxy's page) is one clear error
naming the URL, never a traceback or a page of HTML."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from http.client import HTTPResponse
from typing import Any

from .. import __version__

# What breaks a request or a reply mid-way: the socket (resets, timeouts) or HTTP itself (a
# status line that is not HTTP, a body cut short).
BROKEN = (OSError, http.client.HTTPException)
USER_AGENT = f"gpuq-cli/{__version__}"


class ApiError(Exception):
    def __init__(self, status: int | str, message: str):
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message


class Router:
    def __init__(self, base_url: str, token: str | None = None, timeout_s: float = 30.0):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def _request(
        self, method: str, path: str, body: Any = None, timeout: float | None = None, allow: tuple[int, ...] = ()
    ) -> HTTPResponse | urllib.error.HTTPError:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("X-Gpuq-Actor", "cli")
        req.add_header("User-Agent", USER_AGENT)  # the client a job records (its `client`)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            resp: HTTPResponse = urllib.request.urlopen(req, timeout=timeout or self.timeout_s)
            return resp
        except urllib.error.HTTPError as exc:
            if exc.code in allow:
                return exc  # e.g. /health's 503 still carries the report
            raw = self._read(exc, req.full_url)
            error = _json_object(raw).get("error")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                raise ApiError(exc.code, error["message"]) from None
            raise self._foreign(req.full_url, exc.code, exc.headers, raw) from None
        except urllib.error.URLError as exc:
            raise ApiError(
                "-", f"cannot reach the router at {self.base_url}: {exc.reason}{_start_hint(exc.reason)}"
            ) from None
        except TimeoutError:
            raise ApiError("-", f"no answer from {req.full_url} within {timeout or self.timeout_s:g}s") from None
        except BROKEN as exc:  # e.g. a server that does not speak HTTP, or hangs up at once
            raise ApiError(
                "-",
                f"{req.full_url} did not answer like a gpuq router ({_describe(exc)}); "
                f"is {self.base_url} the router's URL?",
            ) from None

    def call(self, method: str, path: str, body: Any = None, allow: tuple[int, ...] = ()) -> dict[str, Any]:
        url = self.base_url + path
        with self._request(method, path, body, allow=allow) as resp:
            raw = self._read(resp, url)
            data = _json_object(raw)
            if not data:  # every gpuq answer is a non-empty JSON object
                raise self._foreign(url, _status(resp), resp.headers, raw)
            return data

    def lines(self, path: str) -> Iterator[dict[str, Any]]:
        """Follow an NDJSON stream line by line."""
        url = self.base_url + path
        with self._request("GET", path, timeout=3600 * 24) as resp:
            try:
                for raw in resp:
                    if raw.strip():
                        line = _json_object(raw)
                        if not line:
                            raise self._foreign(url, _status(resp), resp.headers, raw)
                        yield line
            except BROKEN as exc:
                raise ApiError("-", f"the stream from {url} broke off: {_describe(exc)}") from None

    def _read(self, resp: HTTPResponse | urllib.error.HTTPError, url: str) -> bytes:
        try:
            return resp.read()
        except BROKEN as exc:
            raise ApiError("-", f"the answer from {url} broke off: {_describe(exc)}") from None

    def _foreign(self, url: str, status: int, headers: Message | None, raw: bytes) -> ApiError:
        """Something answered, but not gpuq: say what it sent, in one line."""
        text = " ".join(raw.decode("utf-8", "replace").split())
        content_type = (headers.get("Content-Type") if headers else None) or ""
        if "html" in content_type or text.startswith("<"):
            what = "an HTML page"
        elif not text:
            what = "an empty body"
        else:
            what = f'"{text[:80]}{"…" if len(text) > 80 else ""}"'
        return ApiError(status, f"{url} answered {what}, not gpuq's JSON; is {self.base_url} the router's URL?")


def _status(resp: HTTPResponse | urllib.error.HTTPError) -> int:
    """An answer's HTTP status; an error answer let through (`allow`) carries it as its code."""
    return resp.code if isinstance(resp, urllib.error.HTTPError) else resp.status


def _json_object(raw: bytes) -> dict[str, Any]:
    """The JSON object in `raw`, or {} when it holds anything else."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _describe(exc: BaseException) -> str:
    """The error in one short line (a BadStatusLine carries whatever the server sent)."""
    text = " ".join(str(exc).split())
    return (text[:80] + "…" if len(text) > 80 else text) or type(exc).__name__


def _start_hint(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "; is it running? Start it with `gpuq serve` (or `make run` in a gpuq checkout)"
    return ""
