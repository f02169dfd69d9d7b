"""Connections the router closes or refuses, so that silent clients never lock out /health:
a header deadline for new connections, an idle keep-alive timeout, a cap on open connections
below the open-file limit, the loop's accept error logged once a minute, and stream clients
that leave (a closed tab) logged quietly."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from conftest import eventually, free_port, node_table

from gpuq.access.connections import Throttled

LOG_BUDGET = 20_000  # bytes: the router's whole log for one of these tests


async def open_idle(url: str, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """`count` connections at once that send nothing, as stuck or malicious clients would."""
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def connect():
        try:
            return await asyncio.wait_for(asyncio.open_connection(host, int(port)), 2)
        except (TimeoutError, OSError):
            return None  # a full accept queue drops some: the router must still recover

    return [c for c in await asyncio.gather(*(connect() for _ in range(count))) if c]


async def closed_by_router(reader: asyncio.StreamReader) -> bool:
    """True once the router has closed this connection (anything it said before, then EOF)."""
    try:
        while await asyncio.wait_for(reader.read(65536), 0.05):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionError:
        return True


async def health_from_new_client(url: str):
    """/health's own answer on a fresh connection (not the cap's 503), or None."""
    try:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(force_close=True), timeout=aiohttp.ClientTimeout(total=2)
        ) as session:
            async with session.get(url + "/health") as resp:
                body = await resp.json()
                return body if "ok" in body else None
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


def close_all(conns) -> None:
    for _, writer in conns:
        writer.close()


async def test_idle_sockets_beyond_the_file_limit_leave_health_answering(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], file_limit=256, header_timeout="1s")
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
    assert "open-file limit 1024, at most 864 connections" in text, text


async def test_out_of_files_accept_error_is_logged_once_a_minute(fakes, daemon_factory):
    # So few files that a burst of connections runs out of them despite the connection cap.
    fake = await fakes("m")
    d = await daemon_factory(
        [node_table("n1", fake, 1, ["task"], "m")], file_limit=40, header_timeout="1s", health_interval="10m"
    )
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
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], header_timeout="1s", keepalive_timeout="1s")
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
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], max_connections=8, header_timeout="1m")
    conns = await open_idle(d.url, 8)
    try:
        async with aiohttp.ClientSession() as session:

            async def refused():
                try:
                    async with session.get(d.url + "/api/jobs") as resp:
                        return resp.status, await resp.json()
                except aiohttp.ClientError:  # the close can overtake the answer
                    return None

            status, body = await eventually(refused, 10, 0.05, "the cap's 503")
        assert status == 503
        assert "router.max_connections" in body["error"]["message"]
        assert await health_from_new_client(d.url)  # a probe beyond the cap (see test_slots below)
        close_all(conns)  # the idle clients leave: a new client gets in
        assert await eventually(lambda: api_from_new_client(d.url, "127.0.0.1"), 10, 0.05, "/api/jobs to answer")
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


# Connection slots no one can hog (issue 22): each listener has its own cap, an address at most
# max_connections_per_peer, a trickling body is cut at body_timeout, idle kept-alive connections
# make room, and /health, /metrics (and the front door's / and /api/version) get in beyond the cap.
# Linux routes all of 127/8 to lo: binding the client's source address makes distinct peers.

CAP, PER_PEER = 20, 8


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


async def connect_from(url: str, source: str):
    host, port = host_port(url)
    return await asyncio.wait_for(asyncio.open_connection(host, port, local_addr=(source, 0)), 2)


async def read_response(reader: asyncio.StreamReader, timeout: float = 5) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length body: (status, body)."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), await asyncio.wait_for(reader.readexactly(length), timeout)


async def get_from(url: str, source: str, path: str) -> tuple[int, dict] | None:
    """GET `path` on a new connection from `source`: (status, JSON body), or None if cut off."""
    try:
        reader, writer = await connect_from(url, source)
    except (TimeoutError, OSError):
        return None
    try:
        host, port = host_port(url)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        status, body = await read_response(reader)
        return status, (json.loads(body) if body.startswith((b"{", b"[")) else {"text": body.decode()})
    except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError, StopIteration):
        return None
    finally:
        writer.close()


async def api_from_new_client(url: str, source: str) -> bool:
    answer = await get_from(url, source, "/api/jobs")
    return answer is not None and answer[0] == 200


async def hog(url: str, source: str, count: int, how: str, path: str = "/api/jobs"):
    """`count` connections from `source` that hold their slot: 'silent' ones send nothing,
    'trickling' ones send a POST's headers and then its body a byte at a time (see trickle)."""
    host, port = host_port(url)
    conns = []
    for _ in range(count):
        try:
            reader, writer = await connect_from(url, source)
        except (TimeoutError, OSError):
            continue
        if how == "trickling":
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: 100000\r\n\r\n{{".encode()
            )
        conns.append((reader, writer))
    return conns


async def refusals(conns) -> list[int]:
    """The statuses the router answered (and closed) on connections that were refused."""
    statuses = []
    for reader, _ in conns:
        try:
            statuses.append((await read_response(reader, 0.2))[0])
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass
    return statuses


async def router_with_front_door(fakes, daemon_factory):
    fake = await fakes("m")
    front = free_port()
    d = await daemon_factory(
        [node_table("n1", fake, 1, ["task"], "m")],
        max_connections=CAP,
        max_connections_per_peer=PER_PEER,
        header_timeout="30s",
        body_timeout="30s",
        ollama_listen=f"127.0.0.1:{front}",
    )
    return d, f"http://127.0.0.1:{front}"


async def hog_every_slot(url: str, path: str) -> list:
    """Three addresses hold every slot of the listener at `url`, with trickling bodies and silence;
    returns once a fourth address is refused there (503)."""
    conns = await hog(url, "127.0.0.1", PER_PEER, "trickling", path)
    conns += await hog(url, "127.0.0.2", PER_PEER, "silent")
    conns += await hog(url, "127.0.0.3", PER_PEER, "trickling", path)

    async def full():
        answer = await get_from(url, "127.0.0.4", path.replace("/api/chat", "/api/tags"))
        return answer if answer and answer[0] == 503 else None

    try:
        await eventually(full, 10, 0.05, f"the slots of {url} to be full")
    except BaseException:
        close_all(conns)
        raise
    return conns


async def test_slots_hogged_on_the_front_door_leave_the_router_answering(fakes, daemon_factory):
    d, front_url = await router_with_front_door(fakes, daemon_factory)
    conns = await hog_every_slot(front_url, "/api/chat")
    try:
        assert await api_from_new_client(d.url, "127.0.0.4")
        assert await api_from_new_client(d.url, "127.0.0.1")
    finally:
        close_all(conns)


async def test_slots_hogged_on_the_router_leave_probes_and_the_front_door_answering(fakes, daemon_factory):
    d, front_url = await router_with_front_door(fakes, daemon_factory)
    conns = await hog_every_slot(d.url, "/api/jobs")
    try:
        status, body = await get_from(d.url, "127.0.0.4", "/api/jobs")
        assert status == 503 and "router.max_connections" in body["error"]["message"], body
        health = await get_from(d.url, "127.0.0.4", "/health")
        assert health and health[0] in (200, 503) and "ok" in health[1], health  # /health's own answer
        metrics = await get_from(d.url, "127.0.0.5", "/metrics")
        assert metrics and metrics[0] == 200 and "gpuq" in metrics[1]["text"], metrics
        assert await get_from(front_url, "127.0.0.1", "/") == (200, {"text": "Ollama is running"})
        version = await get_from(front_url, "127.0.0.2", "/api/version")
        assert version and version[0] == 200 and "version" in version[1], version
    finally:
        close_all(conns)


async def test_a_trickling_body_is_cut_with_408_at_body_timeout(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], body_timeout="1s")
    host, port = host_port(d.url)
    reader, writer = await connect_from(d.url, "127.0.0.1")
    writer.write(
        f"POST /api/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: 10000\r\n\r\n".encode()
    )
    answer: list = []

    async def trickled_until_answered():
        try:
            answer.append(await read_response(reader, 0.1))
            return True
        except TimeoutError:
            writer.write(b" ")  # one byte at a time, as the attack did
            return False

    try:
        await eventually(trickled_until_answered, 8, 0, "the router to answer a trickling body")
        status, body = answer[0]
        assert status == 408, (status, body)
        assert "router.body_timeout" in json.loads(body)["error"]["message"]
        assert await eventually(lambda: closed_by_router(reader), 5, 0, "the router to close the connection")
    finally:
        writer.close()


async def test_one_address_gets_at_most_its_share_of_slots_while_another_is_served(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory(
        [node_table("n1", fake, 1, ["task"], "m")],
        max_connections=CAP,
        max_connections_per_peer=PER_PEER,
        header_timeout="30s",
    )
    conns = await hog(d.url, "127.0.0.2", PER_PEER + 4, "silent")
    try:
        statuses = await eventually(lambda: refusals(conns), 10, 0.05, "the per-address refusals")
        assert statuses == [429] * 4, statuses
        # (the router closes a refused connection at once: the close can overtake its answer)
        status, body = await eventually(lambda: get_from(d.url, "127.0.0.2", "/api/jobs"), 5, 0.05, "a 429")
        assert status == 429 and "router.max_connections_per_peer" in body["error"]["message"], body
        assert await api_from_new_client(d.url, "127.0.0.3")  # another address is served
    finally:
        close_all(conns)


async def keep_alive_after_one_request(url: str, source: str):
    reader, writer = await connect_from(url, source)
    host, port = host_port(url)
    writer.write(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    await read_response(reader)
    return reader, writer


async def test_idle_kept_alive_connections_make_room_when_slots_are_short(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], max_connections=CAP, keepalive_timeout="1m")
    conns = [await keep_alive_after_one_request(d.url, "127.0.0.2") for _ in range(CAP)]
    try:  # every slot is held by an idle kept-alive connection: a new client gets one of theirs
        assert await api_from_new_client(d.url, "127.0.0.3")
        assert await eventually(lambda: any(r.at_eof() for r, _ in conns), 5, 0.05, "an idle connection closed")
    finally:
        close_all(conns)


async def test_keep_alive_renewals_end_at_keepalive_lifetime(fakes, daemon_factory):
    fake = await fakes("m")
    d = await daemon_factory(
        [node_table("n1", fake, 1, ["task"], "m")], keepalive_timeout="1m", keepalive_lifetime="1s"
    )
    reader, writer = await keep_alive_after_one_request(d.url, "127.0.0.1")
    host, port = host_port(d.url)

    async def renewed_until_closed():
        try:
            writer.write(f"GET /health HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
            await read_response(reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            return True
        await asyncio.sleep(0.2)  # the client's pace, not synchronisation
        return False

    try:
        await eventually(renewed_until_closed, 8, 0, "the router to end a renewed keep-alive connection")
    finally:
        writer.close()
