"""gpuq.toml -> validated, frozen settings. Every mistake names the key that is wrong.

settings.py: the Settings, NodeConfig and UserConfig dataclasses and their defaults; keys.py:
every key declared once (KEYS), which the parser, gpuq/reload.py and the documentation's
configuration reference read; checks.py: the value checks; tables.py: the [[user]], [[node]]
and [front] tables; parse.py: a file read and checked whole; starter.py: what `gpuq init` writes."""

from ..errors import ConfigError
from .checks import (
    check_database,
    check_listen,
    check_origin,
    check_token,
    check_url,
    normal_host,
    parse_duration,
    safe_dsn,
)
from .keys import KEYS
from .parse import find_config, load_config, parse_config
from .settings import DEFAULT_LISTEN, DEFAULT_ROUTER, LEGACY_ADMIN, NodeConfig, Settings, UserConfig
from .starter import starter_config

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_ROUTER",
    "KEYS",
    "LEGACY_ADMIN",
    "ConfigError",
    "NodeConfig",
    "Settings",
    "UserConfig",
    "check_database",
    "check_listen",
    "check_origin",
    "check_token",
    "check_url",
    "find_config",
    "load_config",
    "normal_host",
    "parse_config",
    "parse_duration",
    "safe_dsn",
    "starter_config",
]
