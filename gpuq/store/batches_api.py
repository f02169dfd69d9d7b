"""Store's API for batches and their files (batches.py's and batch_create.py's verbs, run on the
one writer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from ..jobs import NodeInfo
from . import batch_create, batches
from .core import Core, handing_over, write, write_untimed
from .steps import Row


class BatchVerbs(Core):
    add_file = write(batches.add_file)
    begin_file = write(batches.begin_file)
    add_file_chunk = write_untimed(batches.add_file_chunk)
    end_file = write_untimed(batches.end_file)
    drop_upload = write_untimed(batches.drop_upload)
    delete_file = write_untimed(batches.delete_file)

    async def create_batch(
        self,
        batch: batches.NewBatch,
        lines: Sequence[batches.NewLine],
        nodes: list[NodeInfo],
        actor: str,
        hand_over: Callable[[Row], None] | None = None,
        *,
        fair: bool = False,
        max_waiting: int | None = None,
    ) -> Row:
        """A batch and every line of it queued, in one commit (or, refused, nothing); the heads of
        idle nodes claimed in it go to their workers through `hand_over` after the commit. (A
        large batch goes in pieces: begin_batch, add_batch_lines, open_batch.)"""
        row, _ = await self._write(
            partial(
                batch_create.create_batch,
                batch=batch,
                lines=lines,
                nodes=nodes,
                actor=actor,
                now=self.clock(),
                fair=fair,
                max_waiting=max_waiting,
                max_running=self._max_running,
            ),
            handing_over(hand_over, nodes),
        )
        return row

    begin_batch = write(batch_create.begin)
    add_batch_lines = write(batch_create.add_lines)
    drop_batch_piece = write_untimed(batch_create.drop_piece)

    async def open_batch(
        self, batch_id: str, creator: str, nodes: list[NodeInfo], hand_over: Callable[[Row], None] | None = None
    ) -> Row:
        """A whole batch made live in one short commit (batch_create.open_batch); the heads of
        idle nodes claimed in it go to their workers through `hand_over` after the commit."""
        row, _ = await self._write(
            partial(
                batch_create.open_batch,
                now=self.clock(),
                max_running=self._max_running,
                batch_id=batch_id,
                creator=creator,
                nodes=nodes,
            ),
            handing_over(hand_over, nodes),
        )
        return row

    keep_batch_response = write_untimed(batches.keep_response)
    cancel_batch = write(batches.cancel_batch)
    expire_batches = write(batches.expire_due)
    retry_batch = write(batches.retry_failed)
    delete_batch = write_untimed(batches.delete_batch)

    finalize_batch = write(batches.finalize)
