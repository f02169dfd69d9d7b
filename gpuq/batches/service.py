"""The batch service: OpenAI's Batch API and Files, Anthropic's Message Batches and `gpuq batch`,
all through this one service. A batch is made from its input (every line a job in the batch lane,
placed by its model, queued in one commit), read, cancelled, deleted and its failed lines retried
here; its output is written here once its every line has ended (`finalize`), whichever asked: the
upkeep's finalizer (gpuq/upkeep/batches.py), or a read that finds it ended first. Who may see and
change which batch and file is gpuq/access/privacy.py's rule. The doors (batches/openai_routes.py,
batches/anthropic_routes.py, api/batches.py) only translate HTTP to these calls; the store keeps
the batches (gpuq/store/batches.py), the dispatcher queues their lines."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from ..access.identity import Caller
from ..access.lanes import Door, lane_for
from ..access.privacy import change_scope, read_scope, refuse_change, visible
from ..config import ConfigError, Settings, parse_duration
from ..errors import FrontError, GpuqError, NotFound
from ..front.call import run_model
from ..jobs import Lane
from ..node.dispatcher import Dispatcher
from ..store import Row, Store
from ..store.batch_create import PIECE_LINES
from ..store.batches import ENDED, NewBatch, NewLine, lines_seen, new_file_id
from .files import FileUpload, chunks_of, numbered_lines
from .parse import (
    ANTHROPIC_ENDPOINT,
    OPENAI_ENDPOINTS,
    Line,
    OpenAIInput,
    Parsed,
    endpoint_of,
    line_job,
    listed,
    parse_anthropic,
)
from .shapes import active, render_anthropic, render_openai

log = logging.getLogger("gpuq")

EXPIRY_ACTOR = "gpuq (completion_window)"  # who cancels an expired batch's waiting lines, in their events


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


class BatchService:
    def __init__(self, store: Store, dispatcher: Dispatcher):
        self.store = store
        self.dispatcher = dispatcher

    @property
    def settings(self) -> Settings:
        """The settings in force (a reload changes the batch limits and privacy live)."""
        return self.dispatcher.settings

    def _reads(self, caller: Caller) -> str | None:
        return read_scope(caller, self.settings.private)

    def visible(self, caller: Caller, batch: Row) -> bool:
        """May `caller` read this batch's name, metadata, errors, files and custom ids?"""
        return visible(caller, batch["owner"], self.settings.private)

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

    async def _line_jobs(self, batch: NewBatch, lines: list[Line], caller: Caller, client: str | None) -> list[NewLine]:
        """Each line's job (or its refusal), made off the event loop a piece at a time when there
        are many (30,000 lines take about a second of CPU): /health and the calls go on meanwhile."""
        ep = endpoint_of(batch.endpoint)
        lane = lane_for(caller.user, Lane.BATCH, Door.FRONT)
        limit = self.settings.max_prompt_bytes

        def made(part: list[Line]) -> list[NewLine]:
            out = []
            for line in part:
                job, refused = line_job(line, ep, batch.id, caller.name, client, lane, limit, self.model_of)
                out.append(NewLine(line.line, line.custom_id, job, refused))
            return out

        if len(lines) <= PIECE_LINES:
            return made(lines)
        new_lines: list[NewLine] = []
        for i in range(0, len(lines), PIECE_LINES):
            new_lines += await asyncio.to_thread(made, lines[i : i + PIECE_LINES])
        return new_lines

    async def _submit(self, batch: NewBatch, lines: list[Line], caller: Caller, client: str | None, actor: str) -> Row:
        started = time.monotonic()
        new_lines = await self._line_jobs(batch, lines, caller, client)
        made = time.monotonic()
        row = await self.dispatcher.submit_batch(batch, new_lines, actor)
        log.info(
            "batch=%s api=%s endpoint=%s lines=%d status=%s actor=%r (lines made in %.2fs, stored in %.2fs)",
            row["id"],
            batch.api,
            batch.endpoint,
            row["total"],
            row["status"],
            actor,
            made - started,
            time.monotonic() - made,
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
        owner = change_scope(caller)  # a batch is made from the caller's own upload
        try:
            found = await self.store.file(input_file_id, owner)
        except NotFound:
            raise FrontError(404, f"no file '{input_file_id}'", "file_not_found") from None
        if found["purpose"] != "batch":
            raise FrontError(
                400, f"file {input_file_id} has purpose '{found['purpose']}'; a batch's input needs purpose 'batch'"
            )
        parsed = await self._read_input(input_file_id, endpoint)
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

    async def _read_input(self, file_id: str, endpoint: str) -> Parsed:
        """An input file's lines read from its chunks and checked a piece at a time, off the
        event loop; past front.max_batch_lines the rest is only counted, for the refusal."""
        parser = OpenAIInput(endpoint)
        counted = 0
        limit = self.settings.front_max_batch_lines
        async for piece in numbered_lines(chunks_of(self.store, file_id)):
            if parser.total <= limit:
                await asyncio.to_thread(parser.feed, piece)
            else:
                counted += sum(1 for _, raw in piece if raw.strip())
        total = parser.total + counted
        if total == 0:
            raise FrontError(400, f"file {file_id} has no requests: a batch needs at least one line", "empty_file")
        self._check_size(total, f"file {file_id}")
        return parser.parsed()

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
        batch = await self.store.batch(batch_id, self._reads(caller))
        if api is not None and batch["api"] != api:
            raise NotFound(f"no batch '{batch_id}'")
        return await self.finalize(batch)

    async def listed(
        self, caller: Caller, api: str | None = None, after: str | None = None, limit: int = 20
    ) -> list[Row]:
        found = await self.store.batches(api, self._reads(caller), after, limit)
        return [await self.finalize(b) for b in found]

    async def open_batches(self, limit: int) -> list[Row]:
        """Every batch in progress, everyone's (the queue page shows the whole lab; what of
        another user's a caller may read is the door's to redact, by `visible`)."""
        return await self.store.batches(open_only=True, limit=limit)

    async def lines(self, batch: Row) -> list[Row]:
        """A batch's lines with their jobs (a batch the caller got from `get`)."""
        return await self.store.batch_lines(batch["id"])

    async def results(self, batch_id: str, caller: Caller, api: str | None = None) -> Row:
        """A batch whose results may be read (410 once retention pruned them): read them by
        `results_pages`."""
        batch = await self.get(batch_id, caller, api)
        if batch.get("pruned_at"):
            raise pruned(f"the results of batch {batch['id']}", batch["id"], batch["pruned_at"])
        return batch

    async def finalize(self, batch: Row) -> Row:
        """The one place a batch ends: one whose every line has ended gets its output files
        written and its final status (two routers at once write it once); any other comes back
        as it is. Its lines are read and rendered off the writer (a 10,000-line batch's output
        takes the writer only to be stored), and the store writes it only if they are as read."""
        if batch["status"] not in ("in_progress", "cancelling") or active(batch["counts"]):
            return batch
        lines = await self.store.batch_results(batch["id"])
        render = render_openai if batch["api"] == "openai" else render_anthropic
        output, errors = await asyncio.to_thread(render, batch, lines)
        done = await self.store.finalize_batch(batch["id"], output, errors, lines_seen(lines))
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
        found = await self.get(batch_id, caller, api)  # (another API's batch is not found)
        refuse_change(caller, found["owner"], f"batch {batch_id}", "batches")
        batch, cancelled = await self.store.cancel_batch(batch_id, actor, change_scope(caller))
        log.info("batch=%s status=%s cancelled_lines=%d actor=%r", batch_id, batch["status"], cancelled, actor)
        self.dispatcher.bus.publish("queue", {"batch": batch_id})
        return await self.finalize(batch)

    async def delete(self, batch_id: str, caller: Caller, actor: str, api: str | None = None) -> Row:
        """An ended batch deleted (Anthropic's DELETE); one in progress is refused: cancel it first."""
        batch = await self.get(batch_id, caller, api)  # (another API's batch is not found)
        refuse_change(caller, batch["owner"], f"batch {batch_id}", "batches")
        if batch["status"] not in ENDED:
            raise FrontError(
                400,
                f"batch {batch_id} is still processing: only an ended batch can be deleted; cancel it first",
                "batch_not_ended",
            )
        await self.store.delete_batch(batch_id, change_scope(caller))
        log.info("batch=%s deleted actor=%r", batch_id, actor)
        self.dispatcher.bus.publish("queue", {"batch": batch_id})
        return batch

    async def retry_failed(self, batch_id: str, caller: Caller, actor: str) -> tuple[Row, list[str]]:
        found = await self.store.batch(batch_id, self._reads(caller))
        refuse_change(caller, found["owner"], f"batch {batch_id}", "batches")
        batch, retried = await self.store.retry_batch(
            batch_id,
            actor,
            change_scope(caller),
            frozenset(n.name for n in await self.dispatcher.batch_nodes()),  # (another router's too)
            self.settings.max_waiting,
            window_s(found["completion_window"]),
        )
        log.info("batch=%s retried_lines=%d actor=%r", batch_id, len(retried), actor)
        self.dispatcher.wake()
        self.dispatcher.bus.publish("queue", {"batch": batch_id})
        return batch, retried

    # -- files -------------------------------------------------------------------------------------

    @staticmethod
    def check_purpose(purpose: str) -> None:
        """gpuq keeps batch input files only (purpose 'batch')."""
        if purpose != "batch":
            raise FrontError(
                400, f"purpose {purpose[:40]!r}: gpuq keeps only batch input files (purpose 'batch')", "invalid_purpose"
            )

    async def upload(self, caller: Caller, purpose: str, filename: str, content: bytes) -> Row:
        """A batch input file kept whole (`gpuq batch submit`'s, within the API's body limit),
        owned by its caller."""
        self.check_purpose(purpose)
        return await self.store.add_file(new_file_id(), purpose, filename[:255], content, caller.name)

    async def begin_upload(self, caller: Caller, filename: str) -> FileUpload:
        """A file uploaded as it arrives (POST /v1/files): stored chunk by chunk, shown once its
        caller `finish`es it, gone if it is `abort`ed (purpose checked by the door)."""
        upload = FileUpload(self.store, caller.name, self.settings.body_timeout_s)
        await upload.begin("batch", filename[:255])
        return upload

    async def files(
        self, caller: Caller, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> list[Row]:
        return await self.store.files(self._reads(caller), purpose, after, limit, ascending)

    async def file(self, file_id: str, caller: Caller) -> Row:
        """A file's row; one retention pruned with its batch is 410, naming when."""
        try:
            return await self.store.file(file_id, self._reads(caller))
        except NotFound:
            await self._pruned_file(file_id)
            raise

    async def file_content(self, file_id: str, caller: Caller) -> tuple[Row, AsyncIterator[bytes]]:
        """A file's row and its content, read chunk by chunk as its reader takes it."""
        found = await self.file(file_id, caller)
        return found, chunks_of(self.store, file_id)

    async def results_pages(self, batch: Row, page: int = 500) -> AsyncIterator[list[Row]]:
        """An ended batch's lines with their replies, `page` at a time in input order (a batch
        the caller got from `results`): never all its replies at once."""
        after = 0
        while found := await self.store.batch_results_page(batch["id"], after, page):
            yield found
            after = found[-1]["line"]

    async def delete_file(self, file_id: str, caller: Caller) -> None:
        found = await self.store.file(file_id, self._reads(caller))
        refuse_change(caller, found["owner"], f"file {file_id}", "files")
        await self.store.delete_file(file_id, change_scope(caller))

    async def submit_text(
        self, caller: Caller, client: str | None, actor: str, text: str, endpoint: str, name: Any, window: Any
    ) -> Row:
        """`gpuq batch submit`: JSON Lines text kept as an input file and the batch made from it,
        as POST /v1/batches makes one; a refused batch keeps nothing of it."""
        file = await self.upload(caller, "batch", str(name or "batch.jsonl"), text.encode("utf-8"))
        metadata = {"name": str(name)[:512]} if name else None
        try:
            return await self.create_openai(caller, client, actor, file["id"], endpoint, window, metadata)
        except GpuqError:
            await self.store.delete_file(file["id"])
            raise

    async def _pruned_file(self, file_id: str) -> None:
        named = await self.store.batch_of_file(file_id)
        if named is not None and named["pruned_at"]:
            raise pruned(f"file {file_id}", named["id"], named["pruned_at"])

    # -- what the upkeep's finalizer runs (gpuq/upkeep/batches.py) ---------------------------------

    async def expire_due(self) -> int:
        """Cancel, as expired, the waiting lines of every batch past its completion_window;
        returns how many batches expired (each is then finalized `expired`)."""
        expired = await self.store.expire_batches(EXPIRY_ACTOR)
        for batch_id, n in expired:
            log.info("batch=%s expired: its completion_window ended; expired_lines=%d", batch_id, n)
        return len(expired)

    async def drop_unfinished(self) -> int:
        """Drop, a piece at a time, every batch whose create will never finish: `validating`, and
        its router dead (killed mid-create: on SQLite, any router before this one) or this router
        no longer creating it (its create failed half-way). It was never answered and none of
        its lines ran (hidden until whole): nothing of it is kept. Returns how many went."""
        found = await self.store.unfinished_batches()
        if not found:
            return 0
        me = self.dispatcher.router.id
        live = (
            {me}
            if self.store.alone
            else {r["id"] for r in (await self.store.routers(self.settings.lease_s))["routers"]}
        )
        dropped = 0
        for batch in found:
            if batch["id"] in self.dispatcher.creating or (batch["creator"] != me and batch["creator"] in live):
                continue
            lines = 0
            while (n := await self.store.drop_batch_piece(batch["id"], batch["creator"])) is not None:
                lines += n
            log.warning(
                "batch=%s dropped: router %s stopped creating it (%d of its %d lines were stored, none ran);"
                " it was never answered: send it again",
                batch["id"],
                batch["creator"],
                lines,
                batch["total"],
            )
            dropped += 1
        return dropped

    async def finalize_open(self) -> int:
        """Write the output of every open batch whose lines have all ended; returns how many."""
        done = 0
        for batch in await self.store.batches(open_only=True, limit=1000):
            if not active(batch["counts"]):
                if (await self.finalize(batch))["status"] not in ("in_progress", "cancelling"):
                    done += 1
        return done
