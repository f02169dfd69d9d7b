"""Who is calling, on a tailnet (`[router] identity = "tailscale"`): no token, the local tailscaled
names the user who owns the connection's peer address. Or, behind `tailscale serve` on loopback,
the `Tailscale-User-Login` header serve sets (and only there).

tailscaled's LocalAPI, as its own client asks it (tailscale/tailscale client/local/local.go
Client.WhoIs): `GET /localapi/v0/whois?addr=IP:PORT` over its Unix socket, Host header
"local-tailscaled.sock" (client/tailscale/apitype LocalAPIHost; ipn/localapi/localapi.go
ServeHTTP refuses other hosts, and any Referer or Origin, with 403). The reply
(ipn/localapi/localapi.go serveWhoIsWithBackend) is apitype.WhoIsResponse: {"Node": {..., "Name",
"Tags"}, "UserProfile": {"ID", "LoginName", "DisplayName", "ProfilePicURL"}, "CapMap"}; an address
no node owns is 404 "no match for IP:port". A tagged node has no user: its UserProfile is the
placeholder "tagged-devices" (cmd/pgproxy/pgproxy.go names such a caller by its tags, as here).
Where the socket is absent (macOS's app serves its LocalAPI otherwise), `tailscale whois --json
IP:PORT` (cmd/tailscale/cli/whois.go) prints the same object."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from email.header import decode_header, make_header
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from ..config import Settings, normal_host
from ..errors import Forbidden, Unauthorized

log = logging.getLogger("gpuq")

LOCALAPI_HOST = "local-tailscaled.sock"  # apitype.LocalAPIHost
SERVE_HEADER = "Tailscale-User-Login"  # ipn/ipnlocal/serve.go addTailscaleIdentityHeaders
TAGGED = "tagged-devices"  # a tagged node's UserProfile.LoginName
WHOIS_TIMEOUT_S = 5.0
CACHE_TTL_S = 10.0  # a peer's owner does not change within seconds; connections are reused
CACHE_SIZE = 1024


@dataclass(frozen=True)
class Owner:
    """Who tailscaled says owns a peer address."""

    login: str | None  # None: a tagged node (no user)
    node: str  # the machine's MagicDNS name, as whois shows it
    tags: tuple[str, ...] = ()


class TailscaledUnavailable(Exception):
    """tailscaled did not answer (not running, no permission, a reply not understood)."""


def owner_of(reply: object) -> Owner:
    """An apitype.WhoIsResponse as the router needs it."""
    if not isinstance(reply, dict):
        raise TailscaledUnavailable("whois: the reply is not a JSON object")
    node_v, profile_v = reply.get("Node"), reply.get("UserProfile")
    node: dict[str, Any] = node_v if isinstance(node_v, dict) else {}
    profile: dict[str, Any] = profile_v if isinstance(profile_v, dict) else {}
    tags = tuple(t for t in node.get("Tags") or () if isinstance(t, str))
    name = str(node.get("ComputedName") or node.get("Name") or "?").rstrip(".")
    login = profile.get("LoginName")
    if tags or login == TAGGED:  # tailcfg.Node.IsTagged: any tags
        return Owner(None, name, tags)
    if not isinstance(login, str) or not login:
        raise TailscaledUnavailable("whois: the reply names no UserProfile.LoginName")
    return Owner(login, name)


class Whois:
    """Asks tailscaled who owns a peer address; answers are kept CACHE_TTL_S per address (at most
    CACHE_SIZE addresses, the oldest dropped first). 'Nobody' (404) is kept too: a non-tailnet
    peer retrying must not ask tailscaled each time. Failures to ask are not kept."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.cache: OrderedDict[tuple[str, str], tuple[float, Owner | None]] = OrderedDict()

    async def owner(self, socket: Path, address: str) -> Owner | None:
        # A tailnet address is one node's, whatever the port: a client's new connections ask once.
        # A loopback one is tailscaled's own proxy (serve, userspace networking: its ProxyMapper
        # maps each port to its peer, ipnlocal WhoIs), so there the port tells peers apart.
        host = address.rsplit(":", 1)[0]
        key = (str(socket), address if _loopback(host.strip("[]")) else host)
        now = self.clock()
        hit = self.cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        answer = await self.ask(socket, address)
        self.cache[key] = (now + CACHE_TTL_S, answer)
        self.cache.move_to_end(key)
        while len(self.cache) > CACHE_SIZE:
            self.cache.popitem(last=False)
        return answer

    async def ask(self, socket: Path, address: str) -> Owner | None:
        if socket.exists():
            return await self.ask_socket(socket, address)
        return await self.ask_cli(address, socket)

    async def ask_socket(self, socket: Path, address: str) -> Owner | None:
        url = f"http://{LOCALAPI_HOST}/localapi/v0/whois?addr={quote(address, safe='')}&proto=tcp"
        timeout = aiohttp.ClientTimeout(total=WHOIS_TIMEOUT_S)
        try:
            async with aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(socket)), timeout=timeout
            ) as session:
                async with session.get(url) as resp:
                    text = await resp.text()
                    if resp.status == 404:  # "no match for IP:port": not a tailnet peer
                        return None
                    if resp.status != 200:
                        raise TailscaledUnavailable(
                            f"tailscaled's whois answered {resp.status} {text.strip()[:200]!r} (socket {socket})"
                        )
                    return owner_of(json.loads(text))
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            raise TailscaledUnavailable(
                f"tailscaled's socket {socket} did not answer whois: {exc or type(exc).__name__}"
            ) from None

    async def ask_cli(self, address: str, socket: Path) -> Owner | None:
        path = shutil.which("tailscale")
        if path is None:
            raise TailscaledUnavailable(
                f"no tailscaled socket at {socket} (set router.tailscale_socket) and no `tailscale` command on PATH"
            )
        proc = await asyncio.create_subprocess_exec(
            path,
            "whois",
            "--json",
            "--proto",
            "tcp",
            address,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), WHOIS_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise TailscaledUnavailable(f"`tailscale whois` did not answer within {WHOIS_TIMEOUT_S:g}s") from None
        if proc.returncode != 0:
            why = err.decode(errors="replace").strip()
            if "not found" in why:  # local.ErrPeerNotFound: "peer not found"
                return None
            raise TailscaledUnavailable(f"`tailscale whois` failed: {why[:200] or f'exit {proc.returncode}'}")
        try:
            return owner_of(json.loads(out))
        except ValueError:
            raise TailscaledUnavailable("`tailscale whois --json` printed no JSON") from None


WHOIS = Whois()
_warned: set[str] = set()  # each untrusted source of a serve header is logged once


def _ip(text: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address((text or "").split("%", 1)[0])
    except ValueError:
        return None
    return (ip.ipv4_mapped or ip) if ip.version == 6 else ip


def _loopback(text: str | None) -> bool:
    ip = _ip(text)
    return ip is not None and ip.is_loopback


def listener_host(settings: Settings, port: int) -> str | None:
    """The host the listener a connection came in on is bound to: the front door's or the router's."""
    if settings.ollama_listen:
        host, _, front_port = settings.ollama_listen.rpartition(":")
        if front_port.isdigit() and int(front_port) == port:
            return host.strip("[]")
    return settings.host if settings.port == port else None


def serve_trusted(settings: Settings, request: web.Request) -> bool:
    """`tailscale serve` proxies from loopback to a service bound to loopback, and deletes any
    Tailscale-User-Login the client sent (serve.go addTailscaleIdentityHeaders). Only then is the
    header serve's: from anywhere else, anyone could have written it."""
    if settings.identity != "tailscale" or request.transport is None:
        return False
    sockname = request.transport.get_extra_info("sockname")
    if not (isinstance(sockname, tuple) and len(sockname) >= 2):
        return False
    host = listener_host(settings, int(sockname[1]))
    bound = host is not None and (normal_host(host) == "localhost" or _loopback(host))
    return bound and _loopback(str(sockname[0])) and _loopback(request.remote)


def serve_login(value: str) -> str:
    """The header's login: serve Q-encodes a non-ASCII one (RFC 2047, serve.go encTailscaleHeaderValue)."""
    if "=?" in value:
        try:
            return str(make_header(decode_header(value)))
        except (ValueError, LookupError):
            return value
    return value


def refuse_login(login: str, how: str) -> Forbidden:
    return Forbidden(
        f"{how} says you are '{login}', and this router has no [[user]] named '{login}' "
        f'and no router.default_role: add [[user]] name = "{login}" to gpuq.toml (role = '
        '"member" or "admin"), or set router.default_role, then `gpuq reload`'
    )


async def login_of(settings: Settings, request: web.Request) -> tuple[str, str, str] | None:
    """The tailnet login of a request that brought no token, as (login, via, who said it): serve's
    header (where trusted), else tailscaled's whois of the peer. None when the router does not ask
    the tailnet (identity "token") or the peer is no one on it (the door answers 401). A tagged
    node is refused: Forbidden, naming it (gpuq/access/identity.py maps a login to its user)."""
    header = request.headers.get(SERVE_HEADER)
    if header is not None:
        if serve_trusted(settings, request):
            login = serve_login(header.strip())
            if not login:
                raise Forbidden("tailscale serve sent an empty Tailscale-User-Login")
            return login, "serve", "tailscale serve"
        source = request.remote or "?"
        if source not in _warned and len(_warned) < CACHE_SIZE:
            _warned.add(source)
            log.warning(
                "ignored a Tailscale-User-Login header from %s: it is trusted only from tailscale serve "
                '(a request from loopback to a listener bound to loopback, with identity = "tailscale")',
                source,
            )
    if settings.identity != "tailscale":
        return None
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    if not (isinstance(peer, tuple) and len(peer) >= 2):
        return None
    ip = _ip(str(peer[0]))
    if ip is None:
        return None
    address = f"[{ip}]:{peer[1]}" if ip.version == 6 else f"{ip}:{peer[1]}"
    try:
        owner = await WHOIS.owner(settings.tailscale_socket, address)
    except TailscaledUnavailable as exc:
        log.warning("identity: %s", exc)
        raise Unauthorized(
            f"no token, and tailscaled could not say who is calling ({exc}); send 'Authorization: Bearer <token>'"
        ) from None
    if owner is None:
        return None
    if owner.login is None:
        raise Forbidden(
            f"the tailnet machine '{owner.node}' is a tagged node ({', '.join(owner.tags) or 'tagged'}) "
            "with no user: it is not identified by the tailnet; give it a [[user]] token "
            "('Authorization: Bearer <token>')"
        )
    return owner.login, "tailscale", f"tailscale (machine '{owner.node}')"
