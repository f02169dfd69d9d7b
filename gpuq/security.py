"""Who may use the router: only requests addressed to its own host names (no DNS rebinding),
an optional bearer token, and no state changes from other sites."""

from __future__ import annotations

import hmac
from functools import lru_cache
from urllib.parse import urlparse

from aiohttp import web

from .config import Settings, normal_host
from .errors import Forbidden, MisdirectedRequest, Unauthorized

UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
# *.localhost is left out: browsers that do not pin it to loopback ask DNS for it, and a
# resolver that answers it can rebind it. Such a name can be listed in router.allowed_hosts.
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})  # listen addresses, never a name a client uses


def router_hosts(settings: Settings) -> frozenset[str]:
    """The host names this router answers to: loopback, its listen address unless that is a
    wildcard, public_url's host, and router.allowed_hosts."""
    listen = normal_host(settings.host)
    public = normal_host(urlparse(settings.public_url).hostname or "")
    names = {*LOOPBACK_HOSTS, *settings.allowed_hosts, public, None if listen in WILDCARD_HOSTS else listen}
    if settings.ollama_listen:  # the front door's own address (gpuq/front/listener.py)
        front = normal_host(settings.ollama_listen.rsplit(":", 1)[0].strip("[]"))
        names.add(None if front in WILDCARD_HOSTS else front)
    return frozenset(names - {None})


@lru_cache(maxsize=64)  # a client sends the same Host header every time: parse it once
def host_in(header: str) -> str | None:
    """The host name in a Host header ('name', 'name:port', '[v6]:port'), port left out."""
    name, colon, port = header.rpartition(":")
    if not colon or header.endswith("]"):
        name, port = header, ""
    if port and not port.isdigit():
        return None
    return normal_host(name)


def check_host(request: web.Request, allowed: frozenset[str]) -> None:
    """A page on a name the router does not know may be a DNS rebinding attack: its domain
    now resolves to this router, so the browser treats the router as the page's own site."""
    given = request.headers.getall("Host", [])
    if len(given) != 1 or not given[0].strip():
        raise MisdirectedRequest("refused: the request has no single Host header; this router answers "
                                 "only to its own host names (add more in router.allowed_hosts)")
    name = host_in(given[0])
    if name not in allowed:
        raise MisdirectedRequest(f"refused: host '{name or given[0][:100]}' is not one of this router's names "
                                 "(a web page under another name may be a DNS rebinding attack); "
                                 "if it is really this router's name, add it to router.allowed_hosts in gpuq.toml")


def token_of(request: web.Request) -> str | None:
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
    given = token_of(request)
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


def host_middleware(settings: Settings):
    allowed = router_hosts(settings)

    @web.middleware
    async def middleware(request: web.Request, handler):
        check_host(request, allowed)
        return await handler(request)
    return middleware


def access_middleware(token: str | None):
    @web.middleware
    async def middleware(request: web.Request, handler):
        check_same_site(request)
        check_token(request, token)
        return await handler(request)
    return middleware
