"""gpuq.toml → validated, frozen settings. Every mistake names the key that is wrong."""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from urllib.parse import urlparse


from .errors import ConfigError
from .params import options_problem, think_problem

DEFAULT_LISTEN = "127.0.0.1:8750"
DEFAULT_ROUTER = f"http://{DEFAULT_LISTEN}"  # where the CLI looks when told nothing
ROLES = ("task", "critique")

DEFAULT_CRITIQUE_TEMPLATE = """\
You are a careful reviewer. Critique the document below. Report only real problems: \
mistakes, risks, missing pieces, unclear parts. For each finding give a short title, \
the detail, a severity (low, medium, high) and where in the document it applies.

{subject}"""


# A front-door request's whole body, images included (its text alone is held to max_prompt_bytes).
# Ollama sets no limit; 64 MiB holds two 20 MB phone photos in base64 (about 27 MB each) or a
# chat that resends a few smaller ones each turn, and bounds what one request makes the router
# hold (its body, the parsed copy, the stored row: a few times this).
FRONT_MAX_REQUEST_BYTES = 64 << 20
_FRONT_REQUEST_RANGE = (1 << 20, 1 << 30)
# Schemes gin-contrib/cors accepts in a configured origin without a '*' (cors.go Validate, with
# Ollama's AllowBrowserExtensions: DefaultSchemas + ExtensionSchemas).
ORIGIN_SCHEMES = ("http://", "https://", "chrome-extension://", "safari-extension://", "moz-extension://",
                  "ms-browser-extension://")


@dataclass(frozen=True)
class NodeConfig:
    name: str
    url: str
    rank: int
    roles: tuple[str, ...]
    model: str
    max_runtime_s: float | None = None  # None: the router's max_runtime
    think: bool | str | None = None  # Ollama's `think` for this node's jobs; None: Ollama's default
    options: dict | None = field(default=None, hash=False)  # Ollama model options, e.g. num_ctx
    unload: str | None = None  # "after-each" | "when-idle"; None: the router's
    max_output_bytes: int | None = None  # None: the router's


USER_ROLES = ("admin", "member")
LANES = ("interactive", "batch")
IDENTITIES = ("token", "tailscale")
LEGACY_ADMIN = "admin"  # the user the single [router] token stands for


@dataclass(frozen=True)
class UserConfig:
    """One [[user]]: who a token (or a tailnet login) stands for, and what they may do."""

    name: str  # as shown on jobs and events; a tailnet user's is their login name
    token: str | None = field(default=None, repr=False)  # None: identified by the tailnet only
    role: str = "member"  # "admin": may act on every job; "member": submits, acts on their own jobs
    lanes: tuple[str, ...] = LANES  # the lanes they may submit to (("batch",): never ahead of others)
    max_waiting: int | None = None  # queued jobs at once; a submit beyond is 429
    max_running: int | None = None  # running jobs at once; more wait even on a free node

    @property
    def admin(self) -> bool:
        return self.role == "admin"


@dataclass(frozen=True)
class Settings:
    listen: str = DEFAULT_LISTEN
    public_url: str = f"http://{DEFAULT_LISTEN}"
    database: Path | str = Path("gpuq.db")  # a SQLite file, or a PostgreSQL DSN (postgresql://...)
    stale_after_s: float = 600.0  # no tokens for this long: the head is stale
    stale_grace_s: float = 30.0  # Ollama finished but the job did not, for this long
    max_runtime_s: float = 4 * 3600.0  # a job running longer is stale, then failed
    job_timeout_s: float | None = None  # default per-job wall-clock limit
    stall_timeout_s: float = 300.0  # no new token from Ollama for this long (after the first) fails the job
    load_timeout_s: float = 600.0  # no first token for this long (a cold model load) fails the job
    unload_timeout_s: float = 30.0  # how long the model may take to leave VRAM
    health_interval_s: float = 15.0  # node health check period
    connect_timeout_s: float = 10.0
    busy_timeout_s: float = 5.0  # SQLite busy timeout
    submit_timeout_s: float = 5.0  # a submit the database has not taken by then answers 503
    max_prompt_bytes: int = 1_000_000
    max_database_bytes: int | None = None  # past this SQLite refuses to grow the file ("full")
    max_output_bytes: int = 8 << 20  # a job's answer and reasoning; past this it fails, output kept
    max_reply_bytes: int = 16 << 20  # a node's non-streamed reply (/api/tags, /api/ps, /api/show...)
    header_timeout_s: float = 10.0  # a new connection must send its request headers within this
    keepalive_timeout_s: float = 75.0  # an idle keep-alive connection is closed after this
    max_connections: int = 1000  # per listener: more open connections at once are refused (503)
    max_connections_per_peer: int = 64  # per listener and client address (loopback too): more get 429
    body_timeout_s: float = 60.0  # a request's whole body must arrive within this of its headers (408)
    keepalive_lifetime_s: float = 3600.0  # a kept-alive connection is closed after this, however busy
    token: str | None = None
    allowed_hosts: tuple[str, ...] = ()  # more names the router answers to (normal_host form)
    ollama_listen: str | None = None  # host:port of the Ollama/OpenAI front door; None: off
    front_max_request_bytes: int = FRONT_MAX_REQUEST_BYTES  # [front] max_request_bytes: a whole request, images too
    front_origins: tuple[str, ...] = ()  # [front] origins: more browser origins, beside Ollama's defaults
    # [front] keep_alive: how long a front-door call's model stays loaded when its client sends no
    # keep_alive (Ollama's own default, envconfig OLLAMA_KEEP_ALIVE: 5m), and [front]
    # max_keep_alive: the most any call keeps it ("forever" asked becomes this). Honoured only while
    # nothing else waits for the node: the next job of another model unloads it first.
    front_keep_alive_s: float = 300.0
    front_max_keep_alive_s: float = 1800.0
    critique_template: str = DEFAULT_CRITIQUE_TEMPLATE
    unload: str = "after-each"  # or "when-idle": back-to-back jobs of one model keep it loaded
    alert_url: str | None = None  # where alerts are POSTed (a webhook, an ntfy topic URL)
    alert_token: str | None = field(default=None, repr=False)  # sent as a Bearer token
    alert_format: str = "json"  # "json" (the alert as a JSON body) or "ntfy" (Title header, text)
    keep_awake: bool = True  # hold a sleep inhibitor while any job runs (gpuq/node/awake.py)
    # How long a SIGTERM (a service manager's stop) lets running jobs finish before the router
    # stops at once, failing them loudly. 15 s fits under both service managers' own limits,
    # after which they SIGKILL (launchd's ExitTimeOut, 20 s; systemd's TimeoutStopSec, 90 s), with
    # time left for the stop itself: the router, not a SIGKILL, ends the jobs and says why. Raise
    # it together with the manager's limit. A Ctrl-C (SIGINT) waits for the jobs without a bound.
    shutdown_grace_s: float = 15.0
    # How long a router's hold on a node lasts unrenewed ([router] lease): it renews every third of
    # it; a router that stops answering (SIGKILL, a laptop asleep) loses its nodes after it.
    lease_s: float = 10.0
    nodes: tuple[NodeConfig, ...] = field(default_factory=tuple)
    users: tuple[UserConfig, ...] = field(default_factory=tuple)  # [[user]] (and the token's admin)
    identity: str = "token"  # "tailscale": a caller without a token is who tailscaled says owns it
    # tailscaled's LocalAPI socket (identity = "tailscale"); absent: `tailscale whois` (macOS's app)
    tailscale_socket: Path = Path("/var/run/tailscale/tailscaled.sock")
    default_role: str | None = None  # a tailnet login with no [[user]]: this role; None: refused
    fair_share: bool | None = None  # interleave users' batch jobs; None: on with two users or more
    # An interactive job queued behind a running batch job interrupts it (gpuq preempt's way).
    interactive_preempts: bool = False
    # The file these settings were read from (what `gpuq reload` and SIGHUP read again); None: the demo.
    source: Path | None = None
    # Settings the command line gave (`gpuq serve --listen ...`): a reload keeps them, whatever the file says.
    pinned: frozenset[str] = frozenset()

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def ollama_url(self) -> str | None:
        """The front door's address for clients (OLLAMA_HOST); None when it is off."""
        if self.ollama_listen is None:
            return None
        host, port = self.ollama_listen.rsplit(":", 1)
        if host.strip("[]") in ("0.0.0.0", "::"):  # listening everywhere: name the public host
            host = urlparse(self.public_url).hostname or "127.0.0.1"
            host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def user(self, name: str) -> UserConfig | None:
        return next((u for u in self.users if u.name == name), None)

    @cached_property
    def max_waiting(self) -> dict[str, int]:
        """Each user's max_waiting, by name (users without one are not in it)."""
        return {u.name: u.max_waiting for u in self.users if u.max_waiting is not None}

    @cached_property
    def max_running(self) -> dict[str, int]:
        """Each user's max_running, by name: every claim of the store applies it."""
        return {u.name: u.max_running for u in self.users if u.max_running is not None}

    def user_by_token(self, token: str) -> UserConfig | None:
        """Compared in constant time, every user's token each time: how long it takes tells nothing."""
        found = None
        for u in self.users:
            if u.token is not None and hmac.compare_digest(u.token.encode(), token.encode()):
                found = u
        return found

    @property
    def shares_fairly(self) -> bool:
        return self.fair_share if self.fair_share is not None else len(self.users) > 1

    def node(self, name: str) -> NodeConfig | None:
        return next((n for n in self.nodes if n.name == name), None)

    def unload_for(self, node: NodeConfig) -> str:
        return node.unload or self.unload

    def max_runtime_for(self, node: NodeConfig) -> float:
        return node.max_runtime_s if node.max_runtime_s is not None else self.max_runtime_s

    def max_output_for(self, node: NodeConfig) -> int:
        return node.max_output_bytes if node.max_output_bytes is not None else self.max_output_bytes



@dataclass(frozen=True)
class Key:
    """One gpuq.toml key, declared once: the parser takes its known keys (and which are durations)
    from KEYS, gpuq/reload.py what a reload keeps from `restart`, and the documentation's
    configuration reference is rendered from these records (docs/hooks/config_reference.py)."""

    section: str  # "router", "front", "node" or "user": [router], [front], [[node]], [[user]]
    name: str  # as written in gpuq.toml
    doc: str
    default: object = None  # the value when the key is left out, as TOML writes it; None: see `shown`
    shown: str | None = None  # what the reference says of the default instead (a computed one, an absence)
    attr: str | None = None  # the field it sets (Settings for [router] and [front], else NodeConfig or UserConfig)
    duration: bool = False  # "90s", "10m", "1h30m", "250ms" or a number of seconds
    # Bound into what the router opened at its start: a reload (SIGHUP, `gpuq reload`) keeps the
    # value in force and names the file's new one as needing a restart. Every other key is live.
    restart: bool = False


def _r(name: str, doc: str, default: object = None, shown: str | None = None, attr: str | None = None,
       duration: bool = False, restart: bool = False) -> Key:
    return Key("router", name, doc, default, shown, attr or (f"{name}_s" if duration else name), duration, restart)


KEYS: tuple[Key, ...] = (
    # -- where the router listens, and who may call it
    _r("listen", "host:port the router binds. Loopback: only this machine. To serve your tailnet, this "
       "machine's Tailscale address (100.x.y.z:8750); `0.0.0.0` exposes it to your LAN too.",
       DEFAULT_LISTEN, restart=True),
    _r("public_url", "Base of the preview links the router hands back, and the CLI's default router. "
       "Scheme, host, port and an optional path prefix; no query, fragment or user:password@.",
       shown='"http://" + listen', restart=True),
    _r("allowed_hosts", "More host names the router and the front door answer to, beside Ollama's rule "
       "(see Reliability: host names); the host name alone, no port or scheme. Any other Host header gets 421.",
       [], restart=True),
    _r("token", "A shared secret every /api call and front-door call must send (`Authorization: Bearer`); "
       "printable ASCII, not empty, no spaces around it. It stands for the admin user `admin` (unless a "
       "[[user]] has it). "
       "Unset: `$GPUQ_TOKEN`, else no token.", shown="not set", restart=True),
    _r("identity", '"token", or "tailscale": a request without a token is whoever tailscaled says owns '
       "its connection (its login name).", "token"),
    _r("default_role", 'The role ("admin" or "member") of a tailnet login with no [[user]] of its name; '
       "unset, such a login is refused (403).", shown="not set"),
    _r("tailscale_socket", "tailscaled's LocalAPI socket, for `identity = \"tailscale\"` (relative to "
       "the config's folder); absent, `tailscale whois` is run instead (macOS's app).",
       "/var/run/tailscale/tailscaled.sock"),
    _r("ollama_listen", "host:port of the front door, the second listener that answers as an Ollama "
       "server (and OpenAI's and Anthropic's APIs). Unset: no front door.", shown="not set (off)",
       restart=True),
    # -- the database
    _r("database", "The SQLite file (relative to the config's folder), or a PostgreSQL URI "
       "(`postgresql://user@host/dbname`) for several routers on one queue. `$GPUQ_DATABASE` and "
       "`gpuq serve --database` win over it.", "gpuq.db", restart=True),
    _r("busy_timeout", "How long a write waits for a SQLite lock (a write transaction held in the "
       "sqlite3 shell) before that request fails with 503.", "5s", duration=True, restart=True),
    _r("submit_timeout", "The longest a submit waits for the database to take it; then 503 \"the "
       "database did not take the submit within ...\" and nothing is stored.", "5s", duration=True, restart=True),
    _r("max_database_bytes", "Cap on the SQLite file, at least 65536: past it submits fail with 503, "
       "as on a full disk. Unset: no cap.", shown="not set", restart=True),
    _r("lease", "PostgreSQL: how long a router's hold on a node lasts unrenewed (renewed every third "
       "of it); a router that stops answering loses its nodes after it. At least 1s.", "10s", duration=True),
    # -- jobs and their limits
    _r("stale_after", "A running job with no new token for this long is a stale queue head: /health "
       "red, an alert.", "10m", duration=True),
    _r("stale_grace", "Ollama finished the stream but the job did not close within this: stale.",
       "30s", duration=True),
    _r("max_runtime", "No job runs longer than this; past it the job fails, loudly. Per node too.",
       "4h", duration=True),
    _r("job_timeout", "Default wall-clock limit per job (a job's own `--timeout` wins). Unset: only "
       "max_runtime.", shown="not set", duration=True),
    _r("load_timeout", "How long a job may wait for its first token (a cold model load) before it fails.",
       "10m", duration=True),
    _r("stall_timeout", "After the first token, no new token for this long fails the job (bytes "
       "without a token are no progress).", "5m", duration=True),
    _r("unload_timeout", "How long a model may take to leave VRAM after a job before its node is "
       "flagged (`vram_stuck`).", "30s", duration=True),
    _r("health_interval", "How often each node's Ollama is checked (`/api/version`, `/api/tags`). "
       "At least 100ms.", "15s", duration=True),
    _r("connect_timeout", "How long connecting to a node's Ollama may take.", "10s", duration=True),
    _r("max_prompt_bytes", "The largest prompt accepted, in bytes (larger: 413); at most 64 MiB "
       "(67108864). A front-door request's text is held to it too.", 1_000_000, restart=True),
    _r("max_output_bytes", "A job's answer and reasoning held past this many bytes fails the job, its "
       "output so far kept. From 1024 to 1 GiB. Per node too.", 8 << 20),
    _r("max_reply_bytes", "A node's non-streamed reply (`/api/tags`, `/api/ps`, `/api/show`, "
       "`/api/version`, an unload) longer than this fails its call. From 64 KiB to 1 GiB.", 16 << 20),
    _r("unload", '"after-each": every job\'s model is unloaded after it and checked gone from VRAM. '
       '"when-idle": kept loaded across back-to-back jobs of one model, unloaded when the node goes '
       "idle or switches model. Per node too.", "after-each"),
    _r("critique_template", "The critique instruction; `{subject}` (required) is the document, or the "
       "task and its result.", shown="a reviewer's instruction (`config.DEFAULT_CRITIQUE_TEMPLATE`)"),
    # -- users and priorities
    _r("fair_share", "Interleave users' batch jobs as they enter a queue (a user's k-th waiting batch "
       "job before anyone's (k+1)-th).", shown="on with two users or more"),
    _r("interactive_preempts", "An interactive job queued on a node running a batch job interrupts "
       "it, as `gpuq preempt` would.", False),
    # -- connections
    _r("header_timeout", "A new connection must send its request headers within this (else 408).",
       "10s", duration=True, restart=True),
    _r("body_timeout", "A request's whole body must arrive within this of its headers (else 408).",
       "60s", duration=True, restart=True),
    _r("keepalive_timeout", "An idle kept-alive connection is closed after this (an open event or job "
       "stream is not idle).", "75s", duration=True, restart=True),
    _r("keepalive_lifetime", "A kept-alive connection open this long is closed after its current "
       "request, however busy.", "1h", duration=True, restart=True),
    _r("max_connections", "Open connections per listener (the router, the front door each); more are "
       "answered 503. From 8 to 1000000.", 1000, restart=True),
    _r("max_connections_per_peer", "Open connections per listener and client address, loopback too "
       "(raise it behind a reverse proxy on this host); more get 429. From 1 to 1000000.", 64, restart=True),
    # -- operations
    _r("alert_url", "Where alerts are POSTed (a webhook, an ntfy topic URL). Unset: firings are "
       "recorded, not sent.", shown="not set"),
    _r("alert_format", '"json" (the alert as a JSON body) or "ntfy" (Title header, text body). Needs '
       "alert_url.", "json"),
    _r("alert_token", "Sent with each alert as `Authorization: Bearer <token>`. Needs alert_url.",
       shown="not set"),
    _r("keep_awake", "While any job runs, hold a sleep inhibitor (macOS `caffeinate`, Linux "
       "`systemd-inhibit`).", True, restart=True),
    _r("shutdown_grace", "How long a SIGTERM lets running jobs finish before the router stops at once, "
       "failing them; keep it under the service manager's own limit. A Ctrl-C waits without a bound.",
       "15s", duration=True),
    # -- [front]
    Key("front", "max_request_bytes", "A front-door request's whole body, images included; from 1 MiB "
        "to 1 GiB. Its text is held to router.max_prompt_bytes.", FRONT_MAX_REQUEST_BYTES,
        attr="front_max_request_bytes", restart=True),
    Key("front", "origins", "Browser origins that may call the front door, beside Ollama's defaults; as "
        "OLLAMA_ORIGINS, exact or with one `*` (`\"*\"` alone: every page, only with a token).", [],
        attr="front_origins", restart=True),
    Key("front", "keep_alive", "How long a front-door call's model stays loaded when its client sends "
        "no keep_alive, while nothing else waits for the node. 0: unloaded after each call.", "5m",
        attr="front_keep_alive_s", duration=True),
    Key("front", "max_keep_alive", "The most any call keeps its model loaded (a \"forever\" asked "
        "becomes this).", "30m", attr="front_max_keep_alive_s", duration=True),
    # -- [[node]]
    Key("node", "name", "The node's name: letters, digits, `.`, `_`, `-`; unique.", shown="required",
        attr="name"),
    Key("node", "url", "Its Ollama's base URL (a path prefix is fine, behind a reverse proxy; no query, "
        "fragment or user:password@).", shown="required", attr="url"),
    Key("node", "rank", "Task placement order: the first free task node by rank (lowest first); unique.",
        shown="required", attr="rank"),
    Key("node", "roles", '"task" (long work) and/or "critique" (reviews, fanned out to every critique '
        "node, never on the parent task's node).", shown="required", attr="roles"),
    Key("node", "model", "The model this node runs for jobs that name none.", shown="required", attr="model"),
    Key("node", "max_runtime", "This node's max_runtime.", shown="the router's", attr="max_runtime_s",
        duration=True),
    Key("node", "think", "Ollama's `think` for jobs of this node's own model: true, false, or "
        '"low" | "medium" | "high". A job\'s own wins.', shown="Ollama's default", attr="think"),
    Key("node", "options", "Ollama model options for every job the node runs (e.g. `{ num_ctx = 32768 }`); "
        "a job's own options win, key by key.", shown="none", attr="options"),
    Key("node", "unload", "This node's unload policy.", shown="the router's", attr="unload"),
    Key("node", "max_output_bytes", "This node's max_output_bytes.", shown="the router's",
        attr="max_output_bytes"),
    # -- [[user]]
    Key("user", "name", "Who the user is on jobs and events; a tailnet user's is their login name "
        "(`alice@example.com`).", shown="required", attr="name"),
    Key("user", "token", "Their token, written out.", shown="none: known by their tailnet login",
        attr="token"),
    Key("user", "token_env", "The environment variable that holds their token (keeps it out of the file); "
        "not both token and token_env.", shown="none", attr="token"),
    Key("user", "role", '"admin" (acts on every job, reloads) or "member" (submits; acts on their own jobs).',
        "member", attr="role"),
    Key("user", "lanes", 'The lanes they may submit to; ["batch"]: never the interactive lane.',
        list(LANES), attr="lanes"),
    Key("user", "max_waiting", "Their queued jobs at once; a submit beyond is 429 with Retry-After. "
        "From 1 to 1000000.", shown="no limit", attr="max_waiting"),
    Key("user", "max_running", "Their running jobs at once; more wait even on a free node. From 1 to 1000000.",
        shown="no limit", attr="max_running"),
)


def _keys(section: str) -> set[str]:
    return {k.name for k in KEYS if k.section == section}


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


# No model's context holds more than a few MB of text (a million tokens is ~4 MB), and the
# router holds a prompt in memory several times over (the request body, up to twice its size
# with JSON escapes and so its client_max_size, the parsed text, the row, each fan-out copy).
MAX_PROMPT_BYTES = 64 * 1024 * 1024

# A node's bytes the router holds: at least enough for any real reply, at most what one
# machine's router should ever hold for one job or one health answer.
_BYTE_LIMITS = {"max_output_bytes": (1024, 1 << 30), "max_reply_bytes": (64 * 1024, 1 << 30)}

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
_DURATION_FLOORS: dict[str, tuple[float, str]] = {
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


def _bounded_duration(value: object, key: str, name: str) -> float:
    """parse_duration, then refuse 0 or what is under the key's floor (`name` is its bare key)."""
    seconds = parse_duration(value, key)
    floor, why = _DURATION_FLOORS[name]
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
        raise ConfigError(f"{key}: use printable ASCII only (no client can send other characters in "
                          "a header); e.g. the output of `openssl rand -hex 32`")
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
        raise ConfigError(f"{where}: a PostgreSQL database is named by a URI, postgresql://user@host/dbname;"
                          f" got {safe_dsn(value)!r}")
    try:
        conninfo_to_dict(value)
    except Exception as exc:  # psycopg.ProgrammingError: libpq's own words
        raise ConfigError(f"{where}: not a PostgreSQL URI libpq accepts ({str(exc).strip()}):"
                          f" {safe_dsn(value)!r}") from None
    return value


def check_listen(value: object, key: str) -> str:
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(f"{key}: expected 'host:port', got {value!r}")
    host, port = value.rsplit(":", 1)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: expected 'host:port' with a port from 1 to 65535, got {value!r}")
    return value


def _http_url(value: object, key: str):
    """Any http(s) URL gpuq can send to: a host, a valid port, no spaces or control characters."""
    parsed = urlparse(value) if isinstance(value, str) else None
    if not parsed or parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {value!r}")
    if any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigError(f"{key}: a URL must not contain spaces or control characters, got {value!r}")
    try:
        parsed.port
    except ValueError:
        raise ConfigError(f"{key}: the URL's port is not a number from 0 to 65535: {value!r}") from None
    return parsed


def check_url(value: object, key: str) -> str:
    """An http(s) base URL that gpuq appends its own paths to. A path prefix is kept (an Ollama
    or router behind a reverse proxy); what cannot survive that appending is refused."""
    parsed = _http_url(value, key)
    if "?" in value or "#" in value:
        raise ConfigError(f"{key}: a URL with a query ('?') or fragment ('#') cannot take gpuq's paths "
                          f"after it; give only scheme, host, port and an optional path, got {value!r}")
    if parsed.username is not None or parsed.password is not None:
        # The URL is stored in the database and shown on the page, in errors and preview links.
        raise ConfigError(f"{key}: a user or password in the URL would be shown on the page and in "
                          f"errors; remove the '...@' part, got {value!r}")
    return value.rstrip("/")


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


def _check_hosts(value: object, key: str) -> tuple[str, ...]:
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


def _byte_limit(table: dict, key: str, where: str) -> int | None:
    value = _typed(table, key, int, where)
    if value is not None:
        low, high = _BYTE_LIMITS[key]
        if not low <= value <= high:
            raise ConfigError(f"{where}.{key}: must be from {low} to {high} (1 GiB), got {value}")
    return value


def _typed(table: dict, key: str, kind: type | tuple, where: str, required: bool = False):
    if key not in table:
        if required:
            raise ConfigError(f"{where}: missing required key '{key}'")
        return None
    value = table[key]
    if isinstance(value, bool) and kind is not bool or not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ConfigError(f"{where}.{key}: expected {names}, got {value!r}")
    return value


_ROUTER_KEYS = _keys("router")
ALERT_FORMATS = ("json", "ntfy")
# [router]'s durations and their Settings fields, checked in the order _DURATION_FLOORS lists them.
DURATION_KEYS = {k.name: k.attr for k in sorted((k for k in KEYS if k.section == "router" and k.duration),
                                                key=lambda k: list(_DURATION_FLOORS).index(k.name))}


def _table(table: object, where: str, kind: str, known: set[str]) -> dict:
    """A table of gpuq.toml, checked for its shape and its keys: `kind` as it is written ("[front]",
    "[[node]]"), `known` its keys; a misspelt key is named with the ones there are."""
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a {kind} table")
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})")
    return table


_USER_KEYS = _keys("user")


def _parse_user(table: object, index: int) -> UserConfig:
    """A [[user]]: its token written out, or read from the environment variable token_env (so
    gpuq.toml can be shared without secrets); neither: a tailnet user, known by login name."""
    where = f"user[{index}]"
    table = _table(table, where, "[[user]]", _USER_KEYS)
    name = _typed(table, "name", str, where, required=True)
    # A tailnet login name (alice@example.com, alice@github) is a name too.
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}", name):
        raise ConfigError(f"{where}.name: use letters, digits, '.', '_', '@', '+' or '-', got {name!r}")
    where = f"user '{name}'"
    token = _typed(table, "token", str, where)
    env = _typed(table, "token_env", str, where)
    if token is not None and env is not None:
        raise ConfigError(f"{where}: give token or token_env, not both")
    if token is not None:
        token = check_token(token, f"{where}.token")
    elif env is not None:
        if env not in os.environ:
            raise ConfigError(f"{where}.token_env: the environment variable ${env} is not set")
        token = check_token(os.environ[env], f"${env} ({where}.token_env)")
    role = table.get("role", "member")
    if role not in USER_ROLES:
        raise ConfigError(f"{where}.role: expected 'admin' or 'member', got {role!r}")
    lanes = _typed(table, "lanes", list, where)
    if lanes is not None and (not lanes or any(lane not in LANES for lane in lanes) or len(set(lanes)) != len(lanes)):
        raise ConfigError(f"{where}.lanes: expected a non-empty list of 'interactive' and/or 'batch', got {lanes!r}")
    limits = {}
    for key in ("max_waiting", "max_running"):
        value = _typed(table, key, int, where)
        if value is not None and not 1 <= value <= 1_000_000:
            raise ConfigError(f"{where}.{key}: must be from 1 to 1000000, got {value}")
        limits[key] = value
    return UserConfig(name=name, token=token, role=role, lanes=tuple(lanes) if lanes else LANES, **limits)


def _parse_users(data: dict, values: dict) -> tuple[UserConfig, ...]:
    """[[user]] tables, and the single [router] token as the admin it always was."""
    raw = data.get("user", [])
    if not isinstance(raw, list):
        raise ConfigError("user: expected [[user]] tables")
    users = [_parse_user(t, i) for i, t in enumerate(raw, start=1)]
    names: set[str] = set()
    tokens: dict[str, str] = {}
    for u in users:
        if u.name in names:
            raise ConfigError(f"user '{u.name}'.name: duplicate user name")
        names.add(u.name)
        if u.token is not None:
            if u.token in tokens:
                raise ConfigError(f"user '{u.name}'.token: the same token as user '{tokens[u.token]}'; "
                                  "each user needs their own")
            tokens[u.token] = u.name
    token = values.get("token")
    if token is not None and token not in tokens:
        if LEGACY_ADMIN in names:
            raise ConfigError(f"router.token: stands for the user '{LEGACY_ADMIN}', and a [[user]] has that name "
                              "with another token; give that user router.token's value, or remove router.token")
        users.insert(0, UserConfig(name=LEGACY_ADMIN, token=token, role="admin"))
    return tuple(users)


_NODE_KEYS = _keys("node")
UNLOAD_POLICIES = ("after-each", "when-idle")


def _unload_policy(table: dict, where: str) -> str | None:
    policy = table.get("unload")
    if policy is not None and policy not in UNLOAD_POLICIES:
        raise ConfigError(f"{where}.unload: expected \"after-each\" or \"when-idle\", got {policy!r}")
    return policy


def _parse_node(table: object, index: int) -> NodeConfig:
    where = f"node[{index}]"
    table = _table(table, where, "[[node]]", _NODE_KEYS)
    name = _typed(table, "name", str, where, required=True)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name):
        raise ConfigError(f"{where}.name: use letters, digits, '.', '_' or '-', got {name!r}")
    where = f"node '{name}'"
    roles = _typed(table, "roles", list, where, required=True)
    if not roles or any(r not in ROLES for r in roles) or len(set(roles)) != len(roles):
        raise ConfigError(f"{where}.roles: expected a non-empty list of 'task' and/or 'critique', got {roles!r}")
    rank = _typed(table, "rank", int, where, required=True)
    if not -(2**63) <= rank < 2**63:  # SQLite's INTEGER
        raise ConfigError(f"{where}.rank: must fit in 64 bits, got {rank}")
    model = _typed(table, "model", str, where, required=True)
    if not model.strip():
        raise ConfigError(f"{where}.model: must not be empty")
    runtime = table.get("max_runtime")
    for key, problem in (("think", think_problem), ("options", options_problem)):
        if key in table and (wrong := problem(table[key])):
            raise ConfigError(f"{where}.{key}: {wrong}")
    return NodeConfig(
        name=name,
        url=check_url(_typed(table, "url", str, where, required=True), f"{where}.url"),
        rank=rank,
        roles=tuple(roles),
        model=model.strip(),
        max_runtime_s=None if runtime is None else _bounded_duration(runtime, f"{where}.max_runtime", "max_runtime"),
        think=table.get("think"),
        options=table.get("options"),
        unload=_unload_policy(table, where),
        max_output_bytes=_byte_limit(table, "max_output_bytes", where),
    )


def _check_alert_url(value: str, key: str) -> str:
    """The exact URL alerts are POSTed to: unlike a base URL, a query (a webhook's own token) is
    fine, and it is kept as written (a receiver may care about a final '/')."""
    _http_url(value, key)
    return value


def _alert_settings(router: dict) -> dict:
    """alert_url, alert_token and alert_format: a token or a format needs somewhere to send."""
    values: dict = {}
    url = _typed(router, "alert_url", str, "router")
    if url is not None:
        values["alert_url"] = _check_alert_url(url, "router.alert_url")
    token = _typed(router, "alert_token", str, "router")
    if token is not None:
        if not token.strip() or any(c in token for c in "\r\n"):  # it goes into a header
            raise ConfigError("router.alert_token: expected a token on one line, got an empty or multi-line string")
        values["alert_token"] = token.strip()
    fmt = _typed(router, "alert_format", str, "router")
    if fmt is not None:
        if fmt not in ALERT_FORMATS:
            raise ConfigError(f"router.alert_format: expected 'json' or 'ntfy', got {fmt!r}")
        values["alert_format"] = fmt
    for key in ("alert_token", "alert_format"):
        if key in router and url is None:
            raise ConfigError(f"router.{key}: set router.alert_url too (where alerts are sent)")
    return values


def _check_origin(entry: object, key: str) -> str:
    """One origin a browser page may call the front door from, as OLLAMA_ORIGINS takes it: exact
    ('https://chat.example.com'), '*' (every origin) or one '*' wildcard ('https://*.example.com',
    'chrome-extension://*'). Compared as gin-contrib/cors does, in lower case."""
    if not isinstance(entry, str):
        raise ConfigError(f"{key}: expected an origin (a string), got {entry!r}")
    origin = entry.strip().lower()
    if origin.count("*") > 1:  # gin-contrib/cors panics: "only one * is allowed"
        raise ConfigError(f"{key}: only one '*' is allowed, got {entry!r}")
    if "*" not in origin and not origin.startswith(ORIGIN_SCHEMES):
        raise ConfigError(f"{key}: expected an origin like 'https://chat.example.com' (scheme and host, or a '*' "
                          f"wildcard), got {entry!r}")
    scheme, sep, rest = origin.partition("://")
    if sep and "/" in rest:
        raise ConfigError(f"{key}: write the origin alone (scheme://host[:port]), without a path, got {entry!r}")
    return origin


def _front_settings(front: object) -> dict:
    """The [front] table: the front door's own request limit and browser origins."""
    front = _table(front, "front", "[front]", _FRONT_KEYS)
    values: dict = {}
    limit = _typed(front, "max_request_bytes", int, "front")
    if limit is not None:
        low, high = _FRONT_REQUEST_RANGE
        if not low <= limit <= high:
            raise ConfigError(f"front.max_request_bytes: must be from {low} (1 MiB) to {high} (1 GiB), got {limit}")
        values["front_max_request_bytes"] = limit
    if "origins" in front:
        origins = front["origins"]
        if not isinstance(origins, list):
            raise ConfigError(f'front.origins: expected a list of origins like ["https://chat.example.com"], '
                              f"got {origins!r}")
        values["front_origins"] = tuple(_check_origin(o, f"front.origins[{i}]") for i, o in enumerate(origins, 1))
    for key in ("keep_alive", "max_keep_alive"):  # 0: a call's model leaves VRAM after it, as before
        if key in front:
            values[f"front_{key}_s"] = parse_duration(front[key], f"front.{key}")
    return values


_FRONT_KEYS = _keys("front")


def parse_config(data: dict, base_dir: Path) -> Settings:
    unknown = sorted(set(data) - {"router", "node", "front", "user"})
    if unknown:
        raise ConfigError(f"unknown key '{unknown[0]}' (expected [router], [front], [[node]] and [[user]] tables)")
    router = _table(data.get("router", {}), "router", "[router]", _ROUTER_KEYS)
    values: dict = {}
    if "listen" in router:
        values["listen"] = check_listen(router["listen"], "router.listen")
    listen = values.get("listen", DEFAULT_LISTEN)
    values["public_url"] = check_url(router.get("public_url", f"http://{listen}"), "router.public_url")
    database = _typed(router, "database", str, "router")
    values["database"] = check_database(database or "gpuq.db", base_dir, "router.database")
    for key, attr in DURATION_KEYS.items():
        if key in router:
            values[attr] = _bounded_duration(router[key], f"router.{key}", key)
    limit = _typed(router, "max_prompt_bytes", int, "router")
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"router.max_prompt_bytes: must be at least 1, got {limit}")
        if limit > MAX_PROMPT_BYTES:
            raise ConfigError(f"router.max_prompt_bytes: must be at most {MAX_PROMPT_BYTES} (64 MiB), got {limit}")
        values["max_prompt_bytes"] = limit
    cap = _typed(router, "max_database_bytes", int, "router")
    if cap is not None:
        if cap < 65536:
            raise ConfigError(f"router.max_database_bytes: must be at least 65536, got {cap}")
        values["max_database_bytes"] = cap
    for key in _BYTE_LIMITS:
        if (limit := _byte_limit(router, key, "router")) is not None:
            values[key] = limit
    connections = _typed(router, "max_connections", int, "router")
    if connections is not None:
        if not 8 <= connections <= 1_000_000:
            raise ConfigError(f"router.max_connections: must be from 8 to 1000000, got {connections}")
        values["max_connections"] = connections
    per_peer = _typed(router, "max_connections_per_peer", int, "router")
    if per_peer is not None:
        if not 1 <= per_peer <= 1_000_000:
            raise ConfigError(f"router.max_connections_per_peer: must be from 1 to 1000000, got {per_peer}")
        values["max_connections_per_peer"] = per_peer
    token = _typed(router, "token", str, "router")
    if token is not None:
        values["token"] = check_token(token, "router.token")
    if "ollama_listen" in router:
        values["ollama_listen"] = check_listen(router["ollama_listen"], "router.ollama_listen")
        if values["ollama_listen"] == listen:
            raise ConfigError(f"router.ollama_listen: {listen} is router.listen already; give the front door "
                              "a port of its own (Ollama clients use 11434, e.g. \"127.0.0.1:11435\" beside it)")
    if "allowed_hosts" in router:
        values["allowed_hosts"] = _check_hosts(router["allowed_hosts"], "router.allowed_hosts")
    policy = _unload_policy(router, "router")
    if policy is not None:
        values["unload"] = policy
    values.update(_alert_settings(router))
    values.update(_front_settings(data.get("front", {})))
    awake = _typed(router, "keep_awake", bool, "router")
    if awake is not None:
        values["keep_awake"] = awake
    identity = router.get("identity")
    if identity is not None:
        if identity not in IDENTITIES:
            raise ConfigError(f"router.identity: expected 'token' or 'tailscale', got {identity!r}")
        values["identity"] = identity
    socket_path = _typed(router, "tailscale_socket", str, "router")
    if socket_path is not None:
        if not socket_path.strip():
            raise ConfigError("router.tailscale_socket: expected the path of tailscaled's socket, got ''")
        values["tailscale_socket"] = base_dir / socket_path
    default_role = router.get("default_role")
    if default_role is not None:
        if default_role not in USER_ROLES:
            raise ConfigError(f"router.default_role: expected 'admin' or 'member', got {default_role!r}")
        values["default_role"] = default_role
    fair = _typed(router, "fair_share", bool, "router")
    if fair is not None:
        values["fair_share"] = fair
    preempts = _typed(router, "interactive_preempts", bool, "router")
    if preempts is not None:
        values["interactive_preempts"] = preempts
    values["users"] = _parse_users(data, values)
    template = _typed(router, "critique_template", str, "router")
    if template is not None:
        if "{subject}" not in template:
            raise ConfigError("router.critique_template: must contain '{subject}'")
        values["critique_template"] = template

    nodes_raw = data.get("node", [])
    if not isinstance(nodes_raw, list):
        raise ConfigError("node: expected [[node]] tables")
    nodes = [_parse_node(t, i) for i, t in enumerate(nodes_raw, start=1)]
    seen_names: dict[str, int] = {}
    seen_ranks: dict[int, str] = {}
    for n in nodes:
        if n.name in seen_names:
            raise ConfigError(f"node '{n.name}'.name: duplicate node name")
        if n.rank in seen_ranks:
            raise ConfigError(f"node '{n.name}'.rank: rank {n.rank} is already used by node '{seen_ranks[n.rank]}'")
        seen_names[n.name] = 1
        seen_ranks[n.rank] = n.name
    values["nodes"] = tuple(sorted(nodes, key=lambda n: n.rank))
    return Settings(**values)


def load_config(path: Path, env_token: bool = True) -> Settings:
    """Read and check `path`; with env_token, $GPUQ_TOKEN is the token when the file sets none."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    settings = replace(parse_config(data, path.resolve().parent), source=path.resolve())
    if not settings.nodes:
        raise ConfigError(f"{path}: node: at least one [[node]] is required")
    if env_token and settings.token is None and "GPUQ_TOKEN" in os.environ:
        # Set but empty is refused, not ignored: a router meant to be locked would run open.
        token = check_token(os.environ["GPUQ_TOKEN"], "$GPUQ_TOKEN")
        if settings.user_by_token(token) is None:
            if settings.user(LEGACY_ADMIN) is not None:
                raise ConfigError(f"$GPUQ_TOKEN: stands for the user '{LEGACY_ADMIN}', and a [[user]] has that "
                                  "name with another token")
            return replace(settings, token=token,
                           users=(UserConfig(name=LEGACY_ADMIN, token=token, role="admin"), *settings.users))
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


def starter_config() -> str:
    """The file `gpuq init` writes: the settings a new lab changes first, each with a comment
    (gpuq.toml.example has every setting)."""
    return f'''# gpuq.toml, written by `gpuq init`. Every setting, with its default and its limits, is in
# gpuq.toml.example. Durations are strings like "90s", "10m", "1h30m".

[router]
# Where the router listens. Loopback: only this machine. To serve your tailnet, use this
# machine's Tailscale address (100.x.y.z:8750), and set a token below.
listen = "{DEFAULT_LISTEN}"
# Base of the preview links the router hands back (and the CLI's default router).
public_url = "http://{DEFAULT_LISTEN}"
# The SQLite file (relative to this file); `sqlite3 gpuq.db` for forensics.
database = "gpuq.db"
# A running job with no new token for this long makes /health red (a stale queue head).
stale_after = "10m"
# The front door: Ollama's and OpenAI's own HTTP API on this address, so `ollama`, `openai`,
# Open WebUI or an editor send their work through gpuq (OLLAMA_HOST=http://127.0.0.1:11435).
ollama_listen = "127.0.0.1:11435"
# A shared secret every client must send (the CLI reads $GPUQ_TOKEN; the front door takes it as
# a Bearer token). Set one before listening on anything but loopback, e.g. the output of
# `python3 -c "import secrets; print(secrets.token_urlsafe(32))"`.
# token = "..."

# One [[node]] per machine running Ollama. rank orders task placement (1 first); roles are
# "task" (long work, the first free node by rank) and "critique" (reviews, on every critique
# node at once, never on the reviewed task's node).
[[node]]
name = "node-1"
url = "http://node-1:11434"
rank = 1
roles = ["task", "critique"]
model = "qwen3-coder:30b"

[[node]]
name = "node-2"
url = "http://node-2:11434"
rank = 2
roles = ["critique"]
model = "deepseek-r1:32b"
'''
