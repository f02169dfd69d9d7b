"""gpuq.toml's tables beside [router]'s own keys: the [[user]] and [[node]] tables, [front], and
[router]'s alert keys, [backup] and [storage], each checked whole."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..params import options_problem, think_problem
from .checks import (
    bounded_duration,
    byte_limit,
    check_alert_url,
    check_origin,
    check_table,
    check_token,
    check_url,
    parse_duration,
    typed,
    within,
)
from .keys import BACKUP_KEYS, FRONT_KEYS, NODE_KEYS, STORAGE_KEYS, USER_KEYS
from .settings import ALERT_FORMATS, LANES, LEGACY_ADMIN, ROLES, UNLOAD_POLICIES, USER_ROLES, NodeConfig, UserConfig

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_FRONT_REQUEST_RANGE = (1 << 20, 1 << 30)  # [front] max_request_bytes: from 1 MiB to 1 GiB


def _parse_user(table: object, index: int, secrets: bool = True) -> UserConfig:
    """A [[user]]: its token written out, or read from the environment variable token_env (so
    gpuq.toml can be shared without secrets); neither: a tailnet user, known by login name.
    Without `secrets` (a client's read: the CLI needs no one else's token) token_env is named,
    not read."""
    where = f"user[{index}]"
    table = check_table(table, where, "[[user]]", USER_KEYS)
    name = typed(table, "name", str, where, required=True)
    # A tailnet login name (alice@example.com, alice@github) is a name too.
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}", name):
        raise ConfigError(f"{where}.name: use letters, digits, '.', '_', '@', '+' or '-', got {name!r}")
    where = f"user '{name}'"
    token = typed(table, "token", str, where)
    env = typed(table, "token_env", str, where)
    if token is not None and env is not None:
        raise ConfigError(f"{where}: give token or token_env, not both")
    if env is not None and not ENV_NAME.fullmatch(env):  # a service's environment file names it too
        raise ConfigError(
            f"{where}.token_env: expected an environment variable's name like GPUQ_ALICE_TOKEN, got {env!r}"
        )
    if token is not None:
        token = check_token(token, f"{where}.token")
    elif env is not None and secrets:
        if env not in os.environ:
            raise ConfigError(f"{where}.token_env: the environment variable ${env} is not set")
        token = check_token(os.environ[env], f"${env} ({where}.token_env)")
    role = table.get("role", "member")
    if role not in USER_ROLES:
        raise ConfigError(f"{where}.role: expected 'admin' or 'member', got {role!r}")
    lanes = typed(table, "lanes", list, where)
    if lanes is not None and (not lanes or any(lane not in LANES for lane in lanes) or len(set(lanes)) != len(lanes)):
        raise ConfigError(f"{where}.lanes: expected a non-empty list of 'interactive' and/or 'batch', got {lanes!r}")
    limits = {}
    for key in ("max_waiting", "max_running"):
        limits[key] = within(table, key, int, where, 1, 1_000_000)
    return UserConfig(
        name=name, token=token, role=role, lanes=tuple(lanes) if lanes else LANES, token_env=env, **limits
    )


def parse_users(data: dict[str, Any], values: dict[str, Any], secrets: bool = True) -> tuple[UserConfig, ...]:
    """[[user]] tables, and the single [router] token as the admin it always was."""
    raw = data.get("user", [])
    if not isinstance(raw, list):
        raise ConfigError("user: expected [[user]] tables")
    users = [_parse_user(t, i, secrets) for i, t in enumerate(raw, start=1)]
    names: set[str] = set()
    tokens: dict[str, str] = {}
    for u in users:
        if u.name in names:
            raise ConfigError(f"user '{u.name}'.name: duplicate user name")
        names.add(u.name)
        if u.token is not None:
            if u.token in tokens:
                raise ConfigError(
                    f"user '{u.name}'.token: the same token as user '{tokens[u.token]}'; each user needs their own"
                )
            tokens[u.token] = u.name
    token = values.get("token")
    if token is not None and token not in tokens:
        if LEGACY_ADMIN in names:
            raise ConfigError(
                f"router.token: stands for the user '{LEGACY_ADMIN}', and a [[user]] has that name "
                "with another token; give that user router.token's value, or remove router.token"
            )
        users.insert(0, UserConfig(name=LEGACY_ADMIN, token=token, role="admin"))
    return tuple(users)


def unload_policy(table: dict[str, Any], where: str) -> str | None:
    policy = table.get("unload")
    if policy is not None and policy not in UNLOAD_POLICIES:
        raise ConfigError(f'{where}.unload: expected "after-each" or "when-idle", got {policy!r}')
    return policy


def parse_node(table: object, index: int) -> NodeConfig:
    where = f"node[{index}]"
    table = check_table(table, where, "[[node]]", NODE_KEYS)
    name = typed(table, "name", str, where, required=True)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise ConfigError(f"{where}.name: use letters, digits, '.', '_' or '-', got {name!r}")
    where = f"node '{name}'"
    roles = typed(table, "roles", list, where, required=True)
    if not roles or any(r not in ROLES for r in roles) or len(set(roles)) != len(roles):
        raise ConfigError(f"{where}.roles: expected a non-empty list of 'task' and/or 'critique', got {roles!r}")
    rank = typed(table, "rank", int, where, required=True)
    if not -(2**63) <= rank < 2**63:  # SQLite's INTEGER
        raise ConfigError(f"{where}.rank: must fit in 64 bits, got {rank}")
    model = typed(table, "model", str, where, required=True)
    if not model.strip():
        raise ConfigError(f"{where}.model: must not be empty")
    runtime = table.get("max_runtime")
    for key, problem in (("think", think_problem), ("options", options_problem)):
        if key in table and (wrong := problem(table[key])):
            raise ConfigError(f"{where}.{key}: {wrong}")
    return NodeConfig(
        name=name,
        url=check_url(typed(table, "url", str, where, required=True), f"{where}.url"),
        rank=rank,
        roles=tuple(roles),
        model=model.strip(),
        max_runtime_s=None if runtime is None else bounded_duration(runtime, f"{where}.max_runtime", "max_runtime"),
        think=table.get("think"),
        options=table.get("options"),
        unload=unload_policy(table, where),
        max_output_bytes=byte_limit(table, "max_output_bytes", where),
    )


def alert_settings(router: dict[str, Any]) -> dict[str, Any]:
    """alert_url, alert_token and alert_format: a token or a format needs somewhere to send."""
    values: dict[str, Any] = {}
    url = typed(router, "alert_url", str, "router")
    if url is not None:
        values["alert_url"] = check_alert_url(url, "router.alert_url")
    token = typed(router, "alert_token", str, "router")
    if token is not None:
        if not token.strip() or any(c in token for c in "\r\n"):  # it goes into a header
            raise ConfigError("router.alert_token: expected a token on one line, got an empty or multi-line string")
        values["alert_token"] = token.strip()
    fmt = typed(router, "alert_format", str, "router")
    if fmt is not None:
        if fmt not in ALERT_FORMATS:
            raise ConfigError(f"router.alert_format: expected 'json' or 'ntfy', got {fmt!r}")
        values["alert_format"] = fmt
    for key in ("alert_token", "alert_format"):
        if key in router and url is None:
            raise ConfigError(f"router.{key}: set router.alert_url too (where alerts are sent)")
    return values


def front_settings(front: object) -> dict[str, Any]:
    """The [front] table: the front door's own request limit and browser origins."""
    front = check_table(front, "front", "[front]", FRONT_KEYS)
    values: dict[str, Any] = {}
    limit = typed(front, "max_request_bytes", int, "front")
    if limit is not None:
        low, high = _FRONT_REQUEST_RANGE
        if not low <= limit <= high:
            raise ConfigError(f"front.max_request_bytes: must be from {low} (1 MiB) to {high} (1 GiB), got {limit}")
        values["front_max_request_bytes"] = limit
    lines = within(front, "max_batch_lines", int, "front", 1, 1_000_000)
    if lines is not None:
        values["front_max_batch_lines"] = lines
    if "origins" in front:
        origins = front["origins"]
        if not isinstance(origins, list):
            raise ConfigError(
                f'front.origins: expected a list of origins like ["https://chat.example.com"], got {origins!r}'
            )
        values["front_origins"] = tuple(check_origin(o, f"front.origins[{i}]") for i, o in enumerate(origins, 1))
    for key in ("keep_alive", "max_keep_alive"):  # 0: a call's model leaves VRAM after it, as before
        if key in front:
            values[f"front_{key}_s"] = parse_duration(front[key], f"front.{key}")
    if "model_aliases" in front:
        values["front_model_aliases"] = model_aliases(front["model_aliases"])
    if "stalled_client_timeout" in front:  # 0 would cut off every client the kernel makes wait
        stalled = parse_duration(front["stalled_client_timeout"], "front.stalled_client_timeout")
        if stalled <= 0:
            raise ConfigError(
                f"front.stalled_client_timeout: must be more than 0, got {front['stalled_client_timeout']!r}"
            )
        values["front_stalled_client_s"] = stalled
    return values


_KEEP_RANGE = (1, 1000)  # [backup] keep
_WARN_DAYS_RANGE = (1, 3650)  # [storage] warn_days
_BACKUP_FLOOR_S = 1.0  # [backup] every: at least a second (a test's); a real one is hours


def backup_settings(backup: object, base_dir: Path, database: Path | str) -> dict[str, Any]:
    """The [backup] table: how often the router backs its database up, how many it keeps, where.
    On PostgreSQL the table is refused (but `every = "off"`): gpuq does not reinvent pg_dump."""
    backup = check_table(backup, "backup", "[backup]", BACKUP_KEYS)
    values: dict[str, Any] = {}
    if "every" in backup:
        every = backup["every"]
        if isinstance(every, str) and every.strip().lower() == "off":
            values["backup_every_s"] = None
        else:
            seconds = parse_duration(every, "backup.every")
            if seconds == 0:
                values["backup_every_s"] = None
            elif seconds < _BACKUP_FLOOR_S:
                raise ConfigError(f'backup.every: must be at least 1s (or "off"), got {every!r}')
            else:
                values["backup_every_s"] = seconds
    keep = within(backup, "keep", int, "backup", *_KEEP_RANGE)
    if keep is not None:
        values["backup_keep"] = keep
    folder = typed(backup, "dir", str, "backup")
    if folder is not None:
        if not folder.strip() or "\x00" in folder:
            raise ConfigError(f"backup.dir: expected a folder's path, got {folder!r}")
        values["backup_dir"] = (base_dir / folder).resolve()
    if not isinstance(database, Path) and backup and values.get("backup_every_s", 0) is not None:
        raise ConfigError(
            "[backup]: the database is on PostgreSQL, and gpuq does not back PostgreSQL up itself: use "
            'pg_dump, pg_basebackup or WAL archiving (docs/operations.md), and remove [backup] or set every = "off"'
        )
    if not isinstance(database, Path):
        values["backup_every_s"] = None  # never gpuq's on PostgreSQL
    return values


def storage_settings(storage: object) -> dict[str, Any]:
    """The [storage] table: when the storage budget warns, and how often the database is sampled."""
    storage = check_table(storage, "storage", "[storage]", STORAGE_KEYS)
    values: dict[str, Any] = {}
    days = within(storage, "warn_days", (int, float), "storage", *_WARN_DAYS_RANGE)
    if days is not None:
        values["storage_warn_days"] = float(days)
    if "sample_every" in storage:
        seconds = parse_duration(storage["sample_every"], "storage.sample_every")
        if seconds < 1:
            raise ConfigError(f"storage.sample_every: must be at least 1s, got {storage['sample_every']!r}")
        values["storage_sample_s"] = seconds
    min_free = within(storage, "min_free_bytes", int, "storage", 0, 1 << 60)
    if min_free is not None:
        values["storage_min_free"] = min_free
    return values


def model_aliases(table: object) -> tuple[tuple[str, str], ...]:
    """[front] model_aliases: name pattern -> a model's name, in the file's order (the first
    pattern a name matches gives its model)."""
    if not isinstance(table, dict):
        raise ConfigError(
            f'front.model_aliases: expected a table like {{"claude-*" = "qwen3:8b"}}, got {table!r}'[:200]
        )
    out = []
    for pattern, model in table.items():
        where = f"front.model_aliases.{pattern!r}"
        if not pattern.strip() or pattern != pattern.strip():
            raise ConfigError(f'{where}: a name pattern (like "claude-*"), with no spaces around it')
        if not isinstance(model, str) or not model.strip() or any(c.isspace() for c in model):
            raise ConfigError(f'{where}: expected a model\'s name (like "qwen3:8b"), got {model!r}'[:200])
        out.append((pattern, model))
    return tuple(out)
