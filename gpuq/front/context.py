"""What the front door's handlers share: the Front (the router's store, dispatcher and bus, and
the relay its waiting calls hear their runs through), and an error in the envelope of the
caller's API."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from aiohttp import web

from ..bus import Bus
from ..config import Settings
from ..errors import Conflict, NotFound, StoreUnavailable, check_text, json_object, json_type
from ..jobs import api_of, preview_url
from ..node.calls import CLIENT_LEFT
from ..node.dispatcher import Dispatcher
from ..node.runtime import NodeRuntime
from ..store import Store
from .anthropic import anthropic_error
from .ollama_api import ollama_error
from .openai_api import openai_error
from .relay import Relay
from .shapes import dumps, should_retry

log = logging.getLogger("gpuq")

CANCEL_RETRY_MAX_S = 5.0  # the longest wait between two tries of a cancel the store refused


class Front:
    """What the front door's handlers share: the router's store, dispatcher and bus, and the
    relay its waiting calls hear their runs through."""

    def __init__(self, settings: Settings, store: Store, dispatcher: Dispatcher, bus: Bus, relay: Relay):
        self.settings = settings
        self.store = store
        self.dispatcher = dispatcher
        self.bus = bus
        self.relay = relay
        self.closing = False

    def nodes_by_rank(self) -> list[NodeRuntime]:
        return sorted(self.dispatcher.nodes.values(), key=lambda rt: rt.config.rank)

    @property
    def spool_dir(self) -> Path | None:
        """Where a call's spool goes (gpuq/front/relay.py Spool): beside the SQLite database, on
        the disk the router already writes (a tmpfs /tmp would keep it in memory); with
        PostgreSQL, the system's temporary directory."""
        database = self.dispatcher.settings.database
        return database.absolute().parent if isinstance(database, Path) else None

    def preview_url(self, job_id: str) -> str:
        return preview_url(self.settings.public_url, job_id)

    async def cancel(self, job_id: str, reason: str, actor: str) -> None:
        """End a call's job because its client is gone: as a delete, with the reason. A job that
        generates has its node request cut first, at once (the node frees without waiting for
        the commit); its worker then commits the cancel with the output so far, in one commit,
        tried again while the store refuses, as it records what a job did (a cut job left
        "running" would hold its node). Else the cancel is committed here, as a delete."""
        cut = self.dispatcher.cut(job_id, reason, actor)
        if cut and reason == CLIENT_LEFT:  # its worker commits the cancel with its output so far
            return
        # Until the cancel is committed, a worker that claims the job ends it instead of running
        # it: a claim that wins the race with this cancel must not load or unload anything.
        self.relay.left(job_id, reason)
        delay = 0.1
        while True:
            try:
                job, interrupted = await self.store.delete(job_id, actor, reason=reason)
                break
            except (Conflict, NotFound):
                self.relay.left(job_id, None)
                return  # it ended on its own meanwhile (or its worker cancelled it)
            except StoreUnavailable as exc:
                if not cut:  # still marked gone: its worker cancels it when it claims it
                    log.error(
                        "job=%s could not be cancelled (%s): %s; its node's worker cancels it before it would run",
                        job_id,
                        reason,
                        exc.message,
                    )
                    return
                log.error("job=%s cancel not recorded yet, trying again in %gs: %s", job_id, delay, exc.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, CANCEL_RETRY_MAX_S)
        self.relay.left(job_id, None)
        self.dispatcher.abort(interrupted, reason)
        self.bus.publish("queue", {"deleted": job_id})
        log.info("job=%s node=%s state=cancelled reason=%r actor=%r", job_id, job["node"], reason, actor)


FRONT = web.AppKey("front", Front)


def error_response(
    request: web.Request, status: int, message: str, code: str | None = None, headers: dict[str, Any] | None = None
) -> web.Response:
    """An error in the shape of the caller's API; an OpenAI or Anthropic client is told whether
    to retry it (x-should-retry, which both SDKs obey): only a refusal that stored nothing and
    may pass later (503, 429) is retried, never one that would be refused again or a job."""
    api = api_of(request.path)
    if api == "ollama":
        return web.json_response(ollama_error(message), status=status, headers=headers, dumps=dumps)
    headers = {**(headers or {}), "x-should-retry": should_retry(status)}
    if api == "anthropic":
        body = anthropic_error(status, message)
    else:
        body = openai_error(status, message, code)
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


async def json_of(request: web.Request) -> dict[str, Any]:
    """A front-door call's body, whatever its API; text that cannot be stored is a 400 here, once."""
    return body_of(await request.read())


def body_of(raw: bytes) -> dict[str, Any]:
    """json_of's parse and check, for a body large enough to be parsed off the event loop."""
    body = json_object(raw, "missing request body", "invalid character in JSON", json_type, strict=True)
    check_text(body)
    return body
