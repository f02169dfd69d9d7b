"""gpuq.toml read again while the router runs (SIGHUP, `gpuq reload`): what differs between the
settings in force and the file's, and what the router does about it. Pure functions: the
router's wiring (gpuq/api/app.py's reload_config, Dispatcher.reconfigure) applies the plan."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from .config import KEYS, LEGACY_ADMIN, NodeConfig, Settings, UserConfig

# Settings bound into what the router opened at its start (its sockets, the database and its
# connection, the middlewares and the front door, the sleep inhibitor): the file's new value is
# named as needing a restart, and the value in force is kept. The token too: the front door
# checks the one it started with, and one token for each door is the rule. Declared with each
# key (config.KEYS, `restart`), which the configuration reference is rendered from.
RESTART = tuple(k.attr for k in KEYS if k.restart and k.attr is not None)  # every key has its attr
SECRET = ("token", "alert_token")  # named as changed, never shown
LONG = ("critique_template",)  # named as changed, too long to show
NODE_FIELDS = ("url", "rank", "roles", "model", "max_runtime_s", "think", "options", "unload", "max_output_bytes")
# What an Ollama client is made with: a change makes the node's client anew.
CLIENT_FIELDS = ("connect_timeout_s", "stall_timeout_s", "load_timeout_s", "max_reply_bytes")
NOT_SETTINGS = ("nodes", "source", "pinned", "users")  # users: named by users_changes, never their tokens
USER_FIELDS = ("role", "lanes", "max_waiting", "max_running")
REMOVED_REASON = "node removed from gpuq.toml"

# A [router] or [[node]] field's key where it is named otherwise ([front]'s fields keep their names).
_KEY_OF = {k.attr: k.name for k in KEYS if k.section in ("router", "node") and k.attr != k.name} | {
    k.attr: f"{k.section}.{k.name}"
    for k in KEYS
    if k.section in ("retention", "backup", "storage") and k.attr is not None
}


def key_of(attr: str) -> str:
    """The gpuq.toml key of a Settings or NodeConfig attribute: stall_timeout_s is stall_timeout."""
    return _KEY_OF.get(attr, attr)


def shown(attr: str, value: object) -> str:
    if attr.startswith("retention_") and attr.endswith("_after_s"):  # periods in days, or off
        if value is None:
            return "off"
        if isinstance(value, (int, float)) and value % 86400 == 0:
            return f"{value / 86400:g}d"
    if attr in ("retention_archive", "retention_compact_share") and value is None:
        return "off"
    if attr == "retention_compact_share" and isinstance(value, float):
        return f"{value * 100:g}%"
    if value is None:
        return "(not set)"
    if attr.endswith("_s") and isinstance(value, (int, float)):
        return f"{value:g}s"
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def change(attr: str, before: object, after: object) -> str:
    """'stall_timeout: 5s -> 10s' (a secret: 'alert_token: changed')."""
    if attr in SECRET:
        return f"{key_of(attr)}: {'set' if before is None else 'removed' if after is None else 'changed'}"
    if attr in LONG:
        return f"{key_of(attr)}: changed"
    return f"{key_of(attr)}: {shown(attr, before)} -> {shown(attr, after)}"


@dataclass(frozen=True)
class Plan:
    """What a reload does: `settings` is what runs after it (the file's values, but those in
    RESTART and those the command line pinned kept as they are)."""

    settings: Settings
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    nodes: dict[str, list[str]] = field(default_factory=dict)  # a kept node's changes
    router: list[str] = field(default_factory=list)  # the [router] settings changed live
    restart: list[str] = field(default_factory=list)  # changed in the file, in force only after a restart
    new_clients: tuple[str, ...] = ()  # the nodes whose Ollama client is made anew (a URL, a timeout)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.nodes or self.router)

    def json(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "added": list(self.added),
            "removed": list(self.removed),
            "nodes": self.nodes,
            "router": self.router,
            "needs_restart": self.restart,
        }

    def summary(self) -> str:
        """One line for the log."""
        parts = [f"added {', '.join(self.added)}"] if self.added else []
        parts += [f"removed {', '.join(self.removed)}"] if self.removed else []
        parts += [f"{name}: {'; '.join(what)}" for name, what in self.nodes.items()]
        parts += self.router
        text = "; ".join(parts) or "nothing changed"
        return text + (f" (needs a restart: {'; '.join(self.restart)})" if self.restart else "")


def plan(old: Settings, new: Settings) -> Plan:
    """Compare the settings in force with the file's, read again."""
    kept = {attr: getattr(old, attr) for attr in (*RESTART, *old.pinned)}
    settings = replace(new, **kept, source=old.source, pinned=old.pinned)
    if settings.token != new.token:  # the token's admin stays the one of the token in force
        settings = replace(settings, users=kept_admin(old, new))
    restart = [
        change(attr, getattr(old, attr), getattr(new, attr))
        for attr in RESTART
        if attr not in old.pinned and getattr(old, attr) != getattr(new, attr)
    ]
    router = [
        change(f.name, getattr(old, f.name), getattr(settings, f.name))
        for f in fields(Settings)
        if f.name not in (*RESTART, *NOT_SETTINGS) and getattr(old, f.name) != getattr(settings, f.name)
    ]
    router += users_changes(old.users, settings.users)
    before = {n.name: n for n in old.nodes}
    after = {n.name: n for n in settings.nodes}
    nodes = {name: what for name in after if name in before if (what := node_changes(before[name], after[name]))}
    clients_changed = any(getattr(old, a) != getattr(settings, a) for a in CLIENT_FIELDS)
    new_clients = tuple(
        name for name in after if name in before and (clients_changed or before[name].url != after[name].url)
    )
    return Plan(
        settings,
        added=tuple(n for n in after if n not in before),
        removed=tuple(n for n in before if n not in after),
        nodes=nodes,
        router=router,
        restart=restart,
        new_clients=new_clients,
    )


def kept_admin(old: Settings, new: Settings) -> tuple[UserConfig, ...]:
    """The file's users, with router.token's admin (config/tables.py parse_users) as it is in force: a new
    router.token needs a restart, so its admin keeps the old one."""

    def legacy(u: UserConfig, token: str | None) -> bool:
        return u.name == LEGACY_ADMIN and token is not None and u.token == token

    users = tuple(u for u in new.users if not legacy(u, new.token))
    admin = tuple(u for u in old.users if legacy(u, old.token))
    return admin + users if not any(u.name == LEGACY_ADMIN for u in users) else users


def users_changes(old: tuple[UserConfig, ...], new: tuple[UserConfig, ...]) -> list[str]:
    """'users: added carol; removed dave; bob's role: member -> admin; erin's token: changed' (never
    a token itself)."""
    before, after = {u.name: u for u in old}, {u.name: u for u in new}
    what = []
    if added := [n for n in after if n not in before]:
        what.append(f"added {', '.join(added)}")
    if removed := [n for n in before if n not in after]:
        what.append(f"removed {', '.join(removed)}")
    for name in (n for n in after if n in before):
        a, b = before[name], after[name]
        what += [
            f"{name}'s {key_of(attr)}: {shown(attr, getattr(a, attr))} -> {shown(attr, getattr(b, attr))}"
            for attr in USER_FIELDS
            if getattr(a, attr) != getattr(b, attr)
        ]
        if a.token != b.token:
            what.append(f"{name}'s token: {'set' if a.token is None else 'removed' if b.token is None else 'changed'}")
    return [f"users: {'; '.join(what)}"] if what else []


def node_changes(old: NodeConfig, new: NodeConfig) -> list[str]:
    return [
        change(attr, getattr(old, attr), getattr(new, attr))
        for attr in NODE_FIELDS
        if getattr(old, attr) != getattr(new, attr)
    ]


def refusal(waiting: dict[str, list[str]], running: dict[str, str]) -> str | None:
    """Why removing nodes is refused (jobs wait or run there), or None when nothing is in the way."""
    names = sorted(set(waiting) | set(running))
    if not names:
        return None
    what = []
    for name in names:
        jobs = []
        if name in running:
            jobs.append(f"{running[name]} running")
        if waiting.get(name):
            jobs.append(f"{', '.join(waiting[name])} waiting")
        what.append(f"{name} has {' and '.join(jobs)}")
    return (
        f"not reloaded, nothing changed: removing a node with jobs would strand them ({'; '.join(what)}). "
        'Move or cancel them first, or reload with --force (API: {"force": true}): its waiting jobs fail '
        f"('{REMOVED_REASON}') and a running one finishes"
    )
