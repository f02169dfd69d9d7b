"""The durable queue: the async facade (Store), the verbs (every SQL statement of the queue),
the one writer thread, the engine seam, and the schema's migrations (shipped as package data)."""

from .facade import MIGRATIONS_DIR, STALE_SQL, Interrupted, NewJob, NodeInfo, Row, Store

__all__ = ["MIGRATIONS_DIR", "STALE_SQL", "Interrupted", "NewJob", "NodeInfo", "Row", "Store"]
