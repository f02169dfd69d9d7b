"""A batch file's bytes between a client and the store, never whole in memory: an upload stored
chunk by chunk as it arrives (each chunk written before more is read, so the store's pace is the
upload's), a file read back chunk by chunk, and an input file's lines handed on in bounded
pieces (a line is whole only where it ends). The store keeps a file as chunks of
FILE_CHUNK_BYTES (gpuq/store/batches.py, migration 025)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from ..errors import GpuqError
from ..store import Row, Store
from ..store.batches import ABANDONED_S, FILE_CHUNK_BYTES, new_file_id

log = logging.getLogger("gpuq")

LINES_PIECE_BYTES = 1 << 20  # an input's lines are checked in pieces of about this many bytes


class FileUpload:
    """One upload on its way to the store: begun (a row no read shows), fed, then ended whole
    (`finish`) or dropped with every chunk it stored (`abort`)."""

    def __init__(self, store: Store, owner: str | None, lasts_s: float) -> None:
        self.store = store
        self.owner = owner
        self.abandoned_s = max(ABANDONED_S, 2 * lasts_s)  # (router.body_timeout bounds an upload)
        self.id = new_file_id()
        self.size = 0
        self.seq = 0
        self.pending = bytearray()
        self.begun = False

    async def begin(self, purpose: str, filename: str) -> None:
        await self.store.begin_file(self.id, purpose, filename, self.owner, self.abandoned_s)
        self.begun = True

    async def write(self, data: bytes) -> None:
        """Bytes of the file, in order; each full chunk is stored before this returns."""
        self.pending += data
        self.size += len(data)
        while len(self.pending) >= FILE_CHUNK_BYTES:
            await self._store(bytes(self.pending[:FILE_CHUNK_BYTES]))
            del self.pending[:FILE_CHUNK_BYTES]

    async def finish(self) -> Row:
        if self.pending:
            await self._store(bytes(self.pending))
            self.pending.clear()
        return await self.store.end_file(self.id, self.size)

    async def abort(self) -> None:
        """Nothing of it kept: its row and its chunks gone. A store that cannot take the delete
        now (full, unwritable) keeps them hidden until a later upload removes them as abandoned."""
        self.pending.clear()
        if self.begun:
            try:
                await self.store.drop_upload(self.id)
            except GpuqError as exc:
                log.warning("upload %s refused; its stored chunks stay hidden until removed: %s", self.id, exc)

    async def _store(self, data: bytes) -> None:
        await self.store.add_file_chunk(self.id, self.seq, data)
        self.seq += 1


async def chunks_of(store: Store, file_id: str) -> AsyncIterator[bytes]:
    """A file's content, one stored chunk at a time (a file deleted meanwhile ends early)."""
    seq = 0
    while (chunk := await store.file_chunk(file_id, seq)) is not None:
        yield chunk
        seq += 1


async def numbered_lines(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[tuple[int, bytes]]]:
    """The lines of a file read as `chunks`, numbered from 1, in pieces of about
    LINES_PIECE_BYTES; a line cut between two chunks is handed on whole, once its end came."""
    rest, number = bytearray(), 0
    async for chunk in chunks:
        rest += chunk
        end = rest.rfind(b"\n")
        if end < 0:
            continue  # a line longer than a chunk: gathered until it ends
        lines = bytes(rest[:end]).split(b"\n")
        del rest[: end + 1]
        piece: list[tuple[int, bytes]] = []
        size = 0
        for line in lines:
            number += 1
            piece.append((number, line))
            size += len(line)
            if size >= LINES_PIECE_BYTES:
                yield piece
                piece, size = [], 0
        if piece:
            yield piece
    yield [(number + 1, bytes(rest))]
