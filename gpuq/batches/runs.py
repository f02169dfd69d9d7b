"""A batch line's run: run as any front-door call is (the relay prepares its node's
request and the worker runs it), but no client waits for it: its chunks are gathered, and its
whole reply, in its endpoint's non-streamed shape (the translation a stream:false call gets),
is kept with its batch line when the run ends, before the job finishes. The relay's other calls
go through it unchanged."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from ..errors import StoreUnavailable
from ..front.endpoints import ENDPOINTS
from ..front.ollama_api import collected
from ..front.relay import NodeRun, Relay
from ..front.shapes import dumps
from ..node.calls import Policy, Sink
from ..node.ollama import OllamaClient
from ..store import Store

log = logging.getLogger("gpuq")

KEEP_RETRY_MAX_S = 5.0


class BatchRelay(Relay):
    """The front door's relay, which also gathers the replies of batch lines (no client waits)."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store
        self.gathering: dict[str, list[Any]] = {}  # a running batch line's chunks (or its one reply)

    def prepare(self, job: dict, policy: Policy, node: str) -> Any:
        run = super().prepare(job, policy, node)
        if '"batch":' not in job["request"]:  # no batch's line (a scan, not a second parse of the call)
            return run
        request = json.loads(job["request"])
        if not request.get("batch"):
            return run
        return BatchLineRun(self, run, request)

    def chunk(self, job_id: str, raw: bytes, chunk: dict) -> None:
        kept = self.gathering.get(job_id)
        if kept is None:
            super().chunk(job_id, raw, chunk)
        else:
            kept.append(chunk)

    def tell(self, job_id: str, *item) -> None:
        kept = self.gathering.get(job_id)
        if kept is not None and item and item[0] == "reply":  # an embedding's one reply
            kept.append(item[1])
        super().tell(job_id, *item)


class BatchLineRun:
    """A batch line's NodeRun, its reply kept for the batch when the node's answer is whole."""

    def __init__(self, relay: BatchRelay, run: NodeRun, request: dict):
        self.relay, self.run_, self.request = relay, run, request
        self.options = run.options
        self.keep_s = run.keep_s

    async def run(self, client: OllamaClient, sink: Sink) -> dict:
        job_id = self.run_.job["id"]
        kept: list[Any] = []
        self.relay.gathering[job_id] = kept
        try:
            last = await self.run_.run(client, sink)
        finally:
            self.relay.gathering.pop(job_id, None)
        ep = ENDPOINTS[self.request["path"]]
        reply = collected(ep.node_route, kept, self.run_.body) if ep.node_streams else (kept[-1] if kept else {})
        body = self.request["body"]
        whole = ep.whole(ep.reply_id(job_id), job_id, body, reply) if ep.whole is not None else reply
        await self.keep(job_id, dumps(whole))
        return last

    async def keep(self, job_id: str, response: str) -> None:
        """Kept before the job finishes; while the database refuses (locked, disk full), tried
        again, as the worker keeps an outcome (the run is done: it is not run again for this)."""
        delay = 0.1
        while True:
            try:
                await self.relay.store.keep_batch_response(job_id, response)
                return
            except StoreUnavailable as exc:
                log.error("job=%s batch reply not kept yet, trying again in %gs: %s", job_id, delay, exc.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, KEEP_RETRY_MAX_S)
