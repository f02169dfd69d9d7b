"""Scheduled backups and the storage budget (issue 35) against the real daemon, a real SQLite file
and the real CLI: the router backs its database up by itself on [backup] every, names each copy
with the UTC time, keeps the newest `keep` and never deletes a file it did not write; a backup
that fails (or is overdue) is a warning on /health and an alert, while /health stays ok; /health
and /metrics show the database's size, its WAL, the free space and the last backup; a database
near router.max_database_bytes warns and alerts; `gpuq storage` says which tables hold the bytes,
on SQLite and on PostgreSQL."""

from __future__ import annotations

import calendar
import json
import re
import secrets
import sqlite3
import time
import tomllib
from pathlib import Path

import tomli_w
from conftest import eventually, node_table
from test_alerts import receiver  # noqa: F401 (a fixture)

from gpuq.budget import NAME
from gpuq.config import Settings
from gpuq.store import Store
from gpuq.upkeep.backups import Backups

MODEL = "qwen3-coder:30b"


def read(path: Path, sql: str, *params) -> list[tuple]:
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return db.execute(sql, params).fetchall()
    finally:
        db.close()


def set_tables(config: Path, **tables: dict) -> None:
    data = tomllib.loads(config.read_text())
    data.update(tables)
    config.write_text(tomli_w.dumps(data))


async def one_node(fakes, daemon_factory, **tables: dict):
    fake = await fakes(MODEL)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)], start=False)
    set_tables(daemon.config, **tables)
    await daemon.start()
    daemon.db = daemon.config.parent / "gpuq.db"
    return daemon


def stamp(name: str) -> float:
    """The UTC time a scheduled backup's name carries."""
    found = re.search(r"-(\d{8}T\d{6})Z", name)
    assert found, name
    return calendar.timegm(time.strptime(found.group(1), "%Y%m%dT%H%M%S"))


async def test_scheduled_backups_are_taken_named_by_utc_time_and_rotated_never_deleting_another_file(
    fakes, daemon_factory, tmp_path
):
    folder = tmp_path / "backups"
    folder.mkdir()
    # A person's files in the backups' folder, one named as the router names its own: never deleted.
    theirs = folder / "gpuq-20200101T000000Z.db"
    theirs.write_bytes(b"a person's own copy")
    notes = folder / "notes.txt"
    notes.write_text("kept")
    daemon = await one_node(fakes, daemon_factory, backup={"every": "1s", "keep": 2, "dir": str(folder)})
    job = (await daemon.submit("task", "remember me"))[0]["id"]
    await daemon.wait_state(job, "done")

    def made() -> list[tuple]:
        return read(daemon.db, "SELECT id, path, ok, bytes, finished_at, removed_at FROM backup WHERE scheduled = 1")

    await eventually(lambda: len([r for r in made() if r[2] == 1 and r[5] is not None]) >= 3, 30, 0.1, "rotations")
    # Scheduled backups off by a reload; the one being made (if any) finishes and rotates.
    set_tables(daemon.config, backup={"every": "off", "keep": 2, "dir": str(folder)})
    assert (await daemon.cli("reload")).code == 0

    async def stopped():
        b = (await daemon.get("/health"))["backup"]
        return not b["scheduled"] and not b["running"] and b

    backup = await eventually(stopped, 15, what="scheduled backups to stop")
    assert backup["off"] == 'off ([backup] every = "off")'
    rows = made()
    kept = [r for r in rows if r[5] is None]
    assert all(r[2] == 1 for r in rows), rows  # none failed
    assert len(kept) == 2 and len(rows) >= 5, rows
    assert theirs.read_bytes() == b"a person's own copy" and notes.read_text() == "kept"
    files = sorted(p.name for p in folder.iterdir())
    assert files == sorted([theirs.name, notes.name, *(Path(r[1]).name for r in kept)]), files
    for _, path, _, size, finished, _ in kept:
        p = Path(path)
        assert p.parent == folder and NAME.match(p.name) and p.name.startswith("gpuq-"), p
        assert p.stat().st_size == size and p.stat().st_mode & 0o777 == 0o600
        assert abs(stamp(p.name) - calendar.timegm(time.strptime(finished[:19], "%Y-%m-%dT%H:%M:%S"))) <= 2
        assert read(p, "PRAGMA integrity_check") == [("ok",)]
        assert read(p, "SELECT state FROM job WHERE id = ?", job) == [("done",)]  # the job, in each copy
    for _, path, *_ in (r for r in rows if r[5] is not None):
        assert not Path(path).exists()
    newest = max(kept)
    assert backup["last"]["path"] == newest[1] and backup["last"]["scheduled"] is True
    assert backup["last"]["bytes"] == newest[3]
    assert "scheduled backup: " in daemon.log.read_text() and "rotation: deleted" in daemon.log.read_text()


async def test_a_failing_backup_warns_and_alerts_while_health_stays_ok_and_a_success_resolves_both(
    fakes, daemon_factory, receiver, tmp_path
):
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the backups' folder should be")
    daemon = await one_node(fakes, daemon_factory, backup={"every": "1s", "dir": str(blocked)})
    set_tables(daemon.config, router={**tomllib.loads(daemon.config.read_text())["router"], "alert_url": receiver.url})
    await daemon.kill(15)
    await daemon.start()

    async def alerting():
        opened = {a["alert"]: a for a in (await daemon.get("/api/alerts"))["alerts"] if a["resolved_at"] is None}
        return opened if {"backup_failed", "backup_overdue"} <= set(opened) else None

    opened = await eventually(alerting, 20, 0.1, "the failed and the overdue backup to alert")
    assert opened["backup_failed"]["node"] == ""
    assert f"the scheduled backup to {blocked} failed" in opened["backup_failed"]["message"]
    assert "cannot make the backup folder" in opened["backup_failed"]["message"]
    assert "no scheduled backup has succeeded yet" in opened["backup_overdue"]["message"]
    status, health = await daemon.request("GET", "/health")
    # A backup that fails does not stop the queue: /health stays 200 and ok, and warns.
    assert status == 200 and health["ok"] is True
    assert any("the scheduled backup to" in w for w in health["warnings"]), health["warnings"]
    assert any("overdue" in w for w in health["warnings"]), health["warnings"]
    assert health["backup"]["last_failure"]["error"].startswith("cannot make the backup folder")
    assert health["backup"]["last"] is None and health["backup"]["overdue"] is True
    metrics = (await daemon.request("GET", "/metrics"))[1]
    assert "gpuq_backup_failing 1.0" in metrics
    # Mended by a reload: the next backup succeeds, and both alerts resolve saying so.
    good = tmp_path / "backups"
    set_tables(daemon.config, backup={"every": "1s", "dir": str(good)})
    assert (await daemon.cli("reload")).code == 0

    async def resolved():
        alerts = (await daemon.get("/api/alerts"))["alerts"]
        ended = {a["alert"]: a for a in alerts if a["alert"].startswith("backup_") and a["resolved_at"]}
        still = [a for a in alerts if a["alert"].startswith("backup_") and a["resolved_at"] is None]
        return ended if len(ended) == 2 and not still else None

    ended = await resolved_within(resolved)
    assert ended["backup_failed"]["resolution"].startswith(f"a scheduled backup succeeded: {good}")
    # Each firing and its end reach the person at router.alert_url, once each.
    await eventually(lambda: len(receiver.got) >= 4, 20, 0.1, "the four notices")
    assert sorted(receiver.statuses()) == sorted(
        [
            ("firing", "backup_failed"),
            ("firing", "backup_overdue"),
            ("resolved", "backup_failed"),
            ("resolved", "backup_overdue"),
        ]
    )
    [notice] = [b for b in receiver.bodies() if b["status"] == "firing" and b["alert"] == "backup_failed"]
    assert notice["node"] == "" and notice["job"] is None and "gpuq backup PATH" in notice["fix"]
    health = await daemon.get("/health")
    assert health["warnings"] == [] and health["backup"]["last_failure"] is None
    assert Path(health["backup"]["last"]["path"]).parent == good


async def resolved_within(check):
    return await eventually(check, 20, 0.1, "the backup alerts to resolve")


async def test_health_and_metrics_show_the_database_size_wal_free_space_and_last_backup(
    fakes, daemon_factory, tmp_path
):
    daemon = await one_node(fakes, daemon_factory, backup={"every": "off"})
    target = tmp_path / "by-hand.db"
    assert (await daemon.cli("backup", str(target))).code == 0

    async def measured():
        h = await daemon.get("/health")
        return h if h["storage"] and h["backup"]["last"] else None

    health = await eventually(measured, 10, what="/health's storage and backup")
    storage = health["storage"]
    db = daemon.db
    assert storage["database"] == str(db) and storage["disk"] == str(db.parent)
    # Its pages, what router.max_database_bytes counts (page_count x page_size); the WAL apart.
    [(pages, page_size)] = read(db, "SELECT page_count, page_size FROM pragma_page_count(), pragma_page_size()")
    assert storage["database_bytes"] == pages * page_size
    assert storage["file_bytes"] > 0 and storage["free_bytes"] > 0
    assert storage["growth_bytes_per_day"] is None  # one sample: no growth known yet
    assert storage["warnings"] == [] and storage["warn_days"] == 14
    assert health["backup"]["last"]["path"] == str(target) and health["backup"]["last"]["scheduled"] is False
    assert health["backup"]["scheduled"] is False
    [(at, size)] = read(db, "SELECT at, database_bytes FROM storage_sample")
    assert size > 0
    metrics = (await daemon.request("GET", "/metrics"))[1]
    values = dict(
        line.rsplit(" ", 1)
        for line in metrics.splitlines()
        if line.startswith(("gpuq_database", "gpuq_disk", "gpuq_backup"))
    )
    assert float(values["gpuq_database_bytes"]) > 0 and float(values["gpuq_disk_free_bytes"]) > 0
    assert "gpuq_database_growth_bytes_per_day" not in values  # not known yet: absent, not 0
    assert float(values["gpuq_backup_last_bytes"]) == target.stat().st_size
    assert abs(float(values["gpuq_backup_last_success_timestamp_seconds"]) - time.time()) < 60
    assert values["gpuq_backup_failing"] == "0.0"
    # A restart keeps the last backup: it is on the record, not in the router's memory.
    await daemon.kill(15)
    await daemon.start()
    again = await eventually(measured, 10, what="/health after a restart")
    assert again["backup"]["last"] == health["backup"]["last"]


async def test_a_database_near_its_cap_warns_and_alerts_with_its_growth_from_the_samples(
    fakes, daemon_factory, tmp_path
):
    daemon = await one_node(fakes, daemon_factory, backup={"every": "off"})
    await daemon.kill(15)
    db = daemon.db
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    size = db.stat().st_size
    # A day of samples (the router's own, as an older router would have left them): 1 MB grown.
    day_ago = time.time() - 86400
    conn.execute(
        "INSERT INTO storage_sample (at, database_bytes, free_bytes) VALUES (?, ?, NULL)",
        (time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(day_ago)), size - 1_000_000),
    )
    conn.commit()
    conn.close()
    set_tables(
        daemon.config,
        router={**tomllib.loads(daemon.config.read_text())["router"], "max_database_bytes": int(size / 0.92)},
    )
    await daemon.start()

    async def alerting():
        opened = [a for a in (await daemon.get("/api/alerts"))["alerts"] if a["alert"] == "database_filling"]
        return opened[0] if opened else None

    alert = await eventually(alerting, 15, 0.1, "the database_filling alert")
    assert alert["node"] == "" and "router.max_database_bytes" in alert["message"] and "raise" in alert["fix"]
    status, health = await daemon.request("GET", "/health")
    assert status == 200 and health["ok"] is True
    assert any("router.max_database_bytes" in w for w in health["warnings"])
    growth = health["storage"]["growth_bytes_per_day"]
    # From the day-old sample to the router's newest: a megabyte, and the pages added since.
    [(newest,)] = read(db, "SELECT database_bytes FROM storage_sample ORDER BY at DESC LIMIT 1")
    grown = newest - (size - 1_000_000)
    assert 0.99 * grown < growth < 1.01 * grown and growth > 990_000, (growth, grown)  # a day: about 1 MB
    res = await daemon.cli("storage")
    assert res.code == 0, res.err
    assert re.search(r"^growth: \+\d\.\d MB/day over the last 24 h \(samples of the last week", res.out, re.M), res.out
    assert "cap: router.max_database_bytes" in res.out and "warning: " in res.out


async def test_gpuq_storage_names_the_tables_that_hold_the_bytes_on_each_engine(lab_on_each_engine, database):
    daemon = lab_on_each_engine
    for _ in range(5):
        await daemon.submit("task", secrets.token_hex(2400))  # 4800 characters that do not compress
    res = await daemon.cli("storage")
    assert res.code == 0, res.err
    out = res.out
    assert out.startswith("database ")
    as_json = json.loads((await daemon.cli("storage", "--json")).out)
    names = {r["name"]: r for r in as_json["relations"]}
    assert names["job"]["kind"] == "table" and names["job"]["bytes"] > 5 * 4800
    assert names["job_queue"]["kind"] == "index" and names["job_queue"]["table"] == "job"
    assert abs(sum(r["share"] for r in as_json["relations"]) - 1) < 0.01
    assert [r["bytes"] for r in as_json["relations"]] == sorted(
        (r["bytes"] for r in as_json["relations"]), reverse=True
    )
    if isinstance(database, Path) or not str(database).startswith("postgres"):
        assert as_json["method"] == "dbstat"
        assert as_json["backup"]["scheduled"] is True and as_json["free_bytes"] > 0
        assert "where the bytes are (dbstat):" in out and "disk " in out
        assert as_json["empty_bytes"] >= 0 and "unused inside the file: " in out
    else:
        assert as_json["method"] == "postgres" and as_json["free_bytes"] is None
        assert as_json["backup"]["scheduled"] is False and "pg_dump" in as_json["backup"]["off"]
        assert "where the bytes are (postgres):" in out
        assert as_json["empty_bytes"] is None and "unused inside" not in out
        assert "scheduled backups: the database is on PostgreSQL" in out
    assert re.search(r"^  job\s+table\s+job\s+", out, re.M), out


async def test_a_backup_whose_record_the_database_refuses_is_not_taken_again_at_once(tmp_path):
    """A full database refuses the backup's record: the schedule still counts the backup made,
    so it waits `every` before the next, rather than copying the database again and again."""
    now = [time.time()]
    store = Store(tmp_path / "gpuq.db", clock=lambda: now[0])
    await store.open()
    now[0] += 2 * 86400  # the database is two days old: a backup is due
    try:
        db = sqlite3.connect(tmp_path / "gpuq.db")
        db.execute(
            "CREATE TRIGGER full_disk BEFORE INSERT ON backup BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END"
        )
        db.commit()
        db.close()
        settings = Settings(database=tmp_path / "gpuq.db", backup_every_s=86400.0)
        backups = Backups(lambda: settings, store, clock=lambda: now[0])
        await backups.run_once()
        [made] = list((tmp_path / "gpuq-backups").iterdir())
        assert read(made, "PRAGMA integrity_check") == [("ok",)]
        assert await store.backups() == []  # refused
        assert await backups.run_once() is None  # not due again: made a moment ago
        now[0] += 3600
        assert await backups.run_once() is None
        assert len(list((tmp_path / "gpuq-backups").iterdir())) == 1
        now[0] += 86400
        await backups.run_once()  # a day on: due
        assert len(list((tmp_path / "gpuq-backups").iterdir())) == 2
    finally:
        await store.close()
