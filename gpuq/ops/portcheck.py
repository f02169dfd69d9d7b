"""Is the router's port free? `make run` asks before it installs anything (`python3 -m
gpuq.ops.portcheck [--listen host:port]`, the standard library only), so a taken port is said in a
second, not after minutes of installing; the router's own start says the same (gpuq/ops/daemon.py).
Exit 2 and one line when the port is taken; 0 otherwise, also when the address cannot be known
here (a config it cannot read: `gpuq serve` then says what is wrong)."""

from __future__ import annotations

import errno
import socket
import sys

TAKEN = 2
FREE_PORT_TRIES = 50  # how far above a taken port the advice looks for a free one


def bind_error(host: str, port: int) -> OSError | None:
    """Bind `host:port` as the router binds it (every address the host resolves to, SO_REUSEADDR),
    and let go at once: the error, or None when it is free."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        return exc
    opened: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            opened.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(1)
    except OSError as exc:
        return exc
    finally:
        for sock in opened:
            sock.close()
    return None


def port_is_free(host: str, port: int) -> bool:
    return bind_error(host, port) is None


def next_free_port(host: str, port: int) -> int | None:
    """The first free port above `port` (within FREE_PORT_TRIES), or None."""
    return next((p for p in range(port + 1, min(port + FREE_PORT_TRIES, 65536)) if port_is_free(host, p)), None)


def split_listen(listen: str) -> tuple[str, int]:
    host, port = listen.rsplit(":", 1)
    return host.strip("[]"), int(port)


def router_listen(listen: str | None) -> str | None:
    """What `gpuq serve` will bind: --listen, else the config's (gpuq.toml or $GPUQ_CONFIG), else
    the default; None when the config cannot be read here."""
    try:
        from ..config import DEFAULT_LISTEN, check_listen, find_config, load_config

        if listen:
            return check_listen(listen, "--listen")
        path = find_config(None)
        # Its address only: no one's token is needed to know it (token_env named, not read).
        return load_config(path, env_token=False, secrets=False).listen if path is not None else DEFAULT_LISTEN
    except Exception:  # (a broken config, an old Python): the router's start says what is wrong
        return None


def taken_message(listen: str, exc: OSError) -> str:
    host, port = split_listen(listen)
    free = next_free_port(host, port)
    why = (exc.strerror or str(exc)).lower()
    return (
        f"gpuq: cannot listen on {listen}: {why}: another program has port {port}, perhaps another gpuq "
        f"router (open http://{listen}/ to see). To listen on another port, run `make run PORT={free or 'PORT'}`."
    )


def main(argv: list[str]) -> int:
    listen = router_listen(argv[1] if len(argv) > 1 and argv[0] == "--listen" else None)
    if listen is None:
        return 0
    host, port = split_listen(listen)
    exc = bind_error(host, port)
    if exc is None or exc.errno != errno.EADDRINUSE:
        return 0  # free, or another trouble the router's start words itself
    print(taken_message(listen, exc), file=sys.stderr)
    return TAKEN


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
