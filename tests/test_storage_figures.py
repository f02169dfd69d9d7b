"""The storage figures are true (issue 43, item 7), on real SQLite files: the size the cap counts
is the database's pages, not the file plus a WAL that a checkpoint folds back; growth says the
window it was measured over, and a WAL that grows while no row is added is no growth; a full or
nearly full disk warns at once; the cap, once reached, is named by the warning and the refusal;
a new database has nothing "left by pruned rows"; `gpuq prune --dry-run` counts the rows a
deletion takes, not only their prompts. And an idle router (the real daemon) writes nothing."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from conftest import eventually, node_table

from gpuq.cli.storage import summary
from gpuq.config import Settings
from gpuq.errors import GpuqError
from gpuq.jobs import NewJob
from gpuq.store import NodeInfo, Store
from gpuq.store.leases import Router
from gpuq.upkeep.retention import Sweeper
from gpuq.upkeep.storage import StorageWatch

NOW = 1_800_000_000.0
DAY = 86400.0
NODES = [NodeInfo("a", 1, ("task",), "m", True, idle=False)]


def pages_of(path: Path) -> int:
    """The database's pages in bytes, as SQLite counts them (another connection's view)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()


def checkpoint(path: Path) -> None:
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        db.close()


def watch(store: Store, clock, **settings) -> StorageWatch:
    values = Settings(storage_min_free=0, **settings)
    return StorageWatch(lambda: values, store, clock)


async def opened(path: Path, clock=None, **kwargs) -> Store:
    store = Store(path, clock=clock, **kwargs) if clock else Store(path, **kwargs)
    await store.open()
    return store


async def test_the_cap_counts_the_pages_and_a_wal_past_it_is_no_warning(tmp_path):
    """The issue's "768.8 kB of router.max_database_bytes 360.0 kB; it reaches the cap soon"
    while submits still worked: the WAL was counted, though the cap (max_page_count) is pages."""
    path = tmp_path / "q.db"
    store = await opened(path)
    try:
        for i in range(150):  # each commit appends the pages it changed to the WAL
            [job] = await store.submit(NewJob("task", f"question {i}", node="a"), NODES, "api")
            await store.delete(job["id"], "api")
        sizes = await store.storage_now()
        pages = pages_of(path)
        assert sizes["database_bytes"] == pages < sizes["file_bytes"] + sizes["wal_bytes"], sizes
        cap = int(pages * 1.5)  # the pages are two thirds of it; the file and its WAL are past it
        assert sizes["file_bytes"] + sizes["wal_bytes"] > cap
        seen = watch(store, lambda: NOW, max_database_bytes=cap)
        await seen.run_once()
        shown = seen.json()
        assert shown is not None and shown["warnings"] == [] and shown["database_bytes"] == pages, shown
    finally:
        await store.close()


async def test_at_the_cap_the_refusal_and_the_warning_name_it(tmp_path):
    path = tmp_path / "q.db"
    cap = 512 * 1024
    store = await opened(path, max_bytes=cap)
    try:
        refused = None
        for i in range(400):
            try:
                await store.submit(NewJob("task", f"{i:04d} " + "x" * 3000, node="a"), NODES, "api")
            except GpuqError as exc:
                refused = exc
                break
        assert refused is not None and refused.status == 503, "the database never reached its cap"
        assert refused.message.startswith(
            "the database cannot be written: it reached router.max_database_bytes (524.3 kB; "
        ), refused.message
        assert "disk is full" not in refused.message and refused.message.endswith("nothing was changed")
        seen = watch(store, lambda: NOW, max_database_bytes=cap)
        await seen.run_once()
        [warning] = seen.json()["warnings"]
        assert warning.startswith(f"{path} is at router.max_database_bytes 524.3 kB ("), warning
        assert warning.endswith("left): a write that needs more room is refused")
        assert [c.alert for c in seen.conditions()] == ["database_filling"]
    finally:
        await store.close()


async def test_growth_says_its_window_and_a_wal_that_grows_with_no_new_row_is_no_growth(tmp_path):
    """The issue's idle router: its WAL grew about 160 kB a minute (lease heartbeats) while the
    file stayed, and that was "+74.3 MB/day over the last week" after one hour of samples."""
    now = [NOW]
    path = tmp_path / "q.db"
    store = await opened(path, clock=lambda: now[0])
    try:
        checkpoint(path)  # the migrations' WAL folded into the file: the WAL starts empty
        seen = watch(store, lambda: now[0], storage_sample_s=3600.0)
        await seen.run_once()  # the first sample
        wal = (await store.storage_now())["wal_bytes"]
        me = Router.new("127.0.0.1:1", None, now[0])
        await store.take_nodes(me, ["a"], 10.0)
        for _ in range(200):  # heartbeats: the same rows written again, no row added
            now[0] += 3
            await store.renew_nodes(me, ["a"], 10.0)
        assert (await store.storage_now())["wal_bytes"] > wal + 500_000  # the WAL grew
        now[0] += 3000
        seen.sampled_at -= 3600  # (its own monotonic clock: the hour passed for it too)
        await seen.run_once()
        shown = seen.json()
        assert (shown["growth_bytes_per_day"], shown["growth_window_s"]) == (0, 3600), shown
        assert "growth: +0 B/day over the last 1 h (samples of the last week, read oldest to newest)" in summary(
            shown | {"backup": {"last": None, "scheduled": False, "off": "off"}, "method": "dbstat", "relations": []}
        )

        # Rows added: the growth and the days left say the hour they were measured over.
        for i in range(30):
            await store.submit(NewJob("task", f"{i} " + "y" * 20_000, node="a"), NODES, "api")
        now[0] += 3600
        seen.sampled_at -= 3600
        seen.settings_of = lambda: Settings(storage_min_free=0, storage_warn_days=1e9, storage_sample_s=3600.0)
        await seen.run_once()
        shown = seen.json()
        assert shown["growth_window_s"] == 7200 and shown["growth_bytes_per_day"] > 0, shown
        [warning] = shown["warnings"]
        assert "at the database's growth (+" in warning and "/day over the last 2 h; " in warning, warning
        lines = summary(
            shown | {"backup": {"last": None, "scheduled": False, "off": "off"}, "method": "dbstat", "relations": []}
        )
        assert any(line.endswith("days at the growth of the last 2 h") for line in lines), lines
    finally:
        await store.close()


async def test_a_full_or_nearly_full_disk_warns_and_alerts_at_once_with_no_samples(tmp_path):
    store = await opened(tmp_path / "q.db")
    try:
        seen = watch(store, lambda: NOW)
        seen.settings_of = lambda: Settings(storage_min_free=1 << 60)  # more than any disk here has free
        await seen.run_once()  # the first measure: no growth known
        shown = seen.json()
        assert shown["growth_bytes_per_day"] is None and shown["min_free_bytes"] == 1 << 60
        [warning] = shown["warnings"]
        assert warning.startswith(f"the disk holding {tmp_path / 'q.db'} is nearly full: "), warning
        assert [c.alert for c in seen.conditions()] == ["disk_filling"]
    finally:
        await store.close()


async def test_a_new_database_has_nothing_to_reclaim_and_says_what_its_empty_room_is(tmp_path):
    """The issue's new database: 60 tables at 4.1 kB each and 241.9 kB "left by pruned rows"."""
    store = await opened(tmp_path / "q.db")
    try:
        found = await store.relations()
        # Each table and index keeps its page however empty: a few free pages (those the
        # migrations' table rebuilds left) are all a compaction could take, far under its 1 MiB.
        assert found["empty_bytes"] > 100_000 and found["reclaimable_bytes"] <= 10 * 4096, found
        assert found["reclaimable_bytes"] * 5 < found["empty_bytes"], found
        one_page = [r for r in found["relations"] if r["pages"] == 1]
        assert len(one_page) > 30
        total = sum(r["bytes"] for r in found["relations"])
        for r in found["relations"]:
            r["share"] = r["bytes"] / total
        lines = summary(
            {"database": "q.db", "database_bytes": total, "file_bytes": 4096, "wal_bytes": 0, "free_bytes": None}
            | {"backup": {"last": None, "scheduled": False, "off": "off"}}
            | found
        )
        text = "\n".join(lines)
        assert "pruned rows" not in text, text
        reclaimable = f"{found['reclaimable_bytes'] / 1000:.1f} kB"
        assert f"a compaction could give back at most {reclaimable} (" in text and "1 MiB" in text, text
        assert f"  and {len(one_page)} more tables and indexes of one page each (4.1 kB)" in lines, text

        # Rows pruned: what they shed leaves their pages part empty, and that is reclaimable.
        for i in range(600):
            [job] = await store.submit(NewJob("task", f"{i} " + "a long prompt " * 70, node="a"), NODES, "api")
            await store.delete(job["id"], "api")
        settings = Settings(retention_archive=tmp_path / "archive", retention_compact_share=None)
        store.clock = lambda: NOW + 40 * DAY  # past prune_after, not delete_after
        await Sweeper(store, lambda: settings, lambda: None).run_once()
        found = await store.relations()
        assert 300_000 < found["reclaimable_bytes"] <= found["empty_bytes"], found
    finally:
        await store.close()


def payload(path: Path, tables: tuple[str, ...]) -> int:
    """The bytes the rows of `tables` take in their pages (dbstat's payload: values and headers)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        marks = ",".join("?" * len(tables))
        return db.execute(f"SELECT SUM(payload) FROM dbstat WHERE name IN ({marks})", tables).fetchone()[0]
    finally:
        db.close()


async def test_the_dry_run_counts_the_rows_a_deletion_takes(tmp_path):
    """The issue's "(102 bytes)" for 3 jobs, 3 runs and 9 events: only the prompts were counted."""
    now = [NOW]
    path = tmp_path / "q.db"
    store = await opened(path, clock=lambda: now[0])
    try:
        for i in range(3):
            [job] = await store.submit(NewJob("task", f"question {i}", node="a"), NODES, "cli 127.0.0.1")
            claimed = await store.claim("a")
            await store.save_output(claimed["run_id"], f"answer {i}")
            await store.work_done(claimed["run_id"], None, {"eval_count": 3, "done_reason": "stop"})
            await store.finish(job["id"], claimed["run_id"], "done", None)
        now[0] += 400 * DAY  # past delete_after (90 days)
        settings = Settings(retention_archive=tmp_path / "archive", retention_compact_share=None)
        sweeper = Sweeper(store, lambda: settings, lambda: None)
        plan = await sweeper.plan()
        tables = ("job", "run", "run_chunk", "event")
        before = payload(path, tables)
        swept = await sweeper.run_once()
        assert swept.deleted["jobs"] == 3
        dropped = before - (payload(path, tables) or 0)
        assert plan["delete"]["jobs"] == 3 and plan["delete"]["runs"] == 3
        # The figure is the rows' stored values: what they took less SQLite's header of each row.
        assert dropped * 0.8 <= plan["delete"]["bytes"] <= dropped, (plan["delete"], dropped)
    finally:
        await store.close()


async def test_an_idle_router_writes_nothing(fakes, daemon_factory, tmp_path):
    """The issue's idle router wrote its leases every third of [router] lease. On SQLite it is
    alone (its lock file): its leases are read, not renewed, and nothing else is due while idle."""
    fake = await fakes("m")
    d = await daemon_factory([node_table("n1", fake, 1, ["task"], "m")], lease="3s")  # a heartbeat a second
    job = (await d.submit("task", "one job, then idle"))[0]
    await d.wait_state(job["id"], "done")

    async def measured():
        storage = (await d.get("/health"))["storage"]
        return storage["measured_at"] if storage else None

    first = await eventually(measured, 10, what="the storage budget's first measure")
    db, wal = tmp_path / "gpuq.db", tmp_path / "gpuq.db-wal"
    before = (db.read_bytes(), wal.read_bytes())
    # Two of the storage watch's measures later (5 s apart): ten heartbeats have come and gone.
    second = await eventually(lambda: _newer(measured, first), 15, what="the next measure")
    await eventually(lambda: _newer(measured, second), 15, what="the measure after")
    assert (db.read_bytes(), wal.read_bytes()) == before, "the idle router wrote to its database"
    health = await d.get("/health")
    [router] = health["routers"]  # still alive, still holding its node
    assert router["nodes"] == ["n1"] and health["holders"]["n1"]["router"] == router["id"]
    job = (await d.submit("task", "and it still runs jobs"))[0]
    await d.wait_state(job["id"], "done")


async def _newer(measured, than: str) -> str | None:
    at = await measured()
    return at if at is not None and at > than else None
