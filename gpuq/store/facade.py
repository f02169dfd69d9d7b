"""The store: one async object, Store, over the queue's verbs and every read, made of a thin API
per aggregate over one core.

Each write is a verb, a plain function of a connection (a job's life cycle: gpuq/store/lifecycle.py;
queue control: control.py; batches: batches.py; the router's records: records.py; retention:
retention.py), run in the writer's own thread on its connection, in a savepoint of a group commit
(`BEGIN IMMEDIATE` ... `COMMIT`, see writer.py), checked against the job's current state inside
it. A verb becomes a Store method by one typed declaration (core.write: `claim =
write_limited(lifecycle.claim)`); what needs more than one write (a submit's hand-over and its
bounded wait, a backup, compaction, the leases' clock) is a method of its own. Reads go through a
second connection (aiosqlite's, its public API; psycopg's pool), which WAL lets in alongside.

- core.py: the engine, the connections, `_write` (the one writer), `read`, the store's health;
- jobs_api.py: a job's life and the queue's control, users' max_running;
- batches_api.py: batches and their files;
- upkeep_api.py: backups, the storage budget, retention's writes;
- router_api.py: the router's records (settings, nodes, reloads, alerts), leases, other routers;
- reads.py and batch_reads.py: every read; usage.py: usage over time.

The engine is SQLite (a file's path: one router) or PostgreSQL (a `postgresql://` DSN: any number
of routers on one queue, gpuq/store/postgres.py): the same verbs, reads and answers; the few
statements written per engine come from its module (`self.engine`)."""

from __future__ import annotations

from ..jobs import Interrupted, NewJob, NodeInfo
from .backup import BackupBusy
from .batch_reads import BatchReads
from .batches_api import BatchVerbs
from .core import MIGRATIONS_DIR, migration_files
from .jobs_api import JobVerbs
from .reads import Reads
from .router_api import RouterRecords
from .sqlite import STALE_SQL
from .steps import Row
from .upkeep_api import UpkeepVerbs
from .usage import UsageReads

__all__ = [
    "BackupBusy",
    "Interrupted",
    "MIGRATIONS_DIR",
    "NewJob",
    "NodeInfo",
    "Row",
    "STALE_SQL",
    "Store",
    "migration_files",
]


class Store(JobVerbs, BatchVerbs, UpkeepVerbs, RouterRecords, Reads, BatchReads, UsageReads):
    """The durable queue: every write through the one writer, every read on the readers."""
