"""Each door's access rules, as aiohttp middlewares: the router's API (its host names, same-site
state changes, its tokens) and the front door (its host names, browsers by CORS, its tokens in
each SDK's words). Who calls is kept as request[CALLER] (gpuq/access/tokens.py)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from ..config import Settings
from .hosts import check_host, front_checks_host, served_hosts
from .sites import Origins, check_same_site, cors, env_origins
from .tokens import CALLER, api_caller, front_caller


def host_middleware(settings: Settings) -> Middleware:
    allowed = served_hosts(settings)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        check_host(request, allowed)
        return await handler(request)

    return middleware


def api_access(live: Callable[[], Settings]) -> Middleware:
    """The API's rules after its host names: no state change from another site, and who calls
    (401 for data by no one the router knows); `live`: the settings in force (a reload changes
    the users at once)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        check_same_site(request)
        request[CALLER] = await api_caller(request, live())
        return await handler(request)

    return middleware


def front_access(
    settings: Settings,
    live: Callable[[], Settings] | None = None,
    anthropic: Callable[[str], bool] = lambda path: False,
) -> Middleware:
    """The front door's rules: its host names only (no DNS rebinding; Ollama's rule, hosts.py;
    not where a token guards a non-loopback door, as Ollama checks only on loopback),
    browsers by CORS as Ollama allows them ([front] origins and OLLAMA_ORIGINS) (a preflight needs no token: browsers send none), and
    its token when one is set (Bearer, as the OpenAI SDK's api_key sends it), on every route but
    `/` ("Ollama is running", which clients probe). Who calls is identity.py's who, over the
    live settings (`live`: a reload's [[user]] changes apply at once), kept as request[CALLER];
    `anthropic(path)`: a route of Anthropic's API (its SDK sends x-api-key)."""
    allowed = served_hosts(settings)
    origins = Origins((*settings.front_origins, *env_origins()))

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if front_checks_host(live() if live else settings):
            check_host(request, allowed, front=True)
        preflight = cors(request, origins)
        if preflight is not None:
            return preflight
        if request.method == "OPTIONS":  # no CORS, a known host: 204 (allowedHostsMiddleware)
            return web.Response(status=204)
        request[CALLER] = await front_caller(request, live() if live else settings, anthropic(request.path))
        return await handler(request)

    return middleware
