"""gpuq.toml read and checked whole: parse_config (a parsed file's tables into Settings),
load_config (a file, and $GPUQ_TOKEN), find_config (which file)."""

from __future__ import annotations

import os
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .checks import (
    BYTE_LIMITS,
    DURATION_FLOORS,
    MAX_PROMPT_BYTES,
    bounded_duration,
    byte_limit,
    check_database,
    check_hosts,
    check_listen,
    check_table,
    check_token,
    check_url,
    typed,
)
from .keys import KEYS, ROUTER_KEYS
from .retention import retention_settings
from .settings import DEFAULT_LISTEN, IDENTITIES, LEGACY_ADMIN, USER_ROLES, NodeConfig, Settings, UserConfig
from .tables import (
    alert_settings,
    backup_settings,
    front_settings,
    parse_node,
    parse_users,
    storage_settings,
    unload_policy,
)

# [router]'s durations and their Settings fields, checked in the order DURATION_FLOORS lists them
# (keys._r gives every [router] key its field: a duration's is its name and "_s").
DURATION_KEYS: dict[str, str] = {
    k.name: k.attr or f"{k.name}_s"
    for k in sorted(
        (k for k in KEYS if k.section == "router" and k.duration), key=lambda k: list(DURATION_FLOORS).index(k.name)
    )
}

# gpuq.toml's top-level tables: any other key is a mistake.
TABLES = ("router", "node", "front", "retention", "backup", "storage", "user")


def parse_config(data: dict[str, Any], base_dir: Path, secrets: bool = True) -> Settings:
    """A parsed gpuq.toml as Settings: [router]'s keys a concern at a time, the tables beside it,
    then the users and the nodes. The first mistake found is the one raised. Without `secrets`,
    no [[user]]'s token_env is read (tables.py _parse_user): a client's read."""
    check_tables(data)
    router = check_table(data.get("router", {}), "router", "[router]", ROUTER_KEYS)
    values = router_addresses(router, base_dir)
    values.update(router_durations(router))
    values.update(router_sizes(router))
    values.update(router_connections(router))
    values.update(router_doors(router, values.get("listen", DEFAULT_LISTEN)))
    policy = unload_policy(router, "router")
    if policy is not None:
        values["unload"] = policy
    values.update(alert_settings(router))
    values.update(front_settings(data.get("front", {})))
    values.update(retention_settings(data.get("retention", {}), values["database"], base_dir))
    values.update(backup_settings(data.get("backup", {}), base_dir, values["database"]))
    values.update(storage_settings(data.get("storage", {})))
    values.update(router_switches(router, ("keep_awake",)))
    values.update(router_identity(router, base_dir))
    values.update(router_switches(router, ("fair_share", "interactive_preempts", "private")))
    values["users"] = parse_users(data, values, secrets)
    values.update(router_template(router))
    values["nodes"] = parse_nodes(data)
    return Settings(**values)


def check_tables(data: dict[str, Any]) -> None:
    """The file holds gpuq's tables and nothing else."""
    unknown = sorted(set(data) - set(TABLES))
    if unknown:
        raise ConfigError(
            f"unknown key '{unknown[0]}' (expected [router], [front], [retention], [backup], [storage], [[node]] and [[user]] tables)"
        )


def router_addresses(router: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Where the router listens, the URL it is reached at (by default its listen address) and
    its database (by default gpuq.db beside the file)."""
    values: dict[str, Any] = {}
    if "listen" in router:
        values["listen"] = check_listen(router["listen"], "router.listen")
    listen = values.get("listen", DEFAULT_LISTEN)
    values["public_url"] = check_url(router.get("public_url", f"http://{listen}"), "router.public_url")
    database = typed(router, "database", str, "router")
    values["database"] = check_database(database or "gpuq.db", base_dir, "router.database")
    return values


def router_durations(router: dict[str, Any]) -> dict[str, Any]:
    """[router]'s durations, each held to its floor (DURATION_FLOORS)."""
    return {
        attr: bounded_duration(router[key], f"router.{key}", key)
        for key, attr in DURATION_KEYS.items()
        if key in router
    }


def router_sizes(router: dict[str, Any]) -> dict[str, Any]:
    """The bytes the router takes: a prompt, the database, a node's output and reply."""
    values: dict[str, Any] = {}
    limit = typed(router, "max_prompt_bytes", int, "router")
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"router.max_prompt_bytes: must be at least 1, got {limit}")
        if limit > MAX_PROMPT_BYTES:
            raise ConfigError(f"router.max_prompt_bytes: must be at most {MAX_PROMPT_BYTES} (64 MiB), got {limit}")
        values["max_prompt_bytes"] = limit
    cap = typed(router, "max_database_bytes", int, "router")
    if cap is not None:
        if cap < 65536:
            raise ConfigError(f"router.max_database_bytes: must be at least 65536, got {cap}")
        values["max_database_bytes"] = cap
    for key in BYTE_LIMITS:
        if (limit := byte_limit(router, key, "router")) is not None:
            values[key] = limit
    return values


def router_connections(router: dict[str, Any]) -> dict[str, Any]:
    """How many connections the router holds open, in all and per peer."""
    values: dict[str, Any] = {}
    connections = typed(router, "max_connections", int, "router")
    if connections is not None:
        if not 8 <= connections <= 1_000_000:
            raise ConfigError(f"router.max_connections: must be from 8 to 1000000, got {connections}")
        values["max_connections"] = connections
    per_peer = typed(router, "max_connections_per_peer", int, "router")
    if per_peer is not None:
        if not 1 <= per_peer <= 1_000_000:
            raise ConfigError(f"router.max_connections_per_peer: must be from 1 to 1000000, got {per_peer}")
        values["max_connections_per_peer"] = per_peer
    return values


def router_doors(router: dict[str, Any], listen: str) -> dict[str, Any]:
    """Who gets in and by which door: the token, the front door's own address (never the
    router's `listen`), and the Host names the router answers to."""
    values: dict[str, Any] = {}
    token = typed(router, "token", str, "router")
    if token is not None:
        values["token"] = check_token(token, "router.token")
    if "ollama_listen" in router:
        values["ollama_listen"] = check_listen(router["ollama_listen"], "router.ollama_listen")
        if values["ollama_listen"] == listen:
            raise ConfigError(
                f"router.ollama_listen: {listen} is router.listen already; give the front door "
                'a port of its own (Ollama clients use 11434, e.g. "127.0.0.1:11435" beside it)'
            )
    if "allowed_hosts" in router:
        values["allowed_hosts"] = check_hosts(router["allowed_hosts"], "router.allowed_hosts")
    return values


def router_switches(router: dict[str, Any], keys: tuple[str, ...]) -> dict[str, bool]:
    """[router]'s on/off keys among `keys`, each a Settings field of its own name, as set."""
    values: dict[str, bool] = {}
    for key in keys:
        value = typed(router, key, bool, "router")
        if value is not None:
            values[key] = value
    return values


def router_identity(router: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """How a caller is known (a token or its tailnet login), tailscaled's socket, and the role
    of a caller known by no [[user]]."""
    values: dict[str, Any] = {}
    identity = router.get("identity")
    if identity is not None:
        if identity not in IDENTITIES:
            raise ConfigError(f"router.identity: expected 'token' or 'tailscale', got {identity!r}")
        values["identity"] = identity
    socket_path = typed(router, "tailscale_socket", str, "router")
    if socket_path is not None:
        if not socket_path.strip():
            raise ConfigError("router.tailscale_socket: expected the path of tailscaled's socket, got ''")
        values["tailscale_socket"] = base_dir / socket_path
    default_role = router.get("default_role")
    if default_role is not None:
        if default_role not in USER_ROLES:
            raise ConfigError(f"router.default_role: expected 'admin' or 'member', got {default_role!r}")
        values["default_role"] = default_role
    return values


def router_template(router: dict[str, Any]) -> dict[str, str]:
    """The critique prompt's template, which must place the document under critique."""
    template = typed(router, "critique_template", str, "router")
    if template is None:
        return {}
    if "{subject}" not in template:
        raise ConfigError("router.critique_template: must contain '{subject}'")
    return {"critique_template": template}


def parse_nodes(data: dict[str, Any]) -> tuple[NodeConfig, ...]:
    """The [[node]] tables by rank: names and ranks each used once."""
    nodes_raw = data.get("node", [])
    if not isinstance(nodes_raw, list):
        raise ConfigError("node: expected [[node]] tables")
    nodes = [parse_node(t, i) for i, t in enumerate(nodes_raw, start=1)]
    seen_names: dict[str, int] = {}
    seen_ranks: dict[int, str] = {}
    for n in nodes:
        if n.name in seen_names:
            raise ConfigError(f"node '{n.name}'.name: duplicate node name")
        if n.rank in seen_ranks:
            raise ConfigError(f"node '{n.name}'.rank: rank {n.rank} is already used by node '{seen_ranks[n.rank]}'")
        seen_names[n.name] = 1
        seen_ranks[n.rank] = n.name
    return tuple(sorted(nodes, key=lambda n: n.rank))


def load_config(path: Path, env_token: bool = True, secrets: bool = True) -> Settings:
    """Read and check `path`; with env_token, $GPUQ_TOKEN is the token when the file sets none.
    Without `secrets` the users' token_env variables are named, not read: what every command but
    `gpuq serve` and `gpuq service install` reads (a user's shell holds their own token only)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    settings = replace(parse_config(data, path.resolve().parent, secrets), source=path.resolve())
    if not settings.nodes:
        raise ConfigError(f"{path}: node: at least one [[node]] is required")
    if env_token and settings.token is None and "GPUQ_TOKEN" in os.environ:
        # Set but empty is refused, not ignored: a router meant to be locked would run open.
        token = check_token(os.environ["GPUQ_TOKEN"], "$GPUQ_TOKEN")
        if settings.user_by_token(token) is None:
            if settings.user(LEGACY_ADMIN) is not None:
                raise ConfigError(
                    f"$GPUQ_TOKEN: stands for the user '{LEGACY_ADMIN}', and a [[user]] has that "
                    "name with another token"
                )
            return replace(
                settings, token=token, users=(UserConfig(name=LEGACY_ADMIN, token=token, role="admin"), *settings.users)
            )
        return replace(settings, token=token)
    return settings


def find_config(explicit: str | None) -> Path | None:
    """--config, then $GPUQ_CONFIG, then ./gpuq.toml (None when there is none)."""
    if explicit:
        return Path(explicit)
    if os.environ.get("GPUQ_CONFIG"):
        return Path(os.environ["GPUQ_CONFIG"])
    local = Path("gpuq.toml")
    return local if local.exists() else None
