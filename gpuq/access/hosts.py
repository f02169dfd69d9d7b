"""The host names both doors answer to: a request addressed to another name may come from a web
page whose domain was rebound to this machine (DNS rebinding), and is refused (Ollama's rule)."""

from __future__ import annotations

import ipaddress
import json
import logging
import shutil
import socket
import subprocess
from functools import lru_cache
from urllib.parse import urlparse

from aiohttp import web

from ..config import Settings, normal_host
from ..errors import MisdirectedRequest

log = logging.getLogger("gpuq")

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})  # listen addresses, never a name a client uses
# Ollama's allowed host names beside its own hostname (server/routes.go allowedHost): names
# under these never come from public DNS, so a web page cannot rebind one to this machine.
LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
# Go's netip.Addr.IsPrivate (RFC 1918 and RFC 4193), which Ollama's allowedHostsMiddleware takes.
PRIVATE_NETWORKS = tuple(ipaddress.ip_network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"))
TAILSCALE_TIMEOUT_S = 5.0


def router_hosts(settings: Settings) -> frozenset[str]:
    """The host names this router answers to: loopback, its listen address unless that is a
    wildcard, public_url's host, and router.allowed_hosts."""
    listen = normal_host(settings.host)
    public = normal_host(urlparse(settings.public_url).hostname or "")
    names = {*LOOPBACK_HOSTS, *settings.allowed_hosts, public, None if listen in WILDCARD_HOSTS else listen}
    if settings.ollama_listen:  # the front door's own address (gpuq/front/listener.py)
        front = normal_host(settings.ollama_listen.rsplit(":", 1)[0].strip("[]"))
        names.add(None if front in WILDCARD_HOSTS else front)
    return frozenset(n for n in names if n is not None)


def tailnet_names(command: str = "tailscale") -> set[str]:
    """This machine's names on its tailnet, when Tailscale runs here: its MagicDNS name, full and
    short (the search domain makes 'box' reach box.tailnet.ts.net), and its tailnet addresses.
    None without Tailscale, or when it does not answer."""
    path = shutil.which(command)
    if path is None:
        return set()
    try:
        done = subprocess.run(
            [path, "status", "--json", "--peers=false"], capture_output=True, text=True, timeout=TAILSCALE_TIMEOUT_S
        )
        me = json.loads(done.stdout).get("Self") or {}
    except (OSError, subprocess.TimeoutExpired, ValueError, AttributeError) as exc:
        log.info("tailscale status: no tailnet names for the host check (%s)", exc)
        return set()
    names = {str(ip) for ip in me.get("TailscaleIPs") or []}
    dns = str(me.get("DNSName") or "").rstrip(".")
    if dns:
        names |= {dns, dns.split(".", 1)[0]}
    return {n for n in map(normal_host, names) if n is not None}


@lru_cache(maxsize=1)  # both listeners ask; the machine's names are read once, at start
def machine_names() -> frozenset[str]:
    """This machine's own names: its hostname (Ollama's os.Hostname() in allowedHost) and its
    tailnet names."""
    return frozenset(n for n in {normal_host(socket.gethostname()), *tailnet_names()} if n is not None)


def _unmapped(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    return ip.ipv4_mapped or ip if ip.version == 6 else ip


def local_address(name: str, request: web.Request) -> bool:
    """An IP literal Ollama answers to (server/routes.go allowedHostsMiddleware): loopback,
    private, unspecified, or this machine's own (isLocalIP; here: the address the request came
    in on, which is how a Tailscale or public address of this machine reaches it). An address
    cannot be rebound: only a domain name can."""
    ip = _unmapped(name)
    if ip is None:
        return False
    if ip.is_loopback or ip.is_unspecified or any(ip in net for net in PRIVATE_NETWORKS):
        return True
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return bool(sockname) and isinstance(sockname, tuple) and _unmapped(str(sockname[0])) == ip


def host_allowed(name: str | None, allowed: frozenset[str], request: web.Request) -> bool:
    """Ollama's rule (server/routes.go allowedHost and allowedHostsMiddleware) and the router's
    own names: localhost and names under .localhost, .local and .internal (host.docker.internal
    for a client in Docker), this machine's hostname and tailnet names, IP literals of this
    machine or a private network, and served_hosts (public_url's host, router.allowed_hosts)."""
    if name is None:
        return False
    return name in allowed or name.endswith(LOCAL_SUFFIXES) or local_address(name, request)


def served_hosts(settings: Settings) -> frozenset[str]:
    """The names both listeners answer to by name: router_hosts and this machine's own names."""
    return router_hosts(settings) | machine_names()


@lru_cache(maxsize=64)  # a client sends the same Host header every time: parse it once
def host_in(header: str) -> str | None:
    """The host name in a Host header ('name', 'name:port', '[v6]:port'), port left out."""
    name, colon, port = header.rpartition(":")
    if not colon or header.endswith("]"):
        name, port = header, ""
    if port and not port.isdigit():
        return None
    return normal_host(name)


def front_on_loopback(settings: Settings) -> bool:
    """Does the front door listen on a loopback address (127.0.0.1, ::1, localhost)?"""
    if not settings.ollama_listen:
        return True
    host = normal_host(settings.ollama_listen.rsplit(":", 1)[0].strip("[]"))
    if host == "localhost":
        return True
    ip = _unmapped(host or "")
    return ip is not None and ip.is_loopback


def token_guards(settings: Settings) -> bool:
    """Must every call bring a token (router.token or [[user]] tokens, identity "token")? A page
    rebound to this machine cannot read one, so it can drive nothing. (With identity "tailscale"
    a tailnet member's browser is that member without a token: the names are still checked.)"""
    return settings.identity == "token" and (settings.token is not None or bool(settings.users))


def front_checks_host(settings: Settings) -> bool:
    """The front door's host check: always on loopback, as Ollama (routes.go
    allowedHostsMiddleware checks Host only when bound to loopback); elsewhere only where no
    token guards the door, for a DNS-rebinding page could drive the queue there. A door on the
    LAN with a token answers to any name, as Ollama does (a docker-compose service name, a
    LAN DNS name)."""
    return front_on_loopback(settings) or not token_guards(settings)


def check_host(request: web.Request, allowed: frozenset[str], front: bool = False) -> None:
    """A page on a name the router does not know may be a DNS rebinding attack: its domain
    now resolves to this router, so the browser treats the router as the page's own site.
    `front`: the front door's words (the rule that applies there: front_checks_host)."""
    given = request.headers.getall("Host", [])
    if len(given) != 1 or not given[0].strip():
        raise MisdirectedRequest(
            "refused: the request has no single Host header; this router answers "
            "only to its own host names (add more in router.allowed_hosts)"
        )
    name = host_in(given[0])
    if not host_allowed(name, allowed, request):
        raise MisdirectedRequest(
            f"refused: host '{name or given[0][:100]}' is not one of this router's names "
            "(a web page under another name may be a DNS rebinding attack); "
            "if it is really this router's name, add it to router.allowed_hosts in gpuq.toml"
            + (
                " (the front door checks names where it listens on loopback or where no token "
                "guards it; with router.token or [[user]] tokens on a non-loopback address it "
                "answers to any name, as Ollama does)"
                if front
                else ""
            )
        )
