"""The settings gpuq.toml gives, as frozen dataclasses (Settings, NodeConfig, UserConfig), with
their defaults and the words each key may take."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

DEFAULT_LISTEN = "127.0.0.1:8750"
DAY_S = 86400.0
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
FRONT_MAX_BATCH_LINES = 50_000  # OpenAI's own limit of requests in a batch


@dataclass(frozen=True)
class NodeConfig:
    name: str
    url: str
    rank: int
    roles: tuple[str, ...]
    model: str
    max_runtime_s: float | None = None  # None: the router's max_runtime
    think: bool | str | None = None  # Ollama's `think` for this node's jobs; None: Ollama's default
    options: dict[str, Any] | None = field(default=None, hash=False)  # Ollama model options, e.g. num_ctx
    unload: str | None = None  # "after-each" | "when-idle"; None: the router's
    max_output_bytes: int | None = None  # None: the router's


USER_ROLES = ("admin", "member")
LANES = ("interactive", "batch")
IDENTITIES = ("token", "tailscale")
LEGACY_ADMIN = "admin"  # the user the single [router] token stands for
UNLOAD_POLICIES = ("after-each", "when-idle")
ALERT_FORMATS = ("json", "ntfy")


@dataclass(frozen=True)
class UserConfig:
    """One [[user]]: who a token (or a tailnet login) stands for, and what they may do."""

    name: str  # as shown on jobs and events; a tailnet user's is their login name
    token: str | None = field(default=None, repr=False)  # None: identified by the tailnet only
    role: str = "member"  # "admin": may act on every job; "member": submits, acts on their own jobs
    lanes: tuple[str, ...] = LANES  # the lanes they may submit to (("batch",): never ahead of others)
    max_waiting: int | None = None  # queued jobs at once; a submit beyond is 429
    max_running: int | None = None  # running jobs at once; more wait even on a free node
    token_env: str | None = field(default=None, compare=False)  # the variable their token is read from

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
    front_max_batch_lines: int = FRONT_MAX_BATCH_LINES  # [front] max_batch_lines: the requests of one batch (400)
    # [front] keep_alive: how long a front-door call's model stays loaded when its client sends no
    # keep_alive (Ollama's own default, envconfig OLLAMA_KEEP_ALIVE: 5m), and [front]
    # max_keep_alive: the most any call keeps it ("forever" asked becomes this). Honoured only while
    # nothing else waits for the node: the next job of another model unloads it first.
    front_keep_alive_s: float = 300.0
    front_max_keep_alive_s: float = 1800.0
    # [front] model_aliases: (name pattern, model) in the file's order; a called name no node has
    # runs as the model of the first pattern it matches (Claude Code's claude-* -> a lab model)
    front_model_aliases: tuple[tuple[str, str], ...] = ()
    # [front] stalled_client_timeout: a streaming client that takes nothing of a write for this
    # long is cut off (its connection closed; its job runs on): gpuq/front/call.py Call.write.
    front_stalled_client_s: float = 30.0
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
    # [retention] (gpuq/config/retention.py): an ended job's bulk (front-door request, output,
    # reasoning) is pruned this long after it ended (done and cancelled; failed ones, kept longer
    # for forensics), its rows deleted after `retention_delete_after_s`; None: never.
    retention_prune_after_s: float | None = 30 * DAY_S
    retention_prune_failed_after_s: float | None = 90 * DAY_S
    retention_prune_cancelled_after_s: float | None = DAY_S  # River's cancelled jobs: a day
    retention_delete_after_s: float | None = 90 * DAY_S
    # Where what leaves the database is written first (one gzip JSON Lines file a month); None: off.
    # Left out: the directory gpuq-archive beside the database (the parser puts it there).
    retention_archive: Path | None = Path("gpuq-archive")
    retention_every_s: float = 3600.0  # how often the sweep runs (and once at the start)
    retention_batch: int = 100  # jobs per transaction: each holds the writer a few milliseconds
    # SQLite: a sweep compacts the file (VACUUM) at idle once this share of it is empty; None: never
    retention_compact_share: float | None = 0.1
    # [backup]: the router backs its SQLite database up itself (gpuq/upkeep/backups.py). On by
    # default: see the key's doc in keys.py. None: off (every = "off"), and always on PostgreSQL.
    backup_every_s: float | None = 86400.0
    backup_keep: int = 7  # the newest scheduled backups kept; older ones the router wrote are deleted
    backup_dir: Path | None = None  # None: gpuq-backups/ beside the database
    # [storage]: warn (and alert) when, at the database's growth, its disk or max_database_bytes
    # is reached within this many days; the database's size is sampled every storage_sample_s.
    storage_warn_days: float = 14.0
    storage_sample_s: float = 3600.0
    storage_min_free: int = 1_000_000_000  # the disk is nearly full below this: warned of at once
    nodes: tuple[NodeConfig, ...] = field(default_factory=tuple)
    users: tuple[UserConfig, ...] = field(default_factory=tuple)  # [[user]] (and the token's admin)
    identity: str = "token"  # "tailscale": a caller without a token is who tailscaled says owns it
    # tailscaled's LocalAPI socket (identity = "tailscale"); absent: `tailscale whois` (macOS's app)
    tailscale_socket: Path = Path("/var/run/tailscale/tailscaled.sock")
    default_role: str | None = None  # a tailnet login with no [[user]]: this role; None: refused
    fair_share: bool | None = None  # interleave users' batch jobs; None: on with two users or more
    # An interactive job queued behind a running batch job interrupts it (gpuq preempt's way),
    # unless that job was interrupted placement.MAX_PREEMPTIONS times already.
    interactive_preempts: bool = True
    # A member sees other users' jobs as placeholders, their own in full (gpuq/access/privacy.py).
    private: bool = False
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
    def backups_dir(self) -> Path | None:
        """Where scheduled backups go: [backup] dir, else gpuq-backups/ beside the database; None
        on PostgreSQL (pg_dump's, not gpuq's)."""
        if not isinstance(self.database, Path):
            return None
        return self.backup_dir or self.database.parent / "gpuq-backups"

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
