"""The router's listening sockets and what keeps their connections in check: each listener's own
cap on open connections, a cap per client address, the top slots kept for loopback peers and a
few beyond the cap for /health and /metrics probes, idle kept-alive connections closed when slots
are short, a deadline for a new connection's first request headers and for each request's body
(after a request, aiohttp's keepalive_timeout closes an idle connection, and a connection's
lifetime bounds its renewals), the open-file limit raised to the hard limit, and the event loop's
accept error logged at most once a minute.

Without these, ~1,000 silent sockets used up a 1024-file limit: /health could no longer be
accepted and asyncio logged its accept error thousands of times a second; and 1,100 connections
trickling their bodies or kept alive held every slot of both listeners for a minute."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource
import socket
import time
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestHandler

from ..errors import StartupError

log = logging.getLogger("gpuq")

BACKLOG = 64  # connections waiting to be accepted; asyncio also accepts up to this many at a time
# Open files kept from client connections: one accepting burst (its refused connections are closed
# only after it), and 64 for SQLite, the Ollama clients, the log and the event loop.
FD_RESERVE = BACKLOG + 64
MIN_CONNECTIONS = 16  # even under a tiny file limit, the page and the CLI must get in
ACCEPT_ERROR = "socket.accept() out of system resource"  # asyncio's message, to its exception handler


def bind_sockets(listen: str, host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address `host` resolves to, bound before anything else starts so
    that a port in use stops the router before it touches its database."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(f"cannot listen on {listen}: {reason(exc)}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart binds over TIME_WAITs
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds it
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortTaken(f"cannot listen on {listen}: {reason(exc)}", port) from None
        raise StartupError(f"cannot listen on {listen}: {reason(exc)}") from None
    return sockets


class PortTaken(StartupError):
    """Another program listens on the port: the router's start adds how to listen on another one."""

    def __init__(self, message: str, port: int):
        super().__init__(message)
        self.port = port


def reason(exc: OSError) -> str:
    """'address already in use' rather than 'Address already in use' mid-sentence."""
    text = exc.strerror or str(exc)
    return text[:1].lower() + text[1:]


def raise_file_limit() -> int:
    """Lift the soft open-file limit to the hard one (desktops often start at 1024); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20  # no limit at all: the cap is what wanted says
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 10240)  # macOS refuses more
    if soft >= target:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("open-file limit stays %d: raising it to %d failed: %s", soft, target, exc)
        return soft
    log.info("open-file limit raised from %d to %d (the hard limit)", soft, target)
    return target


def connection_cap(wanted: int, file_limit: int, listeners: int = 1) -> int:
    """At most `wanted` connections per listener, with each listener's cap and its probes (see
    reserve_for) sharing what is FD_RESERVE below the file limit, so that accepting connections
    does not run out of files."""
    room = max((file_limit - FD_RESERVE) // listeners, MIN_CONNECTIONS)
    room = max(room - reserve_for(room), MIN_CONNECTIONS)
    if wanted > room:
        log.warning(
            "at most %d open connections per listener, not %d (router.max_connections): the open-file limit is %d",
            room,
            wanted,
            file_limit,
        )
    return min(wanted, room)


class Throttled:
    """Logs a line at most once per `every_s`; the repeats in between are counted, and their count
    is logged when the period ends."""

    def __init__(
        self, emit: Callable[[str], None], every_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.emit, self.every_s, self.clock = emit, every_s, clock
        self.quiet_until = float("-inf")
        self.suppressed = 0
        self.last = ""
        self.summary: asyncio.TimerHandle | None = None

    def __call__(self, text: str) -> None:
        now = self.clock()
        if now >= self.quiet_until:
            self.emit(text)
            self.quiet_until = now + self.every_s
            return
        self.suppressed += 1
        self.last = text
        if self.summary is None:
            self.summary = asyncio.get_running_loop().call_later(self.quiet_until - now, self.sum_up)

    def sum_up(self) -> None:
        self.summary = None
        if self.suppressed:
            self.emit(f"{self.last} ({self.suppressed} repeats suppressed in the last {self.every_s:g}s)")
            self.suppressed = 0
            self.quiet_until = self.clock() + self.every_s


def throttle_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """asyncio reports a failed accept() (out of files) to the loop's exception handler on every
    try, thousands of times a second: log it once a minute, with the count of the rest."""
    throttled = Throttled(lambda text: log.error("%s", text))

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") == ACCEPT_ERROR:
            throttled(f"{ACCEPT_ERROR}: {context.get('exception')}")
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


PROBE_HEADER_TIMEOUT_S = 2.0  # a probe beyond the cap sends its headers within this (or header_timeout)
MAX_PROBE_HEAD = 16384  # bytes of a probe's request head kept to read its path
ROUTER_PROBES = ("/health", "/metrics")
FRONT_PROBES = ("/", "/api/version")  # what Ollama clients and monitors ask an Ollama server


def reserve_for(max_connections: int) -> int:
    """The slots at the top of a listener's cap kept for loopback peers, and as many again beyond
    it for probes: 1 per 8 slots, at most 32."""
    return max(1, min(32, max_connections // 8))


def is_loopback(peer: str) -> bool:
    return peer.startswith("127.") or peer in ("::1", "localhost") or peer.startswith("::ffff:127.")


def peer_of(transport: asyncio.BaseTransport) -> str:
    name = transport.get_extra_info("peername")
    return name[0] if isinstance(name, tuple) and name else str(name or "")


def error_reply(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": {"status": status, "message": message}})
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()


class ConnectionGuard:
    """One listener's connection slots. Over `max_connections` a new one is answered 503 and
    closed, and one address may hold at most `per_peer` (429). The top `reserve` slots are for
    loopback peers only; beyond the cap, `reserve` more are kept for probes (`probe_paths`, one
    request each). When slots are short an idle kept-alive connection is closed to make room.
    A connection that has not sent its first request's headers within `header_timeout_s` is
    closed, and one older than `lifetime_s` is closed after its current request."""

    def __init__(
        self,
        max_connections: int,
        header_timeout_s: float,
        per_peer: int = 1 << 30,
        lifetime_s: float = 3600.0,
        probe_paths: tuple[str, ...] = ROUTER_PROBES,
        name: str = "the router",
    ) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.per_peer = per_peer
        self.lifetime_s = lifetime_s
        self.probe_paths = probe_paths
        self.name = name
        self.reserve = reserve_for(max_connections)
        self.counted: dict[GuardedConnection, None] = {}  # the open connections, oldest first
        self.peers: dict[str, int] = {}  # open connections (probes too) per address
        self.probes = 0
        self.refusals = Throttled(lambda text: log.warning("%s", text))
        self.busy_response = error_reply(
            503,
            "Service Unavailable",
            f"{name} has {max_connections} open connections, its limit (router.max_connections); try again shortly",
        )

    @property
    def open(self) -> int:
        return len(self.counted)

    def protocol_factory(self, make_protocol: Callable[[], RequestHandler]) -> Callable[[], asyncio.Protocol]:
        """Wraps aiohttp's protocol factory (the runner's server) for loop.create_server."""
        return lambda: GuardedConnection(self, make_protocol)

    def admit(self, conn: GuardedConnection, peer: str) -> str | None:
        """'slot', 'probe' or None (refused); counts the connection if admitted."""
        if self.peers.get(peer, 0) >= self.per_peer:
            return None
        kind = "slot" if self.fits(peer) or (self.evict_idle() and self.fits(peer)) else None
        if kind is None and self.probes < self.reserve:
            kind, self.probes = "probe", self.probes + 1
        if kind == "slot":
            self.counted[conn] = None
        if kind:
            self.peers[peer] = self.peers.get(peer, 0) + 1
        return kind

    def fits(self, peer: str) -> bool:
        limit = self.max_connections if is_loopback(peer) else self.max_connections - self.reserve
        return self.open < limit

    def evict_idle(self) -> bool:
        """Close the oldest kept-alive connection waiting for its next request, if any."""
        for conn in self.counted:
            if conn.idle():
                log.debug("closed an idle kept-alive connection from %s: %s's slots are short", conn.peer, self.name)
                self.release(conn)
                assert conn.inner is not None  # idle: a slot whose protocol waits for its next request
                conn.inner.force_close()
                return True
        return False

    def release(self, conn: GuardedConnection) -> None:
        if conn.kind == "slot":
            self.counted.pop(conn, None)
        elif conn.kind == "probe":
            self.probes -= 1
        if conn.kind:
            left = self.peers.get(conn.peer, 1) - 1
            if left:
                self.peers[conn.peer] = left
            else:
                self.peers.pop(conn.peer, None)
        conn.kind = None

    def refuse(self, transport: asyncio.Transport, peer: str) -> None:
        if self.peers.get(peer, 0) >= self.per_peer:
            self.refusals(
                f"refused new connections from {peer}: it has {self.per_peer} open to {self.name}, "
                "the limit per address (router.max_connections_per_peer)"
            )
            transport.write(
                error_reply(
                    429,
                    "Too Many Requests",
                    f"{peer} has {self.per_peer} open "
                    f"connections to {self.name}, the limit per address "
                    "(router.max_connections_per_peer); close some or try again shortly",
                )
            )
        else:
            self.refusals(
                f"refused new connections: {self.open} are open to {self.name}, the limit (router.max_connections)"
            )
            transport.write(self.busy_response)
        transport.close()


def request_path(head: bytes) -> tuple[str, str]:
    """The method and path (without its query) of a request head's first line."""
    parts = head.split(b"\r\n", 1)[0].split(b"\n", 1)[0].split()
    if len(parts) < 2:
        return "", ""
    return parts[0].decode("latin-1"), parts[1].decode("latin-1").split("?", 1)[0]


class GuardedConnection(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, counted by the guard, closed when its first
    request's headers are late (a client that connects and sends nothing, or trickles). A probe
    (admitted beyond the cap) gets aiohttp's protocol only once its headers name a probe path."""

    def __init__(self, guard: ConnectionGuard, make_protocol: Callable[[], RequestHandler]) -> None:
        self.guard = guard
        self.make_protocol = make_protocol
        self.inner: RequestHandler | None = None
        self.transport: asyncio.Transport | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.retire: asyncio.TimerHandle | None = None
        self.kind: str | None = None  # 'slot' or 'probe' while counted by the guard
        self.peer = ""
        self.tail = b""  # the last bytes read, to find the end of the headers across reads
        self.head = b""  # a probe's request head, until its path is known

    def connection_made(self, base: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, base)  # loop.create_server's: a stream transport
        self.peer = peer_of(transport)
        self.kind = self.guard.admit(self, self.peer)
        if self.kind is None:
            self.guard.refuse(transport, self.peer)
            return
        self.transport = transport
        loop = asyncio.get_running_loop()
        timeout = self.guard.header_timeout_s
        if self.kind == "probe":
            timeout = min(timeout, PROBE_HEADER_TIMEOUT_S)
        self.deadline = loop.call_later(timeout, self.headers_late)
        if self.kind == "slot":
            self.start_inner()
            self.retire = loop.call_later(self.guard.lifetime_s, self.lifetime_over)

    def start_inner(self) -> None:
        assert self.transport is not None  # admitted: connection_made kept it
        self.inner = self.make_protocol()
        self.inner.connection_made(self.transport)

    def headers_late(self) -> None:
        self.deadline = None
        log.debug("closed a connection that sent no request headers within %gs", self.guard.header_timeout_s)
        assert self.transport is not None  # the deadline is set once it is kept
        self.transport.close()

    def lifetime_over(self) -> None:
        """A kept-alive connection's renewals end: closed now if idle, else after its request."""
        self.retire = None
        assert self.inner is not None  # a slot: its protocol started with it
        if self.idle():
            self.inner.force_close()
        else:
            self.inner.close()

    def idle(self) -> bool:
        """Kept alive after a request and waiting for the next one (aiohttp's own idle test)."""
        waiter = getattr(self.inner, "_waiter", None)
        return (
            self.kind == "slot"
            and self.deadline is None
            and waiter is not None
            and not waiter.done()
            and not getattr(self.inner, "_messages", True)
        )

    def data_received(self, data: bytes) -> None:
        if self.kind is None:
            return
        if self.deadline is not None:
            seen = self.tail + data
            if b"\r\n\r\n" in seen or b"\n\n" in seen:
                self.deadline.cancel()
                self.deadline = None
            self.tail = seen[-3:]
        if self.inner is None:
            self.probe_data(data)
        else:
            self.inner.data_received(data)

    def probe_data(self, data: bytes) -> None:
        """A probe's bytes are kept until its headers are in: a probe path is served (one request,
        then closed); anything else is answered as the full listener it reached."""
        self.head += data
        if self.deadline is not None and len(self.head) < MAX_PROBE_HEAD:
            return
        method, path = request_path(self.head)
        assert self.transport is not None  # admitted as a probe: connection_made kept it
        if self.deadline is not None or method not in ("GET", "HEAD") or path not in self.guard.probe_paths:
            self.transport.write(self.guard.busy_response)
            self.transport.close()
            return
        self.start_inner()
        assert self.inner is not None  # start_inner made it
        self.inner.data_received(self.head)
        self.inner.close()  # one request, then the probe slot is free again

    def eof_received(self) -> bool | None:
        if not self.inner:
            return None
        inner: asyncio.Protocol = self.inner  # its answer passed on, whatever aiohttp's says it is
        return inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return  # refused
        self.guard.release(self)
        for timer in (self.deadline, self.retire):
            if timer is not None:
                timer.cancel()
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner:
            self.inner.resume_writing()


STREAMS_BODY = "gpuq_streams_body"  # a handler's mark: it reads its body as it comes (streams_body)


def streams_body(handler: Handler) -> Handler:
    """Marks a route's handler as one that reads its own body as it arrives, in bounded pieces,
    within its own deadline (an upload): body_deadline does not read it whole first."""
    setattr(handler, STREAMS_BODY, True)
    return handler


def late_body(timeout_s: float) -> str:
    """The 408's words for a body that did not arrive within router.body_timeout."""
    return (
        f"request body not received within {timeout_s:g}s of its headers "
        "(router.body_timeout); send it whole, without pauses"
    )


def body_deadline(timeout_s: float, render: Callable[[web.Request, int, str], web.Response]) -> Middleware:
    """A middleware reading each request's whole body within `timeout_s` of its headers (a client
    trickling its body would hold its connection for ever): late, the client gets 408 and the
    connection is closed at once, without aiohttp's lingering read of the rest. Handlers then read
    the body from aiohttp's cache; one marked by `streams_body` reads its own, as it comes."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists and not getattr(request.match_info.handler, STREAMS_BODY, False):
            try:
                async with asyncio.timeout(timeout_s):
                    await request.read()
            except TimeoutError:
                log.debug("cut %s %s: its body did not arrive within %gs", request.method, request.path, timeout_s)
                resp = render(request, 408, late_body(timeout_s))
                resp.force_close()
                await resp.prepare(request)
                await resp.write_eof()
                request.protocol.force_close()
                return resp
        return await handler(request)

    return middleware
