"""Which router a command talks to, and why. In order: --router; $GPUQ_ROUTER; the router running
on this database (the lock file beside it records the URL its clients use: `make run PORT=8751`
or `gpuq serve --listen` move a router off the config's address, and the lock knows); the
config's public_url; http://127.0.0.1:8750. "This database" is $GPUQ_DATABASE's, else the
config's (--config, $GPUQ_CONFIG, ./gpuq.toml), else the demo's ./gpuq-demo.db, where `gpuq
serve --demo` and `make run` without a gpuq.toml keep their queue.

What a command reads of the config, and nothing more: where the router listens (its database's
lock, public_url) and the caller's own token ($GPUQ_TOKEN, else [router] token, else the one
[[user]] whose token_env is set in this shell). No other user's token_env is read, so a shell
holding only its own secret works. A config that cannot be read stops the command naming the
file and why (`ConfigRead.problem`), never a guess at another address."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..config import DEFAULT_ROUTER, ConfigError, Settings, check_database, find_config, load_config
from ..ops.dblock import running_router

DEMO_DATABASE = "gpuq-demo.db"  # the demo's, in the directory it was started from (gpuq/ops/daemon.py)


@dataclass(frozen=True)
class Found:
    url: str
    why: str  # where the address came from, as the notice says it
    given: bool  # typed by the person (--router, $GPUQ_ROUTER): no notice needed


@dataclass(frozen=True)
class ConfigRead:
    """The config the CLI found: its settings, or why it could not be read (`error`)."""

    path: Path | None
    settings: Settings | None
    error: str | None

    @property
    def problem(self) -> str | None:
        """'the config gpuq.toml could not be read: REASON', when it could not."""
        if self.error is None:
            return None
        reason = self.error.removeprefix(f"{self.path}: ")
        return f"the config {self.path} could not be read: {reason}"


def read_config(explicit: str | None) -> ConfigRead:
    """The config a client command reads: every user's token_env named, none read."""
    path = find_config(explicit)
    if path is None:
        return ConfigRead(None, None, None)
    try:
        return ConfigRead(path, load_config(path, env_token=False, secrets=False), None)
    except ConfigError as exc:
        return ConfigRead(path, None, exc.message)


def own_token(settings: Settings | None) -> tuple[str, str] | None:
    """The caller's token from the config, and where it came from: [router] token (the admin's,
    written in the file), else the one [[user]] whose token_env is set in this shell (several
    set: whose shell is this? none is guessed)."""
    if settings is None:
        return None
    if settings.token is not None:
        return settings.token, f"router.token in {settings.source}"
    mine = [u for u in settings.users if u.token_env and os.environ.get(u.token_env)]
    if len(mine) != 1:
        return None
    env = mine[0].token_env
    assert env is not None
    return os.environ[env], f"${env} (user '{mine[0].name}'.token_env)"


def this_database(config: ConfigRead) -> Path | None:
    """The SQLite file a router started here would use (None: PostgreSQL, or unknown)."""
    value = os.environ.get("GPUQ_DATABASE")
    if value:
        try:
            chosen = check_database(value, Path.cwd(), "$GPUQ_DATABASE")
        except ConfigError:
            return None
        return chosen if isinstance(chosen, Path) else None
    if config.settings is not None:
        return config.settings.database if isinstance(config.settings.database, Path) else None
    if config.path is None:
        return Path(DEMO_DATABASE).resolve()
    return None  # a config that cannot be read: its database is unknown


def find_router(router: str | None, config: ConfigRead) -> Found:
    if router:
        return Found(router, "--router", True)
    if os.environ.get("GPUQ_ROUTER"):
        return Found(os.environ["GPUQ_ROUTER"], "$GPUQ_ROUTER", True)
    database = this_database(config)
    holder = running_router(database) if database is not None else None
    if holder is not None:
        url = holder.get("url") or f"http://{holder['listen']}"
        return Found(url, f"the router running on {shown(database)}, pid {holder['pid']}", False)
    if config.settings is not None:
        return Found(config.settings.public_url, f"public_url in {config.path}", False)
    return Found(DEFAULT_ROUTER, "the default", False)


def shown(path: Path | None) -> str:
    """A file as the notice names it: relative to here when it is under here."""
    if path is None:
        return "?"
    here = Path.cwd()
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def notice(found: Found) -> str | None:
    """The one line a command prints on stderr when it talks to a router it found, not the default."""
    if found.given or found.url.rstrip("/") == DEFAULT_ROUTER:
        return None
    return f"gpuq: router {found.url} ({found.why})"
