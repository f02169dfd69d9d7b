"""The checks of gpuq.toml's values: durations, tokens, the database, addresses and URLs, host
names, origins, and a table's shape and its typed keys. Every mistake names the key that is wrong."""

from __future__ import annotations

import ipaddress
import math
import re
from pathlib import Path
from typing import Any, Literal, TypeVar, overload
from urllib.parse import ParseResult, urlparse

from ..errors import ConfigError

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# No model's context holds more than a few MB of text (a million tokens is ~4 MB), and the
# router holds a prompt in memory several times over (the request body, up to twice its size
# with JSON escapes and so its client_max_size, the parsed text, the row, each fan-out copy).
MAX_PROMPT_BYTES = 64 * 1024 * 1024

# A node's bytes the router holds: at least enough for any real reply, at most what one
# machine's router should ever hold for one job or one health answer.
BYTE_LIMITS = {"max_output_bytes": (1024, 1 << 30), "max_reply_bytes": (64 * 1024, 1 << 30)}

MAX_DURATION_S = 366 * 86400.0  # longer is a typo, and overflows SQLite's busy timeout


def parse_duration(value: object, key: str) -> float:
    """'90s', '10m', '1h30m', '250ms' or a number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a duration like '10m' or '30s', got {value!r}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):  # TOML has inf and nan
            raise ConfigError(f"{key}: a duration must be a finite number, got {value!r}")
        if value < 0:
            raise ConfigError(f"{key}: a duration cannot be negative, got {value!r}")
        return _at_most_a_year(float(value), value, key)
    if isinstance(value, str):
        text = value.strip().lower()
        parts = _DURATION.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return _at_most_a_year(sum(float(n) * _UNIT_S[u] for n, u in parts), value, key)
    raise ConfigError(f"{key}: expected a duration like '10m' or '30s', got {value!r}")


def _at_most_a_year(seconds: float, value: object, key: str) -> float:
    if seconds > MAX_DURATION_S:
        raise ConfigError(f"{key}: a duration longer than a year is surely a mistake, got {value!r}")
    return seconds


# Each duration key's smallest sensible value and why: at 0 a guard turns off, every job fails
# at once, or a loop spins. A floor above 0 is where smaller values can only do harm.
DURATION_FLOORS: dict[str, tuple[float, str]] = {
    "stale_after": (0.0, "0 would call every running job stale"),
    "stale_grace": (0.0, "0 would call every job stale while it closes"),
    "max_runtime": (0.0, "0 would fail every job at once"),
    "job_timeout": (0.0, "0 would fail every job at once; leave it out for no limit"),
    "stall_timeout": (0.0, "0 would turn stall detection off"),
    "load_timeout": (0.0, "0 would fail every job before its model loads"),
    "unload_timeout": (0.0, "0 would flag a node whenever its model takes a moment to leave VRAM"),
    "connect_timeout": (0.0, "0 would wait for an unreachable node forever"),
    # Checks faster than ten a second spin the router's CPU and flood Ollama, for no quicker
    # detection that matters (a job runs for seconds to hours).
    "health_interval": (0.1, "checking more than ten times a second only burns CPU"),
    # SQLite counts whole milliseconds: less is 0, which fails every write that meets a lock.
    "busy_timeout": (0.001, "SQLite would give up on the first lock"),
    "submit_timeout": (0.05, "a submit needs a moment for its commit"),
    "header_timeout": (0.0, "0 would close every new connection before its request"),
    "keepalive_timeout": (0.0, "0 would close every connection after its first request"),
    "body_timeout": (0.0, "0 would refuse every request with a body"),
    "keepalive_lifetime": (0.0, "0 would close every connection after its first request"),
    "shutdown_grace": (0.0, "leave it out for the default; 0 fails every running job at a SIGTERM"),
    # Renewed every third of it: shorter, any pause of the router (a slow disk, a busy CPU) loses its nodes.
    "lease": (1.0, "a router would lose its nodes at any pause"),
}


def bounded_duration(value: object, key: str, name: str) -> float:
    """parse_duration, then refuse 0 or what is under the key's floor (`name` is its bare key)."""
    seconds = parse_duration(value, key)
    floor, why = DURATION_FLOORS[name]
    if floor == 0.0 and seconds == 0.0:
        raise ConfigError(f"{key}: must be more than 0 ({why}), got {value!r}")
    if seconds < floor:
        raise ConfigError(f"{key}: must be at least {floor * 1000:g}ms ({why}), got {value!r}")
    return seconds


def check_token(value: str, key: str) -> str:
    """A bearer token every client can send exactly: a browser sends only ASCII headers, and the
    router strips the Bearer value, so padding or an empty token could never match."""
    if not value.strip():
        raise ConfigError(f"{key}: must not be empty (leave it out for no token)")
    if value != value.strip():
        raise ConfigError(f"{key}: remove the spaces or newlines around the token; no client sends them")
    if not all(" " <= c <= "~" for c in value):
        raise ConfigError(
            f"{key}: use printable ASCII only (no client can send other characters in "
            "a header); e.g. the output of `openssl rand -hex 32`"
        )
    return value


def safe_dsn(dsn: str) -> str:
    """The DSN without its password, for errors and logs."""
    return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", dsn)


def check_database(value: str, base_dir: Path, where: str) -> Path | str:
    """A SQLite file (relative to the config's folder), or a PostgreSQL DSN (`postgresql://...`:
    several routers share its queue), checked by libpq's own parser; its password never shown."""
    if not value.startswith(("postgresql:", "postgres:")):
        return (base_dir / value).resolve()
    from psycopg.conninfo import conninfo_to_dict

    if not value.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            f"{where}: a PostgreSQL database is named by a URI, postgresql://user@host/dbname; got {safe_dsn(value)!r}"
        )
    try:
        conninfo_to_dict(value)
    except Exception as exc:  # psycopg.ProgrammingError: libpq's own words
        raise ConfigError(
            f"{where}: not a PostgreSQL URI libpq accepts ({str(exc).strip()}): {safe_dsn(value)!r}"
        ) from None
    return value


def check_listen(value: object, key: str) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(f"{key}: expected 'host:port', got {value!r}")
    host, port = value.rsplit(":", 1)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: expected 'host:port' with a port from 1 to 65535, got {value!r}")
    return value


def _http_url(value: object, key: str) -> tuple[str, ParseResult]:
    """Any http(s) URL gpuq can send to: a host, a valid port, no spaces or control characters.
    The URL as given, and its parts."""
    parsed = urlparse(value) if isinstance(value, str) else None
    if not isinstance(value, str) or not parsed or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {value!r}")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(f"{key}: a URL must not contain spaces or control characters, got {value!r}")
    try:
        _ = parsed.port  # urllib checks the port only when it is read
    except ValueError:
        raise ConfigError(f"{key}: the URL's port is not a number from 0 to 65535: {value!r}") from None
    return value, parsed


def check_url(value: object, key: str) -> str:
    """An http(s) base URL that gpuq appends its own paths to. A path prefix is kept (an Ollama
    or router behind a reverse proxy); what cannot survive that appending is refused."""
    url, parsed = _http_url(value, key)
    if "?" in url or "#" in url:
        raise ConfigError(
            f"{key}: a URL with a query ('?') or fragment ('#') cannot take gpuq's paths "
            f"after it; give only scheme, host, port and an optional path, got {value!r}"
        )
    if parsed.username is not None or parsed.password is not None:
        # The URL is stored in the database and shown on the page, in errors and preview links.
        raise ConfigError(
            f"{key}: a user or password in the URL would be shown on the page and in "
            f"errors; remove the '...@' part, got {value!r}"
        )
    return url.rstrip("/")


_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")


def normal_host(name: str) -> str | None:
    """A host name or IP address, as compared with the Host header: lower case, IPv6 without
    brackets, no final dot. None when it is neither (a port, a URL, a wildcard...)."""
    name = name.lower().removesuffix(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
        if ":" not in name:
            return None
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    if len(name) <= 253 and all(_LABEL.fullmatch(label) for label in name.split(".")):
        return name
    return None


def check_hosts(value: object, key: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(f'{key}: expected a list of host names like ["mybox.tailnet.ts.net"], got {value!r}')
    return tuple(_check_host(entry, f"{key}[{i}]") for i, entry in enumerate(value, start=1))


def _check_host(entry: object, key: str) -> str:
    if not isinstance(entry, str):
        raise ConfigError(f"{key}: expected a host name (a string), got {entry!r}")
    if "/" in entry:
        raise ConfigError(f"{key}: write the host name alone, not a URL, got {entry!r}")
    if "*" in entry:
        raise ConfigError(f"{key}: wildcards are not supported, list each host name, got {entry!r}")
    name = normal_host(entry)
    if name is None:
        host, _, port = entry.rpartition(":")
        if port.isdigit() and normal_host(host):
            raise ConfigError(f"{key}: leave the port out (any port is accepted), got {entry!r}")
        raise ConfigError(f"{key}: expected a host name or IP address, got {entry!r}")
    return name


# Schemes gin-contrib/cors accepts in a configured origin without a '*' (cors.go Validate, with
# Ollama's AllowBrowserExtensions: DefaultSchemas + ExtensionSchemas).
ORIGIN_SCHEMES = (
    "http://",
    "https://",
    "chrome-extension://",
    "safari-extension://",
    "moz-extension://",
    "ms-browser-extension://",
)


def check_origin(entry: object, key: str) -> str:
    """One origin a browser page may call the front door from, as OLLAMA_ORIGINS takes it: exact
    ('https://chat.example.com'), '*' (every origin) or one '*' wildcard ('https://*.example.com',
    'chrome-extension://*'). Compared as gin-contrib/cors does, in lower case."""
    if not isinstance(entry, str):
        raise ConfigError(f"{key}: expected an origin (a string), got {entry!r}")
    origin = entry.strip().lower()
    if origin.count("*") > 1:  # gin-contrib/cors panics: "only one * is allowed"
        raise ConfigError(f"{key}: only one '*' is allowed, got {entry!r}")
    if "*" not in origin and not origin.startswith(ORIGIN_SCHEMES):
        raise ConfigError(
            f"{key}: expected an origin like 'https://chat.example.com' (scheme and host, or a '*' "
            f"wildcard), got {entry!r}"
        )
    scheme, sep, rest = origin.partition("://")
    if sep and "/" in rest:
        raise ConfigError(f"{key}: write the origin alone (scheme://host[:port]), without a path, got {entry!r}")
    return origin


def check_alert_url(value: str, key: str) -> str:
    """The exact URL alerts are POSTed to: unlike a base URL, a query (a webhook's own token) is
    fine, and it is kept as written (a receiver may care about a final '/')."""
    _http_url(value, key)
    return value


def check_table(table: object, where: str, kind: str, known: frozenset[str]) -> dict[str, Any]:
    """A table of gpuq.toml, checked for its shape and its keys: `kind` as it is written ("[front]",
    "[[node]]"), `known` its keys; a misspelt key is named with the ones there are."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a {kind} table")
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})")
    return table


def byte_limit(table: dict[str, Any], key: str, where: str) -> int | None:
    """max_output_bytes or max_reply_bytes, held to BYTE_LIMITS; None when the table leaves it out."""
    value = typed(table, key, int, where)
    if value is not None:
        low, high = BYTE_LIMITS[key]
        if not low <= value <= high:
            raise ConfigError(f"{where}.{key}: must be from {low} to {high} (1 GiB), got {value}")
    return value


T = TypeVar("T")
N = TypeVar("N", bound=float)


@overload
def typed(table: dict[str, Any], key: str, kind: type[T], where: str, required: Literal[True]) -> T: ...


@overload
def typed(
    table: dict[str, Any], key: str, kind: type[T] | tuple[type[T], ...], where: str, required: bool = False
) -> T | None: ...


def typed(
    table: dict[str, Any], key: str, kind: type[Any] | tuple[type[Any], ...], where: str, required: bool = False
) -> Any:
    """table[key] when it is of `kind` (a bool is no int), None when absent and not required."""
    if key not in table:
        if required:
            raise ConfigError(f"{where}: missing required key '{key}'")
        return None
    value = table[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}.{key}: expected {names}, got {value!r}")
    return value


def within(
    table: dict[str, Any], key: str, kind: type[N] | tuple[type[N], ...], where: str, low: float, high: float
) -> N | None:
    """table[key] (as `typed` reads it) when it lies from `low` to `high`; None when absent."""
    value = typed(table, key, kind, where)
    if value is not None and not low <= value <= high:
        raise ConfigError(f"{where}.{key}: must be from {low} to {high}, got {value}")
    return value
