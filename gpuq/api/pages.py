"""The pages and their static files, served with a strict Content-Security-Policy."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from ..shipped import shipped_dir
from .inputs import job_id_of

WEB_DIR = shipped_dir("web")


CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@web.middleware
async def headers_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    resp = await handler(request)
    resp.headers.setdefault("Content-Security-Policy", CSP)
    resp.headers.setdefault("X-Content-Type-Options", "nosniff")
    resp.headers.setdefault("Referrer-Policy", "no-referrer")
    return resp


async def page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "index.html")


async def history_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "history.html")


async def usage_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(WEB_DIR / "usage.html")


async def preview_page(request: web.Request) -> web.FileResponse:
    job_id_of(request)
    return web.FileResponse(WEB_DIR / "job.html")
