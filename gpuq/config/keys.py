"""Every gpuq.toml key, declared once (Key, KEYS), and the known keys of each table."""

from __future__ import annotations

from dataclasses import dataclass

from .settings import DEFAULT_LISTEN, FRONT_MAX_BATCH_LINES, FRONT_MAX_REQUEST_BYTES, LANES


@dataclass(frozen=True)
class Key:
    """One gpuq.toml key, declared once: the parser takes its known keys (and which are durations)
    from KEYS, gpuq/reload.py what a reload keeps from `restart`, and the documentation's
    configuration reference is rendered from these records (docs/hooks/config_reference.py)."""

    section: str  # "router", "front", "retention", "backup", "storage", "node" or "user": [router]... [[user]]
    name: str  # as written in gpuq.toml
    doc: str
    default: object = None  # the value when the key is left out, as TOML writes it; None: see `shown`
    shown: str | None = None  # what the reference says of the default instead (a computed one, an absence)
    attr: str | None = (
        None  # the field it sets (Settings for [router], [front], [retention], else NodeConfig or UserConfig)
    )
    duration: bool = False  # "90s", "10m", "1h30m", "250ms" or a number of seconds
    # Bound into what the router opened at its start: a reload (SIGHUP, `gpuq reload`) keeps the
    # value in force and names the file's new one as needing a restart. Every other key is live.
    restart: bool = False


def _r(
    name: str,
    doc: str,
    default: object = None,
    shown: str | None = None,
    attr: str | None = None,
    duration: bool = False,
    restart: bool = False,
) -> Key:
    return Key("router", name, doc, default, shown, attr or (f"{name}_s" if duration else name), duration, restart)


KEYS: tuple[Key, ...] = (
    # -- where the router listens, and who may call it
    _r(
        "listen",
        "host:port the router binds. Loopback: only this machine. To serve your tailnet, this "
        "machine's Tailscale address (100.x.y.z:8750); `0.0.0.0` exposes it to your LAN too.",
        DEFAULT_LISTEN,
        restart=True,
    ),
    _r(
        "public_url",
        "Base of the preview links the router hands back, and the CLI's default router. "
        "Scheme, host, port and an optional path prefix; no query, fragment or user:password@.",
        shown='"http://" + listen',
        restart=True,
    ),
    _r(
        "allowed_hosts",
        "More host names the router and the front door answer to, beside Ollama's rule "
        "(see Reliability: host names); the host name alone, no port or scheme. Any other Host header gets 421.",
        [],
        restart=True,
    ),
    _r(
        "token",
        "A shared secret every /api call and front-door call must send (`Authorization: Bearer`); "
        "printable ASCII, not empty, no spaces around it. It stands for the admin user `admin` (unless a "
        "[[user]] has it). "
        "Unset: `$GPUQ_TOKEN`, else no token.",
        shown="not set",
        restart=True,
    ),
    _r(
        "identity",
        '"token", or "tailscale": a request without a token is whoever tailscaled says owns '
        "its connection (its login name).",
        "token",
    ),
    _r(
        "default_role",
        'The role ("admin" or "member") of a tailnet login with no [[user]] of its name; '
        "unset, such a login is refused (403).",
        shown="not set",
    ),
    _r(
        "tailscale_socket",
        'tailscaled\'s LocalAPI socket, for `identity = "tailscale"` (relative to '
        "the config's folder); absent, `tailscale whois` is run instead (macOS's app).",
        "/var/run/tailscale/tailscaled.sock",
    ),
    _r(
        "ollama_listen",
        "host:port of the front door, the second listener that answers as an Ollama "
        "server (and OpenAI's and Anthropic's APIs). Unset: no front door.",
        shown="not set (off)",
        restart=True,
    ),
    # -- the database
    _r(
        "database",
        "The SQLite file (relative to the config's folder), or a PostgreSQL URI "
        "(`postgresql://user@host/dbname`) for several routers on one queue. `$GPUQ_DATABASE` and "
        "`gpuq serve --database` win over it.",
        "gpuq.db",
        restart=True,
    ),
    _r(
        "busy_timeout",
        "How long a write waits for a SQLite lock (a write transaction held in the "
        "sqlite3 shell) before that request fails with 503.",
        "5s",
        duration=True,
        restart=True,
    ),
    _r(
        "submit_timeout",
        'The longest a submit waits for the database to take it; then 503 "the '
        'database did not take the submit within ..." and nothing is stored.',
        "5s",
        duration=True,
        restart=True,
    ),
    _r(
        "max_database_bytes",
        "Cap on the SQLite database, at least 65536: it counts the database's pages (page_count x page_size,"
        " free pages included; not the WAL), SQLite's max_page_count. At it, a write that needs more room"
        " fails with 503 naming this cap; near it (nine tenths), a warning and an alert. Unset: no cap.",
        shown="not set",
        restart=True,
    ),
    _r(
        "lease",
        "PostgreSQL: how long a router's hold on a node lasts unrenewed (renewed every third "
        "of it); a router that stops answering loses its nodes after it. At least 1s.",
        "10s",
        duration=True,
    ),
    # -- jobs and their limits
    _r(
        "stale_after",
        "A running job with no new token for this long is a stale queue head: /health red, an alert.",
        "10m",
        duration=True,
    ),
    _r("stale_grace", "Ollama finished the stream but the job did not close within this: stale.", "30s", duration=True),
    _r(
        "max_runtime", "No job runs longer than this; past it the job fails, loudly. Per node too.", "4h", duration=True
    ),
    _r(
        "job_timeout",
        "Default wall-clock limit per job (a job's own `--timeout` wins). Unset: only max_runtime.",
        shown="not set",
        duration=True,
    ),
    _r(
        "load_timeout",
        "How long a job may wait for its first token (a cold model load) before it fails.",
        "10m",
        duration=True,
    ),
    _r(
        "stall_timeout",
        "After the first token, no new token for this long fails the job (bytes without a token are no progress).",
        "5m",
        duration=True,
    ),
    _r(
        "unload_timeout",
        "How long a model may take to leave VRAM after a job before its node is flagged (`vram_stuck`).",
        "30s",
        duration=True,
    ),
    _r(
        "health_interval",
        "How often each node's Ollama is checked (`/api/version`, `/api/tags`). At least 100ms.",
        "15s",
        duration=True,
    ),
    _r("connect_timeout", "How long connecting to a node's Ollama may take.", "10s", duration=True),
    _r(
        "max_prompt_bytes",
        "The largest prompt accepted, in bytes (larger: 413); at most 64 MiB "
        "(67108864). A front-door request's text is held to it too.",
        1_000_000,
        restart=True,
    ),
    _r(
        "max_output_bytes",
        "A job's answer and reasoning held past this many bytes fails the job, its "
        "output so far kept. From 1024 to 1 GiB. Per node too.",
        8 << 20,
    ),
    _r(
        "max_reply_bytes",
        "A node's non-streamed reply (`/api/tags`, `/api/ps`, `/api/show`, "
        "`/api/version`, an unload) longer than this fails its call. From 64 KiB to 1 GiB.",
        16 << 20,
    ),
    _r(
        "unload",
        '"after-each": every job\'s model is unloaded after it and checked gone from VRAM. '
        '"when-idle": kept loaded across back-to-back jobs of one model, unloaded when the node goes '
        "idle or switches model. Per node too.",
        "after-each",
    ),
    _r(
        "critique_template",
        "The critique instruction; `{subject}` (required) is the document, or the task and its result.",
        shown="a reviewer's instruction (`DEFAULT_CRITIQUE_TEMPLATE` in gpuq/config/settings.py)",
    ),
    # -- users and priorities
    _r(
        "fair_share",
        "Interleave users' batch jobs as they enter a queue (a user's k-th waiting batch "
        "job before anyone's (k+1)-th).",
        shown="on with two users or more",
    ),
    _r(
        "interactive_preempts",
        "An interactive job queued on a node running a batch job interrupts it, as `gpuq preempt` "
        "would, so a person never waits for a batch job; a batch job already interrupted twice runs "
        "to its end (the most of its work thrown away). `false`: an interactive job waits for the "
        "running job, whatever its lane.",
        True,
    ),
    _r(
        "private",
        "With [[user]]s, a member sees other users' jobs as placeholders (owner, state, node, place, "
        "times, token counts; no prompt, output or request) and only their own in full; an admin sees "
        "all (Slurm's `PrivateData=jobs`; see Users: private prompts). Off: a lab that shares its work "
        "sees it all, as before.",
        False,
    ),
    # -- connections
    _r(
        "header_timeout",
        "A new connection must send its request headers within this (else 408).",
        "10s",
        duration=True,
        restart=True,
    ),
    _r(
        "body_timeout",
        "A request's whole body must arrive within this of its headers (else 408); "
        "a batch file's upload (`POST /v1/files`) too.",
        "60s",
        duration=True,
        restart=True,
    ),
    _r(
        "keepalive_timeout",
        "An idle kept-alive connection is closed after this (an open event or job stream is not idle).",
        "75s",
        duration=True,
        restart=True,
    ),
    _r(
        "keepalive_lifetime",
        "A kept-alive connection open this long is closed after its current request, however busy.",
        "1h",
        duration=True,
        restart=True,
    ),
    _r(
        "max_connections",
        "Open connections per listener (the router, the front door each); more are answered 503. From 8 to 1000000.",
        1000,
        restart=True,
    ),
    _r(
        "max_connections_per_peer",
        "Open connections per listener and client address, loopback too "
        "(raise it behind a reverse proxy on this host); more get 429. From 1 to 1000000.",
        64,
        restart=True,
    ),
    # -- operations
    _r(
        "alert_url",
        "Where alerts are POSTed (a webhook, an ntfy topic URL). Unset: firings are recorded, not sent.",
        shown="not set",
    ),
    _r(
        "alert_format",
        '"json" (the alert as a JSON body) or "ntfy" (Title header, text body). Needs alert_url.',
        "json",
    ),
    _r("alert_token", "Sent with each alert as `Authorization: Bearer <token>`. Needs alert_url.", shown="not set"),
    _r(
        "keep_awake",
        "While any job runs, hold a sleep inhibitor (macOS `caffeinate`, Linux `systemd-inhibit`).",
        True,
        restart=True,
    ),
    _r(
        "shutdown_grace",
        "How long a SIGTERM lets running jobs finish before the router stops at once, "
        "failing them; keep it under the service manager's own limit. A Ctrl-C waits without a bound.",
        "15s",
        duration=True,
    ),
    # -- [front]
    Key(
        "front",
        "max_request_bytes",
        "A front-door request's whole body, images included; from 1 MiB "
        "to 1 GiB. Its text is held to router.max_prompt_bytes. A batch's input file "
        "(`POST /v1/files`) is one request: this bounds it too.",
        FRONT_MAX_REQUEST_BYTES,
        attr="front_max_request_bytes",
        restart=True,
    ),
    Key(
        "front",
        "max_batch_lines",
        "The most requests one batch may hold (more: 400), from 1 to 1,000,000. Live.",
        FRONT_MAX_BATCH_LINES,
        attr="front_max_batch_lines",
    ),
    Key(
        "front",
        "origins",
        "Browser origins that may call the front door, beside Ollama's defaults; as "
        'OLLAMA_ORIGINS, exact or with one `*` (`"*"` alone: every page, only with a token).',
        [],
        attr="front_origins",
        restart=True,
    ),
    Key(
        "front",
        "keep_alive",
        "How long a front-door call's model stays loaded when its client sends "
        "no keep_alive, while nothing else waits for the node. 0: unloaded after each call.",
        "5m",
        attr="front_keep_alive_s",
        duration=True,
    ),
    Key(
        "front",
        "max_keep_alive",
        'The most any call keeps its model loaded (a "forever" asked becomes this).',
        "30m",
        attr="front_max_keep_alive_s",
        duration=True,
    ),
    Key(
        "front",
        "stalled_client_timeout",
        "A streaming client that takes nothing of its answer for this long is cut off (its "
        "connection closed); its job runs on and keeps its whole output. A client that reads, "
        "however slowly, is never cut: past 512 KiB behind its stream, the rest waits for it "
        "on disk (the call's spool) and it is caught up from there. A batch file's download or a "
        "batch's results that its client takes nothing of for this long is cut off too.",
        "30s",
        attr="front_stalled_client_s",
        duration=True,
    ),
    Key(
        "front",
        "model_aliases",
        "Model names no node has, given a model of the lab: a table of shell-style patterns "
        '(case-insensitive) to model names, like `{"claude-*" = "qwen3:8b", "gpt-*" = "qwen3:8b"}`; '
        "the first pattern a name matches wins. For clients that ask their own default model "
        "(Claude Code, Codex). The job keeps the name asked in its request and runs the model given.",
        {},
        shown="none",
        attr="front_model_aliases",
    ),
    # -- [retention] (gpuq/config/retention.py): what an ended job keeps, for how long
    Key(
        "retention",
        "prune_after",
        "How long after a done job ended its bulk is pruned: a front-door call's request "
        "(its images too), the output and the reasoning, and its prompt past the first 300 characters. The "
        'job, its runs and events stay, and say "output pruned on <date> (retention)". A period ("30d", '
        '"12h") or "off".',
        "30d",
        attr="retention_prune_after_s",
    ),
    Key(
        "retention",
        "prune_failed_after",
        "The same for a failed job: kept longer, for forensics.",
        "90d",
        attr="retention_prune_failed_after_s",
    ),
    Key(
        "retention",
        "prune_cancelled_after",
        "The same for a cancelled job: an editor's abandoned completions (thousands a day, each with the "
        "file around its cursor) and jobs someone cancelled. Kept a day, as River keeps its cancelled jobs.",
        "1d",
        attr="retention_prune_cancelled_after_s",
    ),
    Key(
        "retention",
        "delete_after",
        "How long after an ended job its rows go too (the job, its runs, its events), archived first: the "
        "archive keeps the record (`gpuq archive search`). A critique's parent stays while a critique of it "
        'has not ended. "off": kept for ever.',
        "90d",
        attr="retention_delete_after_s",
    ),
    Key(
        "retention",
        "archive",
        "The directory a job is written to (one gzip JSON Lines file a month, `jobs-YYYY-MM.jsonl.gz`, "
        "by the month the job was made; a month whose file was damaged goes on in `jobs-YYYY-MM.2.jsonl.gz`, "
        '`.3`, ...) before its bulk or its rows leave the database. "off": not archived.',
        shown="`gpuq-archive` beside the database",
        attr="retention_archive",
    ),
    Key(
        "retention",
        "every",
        "How often the sweep runs (and once a minute after the router starts).",
        "1h",
        attr="retention_every_s",
        duration=True,
    ),
    Key(
        "retention",
        "batch",
        "The most jobs per transaction of the sweep: each holds the database's writer a few milliseconds. "
        "A batch also stops at 1 MiB of archived jobs, and is halved after one that held the writer over "
        "20 ms (growing back after short ones). 1 to 10000.",
        100,
        attr="retention_batch",
    ),
    Key(
        "retention",
        "compact",
        "SQLite: when the space left empty inside the database file (pruned rows leave their pages part empty, "
        "which the sweep's incremental_vacuum cannot give back), past what a compacted file holds empty "
        "anyway (about 15%: a B-tree's pages are never all full), reaches this share of it, a sweep that shed "
        "bulk with no job waiting or running rewrites the file without it (`VACUUM`: it holds the writer "
        "meanwhile, about 0.2 s for 10 MB; `gpuq storage` shows the unused bytes). Less than 1 MiB past that "
        'is never worth a rewrite, whatever the share. A percentage ("10%") or "off".',
        "10%",
        attr="retention_compact_share",
    ),
    # -- [backup]
    Key(
        "backup",
        "every",
        "How often the router backs its SQLite database up by itself (a checked `VACUUM INTO` copy, "
        'as `gpuq backup` makes), e.g. "1d", "6h"; "off" (or 0) turns it off. On by default: the '
        "database is often a laptop's only record of its queue, and a torn or mistaken file is lost "
        "without one; a daily compact copy costs little. Refused on PostgreSQL (use pg_dump). Reloads.",
        "1d",
        attr="backup_every_s",
        duration=True,
    ),
    Key(
        "backup",
        "keep",
        "How many scheduled backups are kept: after each, the oldest the router wrote beyond this "
        "are deleted (never a file it did not write). From 1 to 1000. Reloads.",
        7,
        attr="backup_keep",
    ),
    Key(
        "backup",
        "dir",
        "Where scheduled backups go (relative to gpuq.toml's folder), each named "
        "`<database>-<UTC time>.db`; another disk is safer. Made when missing. Reloads.",
        shown="gpuq-backups/ beside the database",
        attr="backup_dir",
    ),
    # -- [storage]
    Key(
        "storage",
        "warn_days",
        "A warning on /health and the page, and an alert, when at the database's growth per day its "
        "disk fills (or router.max_database_bytes is reached) within this many days. Reloads.",
        14,
        attr="storage_warn_days",
    ),
    Key(
        "storage",
        "sample_every",
        "How often the router records the database's size and its disk's free space (its growth "
        "per day is read from these samples). Reloads.",
        "1h",
        attr="storage_sample_s",
        duration=True,
    ),
    Key(
        "storage",
        "min_free_bytes",
        "A warning and an alert at once, whatever the growth, when the database's disk has less free "
        "than this many bytes (a full disk always warns; 0: only then). Reloads.",
        1_000_000_000,
        attr="storage_min_free",
    ),
    # -- [[node]]
    Key("node", "name", "The node's name: letters, digits, `.`, `_`, `-`; unique.", shown="required", attr="name"),
    Key(
        "node",
        "url",
        "Its Ollama's base URL (a path prefix is fine, behind a reverse proxy; no query, fragment or user:password@).",
        shown="required",
        attr="url",
    ),
    Key(
        "node",
        "rank",
        "Task placement order: the first free task node by rank (lowest first); unique.",
        shown="required",
        attr="rank",
    ),
    Key(
        "node",
        "roles",
        '"task" (long work) and/or "critique" (reviews, fanned out to every critique '
        "node, never on the parent task's node).",
        shown="required",
        attr="roles",
    ),
    Key("node", "model", "The model this node runs for jobs that name none.", shown="required", attr="model"),
    Key("node", "max_runtime", "This node's max_runtime.", shown="the router's", attr="max_runtime_s", duration=True),
    Key(
        "node",
        "think",
        "Ollama's `think` for jobs of this node's own model: true, false, or "
        '"low" | "medium" | "high". A job\'s own wins.',
        shown="Ollama's default",
        attr="think",
    ),
    Key(
        "node",
        "options",
        "Ollama model options for every job the node runs (e.g. `{ num_ctx = 32768 }`); "
        "a job's own options win, key by key.",
        shown="none",
        attr="options",
    ),
    Key("node", "unload", "This node's unload policy.", shown="the router's", attr="unload"),
    Key("node", "max_output_bytes", "This node's max_output_bytes.", shown="the router's", attr="max_output_bytes"),
    # -- [[user]]
    Key(
        "user",
        "name",
        "Who the user is on jobs and events; a tailnet user's is their login name (`alice@example.com`).",
        shown="required",
        attr="name",
    ),
    Key("user", "token", "Their token, written out.", shown="none: known by their tailnet login", attr="token"),
    Key(
        "user",
        "token_env",
        "The environment variable that holds their token (keeps it out of the file); not both token and token_env.",
        shown="none",
        attr="token",
    ),
    Key(
        "user",
        "role",
        '"admin" (acts on every job, reloads) or "member" (submits; acts on their own jobs).',
        "member",
        attr="role",
    ),
    Key(
        "user",
        "lanes",
        'The lanes they may submit to; ["batch"]: never the interactive lane.',
        list(LANES),
        attr="lanes",
    ),
    Key(
        "user",
        "max_waiting",
        "Their queued jobs at once; a submit beyond is 429 with Retry-After. From 1 to 1000000.",
        shown="no limit",
        attr="max_waiting",
    ),
    Key(
        "user",
        "max_running",
        "Their running jobs at once; more wait even on a free node. From 1 to 1000000.",
        shown="no limit",
        attr="max_running",
    ),
)


def keys_of(section: str) -> frozenset[str]:
    """The keys a table may hold: what the parser takes, a misspelt key is named with these."""
    return frozenset(k.name for k in KEYS if k.section == section)


ROUTER_KEYS = keys_of("router")
FRONT_KEYS = keys_of("front")
NODE_KEYS = keys_of("node")
USER_KEYS = keys_of("user")
RETENTION_KEYS = keys_of("retention")
BACKUP_KEYS = keys_of("backup")
STORAGE_KEYS = keys_of("storage")
