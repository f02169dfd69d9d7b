"""The CLI's HTTP client: a few clear lines of urllib, errors carried with their status."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Iterator


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

    def _request(self, method: str, path: str, body: Any = None, timeout: float | None = None,
                 allow: tuple[int, ...] = ()):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("X-Gpuq-Actor", "cli")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            return urllib.request.urlopen(req, timeout=timeout or self.timeout_s)
        except urllib.error.HTTPError as exc:
            if exc.code in allow:
                return exc  # e.g. /health's 503 still carries the report
            raise ApiError(exc.code, _error_message(exc.read(), exc.reason)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError("-", f"cannot reach the router at {self.base_url}: {reason}") from None

    def call(self, method: str, path: str, body: Any = None, allow: tuple[int, ...] = ()) -> dict:
        with self._request(method, path, body, allow=allow) as resp:
            return json.loads(resp.read() or b"{}")

    def lines(self, path: str) -> Iterator[dict]:
        """Follow an NDJSON stream line by line."""
        with self._request("GET", path, timeout=3600 * 24) as resp:
            for raw in resp:
                if raw.strip():
                    yield json.loads(raw)


def _error_message(raw: bytes, fallback: str) -> str:
    try:
        data = json.loads(raw)
        return data["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return raw.decode("utf-8", "replace").strip() or str(fallback)
