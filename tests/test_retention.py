"""Retention and its archive (issue 35) against the real daemon, a real SQLite file, a fake Ollama
node and the real CLI. Jobs are aged by setting their times in the database file while the router
is stopped (a person at the sqlite3 shell could do the same); the router then prunes their bulk
(output, reasoning, a call's request) and deletes the rows of the oldest, archiving each first in
a gzip JSON Lines file a person reads with ordinary tools. What was shed says so everywhere: the
API, the job's stream, `gpuq show`. Waiting and running jobs are never touched; a SIGKILL in the
middle of a sweep leaves every job in the database or the archive (or both), never in neither,
and the archive's search gives each job once."""

from __future__ import annotations

import gzip
import json
import logging
import re
import signal
import sqlite3
import time
import tomllib
from pathlib import Path

import pytest
import tomli_w
from conftest import eventually, node_table, run_cli

from gpuq.store import Store
from gpuq.upkeep import archive
from gpuq.upkeep.retention import Sweeper

MODEL = "qwen3-coder:30b"
DAY = 86400
PRUNED = re.compile(r"output pruned on \d{4}-\d\d-\d\d \(retention\)")
TOKENS = {"member": "member-token", "root": "root-token"}
USERS = [
    {"name": "member", "token": TOKENS["member"], "role": "member"},
    {"name": "root", "token": TOKENS["root"], "role": "admin"},
]


async def router(fakes, daemon_factory, retention: dict, users: list[dict] | None = None, **script):
    fake = await fakes(MODEL, **({"tokens": 6, "thinking_tokens": 0} | script))
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task", "critique"], MODEL)], start=False)
    data = tomllib.loads(daemon.config.read_text())
    data["retention"] = retention
    if users:
        data["user"] = users
        daemon.auth = {"Authorization": f"Bearer {TOKENS['root']}"}
    daemon.config.write_text(tomli_w.dumps(data))
    await daemon.start()
    daemon.fake = fake
    daemon.db = daemon.config.parent / "gpuq.db"
    return daemon


def sql(path: Path, statement: str, *params) -> list[tuple]:
    db = sqlite3.connect(path, isolation_level=None)
    try:
        return db.execute(statement, params).fetchall()
    finally:
        db.close()


def age(path: Path, ids: list[str], days: float) -> None:
    """The jobs ended (and were made) `days` ago, as the router reads its times: ISO text."""
    marks = ",".join("?" * len(ids))
    shift = f"-{days * DAY} seconds"
    sql(
        path,
        "UPDATE job SET finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', finished_at, ?),"
        f" created_at = strftime('%Y-%m-%dT%H:%M:%fZ', created_at, ?) WHERE id IN ({marks})",
        shift,
        shift,
        *ids,
    )


async def finished_jobs(daemon, n: int, prompt: str) -> list[str]:
    ids = [(await daemon.submit("task", f"{prompt} {i}"))[0]["id"] for i in range(n)]
    for job_id in ids:
        await daemon.wait_state(job_id, "done", timeout=30)
    return ids


async def restart(daemon) -> None:
    await daemon.kill(signal.SIGTERM)
    await daemon.start()


def archived_lines(directory: Path) -> list[dict]:
    """What `zcat jobs-*.jsonl.gz | jq` reads: every line of every month's file."""
    out = []
    for path in sorted(directory.glob("jobs-*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            out += [json.loads(line) for line in f]
    return out


async def test_a_router_prunes_old_jobs_archives_them_first_and_says_so_everywhere(fakes, daemon_factory, tmp_path):
    daemon = await router(fakes, daemon_factory, {"every": "1s"})
    old = await finished_jobs(daemon, 2, "an old question")
    long_prompt = "a long old question, " + "with its context pasted in, " * 20
    [long] = await finished_jobs(daemon, 1, long_prompt)
    recent = await finished_jobs(daemon, 1, "a recent question")
    daemon.fake.script.token_delay_s = 0.05
    daemon.fake.script.tokens = 2000
    await daemon.kill(signal.SIGTERM)
    age(daemon.db, [*old, long], 40)  # past prune_after (30 days), well before delete_after (90)
    await daemon.start()
    [running] = await daemon.submit("task", "still running")
    [waiting] = await daemon.submit("task", "still waiting")
    await daemon.wait_state(running["id"], "running")

    async def pruned():
        return all([(await daemon.job(j)).get("output_pruned") for j in [*old, long]])

    await eventually(pruned, 20, 0.1, "the sweep to prune the old jobs")
    for job_id in old:
        job = await daemon.job(job_id)
        assert PRUNED.fullmatch(job["output_pruned"]) and job["pruned_at"]
        assert job["output"] is None and job["thinking"] is None and job["runs"][0]["output"] is None
        assert job["prompt"].startswith("an old question") and [e["to_state"] for e in job["events"]] == [
            "queued",
            "running",
            "done",
        ]
        assert job["eval_count"] == 6  # the record stays: tokens, times, state
    assert "prompt_pruned" not in job  # a short prompt is whole
    cut = await daemon.job(long)  # a long one keeps its first 300 characters, and says so
    assert cut["prompt"] == f"{long_prompt} 0"[:300] and cut["prompt_bytes"] == 300
    assert re.fullmatch(
        r"prompt kept to its first 300 characters on \d{4}-\d\d-\d\d \(retention\)", cut["prompt_pruned"]
    )
    fresh = await daemon.job(recent[0])
    assert fresh["output"] and fresh["pruned_at"] is None and "output_pruned" not in fresh
    assert (await daemon.job(running["id"]))["state"] == "running"
    assert (await daemon.job(waiting["id"]))["state"] == "queued"
    assert sql(
        daemon.db, "SELECT COUNT(*) FROM run_chunk c JOIN run r ON r.id = c.run_id WHERE r.job_id IN (?, ?)", *old
    ) == [(0,)]
    assert sql(daemon.db, "PRAGMA auto_vacuum") == [(2,)]  # INCREMENTAL: freed pages go back
    await eventually(lambda: "retention sweep: " in daemon.log.read_text(), 10, 0.1, "the sweep's log line")

    # The archive, beside the database: each old job whole, with its output, before it was shed.
    lines = archived_lines(tmp_path / "gpuq-archive")
    assert sorted(line["id"] for line in lines) == sorted([*old, long])
    assert [line["prompt"] for line in lines if line["id"] == long] == [f"{long_prompt} 0"]  # whole there
    for line in lines:
        assert line["archived_for"] == "prune" and line["output"] and line["runs"][0]["output"] == line["output"]
        assert [e["to_state"] for e in line["events"]] == ["queued", "running", "done"]
    assert {p.name for p in (tmp_path / "gpuq-archive").iterdir()} == {f"jobs-{lines[0]['created_at'][:7]}.jsonl.gz"}

    # Its stream and the CLI say so, never an empty output.
    status, text = await daemon.request("GET", f"/api/jobs/{old[0]}/stream")
    stream = [json.loads(x) for x in text.splitlines()]
    assert status == 200 and PRUNED.fullmatch(stream[-2]["pruned"]) and stream[-1]["done"]
    assert not any("text" in x for x in stream)
    shown = await daemon.cli("show", old[0])
    assert shown.code == 0 and re.search(r"-- output --\n\(output pruned on \d{4}-\d\d-\d\d \(retention\)\)", shown.out)
    shown = await daemon.cli("show", long)
    assert shown.code == 0 and re.search(
        r"\n\(prompt kept to its first 300 characters on [-\d]+ \(retention\)\)\n", shown.out
    )
    found = await run_cli("archive", "search", "AN OLD QUESTION 1", "--dir", str(tmp_path / "gpuq-archive"), "--json")
    assert found.code == 0 and [json.loads(x)["id"] for x in found.out.splitlines()] == [old[1]]
    assert json.loads(found.out)["output"] == lines[[x["id"] for x in lines].index(old[1])]["output"]
    retried = await daemon.request("POST", f"/api/jobs/{old[0]}/retry")
    assert retried[0] == 409  # (done: never retried anyway; a pruned failed one is refused too)


async def test_gpuq_prune_says_what_it_would_drop_then_drops_it_and_deletes_the_oldest(fakes, daemon_factory, tmp_path):
    daemon = await router(fakes, daemon_factory, {"delete_after": "400d", "batch": 1}, users=USERS)
    ids = await finished_jobs(daemon, 4, "question")
    await daemon.kill(signal.SIGTERM)
    age(daemon.db, ids[:2], 40)  # pruned
    age(daemon.db, ids[2:3], 500)  # deleted
    await daemon.start()

    dry = await daemon.cli("prune", "--dry-run")
    assert dry.code == 0, dry.err
    lines = dry.out.splitlines()
    assert re.fullmatch(
        r"would delete 1 job\(s\) with 1 run\(s\) and 3 event\(s\) \(\d+ bytes: their rows' stored values, every column\)",
        lines[0],
    ), lines
    assert re.fullmatch(r"would prune the output and request of 2 job\(s\) \(\d+ bytes: the request, .*\)", lines[1]), (
        lines
    )
    assert lines[2] == f"archived first to {tmp_path / 'gpuq-archive'}"
    as_json = json.loads((await daemon.cli("prune", "--dry-run", "--json")).out)
    assert as_json["prune"]["jobs"] == 2 and as_json["prune"]["bytes"] > 0 and as_json["delete"]["jobs"] == 1
    assert all([(await daemon.job(j))["pruned_at"] is None for j in ids])  # a dry run changes nothing

    member = await run_cli("--router", daemon.url, "prune", env={"GPUQ_TOKEN": TOKENS["member"]})
    assert member.code == 1 and member.err.startswith("error 403 "), member.err

    done = await daemon.cli("prune", "--json")
    assert done.code == 0, done.err
    answer = json.loads(done.out)
    assert answer["deleted"] == {"jobs": 1, "runs": 1, "events": 3}
    assert answer["pruned"]["jobs"] == 2 and answer["archived"]["jobs"] == 3 and answer["batches"] == 3
    status, body = await daemon.request("GET", f"/api/jobs/{ids[2]}")
    assert status == 404
    assert all([PRUNED.fullmatch((await daemon.job(j))["output_pruned"]) for j in ids[:2]])
    assert (await daemon.job(ids[3]))["output"]  # too young for either
    again = await daemon.cli("prune")
    assert again.out.splitlines()[:2] == [
        "deleted 0 job(s) with 0 run(s) and 0 event(s)",
        "pruned the output and request of 0 job(s)",
    ]
    found = await run_cli("--config", str(daemon.config), "archive", "search", ids[2])
    assert found.code == 0 and found.out.startswith(f"{ids[2]}  task  done  on node-1"), found

    # A reload applies [retention] to the next sweep: the youngest job is due at once.
    data = tomllib.loads(daemon.config.read_text())
    data["retention"] |= {"prune_after": "1s", "delete_after": "off"}
    daemon.config.write_text(tomli_w.dumps(data))
    reloaded = await daemon.cli("reload")
    assert reloaded.code == 0 and "retention.prune_after: 30d -> 1s" in reloaded.out, reloaded
    assert "retention.delete_after: 400d -> off" in reloaded.out, reloaded.out
    plan = json.loads((await daemon.cli("prune", "--dry-run", "--json")).out)
    assert plan["prune"]["jobs"] == 1 and plan["delete"]["jobs"] == 0


async def test_a_router_killed_mid_sweep_leaves_every_job_somewhere_and_a_resweep_finishes(
    fakes, daemon_factory, tmp_path
):
    daemon = await router(
        fakes, daemon_factory, {"every": "1s", "delete_after": "1d", "batch": 1}, token_delay_s=0.5, tokens=100
    )
    [blocker] = await daemon.submit("task", "keeps the node busy")
    await daemon.wait_state(blocker["id"], "running")
    ids = [(await daemon.submit("task", f"doomed {i}"))[0]["id"] for i in range(300)]
    status, _ = await daemon.request("POST", "/api/nodes/node-1/clear", {})
    assert status == 200
    await daemon.kill(signal.SIGTERM)
    age(daemon.db, ids, 10)  # cancelled ten days ago: due for deletion
    assert sql(daemon.db, "SELECT COUNT(*) FROM job WHERE state = 'cancelled'") == [(300,)]
    directory = tmp_path / "gpuq-archive"
    await daemon.start()
    await eventually(lambda: list(directory.glob("jobs-*.jsonl.gz")), 20, 0.005, "the sweep to archive")
    await daemon.kill(signal.SIGKILL)  # in the middle of the sweep

    stored = {r[0] for r in sql(daemon.db, "SELECT id FROM job")}
    saved = {line["id"] for line in archived_lines(directory)}
    assert set(ids) <= stored | saved  # never in neither
    assert stored & set(ids), "the sweep finished before the kill: nothing was tested"

    await daemon.start()  # the next router's sweep finishes the work
    await eventually(lambda: not {r[0] for r in sql(daemon.db, "SELECT id FROM job")} & set(ids), 60, 0.2, "a resweep")
    found = archive.search(directory, "doomed", limit=1000)
    assert sorted(j["id"] for j in found) == sorted(ids)  # each once, however many lines it has


async def test_an_archive_written_then_a_crash_before_the_delete_keeps_the_job_in_both(tmp_path):
    """The crash between the archive's fsync and the delete's commit, made exactly there: the
    store's delete raises once, as a router dying at that moment never commits it."""
    from gpuq.config import Settings
    from gpuq.jobs import NewJob
    from gpuq.store import NodeInfo

    class DiesBeforeTheDelete(Store):
        dies = True

        async def delete_ended(self, ids, cutoffs):
            if self.dies:
                self.dies = False
                raise RuntimeError("the router died here")
            return await super().delete_ended(ids, cutoffs)

    now = [1_800_000_000.0]
    store = DiesBeforeTheDelete(tmp_path / "q.db", clock=lambda: now[0])
    await store.open()
    try:
        [job] = await store.submit(
            NewJob("task", "forensics please", node="a"), [NodeInfo("a", 1, ("task",), "m", True, idle=False)], "api"
        )
        await store.delete(job["id"], "api")
        now[0] += 400 * DAY
        settings = Settings(retention_archive=tmp_path / "archive")
        sweeper = Sweeper(store, lambda: settings, lambda: None)
        with pytest.raises(RuntimeError):
            await sweeper.run_once()
        assert (await store.job(job["id"]))["state"] == "cancelled"  # still in the database
        assert [line["id"] for line in archived_lines(tmp_path / "archive")] == [job["id"]]  # and archived
        swept = await sweeper.run_once()
        assert swept.deleted["jobs"] == 1 and swept.archived["jobs"] == 1
        assert [line["id"] for line in archived_lines(tmp_path / "archive")] == [job["id"]] * 2
        [found] = archive.search(tmp_path / "archive", "FORENSICS")
        assert found["id"] == job["id"] and found["archived_lines"] == 2
    finally:
        await store.close()


async def test_an_archive_that_cannot_be_written_keeps_the_jobs_in_the_database(tmp_path):
    from gpuq.config import Settings
    from gpuq.errors import StoreUnavailable
    from gpuq.jobs import NewJob
    from gpuq.store import NodeInfo

    now = [1_800_000_000.0]
    store = Store(tmp_path / "q.db", clock=lambda: now[0])
    await store.open()
    try:
        [job] = await store.submit(
            NewJob("task", "p", node="a"), [NodeInfo("a", 1, ("task",), "m", True, idle=False)], "api"
        )
        await store.delete(job["id"], "api")
        now[0] += 400 * DAY
        blocked = tmp_path / "a-file"
        blocked.write_text("not a directory")
        settings = Settings(retention_archive=blocked / "archive")
        with pytest.raises(
            StoreUnavailable, match=r"the retention archive .* cannot be written .* nothing of this batch was pruned"
        ):
            await Sweeper(store, lambda: settings, lambda: None).run_once()
        assert (await store.job(job["id"]))["state"] == "cancelled"
    finally:
        await store.close()


async def test_the_archive_reads_past_a_member_cut_short_by_a_crash(tmp_path):
    job = {"id": "1-00000000", "created_at": "2026-12-01T00:00:00.000000Z", "prompt": "p", "runs": []}
    archive.append(tmp_path, [job], "prune", 1_800_000_000.0)
    path = next(tmp_path.glob("jobs-*.jsonl.gz"))
    with open(path, "ab") as f:
        f.write(gzip.compress(b'{"id": "2-00000000"}\n')[:15])  # a member the crash cut short
    assert [j["id"] for j in archive.search(tmp_path, "")] == ["1-00000000"]


async def test_with_several_routers_one_sweeps_and_the_others_say_so(database, tmp_path):
    """On PostgreSQL the router holding the sweep's lease sweeps; another's sweep says it is not
    its turn (an admin's `gpuq prune` on it sweeps anyway). On SQLite the one router always does."""
    from gpuq.config import Settings
    from gpuq.jobs import NewJob
    from gpuq.store import NodeInfo
    from gpuq.store.leases import Router

    now = [1_800_000_000.0]
    stores = [Store(database, clock=lambda: now[0]) for _ in range(2)]
    for s in stores:
        await s.open()
    try:
        nodes = [NodeInfo("a", 1, ("task",), "m", True, idle=False)]
        jobs = [(await stores[0].submit(NewJob("task", f"p{i}", node="a"), nodes, "api"))[0]["id"] for i in range(2)]
        for job_id in jobs:
            await stores[0].delete(job_id, "api")
        now[0] += 400 * DAY
        settings = Settings(retention_archive=tmp_path / "archive")
        routers = [Router.new("127.0.0.1:8750", None, now[0]) for _ in range(2)]
        one, two = (Sweeper(s, lambda: settings, lambda r=r: r) for s, r in zip(stores, routers))
        first = await one.run_once()
        assert first.skipped is None and first.deleted["jobs"] == 2
        # The other router reports that sweep truthfully, from the record (its loop reads it).
        await two.report.refresh()
        shown = two.report.json()["last"]
        assert shown["router"] == routers[0].id and shown["ok"] is True and shown["swept"]["deleted"]["jobs"] == 2
        second = await two.run_once()
        if stores[0].dsn:
            assert second.skipped == "another router runs the retention sweep" and second.batches == 0
            assert (await two.run_once(force=True)).skipped is None
        else:
            assert second.skipped is None  # one router per file: it is always this one
    finally:
        for s in stores:
            await s.close()


def test_the_sweeps_reads_and_checks_walk_their_indexes_never_the_table(tmp_path):
    """A batch holds the writer a few milliseconds however long the history: the due reads walk
    job_unpruned / job_finished from their start, the verbs find their jobs by id (a `state IN`
    test led the planner to walk every ended job by its state index: 100 ms a batch)."""
    from test_schema import migrated

    from gpuq.store import retention

    db = migrated(tmp_path / "q.db")
    params = {
        "prune": "x",
        "prune_failed": "x",
        "prune_cancelled": "x",
        "delete": "x",
        "limit": 100,
        "now": "x",
        "id0": "a",
        "id1": "b",
    }

    def plan(statement: str) -> str:
        return " | ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + statement, params))

    assert "USING INDEX job_unpruned" in plan(retention.due_sql("prune"))
    assert "USING COVERING INDEX job_finished" in plan(retention.due_sql("delete"))
    checks = [
        f"UPDATE job AS j SET pruned_at = :now WHERE j.id IN (:id0, :id1) AND {retention.PRUNE_DUE}",
        f"SELECT j.id FROM job j WHERE j.id IN (:id0, :id1) AND {retention.DELETE_DUE}",
    ]
    for statement in checks:
        assert plan(statement).startswith("SEARCH j USING INDEX sqlite_autoindex_job_1 (id=?)"), plan(statement)
    assert not any(
        " SCAN " in f" {plan(s)}" for s in [retention.due_sql("prune"), retention.due_sql("delete"), *checks]
    )


async def test_a_database_from_before_retention_upgrades_whole_and_is_vacuumed_once(tmp_path, caplog):
    """Migration 017 rebuilds the job table with pruned_at (a front-door call keeps its request),
    and the store's start gives the file auto_vacuum = INCREMENTAL by one VACUUM, logged, once."""
    import logging

    from test_schema import migrated

    path = tmp_path / "old.db"
    db = migrated(path, up_to=16)
    db.execute(
        "INSERT INTO job (id, kind, state, node, model, position, placement, created_at, finished_at, endpoint,"
        " request, prompt) VALUES ('1-aaaaaaaa', 'task', 'done', 'a', 'm', 1024, 'x', '2026-01-01T00:00:00.000000Z',"
        " '2026-01-01T00:00:01.000000Z', '/api/chat', '{\"path\": \"/api/chat\"}', 'hi')"
    )
    db.execute("PRAGMA auto_vacuum = NONE")
    db.execute("VACUUM")
    assert db.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    db.close()
    caplog.set_level(logging.INFO, logger="gpuq")
    for _ in range(2):
        store = Store(path)
        await store.open()
        try:
            detail = await store.job_detail("1-aaaaaaaa")
            assert (detail["request"], detail["pruned_at"], detail["state"]) == ('{"path": "/api/chat"}', None, "done")
        finally:
            await store.close()
    assert sql(path, "PRAGMA auto_vacuum") == [(2,)]
    assert [r.getMessage() for r in caplog.records].count(
        f"database {path} (0 MB): a one-time VACUUM for auto_vacuum = INCREMENTAL ..."
    ) == 1
    assert any(r.getMessage().startswith(f"database {path}: VACUUM done in ") for r in caplog.records)


async def test_prune_through_the_router_on_each_engine(fakes, daemon_factory, database, tmp_path):
    """The same sweep, the same answers and the same marker on SQLite and on PostgreSQL (where the
    archive sits beside gpuq.toml); the job is aged at the database's shell while the router runs."""
    from conftest import shell

    from gpuq.jobs import iso

    fake = await fakes(MODEL, tokens=6, thinking_tokens=0)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)], database=str(database), start=True)
    old, new = await finished_jobs(daemon, 2, "engine question")
    aged = "UPDATE job SET finished_at = ? WHERE id = ?"
    when = iso(time.time() - 40 * DAY)  # past prune_after, not delete_after
    if isinstance(database, Path):
        sql(database, aged, when, old)
    else:
        import psycopg

        from gpuq.store.postgres import translate

        with psycopg.connect(database, autocommit=True) as db:
            db.execute(translate(aged), (when, old))
    status, plan = await daemon.request("POST", "/api/prune", {"dry_run": True})
    assert status == 200 and plan["prune"]["jobs"] == 1 and plan["archive"] == str(tmp_path / "gpuq-archive")
    status, swept = await daemon.request("POST", "/api/prune", {})
    assert status == 200 and swept["pruned"]["jobs"] == 1 and swept["archived"]["jobs"] == 1, swept
    assert PRUNED.fullmatch((await daemon.job(old))["output_pruned"])
    assert (await daemon.job(new))["output"]
    assert shell(daemon, "SELECT COUNT(*) FROM run_chunk c JOIN run r ON r.id = c.run_id WHERE r.job_id = ?", old) == [
        (0,)
    ]
    [line] = archived_lines(tmp_path / "gpuq-archive")
    assert line["id"] == old and line["output"]
    status, body = await daemon.request("POST", "/api/prune", {"dry_run": "yes"})
    assert status == 400 and "dry_run" in body["error"]["message"]


async def test_a_pruned_calls_image_is_archived_whole_and_then_leaves_the_database(tmp_path):
    """A chat's image is stored once apart from its request (gpuq/store/parts.py): the archive's line
    holds the request whole, image included, and once no job refers to the image it is dropped."""
    from gpuq.config import Settings
    from gpuq.jobs import NewJob, compact_json
    from gpuq.store import NodeInfo

    now = [1_800_000_000.0]
    store = Store(tmp_path / "q.db", clock=lambda: now[0])
    await store.open()
    try:
        image = "iVBORw0KGgo" + "A" * (200 << 10)
        body = {"model": "m", "messages": [{"role": "user", "content": "what is this?", "images": [image]}]}
        request = compact_json({"path": "/api/chat", "user_agent": "ui/1", "body": body})
        node = [NodeInfo("a", 1, ("task",), "m", True, idle=False)]
        ids = []
        for _ in range(2):  # two turns sending the same image: one copy
            [job] = await store.submit(
                NewJob("task", "what is this?", node="a", endpoint="/api/chat", request=request), node, "api"
            )
            await store.delete(job["id"], "api")
            ids.append(job["id"])
        assert sql(tmp_path / "q.db", "SELECT COUNT(*) FROM request_part") == [(1,)]
        now[0] += 40 * DAY
        settings = Settings(retention_archive=tmp_path / "archive")
        swept = await Sweeper(store, lambda: settings, lambda: None).run_once()
        assert swept.pruned["jobs"] == 2 and swept.parts["parts"] == 1 and swept.parts["bytes"] >= len(image)
        lines = archived_lines(tmp_path / "archive")
        assert sorted(line["id"] for line in lines) == sorted(ids)
        assert all(line["request"]["body"]["messages"][0]["images"] == [image] for line in lines)
        assert sql(tmp_path / "q.db", "SELECT COUNT(*) FROM request_part") == [(0,)]
        for i in ids:
            assert (await store.job_detail(i))["request"] is None
    finally:
        await store.close()


async def test_a_sweep_compacts_the_file_at_idle_once_a_tenth_of_it_is_empty(tmp_path, caplog):
    """Pruned rows leave their pages part empty, which incremental_vacuum cannot give back: a sweep
    with no job waiting or running rewrites the file (VACUUM) once [retention] compact of it is
    empty; with a job waiting it leaves the file alone (the rewrite would hold the writer)."""
    from gpuq.config import Settings
    from gpuq.jobs import NewJob
    from gpuq.store import NodeInfo

    now = [1_800_000_000.0]
    path = tmp_path / "q.db"
    store = Store(path, clock=lambda: now[0])
    await store.open()
    nodes = [NodeInfo("a", 1, ("task",), "m", True, idle=False)]
    try:
        ended = []
        for i in range(1500):
            [job] = await store.submit(NewJob("task", f"{i} " + "a long prompt " * 70, node="a"), nodes, "api")
            ended.append(job["id"])
            await store.delete(job["id"], "api")
        [waiting] = await store.submit(NewJob("task", "still waiting", node="a"), nodes, "api")
        now[0] += 40 * DAY
        settings = Settings(retention_archive=tmp_path / "archive")
        sweeper = Sweeper(store, lambda: settings, lambda: None)
        swept = await sweeper.run_once()
        assert swept.pruned["jobs"] == 1500 and swept.compacted is None  # a job waits: not now
        empty = (await store.relations())["empty_bytes"]
        size = (await store.storage_now())["file_bytes"]
        assert empty > size / 4, (empty, size)  # what pruning left inside the pages

        await store.delete(waiting["id"], "api")
        now[0] += 40 * DAY  # the cancelled one is due: this sweep sheds it, at idle
        with caplog.at_level(logging.INFO, logger="gpuq"):
            swept = await sweeper.run_once()
        assert swept.compacted is not None and swept.compacted["after"] < swept.compacted["before"] / 2
        assert (await store.storage_now())["file_bytes"] == swept.compacted["after"]  # (its WAL was truncated)
        assert (await store.relations())["empty_bytes"] < empty / 4
        assert "database compacted" in caplog.text
        assert [(await store.job(j))["state"] for j in ended] == ["cancelled"] * 1500  # the record stays

        [another] = await store.submit(NewJob("task", "one more", node="a"), nodes, "api")
        await store.delete(another["id"], "api")
        now[0] += 40 * DAY  # a sweep that sheds little leaves a compact file alone (its own slack)
        assert (await sweeper.run_once()).pruned["jobs"] == 1 and sweeper.last.compacted is None

        now[0] += 40 * DAY
        off = Settings(retention_archive=tmp_path / "archive", retention_compact_share=None)
        assert (await Sweeper(store, lambda: off, lambda: None).run_once()).compacted is None
    finally:
        await store.close()
