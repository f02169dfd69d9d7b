"""The router's listening sockets and what keeps its connections in check: a cap on open
connections, a deadline for a new connection's first request headers (after that request,
aiohttp's keepalive_timeout closes an idle connection), the open-file limit raised to the hard
limit, and the event loop's accept error logged at most once a minute.

Without these, ~1,000 silent sockets used up a 1024-file limit: /health could no longer be
accepted and asyncio logged its accept error thousands of times a second."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import time
from typing import Callable

from .errors import StartupError

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
        raise StartupError(f"cannot listen on {listen}: {reason(exc)}") from None
    return sockets


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


def connection_cap(wanted: int, file_limit: int) -> int:
    """At most `wanted` connections, and FD_RESERVE below the file limit, so that accepting
    connections does not run out of files."""
    room = max(file_limit - FD_RESERVE, MIN_CONNECTIONS)
    if wanted > room:
        log.warning("at most %d open connections, not %d (router.max_connections): the open-file "
                    "limit is %d", room, wanted, file_limit)
    return min(wanted, room)


class Throttled:
    """Logs a line at most once per `every_s`; the repeats in between are counted, and their count
    is logged when the period ends."""

    def __init__(self, emit: Callable[[str], None], every_s: float = 60.0, clock=time.monotonic):
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

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        if context.get("message") == ACCEPT_ERROR:
            throttled(f"{ACCEPT_ERROR}: {context.get('exception')}")
        else:
            loop.default_exception_handler(context)
    loop.set_exception_handler(handler)


class ConnectionGuard:
    """Counts the open connections: over `max_connections` a new one is answered 503 and closed at
    once; one that has not sent its first request's headers within `header_timeout_s` is closed."""

    def __init__(self, max_connections: int, header_timeout_s: float):
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.open = 0
        self.refusals = Throttled(lambda text: log.warning("%s", text))
        body = json.dumps({"error": {"status": 503, "message": f"the router has {max_connections} open "
                                     "connections, its limit (router.max_connections); try again shortly"}})
        self.busy_response = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                              f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode()

    def protocol_factory(self, make_protocol: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """Wraps aiohttp's protocol factory (the runner's server) for loop.create_server."""
        return lambda: GuardedConnection(self, make_protocol)

    def refuse(self, transport: asyncio.Transport) -> None:
        self.refusals(f"refused new connections: {self.open} are open, the limit (router.max_connections)")
        transport.write(self.busy_response)
        transport.close()


class GuardedConnection(asyncio.Protocol):
    """One connection: aiohttp's protocol inside, counted by the guard, closed when its first
    request's headers are late (a client that connects and sends nothing, or trickles)."""

    def __init__(self, guard: ConnectionGuard, make_protocol: Callable[[], asyncio.Protocol]):
        self.guard = guard
        self.make_protocol = make_protocol
        self.inner: asyncio.Protocol | None = None
        self.transport: asyncio.Transport | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.tail = b""  # the last bytes read, to find the end of the headers across reads

    def connection_made(self, transport) -> None:
        if self.guard.open >= self.guard.max_connections:
            self.guard.refuse(transport)
            return
        self.guard.open += 1
        self.transport = transport
        self.deadline = asyncio.get_running_loop().call_later(self.guard.header_timeout_s, self.headers_late)
        self.inner = self.make_protocol()
        self.inner.connection_made(transport)

    def headers_late(self) -> None:
        self.deadline = None
        log.debug("closed a connection that sent no request headers within %gs", self.guard.header_timeout_s)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.inner is None:
            return
        if self.deadline is not None:
            seen = self.tail + data
            if b"\r\n\r\n" in seen or b"\n\n" in seen:
                self.deadline.cancel()
                self.deadline = None
            self.tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.inner else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.inner is None:
            return
        self.guard.open -= 1
        if self.deadline is not None:
            self.deadline.cancel()
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.inner:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.inner:
            self.inner.resume_writing()
