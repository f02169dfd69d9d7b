"""The front door's answers that make no job, as Ollama and OpenAI give them: the version, the
models the lab has (tags, ps, show, /v1/models), pull, and the routes gpuq does not serve."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from ..errors import BadRequest, FrontError, NotFound, OllamaError
from ..jobs import normalize_model
from ..node.runtime import NodeRuntime
from .context import FRONT, Front, json_of
from .endpoints import entries_of, front_nodes
from .names import local_name
from .ollama_api import merged_ps, merged_tags, pull_model_of, pull_progress
from .openai_api import model_card, model_list
from .shapes import dumps

log = logging.getLogger("gpuq")


LISTING_TIMEOUT_S = 3.0  # /api/ps and /api/show ask the nodes; a slow node is left out of /api/ps


NOT_SERVED = ("/api/push", "/api/create", "/api/delete", "/api/copy", "/api/blobs")


def _version_key(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("-")[0].split("."):
        parts.append(int(piece) if piece.isdigit() else 0)
    return tuple(parts)


async def root(request: web.Request) -> web.Response:
    return web.Response(text="Ollama is running")


async def version(request: web.Request) -> web.Response:
    """The oldest Ollama among the nodes: what every node can do (clients gate features on it)."""
    known = [rt.version for rt in request.app[FRONT].nodes_by_rank() if rt.version]
    return web.json_response({"version": min(known, key=_version_key) if known else "0.0.0"}, dumps=dumps)


def all_tags(front: Front) -> list[dict[str, Any]]:
    return merged_tags((rt.tags for rt in front_nodes(front.nodes_by_rank())), normalize_model)


async def tags(request: web.Request) -> web.Response:
    """Every model the front door can run (installed on a task node), each once, as the nodes'
    last health checks saw them: a critique-only node's models are not listed."""
    return web.json_response({"models": all_tags(request.app[FRONT])}, dumps=dumps)


async def status(request: web.Request) -> web.Response:
    """GET /api/status (routes.go StatusHandler, api.StatusResponse): a local server with no
    cloud. `ollama launch` asks it before it offers cloud models; a lab has none to offer."""
    return web.json_response({"cloud": {"disabled": True, "source": "config"}}, dumps=dumps)


async def ps(request: web.Request) -> web.Response:
    """What the nodes have loaded now (a node that does not answer in time is left out)."""
    nodes = [rt for rt in request.app[FRONT].nodes_by_rank() if rt.up]
    answers = await asyncio.gather(*(rt.client.ps(timeout_s=LISTING_TIMEOUT_S) for rt in nodes), return_exceptions=True)
    return web.json_response({"models": merged_ps(a for a in answers if isinstance(a, list))}, dumps=dumps)


def node_with(front: Front, model: str) -> NodeRuntime | None:
    """The first node by rank, up, whose Ollama lists the model (for /api/show)."""
    wanted = normalize_model(model)
    return next((rt for rt in front.nodes_by_rank() if rt.up and rt.installed and wanted in rt.installed), None)


async def _show(front: Front, body: dict[str, Any]) -> dict[str, Any]:
    model = body.get("model") or body.get("name")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("model is required")
    model = local_name(model)  # as ShowHandler reads it: `:local` dropped, cloud and bad names refused
    rt = node_with(front, model)
    if rt is None:
        raise NotFound(f"model '{model}' not found")
    try:
        shown: dict[str, Any] = await rt.client.post("/api/show", {**body, "model": model}, timeout_s=30.0)
    except OllamaError as exc:
        raise FrontError(exc.status or 502, exc.message) from None
    return shown


def model_not_found(front: Front, model: str) -> str:
    """Ollama's 404 text, and why when /api/tags lists the model: only nodes that take no task
    jobs have it, and every front-door call is a task (or embed) job."""
    wanted = normalize_model(model)
    elsewhere = [
        rt.name
        for rt in front.nodes_by_rank()
        if "task" not in rt.config.roles and rt.installed and wanted in rt.installed
    ]
    if not elsewhere:
        return f"model '{model}' not found"
    return (
        f"model '{model}' not found on a node that takes task jobs: only {', '.join(elsewhere)} has it "
        "(front-door calls run on task nodes; pull it on one, or give that node the task role)"
    )


async def show(request: web.Request) -> web.Response:
    """Answered by a node that has the model: no GPU work, so not a job."""
    return web.json_response(await _show(request.app[FRONT], await json_of(request)), dumps=dumps)


async def openai_models(request: web.Request) -> web.Response:
    return web.json_response(model_list(all_tags(request.app[FRONT])), dumps=dumps)


async def openai_model(request: web.Request) -> web.Response:
    """A model /v1/models lists (a task node has it), described by a node's /api/show."""
    name = request.match_info["model"]
    if not entries_of(request.app[FRONT].nodes_by_rank(), name):
        raise NotFound(f"model '{name}' not found")
    return web.json_response(model_card(name, await _show(request.app[FRONT], {"model": name})), dumps=dumps)


async def pull(request: web.Request) -> web.StreamResponse:
    """Ollama's success for a model a task node has (server/routes.go PullHandler: a stream of
    progress objects, or with stream:false the last one); a 404 saying where to pull one that
    none has."""
    front = request.app[FRONT]
    body = await json_of(request)
    model = pull_model_of(body)
    nodes = front_nodes(front.nodes_by_rank())
    having = [rt.name for rt in nodes if entries_of([rt], model)]
    progress = pull_progress(model, having, {rt.name: sorted(rt.installed or ()) for rt in nodes})
    if body.get("stream") is False:
        return web.json_response(progress[-1], dumps=dumps)
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await resp.prepare(request)
    await resp.write(b"".join(dumps(p).encode() + b"\n" for p in progress))
    await resp.write_eof()
    return resp


async def not_served(request: web.Request) -> web.Response:
    raise FrontError(
        501,
        f"gpuq's front door does not manage models ({request.path}): run it on a node's own "
        "Ollama (e.g. `ollama pull <model>` there); /api/tags lists what the nodes have",
    )
