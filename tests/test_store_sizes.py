"""Which tables hold a SQLite database's bytes (gpuq/store/storage.py), as `gpuq storage` shows
them: SQLite's dbstat counts each table's and index's pages; a build without dbstat falls back
to the stored values' lengths, tables only, and says so."""

from __future__ import annotations

from gpuq.store import NewJob, NodeInfo, Store
from gpuq.store.storage import disk_free, file_bytes, sqlite_relations

NODES = [NodeInfo("a", 1, ("task",), "m", True)]


async def test_dbstat_counts_pages_and_the_estimate_counts_the_stored_values(tmp_path):
    path = tmp_path / "q.db"
    store = Store(path)
    await store.open()
    try:
        for i in range(3):
            await store.submit(NewJob("task", f"{i}" * 100_000, node="a"), NODES, "api")
        method, exact, empty, _ = sqlite_relations(path, 5.0)
        fallback, estimated, unknown, _ = sqlite_relations(path, 5.0, dbstat=False)
    finally:
        await store.close()
    assert (method, fallback) == ("dbstat", "estimate")
    assert (empty is not None, unknown) == (True, None)  # the empty space is counted by dbstat only
    assert all(0 <= r["empty_bytes"] <= r["bytes"] for r in exact) and empty >= sum(r["empty_bytes"] for r in exact)
    exact_by = {r["name"]: r for r in exact}
    estimated_by = {r["name"]: r for r in estimated}
    assert exact_by["job"]["bytes"] >= 300_000 and exact_by["job"]["bytes"] % 4096 == 0  # whole pages
    assert exact_by["job_queue"]["kind"] == "index" and exact_by["job_queue"]["table"] == "job"
    assert 300_000 <= estimated_by["job"]["bytes"] < exact_by["job"]["bytes"]  # the values, not their pages
    assert all(r["kind"] == "table" for r in estimated)  # no index is estimated
    main, wal = file_bytes(path)
    assert main > 0 and wal >= 0 and file_bytes(tmp_path / "none.db") == (0, 0)
    assert disk_free(path) > 0
