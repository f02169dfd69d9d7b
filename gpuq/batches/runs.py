"""A batch line's run: run as any front-door call is (the relay prepares its node's
request and the worker runs it), but no client waits for it: its chunks are gathered, and its
whole reply, in its endpoint's non-streamed shape (the translation a stream:false call gets),
is kept with its batch line when the run ends, before the job finishes. The relay's other calls
go through it unchanged."""

from __future__ import annotations

import asyncio
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

    def prepare(self, job: dict[str, Any], policy: Policy, node: str) -> NodeRun:
        run = super().prepare(job, policy, node)
        return run if run.call.batch is None else BatchLineRun(self, run)

    def chunk(self, job_id: str, raw: bytes, chunk: dict[str, Any]) -> None:
        kept = self.gathering.get(job_id)
        if kept is None:
            super().chunk(job_id, raw, chunk)
        else:
            kept.append(chunk)

    def tell(self, job_id: str, *item: Any) -> None:
        kept = self.gathering.get(job_id)
        if kept is not None and item and item[0] == "reply":  # an embedding's one reply
            kept.append(item[1])
        super().tell(job_id, *item)


class BatchLineRun(NodeRun):
    """A batch line's run, its reply kept for the batch when the node's answer is whole."""

    def __init__(self, relay: BatchRelay, run: NodeRun) -> None:
        super().__init__(relay, run.job, run.node, run.route, run.body, run.keep_s, run.call)
        self.batch_relay = relay

    async def run(self, client: OllamaClient, sink: Sink) -> dict[str, Any]:
        job_id = self.job["id"]
        kept: list[Any] = []
        self.batch_relay.gathering[job_id] = kept
        try:
            last = await super().run(client, sink)
        finally:
            self.batch_relay.gathering.pop(job_id, None)
        ep = ENDPOINTS[self.call.path]
        reply = collected(ep.node_route, kept, self.body) if ep.node_streams else (kept[-1] if kept else {})
        whole = ep.whole(ep.reply_id(job_id), job_id, self.call.body, reply) if ep.whole is not None else reply
        await self.keep(job_id, dumps(whole))
        return last

    async def keep(self, job_id: str, response: str) -> None:
        """Kept before the job finishes; while the database refuses (locked, disk full), tried
        again, as the worker keeps an outcome (the run is done: it is not run again for this)."""
        delay = 0.1
        while True:
            try:
                await self.batch_relay.store.keep_batch_response(job_id, response)
                return
            except StoreUnavailable as exc:
                log.error("job=%s batch reply not kept yet, trying again in %gs: %s", job_id, delay, exc.message)
                await asyncio.sleep(delay)
                delay = min(delay * 2, KEEP_RETRY_MAX_S)
