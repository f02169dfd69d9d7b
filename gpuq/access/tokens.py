"""Who a request says it is: the tokens it offers, and the Caller they (or the tailnet) stand
for, kept as request[CALLER] by each door's access middleware (gpuq/access/doors.py)."""

from __future__ import annotations

from aiohttp import web

from ..config import Settings
from ..errors import FrontError, Unauthorized
from . import identity
from .identity import ANYONE, Caller

CALLER = "gpuq.caller"  # request[CALLER]: who sent a request (gpuq/access/identity.py), set by access_middleware


def token_of(request: web.Request) -> str | None:
    """The Bearer token of the Authorization header (the scheme in any case: RFC 7235 says it is
    case-insensitive, and some clients send `bearer`), or /api/events' ?token=."""
    scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if request.path == "/api/events":  # EventSource cannot send headers
        return request.query.get("token")
    return None


def tokens_given(request: web.Request, anthropic: bool) -> list[str]:
    """The tokens a call offers: Bearer, and on /v1/messages also x-api-key (the Anthropic SDK's
    api_key and Claude Code's ANTHROPIC_API_KEY send it; ANTHROPIC_AUTH_TOKEN sends Bearer)."""
    given = [token_of(request)]
    if anthropic:
        given.append(request.headers.get("x-api-key"))
    return [t for t in given if t is not None]


async def api_caller(request: web.Request, settings: Settings) -> Caller:
    """Who sends the request (gpuq/access/identity.py's who), kept as request[CALLER]; a request for
    data by no one the router knows is 401. Only /api and /metrics carry data: /health reveals no
    prompts, and the page's HTML and static files load without the token so the page can ask for it."""
    if not (request.path.startswith("/api/") or request.path == "/metrics"):
        return ANYONE
    given = token_of(request)
    caller = await identity.who(settings, [] if given is None else [given], request)
    if caller is None:
        raise Unauthorized(
            "missing or wrong token: send 'Authorization: Bearer <token>' "
            "(the router's token and each [[user]]'s are set in gpuq.toml, or $GPUQ_TOKEN)"
            + ("; or call from a tailnet machine whose user has a [[user]]" if settings.identity == "tailscale" else "")
        )
    return caller


async def front_caller(request: web.Request, settings: Settings, anthropic: bool) -> Caller:
    """Who calls the front door; no one the router knows is 401 in the words of the caller's SDK
    (`/`, "Ollama is running", which clients probe, needs no token)."""
    caller = await identity.who(settings, tokens_given(request, anthropic), request, any_key=True)
    if caller is None and request.path != "/":
        if anthropic:
            raise FrontError(
                401,
                "missing or wrong token: this gpuq front door needs the token as 'x-api-key: "
                "<token>' or 'Authorization: Bearer <token>' (ANTHROPIC_API_KEY or "
                "ANTHROPIC_AUTH_TOKEN=<token>)",
            )
        raise FrontError(
            401,
            "missing or wrong token: this gpuq front door needs 'Authorization: Bearer "
            "<token>' (OpenAI SDK: api_key=<token>; ollama: "
            "headers={'Authorization': 'Bearer <token>'})",
            "invalid_api_key",
        )
    return caller or ANYONE
