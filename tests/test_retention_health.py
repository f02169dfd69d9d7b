"""The retention sweep made visible (issue 35): each sweep that ran is on the record (the
retention_sweep table), and /health, /api/storage, `gpuq storage` and the alerts say when the
last one ran and finished, what it did and its longest hold of the writer, or why it failed. A
failing sweep (its archive cannot be written) warns and alerts as a failing backup does, /health
staying ok (the queue moves; a restart mends nothing), deletes nothing, and its alert resolves
once a sweep succeeds. Against the real daemon with a fake Ollama node and the real CLI; the
rules of overdue and of a refused record on a real store with a clock the test moves."""

from __future__ import annotations

import signal
import tomllib

import pytest
import tomli_w
from conftest import eventually, node_table
from test_alerts import receiver  # noqa: F401 (a fixture)
from test_retention import age, finished_jobs, sql

from gpuq.errors import StoreUnavailable
from gpuq.store import Store
from gpuq.upkeep.retention import Sweeper
from gpuq.upkeep.retention_report import OVERDUE_EVERY

MODEL = "qwen3-coder:30b"
DAY = 86400


async def router(fakes, daemon_factory, retention: dict, alert_url: str | None = None):
    fake = await fakes(MODEL, tokens=6, thinking_tokens=0)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)], start=False)
    data = tomllib.loads(daemon.config.read_text())
    data["retention"] = retention
    if alert_url:
        data["router"]["alert_url"] = alert_url
    daemon.config.write_text(tomli_w.dumps(data))
    await daemon.start()
    daemon.db = daemon.config.parent / "gpuq.db"
    return daemon


async def aged_jobs(daemon, n: int, days: float) -> list[str]:
    """`n` done jobs that ended `days` ago (the router stopped to age them, then started)."""
    ids = await finished_jobs(daemon, n, "an old question")
    await daemon.kill(signal.SIGTERM)
    age(daemon.db, ids, days)
    await daemon.start()
    return ids


async def test_a_sweep_that_ran_shows_in_health_storage_and_the_cli(fakes, daemon_factory, tmp_path):
    daemon = await router(fakes, daemon_factory, {"every": "3s"})
    old = await aged_jobs(daemon, 2, 40)

    async def shown():
        health = await daemon.get("/health")
        last = health["retention"]["last"]
        return health if last and last["swept"]["pruned"]["jobs"] == 2 else None

    health = await eventually(shown, 30, 0.1, "/health to show the sweep that pruned the two old jobs")
    sweep = health["retention"]
    last = sweep["last"]
    assert health["ok"] is True and health["warnings"] == []
    assert last["ok"] is True and last["error"] is None and last["by"] == "the schedule"
    assert last["router"] == health["router"]["id"]
    assert last["started_at"] <= last["finished_at"] <= sweep["next_at"]
    did = last["swept"]
    assert did["archived"]["jobs"] == 2 and did["archived"]["bytes"] > 0 and did["batches"] >= 1
    assert 0 < did["longest_hold_ms"] < 1000 and did["deleted"]["jobs"] == 0
    assert sweep["every_s"] == 3 and sweep["failing"] is False and sweep["overdue"] is False
    assert sweep["last_success_at"] == last["finished_at"] and sweep["archive"] == str(tmp_path / "gpuq-archive")
    assert all([(await daemon.job(j))["pruned_at"] for j in old])
    # The record every router reads: one row per sweep that ran, this one with its counts.
    rows = sql(daemon.db, "SELECT ok, router, swept FROM retention_sweep WHERE swept LIKE '%\"jobs\": 2%'")
    assert rows and rows[0][:2] == (1, health["router"]["id"])

    metrics = (await daemon.request("GET", "/metrics"))[1]
    assert "gpuq_retention_failing 0.0" in metrics and "gpuq_retention_last_success_timestamp_seconds 1." in metrics
    assert "gpuq_retention_last_hold_seconds " in metrics
    storage = await daemon.get("/api/storage")
    assert storage["retention"]["last"]["ok"] is True and storage["retention"]["every_s"] == 3
    res = await daemon.cli("storage")
    assert res.code == 0, res.err
    assert "last retention sweep: 20" in res.out and "longest hold of the writer" in res.out, res.out
    assert "FAILED" not in res.out
    # `gpuq prune` is on the record too, said so.
    assert (await daemon.cli("prune")).code == 0
    rows = sql(daemon.db, "SELECT asked FROM retention_sweep ORDER BY id")
    assert (1,) in rows and (0,) in rows


async def test_a_sweep_whose_archive_cannot_be_written_warns_alerts_deletes_nothing_and_resolves(
    fakes, daemon_factory, receiver, tmp_path
):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    daemon = await router(fakes, daemon_factory, {"every": "1s", "archive": str(blocked / "archive")}, receiver.url)
    old = await aged_jobs(daemon, 2, 400)  # due to be deleted, archived first

    async def alerting():
        opened = {a["alert"]: a for a in (await daemon.get("/api/alerts"))["alerts"] if a["resolved_at"] is None}
        return opened.get("retention_failed")

    alert = await eventually(alerting, 30, 0.1, "the failed sweep to alert")
    assert alert["node"] == "" and "the retention sweep failed at" in alert["message"]
    assert f"the retention archive {blocked / 'archive'} cannot be written" in alert["message"]
    assert f"make {blocked / 'archive'} a writable directory" in alert["fix"] and "gpuq prune" in alert["fix"]
    status, health = await daemon.request("GET", "/health")
    # A sweep that fails does not stop the queue: /health stays 200 and ok, and warns.
    assert status == 200 and health["ok"] is True
    assert any(w.startswith("the retention sweep failed at") for w in health["warnings"]), health["warnings"]
    sweep = health["retention"]
    assert sweep["failing"] is True and sweep["last"]["ok"] is False and sweep["last_success_at"] is None
    assert "cannot be written" in sweep["last"]["error"] and sweep["last"]["swept"]["deleted"]["jobs"] == 0
    assert "gpuq_retention_failing 1.0" in (await daemon.request("GET", "/metrics"))[1]
    res = await daemon.cli("storage")
    assert "last retention sweep FAILED: the retention archive" in res.out and "last success: none yet" in res.out
    # Nothing was deleted: every old job is whole.
    for job_id in old:
        job = await daemon.job(job_id)
        assert job["state"] == "done" and job["output"] and job["pruned_at"] is None

    # Mended by a reload: the next sweep archives and deletes them, and the alert resolves saying so.
    data = tomllib.loads(daemon.config.read_text())
    data["retention"]["archive"] = str(tmp_path / "archive")
    daemon.config.write_text(tomli_w.dumps(data))
    assert (await daemon.cli("reload")).code == 0

    async def resolved():
        alerts = [a for a in (await daemon.get("/api/alerts"))["alerts"] if a["alert"] == "retention_failed"]
        return alerts if alerts and all(a["resolved_at"] for a in alerts) else None

    [ended] = await eventually(resolved, 30, 0.1, "the failed sweep's alert to resolve")
    assert ended["resolution"].startswith("a retention sweep succeeded at 20")
    assert not {r[0] for r in sql(daemon.db, "SELECT id FROM job")} & set(old)
    health = await daemon.get("/health")
    assert health["warnings"] == [] and health["retention"]["failing"] is False
    await eventually(lambda: len(receiver.got) >= 2, 20, 0.1, "the firing and the resolved notice")
    assert sorted(s for s in receiver.statuses() if s[1] == "retention_failed") == [
        ("firing", "retention_failed"),
        ("resolved", "retention_failed"),
    ]


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_no_sweep_succeeding_for_three_everys_is_overdue_and_a_refused_record_still_shows(tmp_path):
    from gpuq.config import Settings
    from gpuq.jobs import NewJob
    from gpuq.store import NodeInfo

    clock = Clock()
    store = Store(tmp_path / "q.db", clock=clock)
    await store.open()
    try:
        [job] = await store.submit(
            NewJob("task", "p", node="a"), [NodeInfo("a", 1, ("task",), "m", True, idle=False)], "api"
        )
        await store.delete(job["id"], "api")  # ended: due in a year
        blocked = tmp_path / "a-file"
        blocked.write_text("not a directory")
        settings = Settings(retention_archive=blocked / "archive", retention_every_s=3600.0)
        sweeper = Sweeper(store, lambda: settings, lambda: None)
        report = sweeper.report
        assert report.conditions() == [] and report.json()["last"] is None
        clock.now += 60 + OVERDUE_EVERY * 3600 - 1
        assert report.conditions() == []  # not yet: the first sweep was due a minute after the start
        clock.now += 2
        [overdue] = report.conditions()
        assert overdue.alert == "retention_overdue" and "no retention sweep has succeeded yet" in overdue.message
        assert report.json()["overdue"] is True

        settings = Settings(retention_archive=tmp_path / "archive", retention_every_s=3600.0)
        await sweeper.run_once()
        assert report.conditions() == [] and report.json()["last"]["ok"] is True
        clock.now += OVERDUE_EVERY * 3600 + 1
        [overdue] = report.conditions()
        assert f"since {report.json()['last_success_at']}" in overdue.message

        # The database refuses the record (full, say): the failure shows from memory all the same.
        async def refused(*args, **kwargs):
            raise StoreUnavailable("database or disk is full")

        store.record_sweep = refused  # type: ignore[method-assign]
        clock.now += 400 * DAY  # the job is due now: its archive is written first
        settings = Settings(retention_archive=blocked / "archive", retention_every_s=3600.0)
        with pytest.raises(StoreUnavailable):
            await sweeper.run_once()
        shown = report.json()
        assert shown["failing"] is True and "cannot be written" in shown["last"]["error"]
        assert {c.alert for c in report.conditions()} == {"retention_failed", "retention_overdue"}
        assert (await store.job(job["id"]))["state"] == "cancelled"  # nothing deleted
    finally:
        await store.close()
