"""Browsers on other sites. The router's API refuses their state changes (its page is its only
site); the front door answers them by CORS as Ollama does, with Ollama's configuration
(server/routes.go GenerateRoutes: cors.DefaultConfig, AllowWildcard, its AllowHeaders;
envconfig/config.go AllowedOrigins), answered as gin-contrib/cors v1.7.2 does."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from urllib.parse import urlparse

from aiohttp import web

from ..config import ConfigError, check_origin
from ..errors import Forbidden, FrontError

log = logging.getLogger("gpuq")

UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")

# Browsers and Electron apps call the front door as they call Ollama, from these origins.
DEFAULT_ORIGINS = (
    *(
        f"{scheme}://{host}{port}"
        for host in ("localhost", "127.0.0.1", "0.0.0.0")
        for port in ("", ":*")
        for scheme in ("http", "https")
    ),
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
)

CORS_ALLOW_METHODS = "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"  # cors.DefaultConfig

CORS_ALLOW_HEADERS = ",".join(
    (  # canonical forms, as gin-contrib/cors writes them (utils.go)
        "Authorization",
        "Content-Type",
        "User-Agent",
        "Accept",
        "X-Requested-With",
        "Openai-Beta",
        "X-Stainless-Arch",
        "X-Stainless-Async",
        "X-Stainless-Custom-Poll-Interval",
        "X-Stainless-Helper-Method",
        "X-Stainless-Lang",
        "X-Stainless-Os",
        "X-Stainless-Package-Version",
        "X-Stainless-Poll-Helper",
        "X-Stainless-Retry-Count",
        "X-Stainless-Runtime",
        "X-Stainless-Runtime-Version",
        "X-Stainless-Timeout",
    )
)

CORS_MAX_AGE = "43200"  # cors.DefaultConfig's MaxAge, 12 h

CORS_ORIGIN = "gpuq.cors_origin"  # the request's allowed origin, for its answer's headers


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


def env_origins(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """OLLAMA_ORIGINS as Ollama reads it (envconfig AllowedOrigins and Var: the value trimmed of
    spaces and quotes, split on commas), so a machine set up for Ollama's browser clients serves
    them here too, beside [front] origins. An entry that is not an origin is left out, and said."""
    value = environ.get("OLLAMA_ORIGINS", "").strip().strip("\"'")
    out = []
    for i, entry in enumerate(value.split(",") if value else [], 1):
        try:
            out.append(check_origin(entry, f"OLLAMA_ORIGINS[{i}]"))
        except ConfigError as exc:
            log.warning("%s: left out", exc)
    return tuple(out)


class Origins:
    """Which browser origins may call the front door: Ollama's defaults and [front] origins (as
    OLLAMA_ORIGINS), matched as gin-contrib/cors matches them (config.go validateOrigin: exact, or
    one '*' as a prefix/suffix wildcard; a lone '*' allows every origin)."""

    def __init__(self, configured: tuple[str, ...]):
        listed = [*configured, *DEFAULT_ORIGINS]
        self.everyone = "*" in listed
        self.exact = frozenset(o for o in listed if "*" not in o)
        self.wildcards = [tuple(o.split("*", 1)) for o in listed if "*" in o and o != "*"]

    def allows(self, origin: str) -> bool:
        if self.everyone or origin in self.exact:
            return True
        return any(
            origin.startswith(head) and origin.endswith(tail) and len(origin) >= len(head) + len(tail)
            for head, tail in self.wildcards
        )


def cors(request: web.Request, origins: Origins) -> web.Response | None:
    """gin-contrib/cors's applyCors for one request: no Origin, or the front door's own origin,
    is not a CORS request; an origin not allowed is 403; a preflight (OPTIONS) from an allowed
    one is answered here, 204, and any other call goes on, its answer marked for that origin."""
    origin = request.headers.get("Origin")
    if not origin or origin in (f"http://{request.host}", f"https://{request.host}"):
        return None
    if not origins.allows(origin):
        raise FrontError(
            403,
            f"origin '{origin[:200]}' is not allowed to call this gpuq front door (as in Ollama, "
            "allowed are localhost, 127.0.0.1 and 0.0.0.0 on any port, app://, file://, tauri://, "
            "vscode-webview:// and vscode-file://); add it to [front] origins in gpuq.toml, "
            "as OLLAMA_ORIGINS",
        )
    request[CORS_ORIGIN] = "*" if origins.everyone else origin
    if request.method != "OPTIONS":
        return None
    headers = {
        "Access-Control-Allow-Origin": request[CORS_ORIGIN],
        "Access-Control-Allow-Methods": CORS_ALLOW_METHODS,
        "Access-Control-Allow-Headers": CORS_ALLOW_HEADERS,
        "Access-Control-Max-Age": CORS_MAX_AGE,
    }
    resp = web.Response(status=204, headers=headers)
    if not origins.everyone:
        for vary in ("Origin", "Access-Control-Request-Method", "Access-Control-Request-Headers"):
            resp.headers.add("Vary", vary)
    return resp


async def cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer to an allowed cross-origin call, errors and streams too, names its origin
    (on_response_prepare: a stream's headers go out before its handler returns)."""
    origin = request.get(CORS_ORIGIN)
    if origin is not None and request.method != "OPTIONS":
        response.headers["Access-Control-Allow-Origin"] = origin
        if origin != "*":
            response.headers.add("Vary", "Origin")
