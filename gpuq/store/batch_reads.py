"""The reads of batches and files, and their SQL: Store's, through its readers' connection
(Core.read). A batch's rows carry their lines' counts (batches.with_counts)."""

from __future__ import annotations

from typing import Any

from ..errors import NotFound
from .batches import LINES_SQL, counts_sql, with_counts
from .core import Core
from .steps import Row

BATCH_SQL = "SELECT * FROM batch WHERE id = ?"
# A page of a batch's lines with their replies, past the last line sent (results streamed).
LINES_PAGE_SQL = LINES_SQL.replace("WHERE l.batch_id = ?", "WHERE l.batch_id = ? AND l.line > ?") + " LIMIT ?"


def batches_sql(api: str | None, owner: bool, after: bool, status: bool) -> str:
    """Batches, newest first, paged by the last one seen (`after`: its created_at and id)."""
    where = []
    if api is not None:
        where.append("api = :api")
    if owner:
        where.append("owner = :owner")
    if status:
        where.append("status IN ('in_progress', 'cancelling')")
    if after:
        where.append("(created_at < :created_at OR (created_at = :created_at AND id < :id))")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT * FROM batch{clause} ORDER BY created_at DESC, id DESC LIMIT :limit"


# A batch's lines that are jobs, with the page's and the CLI's view of each.
LINE_JOBS_SQL = (
    "SELECT l.line, l.custom_id, l.job_id, l.refused, j.state, j.error, j.node, j.model, j.created_at, j.finished_at"
    " FROM batch_line l LEFT JOIN job j ON j.id = l.job_id WHERE l.batch_id = ? ORDER BY l.line"
)
# The batch a job is a line of (the page folds them).
OPEN_LINES_SQL = (
    "SELECT l.batch_id, l.job_id FROM batch_line l JOIN batch b ON b.id = l.batch_id"
    " JOIN job j ON j.id = l.job_id WHERE b.status IN ('in_progress', 'cancelling') AND j.state IN ('queued', 'running')"
)
# The open batches' lines per node and state (the queue page folds them: one line per node).
OPEN_BY_NODE_SQL = (
    "SELECT l.batch_id, j.node, j.state, COUNT(*) AS n FROM batch b JOIN batch_line l ON l.batch_id = b.id"
    " JOIN job j ON j.id = l.job_id WHERE b.status IN ('in_progress', 'cancelling')"
    " GROUP BY l.batch_id, j.node, j.state"
)
# The batches still being created, and by which router (batch_create.py).
UNFINISHED_SQL = "SELECT id, creator, owner, total, created_at FROM batch WHERE status = 'validating'"
# A file under upload (bytes -1: gpuq/store/batches.py begin_file) is shown by no read.
FILE_SQL = "SELECT id, purpose, filename, bytes, created_at, owner FROM batch_file WHERE id = ? AND bytes >= 0"
# A file's content, one chunk (at most FILE_CHUNK_BYTES) per read: never the file whole.
FILE_CHUNK_SQL = "SELECT bytes FROM batch_file_chunk WHERE file_id = ? AND seq = ?"
# Batches by state, and the lines of the open ones by their jobs' states (/metrics: a scrape
# reads the lines of the batches in progress only, never the whole history's).
BATCH_STATES_SQL = "SELECT status, COUNT(*) AS n FROM batch GROUP BY status"
LINE_STATES_SQL = (
    "SELECT COALESCE(j.state, 'refused') AS state, COUNT(*) AS n FROM batch b"
    " JOIN batch_line l ON l.batch_id = b.id LEFT JOIN job j ON j.id = l.job_id"
    " WHERE b.status IN ('in_progress', 'cancelling') GROUP BY COALESCE(j.state, 'refused')"
)


def files_sql(owner: bool, purpose: bool, after: bool, ascending: bool) -> str:
    where = ["bytes >= 0"]
    if owner:
        where.append("owner = :owner")
    if purpose:
        where.append("purpose = :purpose")
    if after:
        op = ">" if ascending else "<"
        where.append(f"(created_at {op} :created_at OR (created_at = :created_at AND id {op} :id))")
    clause = f" WHERE {' AND '.join(where)}"
    order = "ASC" if ascending else "DESC"
    return (
        f"SELECT id, purpose, filename, bytes, created_at, owner FROM batch_file{clause}"
        f" ORDER BY created_at {order}, id {order} LIMIT :limit"
    )


class BatchReads(Core):
    """The reads of batches and files (Store's, through its readers' connection). `only_owner`: a
    member's name; another's batch or file is not found (404), as another's job is not theirs."""

    async def batch(self, batch_id: str, only_owner: str | None = None) -> Row:
        found = await self.read(BATCH_SQL, (batch_id,))
        if not found or (only_owner is not None and found[0]["owner"] != only_owner):
            raise NotFound(f"no batch '{batch_id}'")
        return with_counts(found[0], await self.read(counts_sql(1), (batch_id,)))

    async def batches(
        self,
        api: str | None = None,
        owner: str | None = None,
        after: str | None = None,
        limit: int = 20,
        open_only: bool = False,
    ) -> list[Row]:
        """Newest first; `after`: the id of the last one seen (the next page starts past it)."""
        params: dict[str, Any] = {"api": api, "owner": owner, "limit": limit}
        if after is not None:
            seen = await self.read(BATCH_SQL, (after,))
            if not seen:
                raise NotFound(f"no batch '{after}' to list after")
            params.update(created_at=seen[0]["created_at"], id=after)
        found = await self.read(batches_sql(api, owner is not None, after is not None, open_only), params)
        if not found:
            return []
        ids = [b["id"] for b in found]
        counted = await self.read(counts_sql(len(ids)), ids)
        return [with_counts(b, counted) for b in found]

    async def unfinished_batches(self) -> list[Row]:
        """The batches still being created (`validating`), each with the router creating it."""
        return await self.read(UNFINISHED_SQL)

    async def batch_lines(self, batch_id: str) -> list[Row]:
        """A batch's lines in order, each with its job's state, node and error (None: refused)."""
        return await self.read(LINE_JOBS_SQL, (batch_id,))

    async def batch_results(self, batch_id: str) -> list[Row]:
        """A batch's lines in order with their kept replies (its results, its output files)."""
        return await self.read(LINES_SQL, (batch_id,))

    async def batch_results_page(self, batch_id: str, after_line: int, limit: int) -> list[Row]:
        """Up to `limit` of a batch's lines past `after_line`, in order, with their kept replies:
        its results sent page by page, never all its replies at once."""
        return await self.read(LINES_PAGE_SQL, (batch_id, after_line, limit))

    async def open_batch_lines(self) -> dict[str, str]:
        """The waiting and running jobs that are lines of open batches: job id -> batch id."""
        return {r["job_id"]: r["batch_id"] for r in await self.read(OPEN_LINES_SQL)}

    async def batches_of_jobs(self, job_ids: list[str]) -> dict[str, Row]:
        """The batch each of these jobs is a line of ({id, name, custom_id}); others are left out."""
        if not job_ids:
            return {}
        found = await self.read(
            "SELECT l.job_id, b.id, b.name, l.custom_id FROM batch_line l JOIN batch b ON b.id = l.batch_id"
            f" WHERE l.job_id IN ({','.join('?' * len(job_ids))})",
            job_ids,
        )
        return {r["job_id"]: {"id": r["id"], "name": r["name"], "custom_id": r["custom_id"]} for r in found}

    async def open_batches_by_node(self) -> dict[str, dict[str, dict[str, int]]]:
        """The open batches' lines on each node by state: batch id -> node -> state -> count."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for r in await self.read(OPEN_BY_NODE_SQL):
            out.setdefault(r["batch_id"], {}).setdefault(r["node"], {})[r["state"]] = int(r["n"])
        return out

    async def batch_totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """Batches by status, and the open batches' lines by their jobs' states (/metrics)."""
        by_status = {r["status"]: int(r["n"]) for r in await self.read(BATCH_STATES_SQL)}
        by_state = {r["state"]: int(r["n"]) for r in await self.read(LINE_STATES_SQL)}
        return by_status, by_state

    async def file(self, file_id: str, only_owner: str | None = None) -> Row:
        found = await self.read(FILE_SQL, (file_id,))
        if not found or (only_owner is not None and found[0]["owner"] != only_owner):
            raise NotFound(f"no file '{file_id}'")
        return found[0]

    async def files(
        self,
        owner: str | None = None,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10000,
        ascending: bool = False,
    ) -> list[Row]:
        params: dict[str, Any] = {"owner": owner, "purpose": purpose, "limit": limit}
        if after is not None:
            seen = await self.read(FILE_SQL, (after,))
            if not seen:
                raise NotFound(f"no file '{after}' to list after")
            params.update(created_at=seen[0]["created_at"], id=after)
        return await self.read(files_sql(owner is not None, purpose is not None, after is not None, ascending), params)

    async def file_chunk(self, file_id: str, seq: int) -> bytes | None:
        """A file's chunk `seq` (from 0), or None past its last: a file is read one chunk at a
        time (a member's read is checked by `file` first)."""
        found = await self.read(FILE_CHUNK_SQL, (file_id, seq))
        return bytes(found[0]["bytes"]) if found else None

    async def file_content(self, file_id: str, only_owner: str | None = None) -> bytes:
        """A file whole: for what is small by its own limit (the tests, a batch's output checked
        in the store's contract); the routes stream a file by `file_chunk`."""
        await self.file(file_id, only_owner)
        out, seq = [], 0
        while (chunk := await self.file_chunk(file_id, seq)) is not None:
            out.append(chunk)
            seq += 1
        return b"".join(out)
