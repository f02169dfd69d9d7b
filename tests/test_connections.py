"""Connections the router closes or refuses, so that silent clients never lock out /health:
a header deadline for new connections, an idle keep-alive timeout, a cap on open connections
below the open-file limit, the loop's accept error logged once a minute, and stream clients
that leave (a closed tab) logged quietly."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from conftest import eventually, node_table
from gpuq.connections import Throttled

LOG_BUDGET = 20_000  # bytes: the router's whole log for one of these tests


async def open_idle(url: str, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`count` connections at once that send nothing, as stuck or malicious clients would."""
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def connect():
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2)
        except (OSError, asyncio.TimeoutError):
            return None  # a full accept queue drops some: the router must still recover
    return [c for c in await asyncio.gather(*(connect() for _ in range(count))) if c]


async def closed_by_router(reader: asyncio.StreamReader) -> bool:
    """True once the router has closed this connection (anything it said before, then EOF)."""
    try:
        while await asyncio.wait_for(reader.read(65536), 0.05):
            pass
        return True
    except asyncio.TimeoutError:
        return False
    except ConnectionError:
        return True


async def health_from_new_client(url: str):
    """/health's own answer on a fresh connection (not the cap's 503), or None."""
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                         timeout=aiohttp.ClientTimeout(total=2)) as session:
            async with session.get(url + "/health") as resp:
                body = await resp.json()
                return body if "ok" in body else None
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


def close_all(conns) -> None:
    for _, writer in conns:
        writer.close()


async def test_idle_sockets_beyond_the_file_limit_leave_health_answering(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], file_limit=256,
                             header_timeout="1s")
    conns = await open_idle(d.url, 400)
    try:  # the silent sockets stay open on this side: the router closes or refuses them
        assert await eventually(lambda: health_from_new_client(d.url), 15, 0.2, "/health to answer")
    finally:
        close_all(conns)
    text = d.log.read_text()
    assert text.count("out of system resource") <= 1, text[-3000:]
    assert len(text) < LOG_BUDGET, text[-3000:]


async def test_the_soft_file_limit_is_raised_to_the_hard_limit(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], file_limit=(256, 1024))
    text = d.log.read_text()
    assert "open-file limit raised from 256 to 1024 (the hard limit)" in text, text
    assert "open-file limit 1024, at most 896 connections" in text, text


async def test_out_of_files_accept_error_is_logged_once_a_minute(fakes, daemon_factory):
    # So few files that a burst of connections runs out of them despite the connection cap.
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], file_limit=40,
                             header_timeout="1s", health_interval="10m")
    conns = await open_idle(d.url, 200)
    try:
        assert await eventually(lambda: health_from_new_client(d.url), 15, 0.2, "/health to answer")
    finally:
        close_all(conns)
    text = d.log.read_text()
    assert text.count("socket.accept() out of system resource") == 1, text[-3000:]
    assert len(text) < LOG_BUDGET, text[-3000:]


async def test_slow_headers_and_idle_keep_alive_connections_are_closed(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], header_timeout="1s",
                             keepalive_timeout="1s")
    host, port = d.url.removeprefix("http://").rsplit(":", 1)

    # Headers trickled one line at a time never finish: the router closes the connection.
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n".encode())
    lines = 0

    async def trickled_until_closed():
        nonlocal lines
        if reader.at_eof() or await closed_by_router(reader):
            return True
        writer.write(f"X-Slow-{lines}: 1\r\n".encode())
        lines += 1
        await asyncio.sleep(0.2)  # the client's pace, not synchronisation
        return False
    # (10 s of trickling is 40 lines: aiohttp's own limit of 128 header lines is not what closes it)
    await eventually(trickled_until_closed, 10, 0, "the router to close a slow-headers connection")
    writer.close()

    # A kept-alive connection that answered one request and then sits idle is closed too.
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    await eventually(lambda: closed_by_router(reader), 10, 0, "the router to close an idle keep-alive connection")
    writer.close()


async def test_connections_over_the_cap_get_503_and_health_answers_once_they_close(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], max_connections=8,
                             header_timeout="1m")
    conns = await open_idle(d.url, 8)
    try:
        async with aiohttp.ClientSession() as session:
            async def refused():
                try:
                    async with session.get(d.url + "/health") as resp:
                        return resp.status, await resp.json()
                except aiohttp.ClientError:  # the close can overtake the answer
                    return None
            status, body = await eventually(refused, 10, 0.05, "the cap's 503")
        assert status == 503
        assert "router.max_connections" in body["error"]["message"]
        close_all(conns)  # the idle clients leave: a new client gets in
        assert await eventually(lambda: health_from_new_client(d.url), 10, 0.05, "/health to answer")
    finally:
        close_all(conns)


async def test_stream_clients_that_leave_log_no_error(fakes, daemon_factory):
    fake = await fakes("m", token_delay_s=0.05, tokens=40)
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")])
    job = (await d.submit("task", "watched by tabs that close"))[0]
    await d.wait_state(job["id"], "running")
    async with aiohttp.ClientSession() as session:
        for path in ["/api/events", f"/api/jobs/{job['id']}/stream"] * 3:
            resp = await session.get(d.url + path)
            assert await resp.content.readline()  # connected and streaming
            resp.close()  # the tab closes mid-stream
    done = await d.wait_state(job["id"], "done")  # every token after that was written to the leavers
    assert len(done["output"].split()) == 40
    async with aiohttp.ClientSession() as session:  # a stream that stays gets to the end
        async with session.get(d.url + f"/api/jobs/{job['id']}/stream") as resp:
            last = [json.loads(line) for line in (await resp.text()).splitlines()][-1]
    assert last["done"] and last["job"]["state"] == "done"
    text = d.log.read_text()
    assert " ERROR " not in text and "Traceback" not in text, text[-3000:]


async def test_throttled_log_says_how_many_repeats_it_held_back():
    lines: list[str] = []
    throttled = Throttled(lines.append, every_s=0.2)
    for i in range(5):
        throttled(f"accept failed {i}")
    assert lines == ["accept failed 0"]
    await eventually(lambda: len(lines) == 2, 5, what="the summary of the held-back repeats")
    assert lines[1] == "accept failed 4 (4 repeats suppressed in the last 0.2s)"
    throttled("accept failed 5")  # within a period of the summary: held back, summed up later
    assert len(lines) == 2
