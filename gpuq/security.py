"""Who may use the router: an optional bearer token, and no state changes from other sites."""

from __future__ import annotations

import hmac
from urllib.parse import urlparse

from aiohttp import web

from .errors import GpuqError

UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")


class Unauthorized(GpuqError):
    status = 401


class Forbidden(GpuqError):
    status = 403


def _token_of(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    if header.startswith("Bearer "):
        return header[len("Bearer "):].strip()
    if request.path == "/api/events":  # EventSource cannot send headers
        return request.query.get("token")
    return None


def check_token(request: web.Request, token: str | None) -> None:
    # Only /api and /metrics carry data: /health reveals no prompts, and the page's HTML and static
    # files load without the token so the page can ask for it.
    if token is None or not (request.path.startswith("/api/") or request.path == "/metrics"):
        return
    given = _token_of(request)
    if given is None or not hmac.compare_digest(given.encode(), token.encode()):
        raise Unauthorized("missing or wrong token: send 'Authorization: Bearer <token>' "
                           "(the router's token is set in gpuq.toml or $GPUQ_TOKEN)")


def check_same_site(request: web.Request) -> None:
    """A page on another site must not change the queue through the user's browser."""
    if request.method not in UNSAFE_METHODS:
        return
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ("same-origin", "none"):
        raise Forbidden(f"cross-site request refused (Sec-Fetch-Site: {site})")
    origin = request.headers.get("Origin")
    if origin is not None and origin != "null":
        parsed = urlparse(origin)
        if parsed.netloc != request.host:
            raise Forbidden(f"cross-site request refused (Origin {origin} is not {request.host})")
    elif origin == "null":
        raise Forbidden("cross-site request refused (Origin: null)")


def access_middleware(token: str | None):
    @web.middleware
    async def middleware(request: web.Request, handler):
        check_same_site(request)
        check_token(request, token)
        return await handler(request)
    return middleware
