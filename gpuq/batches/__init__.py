"""Batches: OpenAI's Batch API and Files, Anthropic's Message Batches and `gpuq batch`, as one
service (service.py) over the store, with its input read and checked (parse.py), its output in
the hosted APIs' shapes (shapes.py), its lines' runs (runs.py: each reply kept for its batch),
and the front door's routes to it (openai_routes.py, anthropic_routes.py; the router's API's are
gpuq/api/batches.py). Its finalizer runs with the upkeep (gpuq/upkeep/batches.py)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from . import anthropic_routes, openai_routes
from .doors import BATCHES
from .service import BatchService


def front_door_routes(service: BatchService) -> Callable[[web.Application], None]:
    """What adds the batch routes to the front door's app (gpuq/front/listener.py takes it)."""

    def add(app: web.Application) -> None:
        app[BATCHES] = service
        openai_routes.add_routes(app.router)
        anthropic_routes.add_routes(app.router)

    return add
