"""A batch file's body is streamed, never held whole (issue 43, items 2 and 3): an upload goes to
the store chunk by chunk and one cut before its closing multipart boundary is refused with
nothing kept; a large file is stored, checked as a batch's input and read back byte for byte
while the router's memory stays small; a download its client stops reading ends at
[front] stalled_client_timeout. The real daemon, a real SQLite file, the openai SDK and raw
sockets on loopback; the router's memory is read from /proc."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sqlite3
from pathlib import Path

import aiohttp
import psycopg
import pytest
from conftest import eventually, free_port, node_table
from test_front import CHAT_MODEL, FrontLab

from gpuq.shipped import shipped_files
from gpuq.store import MIGRATIONS_DIR, postgres
from gpuq.store import sqlite as engine

BOUNDARY = "gpuq-test-boundary"
INCOMPLETE = "the upload ended before its closing multipart boundary: incomplete upload"
MB = 1 << 20


@pytest.fixture
async def door(fakes, daemon_factory):
    """One node behind the front door; a client that takes nothing for 1s is cut off."""
    chat = await fakes(CHAT_MODEL)
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", chat, 1, ["task"], CHAT_MODEL)],
        ollama_listen=f"127.0.0.1:{port}",
        front={"stalled_client_timeout": "1s"},
    )
    lab = FrontLab(daemon, f"http://127.0.0.1:{port}", {"node-1": chat})

    async def answers():
        try:
            async with daemon.session.get(lab.url + "/") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(answers, 10, what="the front door to answer")
    yield lab
    await lab.close()


def form(purpose: bytes, filename: str, content: bytes) -> bytes:
    """multipart/form-data as the SDK sends it: purpose, then the file, then the closing boundary."""
    b = BOUNDARY.encode()
    return (
        b"--" + b + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n' + purpose + b"\r\n"
        b"--"
        + b
        + f'\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'.encode()
        + b"Content-Type: application/jsonl\r\n\r\n"
        + content
        + b"\r\n--"
        + b
        + b"--\r\n"
    )


def chat_line(custom_id: str, pad: int = 0) -> bytes:
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": f"q {custom_id}"}]}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    if pad:
        line["pad"] = "x" * pad  # (a field the batch ignores: long lines that cross chunks)
    return json.dumps(line).encode() + b"\n"


def stored(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in ("batch_file", "batch", "job")}
    finally:
        conn.close()


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


async def post_raw(lab: FrontLab, body: bytes) -> tuple[int, dict]:
    headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
    async with lab.daemon.session.post(lab.url + "/v1/files", data=body, headers=headers) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("cut", ["at a line", "before the closing boundary"])
async def test_an_upload_cut_before_its_closing_boundary_is_refused_and_keeps_nothing(door, cut):
    """The issue's case: a form cut at line 12 of 20 was kept, and its batch `completed` with 12
    lines and no error. Now it is a 400 naming it, and neither a file nor a batch exists."""
    content = b"".join(chat_line(f"q-{i}") for i in range(20))
    whole = form(b"batch", "sweep.jsonl", content)
    body = whole[: whole.index(b'{"custom_id": "q-12"')] if cut == "at a line" else whole[: whole.rindex(b"\r\n--")]
    db = door.daemon.config.parent / "gpuq.db"
    status, got = await post_raw(door, body)
    assert status == 400, got
    assert got["error"]["message"] == INCOMPLETE
    assert stored(db) == {"batch_file": 0, "batch": 0, "job": 0}
    assert [f async for f in door.openai().files.list()] == []
    # The same form whole is kept, so the refusal was the cut's.
    assert (await post_raw(door, whole))[0] == 200


async def test_a_large_file_is_stored_checked_and_read_back_whole_while_the_router_stays_small(door):
    """A 40 MB input file (once: +440 MB of router memory for 51 MB) goes up through the SDK, a
    batch made from it is checked line by line across its chunks (its one bad line named), and
    it comes back byte for byte; the router's peak memory grows by far less than the file."""
    bad = 233
    lines = [chat_line(f"q-{i}", pad=100_000) for i in range(1, 401)]
    lines[bad - 1] = b'{"custom_id": "broken", \n'
    content = b"".join(lines)
    assert len(content) > 38 * MB
    pid = door.daemon.proc.pid
    before = peak_rss_mb(pid)
    client = door.openai()
    uploaded = await client.files.create(file=("big.jsonl", content), purpose="batch")
    assert uploaded.bytes == len(content)
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [(bad, "invalid_json_line")]
    got = await client.files.content(uploaded.id)
    assert got.content == content
    grown = peak_rss_mb(pid) - before
    assert grown < 120, f"the router's peak memory grew by {grown:.0f} MiB for a {len(content) / MB:.0f} MiB file"


async def stalled_download(url: str, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A GET whose client then reads nothing (its receive buffer kept small)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port), limit=MB)
    writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def test_a_download_its_client_does_not_read_ends_at_the_stalled_deadline_and_holds_little(door):
    """Four downloads of a 30 MB file that are never read (once: +224 MB, held for ever): each is
    cut off at [front] stalled_client_timeout (1s here), having sent little more than the
    socket's buffers, and the router's peak memory stays far below the files' size."""
    content = b"".join(chat_line(f"d-{i}", pad=100_000) for i in range(300))
    pid = door.daemon.proc.pid
    before = peak_rss_mb(pid)
    uploaded = await door.openai().files.create(file=("d.jsonl", content), purpose="batch")
    clients = [await stalled_download(door.url, f"/v1/files/{uploaded.id}/content") for _ in range(4)]
    log = door.daemon.log

    def cut_off() -> bool:
        return log.read_text(errors="replace").count("stalled_client_timeout") >= 4

    await eventually(cut_off, 15, what="the four stalled downloads to be cut off")
    grown = peak_rss_mb(pid) - before
    for reader, writer in clients:
        got = 0
        try:
            while chunk := await asyncio.wait_for(reader.read(MB), 10):
                got += len(chunk)
        except ConnectionResetError:
            pass
        writer.close()
        assert got < len(content) // 2, f"a stalled client still got {got} of {len(content)} bytes"
    assert grown < 100, f"the router's peak memory grew by {grown:.0f} MiB for 4 stalled downloads"
    # The file is whole for a client that reads it.
    assert (await door.openai().files.content(uploaded.id)).content == content


def test_migration_025_moves_each_files_content_into_its_chunks(tmp_path):
    """A database from before 025 keeps its files: each one's bytes, cut into 1 MiB chunks, read
    back the same."""
    files = shipped_files(MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations")
    db = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    engine.migrate(db, [f for f in files if int(f.name[:3]) <= 24], 0.0, tmp_path / "old.db")
    big = bytes(range(256)) * (2 * 4096 + 10)  # 2 MiB and 2,560 bytes
    for file_id, content in (("file-big", big), ("file-small", b'{"a": 1}\n'), ("file-empty", b"")):
        db.execute(
            "INSERT INTO batch_file (id, purpose, filename, bytes, created_at, owner, content)"
            " VALUES (?, 'batch', 'f.jsonl', ?, '2026-01-01T00:00:00Z', NULL, ?)",
            (file_id, len(content), content),
        )
    engine.migrate(db, files, 0.0, tmp_path / "old.db")
    chunks = db.execute("SELECT file_id, seq, bytes FROM batch_file_chunk ORDER BY file_id, seq").fetchall()
    whole = {f: b"".join(c for fid, _, c in chunks if fid == f) for f in ("file-big", "file-small", "file-empty")}
    assert whole == {"file-big": big, "file-small": b'{"a": 1}\n', "file-empty": b""}
    assert [len(c) for fid, _, c in chunks if fid == "file-big"] == [MB, MB, 2560]
    assert "content" not in [r[1] for r in db.execute("PRAGMA table_info(batch_file)")]


@pytest.mark.postgres
def test_migration_025_moves_each_files_content_into_its_chunks_on_postgres(pg_dsn):
    """PostgreSQL's 025 as SQLite's: a file's bytes in 1 MiB chunks, read back the same."""
    files = shipped_files(postgres.MIGRATIONS_DIR, "[0-9][0-9][0-9]_*.sql", "migrations/postgres")
    big = bytes(range(256)) * (2 * 4096 + 10)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        postgres.migrate(conn, [f for f in files if int(f.name[:3]) < 25], 0.0, "test")
        for file_id, content in (("file-big", big), ("file-small", b'{"a": 1}\n'), ("file-empty", b"")):
            conn.execute(
                "INSERT INTO batch_file (id, purpose, filename, bytes, created_at, owner, content)"
                " VALUES (%s, 'batch', 'f.jsonl', %s, '2026-01-01T00:00:00Z', NULL, %s)",
                (file_id, len(content), content),
            )
        postgres.migrate(conn, files, 0.0, "test")
        chunks = conn.execute("SELECT file_id, seq, bytes FROM batch_file_chunk ORDER BY file_id, seq").fetchall()
        columns = [
            r[0]
            for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'batch_file'")
        ]
    whole = {
        f: b"".join(bytes(c) for fid, _, c in chunks if fid == f) for f in ("file-big", "file-small", "file-empty")
    }
    assert whole == {"file-big": big, "file-small": b'{"a": 1}\n', "file-empty": b""}
    assert [len(c) for fid, _, c in chunks if fid == "file-big"] == [MB, MB, 2560]
    assert "content" not in columns


def chunks_stored(db: Path) -> int:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT COUNT(*) FROM batch_file_chunk").fetchone()[0]
    finally:
        conn.close()


async def send_head(url: str, length: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        f"POST /v1/files HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
    )
    return reader, writer


async def test_an_upload_whose_client_leaves_half_way_keeps_nothing_and_was_never_held_whole(door):
    """A 60 MB upload whose client goes after 30 MB: what reached the router went to the store as
    it came (not into its memory), and all of it is gone once the client is."""
    content = b"".join(chat_line(f"h-{i}", pad=100_000) for i in range(600))
    body = form(b"batch", "half.jsonl", content)
    db = door.daemon.config.parent / "gpuq.db"
    pid = door.daemon.proc.pid
    before = peak_rss_mb(pid)
    _, writer = await send_head(door.url, len(body))
    writer.write(body[: 30 * MB])
    await writer.drain()
    await eventually(lambda: chunks_stored(db) >= 20, 20, what="the upload's first chunks in the store")
    writer.transport.abort()
    await eventually(lambda: chunks_stored(db) == 0 and stored(db)["batch_file"] == 0, 10, what="the upload dropped")
    grown = peak_rss_mb(pid) - before
    assert grown < 20, f"the router's peak memory grew by {grown:.0f} MiB for 30 MiB of an upload"


async def test_an_upload_that_trickles_is_cut_with_408_at_body_timeout_and_keeps_nothing(fakes, daemon_factory):
    """An upload is read as it arrives (not whole by the body deadline's middleware), within
    router.body_timeout all the same: a client that trickles it is answered 408 naming the key."""
    chat = await fakes(CHAT_MODEL)
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", chat, 1, ["task"], CHAT_MODEL)], ollama_listen=f"127.0.0.1:{port}", body_timeout="1s"
    )
    url = f"http://127.0.0.1:{port}"

    async def answers():
        try:
            async with daemon.session.get(url + "/") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    await eventually(answers, 10, what="the front door to answer")
    body = form(b"batch", "slow.jsonl", b"".join(chat_line(f"s-{i}") for i in range(50)))
    reader, writer = await send_head(url, len(body))
    writer.write(body[:500])
    answer: list[bytes] = []

    async def trickled_until_answered():
        try:
            answer.append(await asyncio.wait_for(reader.read(65536), 0.1))
            return True
        except TimeoutError:
            writer.write(body[500 + len(answer) : 501 + len(answer)])  # a byte at a time
            return False

    try:
        await eventually(trickled_until_answered, 8, 0, "the router to answer a trickling upload")
        head, _, rest = answer[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[0]
        assert "router.body_timeout" in json.loads(rest)["error"]["message"]
    finally:
        writer.close()
    db = daemon.config.parent / "gpuq.db"
    await eventually(lambda: stored(db)["batch_file"] == 0 and chunks_stored(db) == 0, 5, what="nothing kept")
