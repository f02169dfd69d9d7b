"""The durable queue: Store (facade.py: a thin API per aggregate over one core) and its reads,
the verbs (every SQL statement that writes the queue: a job's life cycle, queue control,
batches, the router's records, retention, the steps they share), the one writer thread, the
engine seam, and the schema's migrations (shipped as package data)."""

from .facade import MIGRATIONS_DIR, STALE_SQL, Interrupted, NewJob, NodeInfo, Row, Store

__all__ = ["MIGRATIONS_DIR", "STALE_SQL", "Interrupted", "NewJob", "NodeInfo", "Row", "Store"]
