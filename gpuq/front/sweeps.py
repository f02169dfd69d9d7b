"""Sweeps (issue 37): the batches of OpenAI's Batch API and Anthropic's Message Batches, and
`gpuq batch`, all through this one service: a batch created from its input (every line a job
in the batch lane, placed by its model, queued in one commit), read (its output written once
its every line has ended: finalize), cancelled, its failed lines retried. The front door's
handlers (front/batches.py, front/message_batches.py) and the router's API (api/batches.py)
call it; the store keeps it (gpuq/store/batches.py), the dispatcher queues it."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from typing import Any

from ..access.identity import Caller
from ..access.lanes import Door, lane_for
from ..config import ConfigError, Settings, parse_duration
from ..errors import FrontError, GpuqError, NotFound
from ..jobs import Lane
from ..node.dispatcher import Dispatcher
from ..store import Row, Store
from ..store.batches import ENDED, NewBatch, NewLine
from .batch_input import (
    ANTHROPIC_ENDPOINT,
    OPENAI_ENDPOINTS,
    Line,
    endpoint_of,
    line_job,
    listed,
    parse_anthropic,
    parse_openai,
)
from .batch_output import active, render_anthropic, render_openai
from .call import run_model

log = logging.getLogger("gpuq")

FINALIZE_EVERY_S = 1.0  # how often open batches are looked at, so a finished one is written soon
EXPIRY_ACTOR = "gpuq (completion_window)"  # who cancels an expired batch's waiting lines, in their events


def only_owner(caller: Caller) -> str | None:
    """A member sees and acts on their own batches and files; an admin (or an open router) on all."""
    return None if caller.admin else caller.name or ""


def window_s(window: Any) -> float:
    """completion_window: OpenAI's "24h", or any duration gpuq reads ('2h', '7d' is not one)."""
    if not isinstance(window, str):
        raise FrontError(400, "completion_window: a duration like '24h' is required", "invalid_completion_window")
    try:
        seconds = parse_duration(window, "completion_window")
    except ConfigError as exc:
        raise FrontError(400, exc.message, "invalid_completion_window") from None
    if seconds <= 0:
        raise FrontError(400, "completion_window: must be longer than 0", "invalid_completion_window")
    return seconds


def pruned(what: str, batch_id: str, pruned_at: str) -> FrontError:
    """410 for what retention took of an ended batch (its files, its lines' replies)."""
    return FrontError(
        410,
        f"{what} was pruned by retention on {pruned_at[:10]} ([retention] prune_after): batch {batch_id}"
        " keeps its status and counts, not its files or replies",
        "pruned",
    )


class Sweeps:
    def __init__(self, store: Store, dispatcher: Dispatcher):
        self.store = store
        self.dispatcher = dispatcher

    @property
    def settings(self) -> Settings:
        """The settings in force (a reload changes the batch limits live)."""
        return self.dispatcher.settings

    def model_of(self, asked: str) -> str:
        """A line's model, as a front-door call's (its refusal is that line's error)."""
        return run_model(self.dispatcher, asked)

    # -- create ----------------------------------------------------------------------------------

    def _check_size(self, n: int, what: str) -> None:
        limit = self.settings.front_max_batch_lines
        if n > limit:
            raise FrontError(
                400, f"{what} has {n} requests, over the limit of {limit} (front.max_batch_lines)", "too_many_requests"
            )

    async def _submit(self, batch: NewBatch, lines: list[Line], caller: Caller, client: str | None, actor: str) -> Row:
        ep = endpoint_of(batch.endpoint)
        lane = lane_for(caller.user, Lane.BATCH, Door.FRONT)
        new_lines = []
        for line in lines:
            job, refused = line_job(
                line, ep, batch.id, caller.name, client, lane, self.settings.max_prompt_bytes, self.model_of
            )
            new_lines.append(NewLine(line.line, line.custom_id, job, refused))
        row = await self.dispatcher.submit_batch(batch, new_lines, actor)
        log.info(
            "batch=%s api=%s endpoint=%s lines=%d status=%s actor=%r",
            row["id"],
            batch.api,
            batch.endpoint,
            row["total"],
            row["status"],
            actor,
        )
        return row

    async def create_openai(
        self,
        caller: Caller,
        client: str | None,
        actor: str,
        input_file_id: Any,
        endpoint: Any,
        completion_window: Any,
        metadata: Any = None,
    ) -> Row:
        """POST /v1/batches: the input file read and checked; a file whose lines are not
        requests makes a batch that failed its validation (its `errors` name each line)."""
        if endpoint not in OPENAI_ENDPOINTS:
            raise FrontError(
                400,
                f"endpoint: {str(endpoint)[:80]!r} is not one a batch may call; one of {', '.join(OPENAI_ENDPOINTS)}",
                "invalid_endpoint",
            )
        if not isinstance(input_file_id, str) or not input_file_id:
            raise FrontError(400, "input_file_id: the id of an uploaded file (purpose 'batch') is required")
        seconds = window_s(completion_window)
        if metadata is not None and not (
            isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values()) and len(metadata) <= 16
        ):
            raise FrontError(400, "metadata: an object of at most 16 string values is required", "invalid_metadata")
        owner = only_owner(caller)
        try:
            found = await self.store.file(input_file_id, owner)
        except NotFound:
            raise FrontError(404, f"no file '{input_file_id}'", "file_not_found") from None
        if found["purpose"] != "batch":
            raise FrontError(
                400, f"file {input_file_id} has purpose '{found['purpose']}'; a batch's input needs purpose 'batch'"
            )
        parsed = parse_openai(await self.store.file_content(input_file_id, owner), endpoint)
        total = len(parsed.lines) + len(parsed.errors)
        if total == 0:
            raise FrontError(
                400, f"file {input_file_id} has no requests: a batch needs at least one line", "empty_file"
            )
        self._check_size(total, f"file {input_file_id}")
        now = time.time()
        name = (metadata or {}).get("name") or found["filename"]
        batch = NewBatch(
            id="batch_" + secrets.token_hex(12),
            api="openai",
            endpoint=endpoint,
            completion_window=completion_window,
            expires_at=now + seconds,
            owner=caller.name,
            name=name,
            input_file_id=input_file_id,
            metadata=metadata,
            errors=listed(parsed.errors) if parsed.errors else None,
        )
        return await self._submit(batch, parsed.lines, caller, client, actor)

    async def create_anthropic(self, caller: Caller, client: str | None, actor: str, body: dict[str, Any]) -> Row:
        """POST /v1/messages/batches: every request a job of /v1/messages."""
        lines = parse_anthropic(body.get("requests"))
        self._check_size(len(lines), "the batch")
        batch = NewBatch(
            id="msgbatch_" + secrets.token_hex(12),
            api="anthropic",
            endpoint=ANTHROPIC_ENDPOINT,
            completion_window="24h",
            expires_at=time.time() + 24 * 3600,
            owner=caller.name,
            name=f"message batch of {len(lines)}",
        )
        return await self._submit(batch, lines, caller, client, actor)

    # -- read, cancel, retry -----------------------------------------------------------------------

    async def get(self, batch_id: str, caller: Caller, api: str | None = None) -> Row:
        """A batch as it is now; one whose every line has ended has its output written first."""
        batch = await self.store.batch(batch_id, only_owner(caller))
        if api is not None and batch["api"] != api:
            raise NotFound(f"no batch '{batch_id}'")
        return await self.finalized(batch)

    async def listed(
        self, caller: Caller, api: str | None = None, after: str | None = None, limit: int = 20
    ) -> list[Row]:
        found = await self.store.batches(api, only_owner(caller), after, limit)
        return [await self.finalized(b) for b in found]

    async def finalized(self, batch: Row) -> Row:
        if batch["status"] not in ("in_progress", "cancelling") or active(batch["counts"]):
            return batch
        render = render_openai if batch["api"] == "openai" else render_anthropic
        done = await self.store.finalize_batch(batch["id"], render)
        if done is not None:
            log.info(
                "batch=%s status=%s output=%s errors=%s",
                done["id"],
                done["status"],
                done["output_file_id"],
                done["error_file_id"],
            )
            return done
        return await self.store.batch(batch["id"])

    async def cancel(self, batch_id: str, caller: Caller, actor: str, api: str | None = None) -> Row:
        await self.get(batch_id, caller, api)  # (another API's batch is not found)
        batch, cancelled = await self.store.cancel_batch(batch_id, actor, only_owner(caller))
        log.info("batch=%s status=%s cancelled_lines=%d actor=%r", batch_id, batch["status"], cancelled, actor)
        self.dispatcher.bus.publish("queue", {"batch": batch_id})
        return await self.finalized(batch)

    async def delete(self, batch_id: str, caller: Caller, actor: str, api: str | None = None) -> Row:
        """An ended batch deleted (Anthropic's DELETE); one in progress is refused: cancel it first."""
        batch = await self.get(batch_id, caller, api)  # (another API's batch is not found)
        if batch["status"] not in ENDED:
            raise FrontError(
                400,
                f"batch {batch_id} is still processing: only an ended batch can be deleted; cancel it first",
                "batch_not_ended",
            )
        await self.store.delete_batch(batch_id, only_owner(caller))
        log.info("batch=%s deleted actor=%r", batch_id, actor)
        self.dispatcher.bus.publish("queue", {"batch": batch_id})
        return batch

    async def retry_failed(self, batch_id: str, caller: Caller, actor: str) -> tuple[Row, list[str]]:
        found = await self.store.batch(batch_id, only_owner(caller))
        batch, retried = await self.store.retry_batch(
            batch_id,
            actor,
            only_owner(caller),
            frozenset(n.name for n in await self.dispatcher.batch_nodes()),  # (another router's too)
            self.settings.max_waiting,
            window_s(found["completion_window"]),
        )
        log.info("batch=%s retried_lines=%d actor=%r", batch_id, len(retried), actor)
        self.dispatcher.wake()
        self.dispatcher.bus.publish("queue", {"batch": batch_id})
        return batch, retried

    def check_results(self, batch: Row) -> None:
        """A pruned batch's replies are gone: its results are 410, not an empty list."""
        if batch.get("pruned_at"):
            raise pruned(f"the results of batch {batch['id']}", batch["id"], batch["pruned_at"])

    async def file(self, file_id: str, caller: Caller) -> Row:
        """A file's row; one retention pruned with its batch is 410, naming when."""
        try:
            return await self.store.file(file_id, only_owner(caller))
        except NotFound:
            await self._pruned_file(file_id)
            raise

    async def file_content(self, file_id: str, caller: Caller) -> bytes:
        try:
            return await self.store.file_content(file_id, only_owner(caller))
        except NotFound:
            await self._pruned_file(file_id)
            raise

    async def _pruned_file(self, file_id: str) -> None:
        named = await self.store.batch_of_file(file_id)
        if named is not None and named["pruned_at"]:
            raise pruned(f"file {file_id}", named["id"], named["pruned_at"])

    # -- the finalizer ---------------------------------------------------------------------------

    async def expire_due(self) -> int:
        """Cancel, as expired, the waiting lines of every batch past its completion_window;
        returns how many batches expired (each is then finalized `expired`)."""
        expired = await self.store.expire_batches(EXPIRY_ACTOR)
        for batch_id, n in expired:
            log.info("batch=%s expired: its completion_window ended; expired_lines=%d", batch_id, n)
        return len(expired)

    async def finalize_open(self) -> int:
        """Write the output of every open batch whose lines have all ended; returns how many."""
        done = 0
        for batch in await self.store.batches(open_only=True, limit=1000):
            if not active(batch["counts"]):
                if (await self.finalized(batch))["status"] not in ("in_progress", "cancelling"):
                    done += 1
        return done

    async def run(self) -> None:
        """Until cancelled: open batches finalized as their last lines end (a batch nobody polls
        still gets its output, and the page and /metrics see it end)."""
        while True:
            try:
                if await self.expire_due() + await self.finalize_open():
                    self.dispatcher.bus.publish("queue", {"batches": "ended"})
            except GpuqError as exc:
                log.warning("batches not finalized this time: %s", exc.message)
            await asyncio.sleep(FINALIZE_EVERY_S)
