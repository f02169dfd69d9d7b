"""Listings carry excerpts (issue 11, item 8): /api/queue and /api/jobs give each prompt's first
300 characters and its size in bytes, never the prompt; only /api/jobs/{id} has the whole
prompt. The CLI's `gpuq queue` shows the excerpt. Databases written before the change are
rebuilt by migration 005 without losing anything. (The speed and memory this buys are
measured in bench/, section `listings`.)"""

from __future__ import annotations

import json
import sqlite3

from conftest import eventually

from gpuq.store import MIGRATIONS_DIR, NewJob, NodeInfo, Store

EXCERPT_CHARS = 300
PROMPT_BYTES = 200_000


def large_prompt(tag: str) -> str:
    """About 200 KB of UTF-8 whose characters take 1 to 3 bytes: characters != bytes."""
    unit = "Grüße an die Welt, 世界 — review the export job's retry budget.\n"
    text = f"{tag}: " + unit * (PROMPT_BYTES // len(unit.encode()))
    assert len(text.encode()) > PROMPT_BYTES * 0.99
    return text


def one_line(text: str, width: int) -> str:
    """What `gpuq queue` prints of a long prompt: flattened, cut, marked as cut."""
    return " ".join(text.split())[: width - 1] + "…"


async def raw_get(daemon, path: str) -> bytes:
    async with daemon.session.get(daemon.url + path) as resp:
        assert resp.status == 200, (resp.status, await resp.text())
        return await resp.read()


def assert_listed(job: dict, prompt: str) -> None:
    assert "prompt" not in job, f"a listing carries {job['id']}'s whole prompt"
    assert job["prompt_excerpt"] == prompt[:EXCERPT_CHARS]  # characters, not bytes
    assert job["prompt_bytes"] == len(prompt.encode("utf-8"))


async def test_listings_carry_excerpts_and_sizes_and_the_job_its_prompt(lab):
    f3 = lab.fakes["node-3"]
    f3.script.token_delay_s, f3.script.tokens = 0.05, 100_000  # node-3's head runs all along
    prompts = {}
    for tag in ("head", "second", "third"):
        job = (await lab.submit("task", large_prompt(tag), node="node-3"))[0]
        prompts[job["id"]] = large_prompt(tag)
        if tag == "head":
            head = job["id"]
            await lab.wait_state(head, "running")

    async def queue_with_tokens():
        body = json.loads(await raw_get(lab, "/api/queue"))
        node3 = next(n for n in body["nodes"] if n["name"] == "node-3")
        return (body, node3) if (node3["running"] or {}).get("tokens_so_far") else None

    body, node3 = await eventually(queue_with_tokens, what="node-3's head to stream tokens")
    assert node3["running"]["id"] == head
    assert_listed(node3["running"], prompts[head])  # the running job too, with its live count
    assert [j["id"] for j in node3["queued"]] == list(prompts)[1:]
    for job in node3["queued"]:
        assert_listed(job, prompts[job["id"]])
    raw = await raw_get(lab, "/api/queue")
    assert len(raw) < 16_000, f"/api/queue is {len(raw)} bytes for three jobs"
    # Excerpts in any script cost their UTF-8 bytes, not six bytes per character as \u escapes.
    assert "Grüße an die Welt, 世界".encode() in raw and b"\\u" not in raw

    raw = await raw_get(lab, "/api/jobs?node=node-3&limit=10")
    listed = json.loads(raw)["jobs"]
    assert {j["id"] for j in listed} == set(prompts)
    for job in listed:
        assert_listed(job, prompts[job["id"]])
    assert len(raw) < 16_000, f"/api/jobs is {len(raw)} bytes for three jobs"
    assert "Grüße an die Welt, 世界".encode() in raw and b"\\u" not in raw

    for job_id, prompt in prompts.items():
        detail = await lab.job(job_id)
        assert detail["prompt"] == prompt
        assert detail["prompt_bytes"] == len(prompt.encode("utf-8"))

    out = await lab.cli("queue")
    assert out.code == 0, out.err
    lines = {
        line.split()[1]: line
        for line in out.out.splitlines()  # "  running  ID ..." / "  1  ID ..."
        if len(line.split()) > 1 and line.split()[1] in prompts
    }
    assert set(lines) == set(prompts), out.out
    for job_id, line in lines.items():
        assert line.endswith(one_line(prompts[job_id], 50)), line


async def test_a_finished_jobs_listing_and_stream_end_carry_no_prompt(lab):
    prompt = large_prompt("done")
    job = (await lab.submit("task", prompt, node="node-1"))[0]
    await lab.wait_state(job["id"], "done")
    [listed] = json.loads(await raw_get(lab, "/api/jobs?state=done&limit=5"))["jobs"]
    assert_listed(listed, prompt)

    lines = [json.loads(line) for line in (await raw_get(lab, f"/api/jobs/{job['id']}/stream")).splitlines()]
    final = lines[-1]
    assert final["done"] and final["job"]["state"] == "done"
    assert_listed(final["job"], prompt)
    assert "".join(line.get("text", "") for line in lines) == final["job"]["output"]


async def test_a_short_prompt_is_its_own_excerpt(lab):
    job = (await lab.submit("task", "  two\n words  ", node="node-1"))[0]
    [listed] = [j for j in (await lab.get("/api/jobs"))["jobs"] if j["id"] == job["id"]]
    assert listed["prompt_excerpt"] == "  two\n words  "
    assert listed["prompt_bytes"] == len("  two\n words  ")


# -- databases written before the excerpts -------------------------------------------------------


def old_database(path) -> None:
    """A database as gpuq wrote it before migration 005: a done task with its run and events,
    its critique on another node, a waiting job with a long prompt, think and options, a
    critique held for it, the views."""
    db = sqlite3.connect(path)
    db.execute("PRAGMA foreign_keys = ON")
    db.execute(
        "CREATE TABLE schema_migration (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    for f in sorted(MIGRATIONS_DIR.glob("[0-9][0-9][0-9]_*.sql")):
        if int(f.name[:3]) < 5:
            db.executescript(f.read_text())
            db.execute("INSERT INTO schema_migration VALUES (?, ?, '2026-01-01T00:00:00Z')", (int(f.name[:3]), f.stem))
    t = "2026-01-01T00:00:00.000000Z"
    rows = [
        ("1-0000000a", "task", "done", "a", "ma", "the task", None, 1024, "asked", 1, t, t),
        ("1-0000000b", "critique", "queued", "b", "mb", "critique it", "1-0000000a", 1024, "fan-out", None, t, None),
        ("1-0000000c", "task", "queued", "a", "ma", large_prompt("old"), None, 2048, "asked", None, t, None),
    ]
    db.executemany(
        "INSERT INTO job (id, kind, state, node, model, prompt, parent_id, position, placement,"
        " run_id, created_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        rows,
    )
    db.execute("UPDATE job SET think = '\"high\"', options = '{\"num_ctx\": 8192}' WHERE id = '1-0000000c'")
    db.execute(
        "INSERT INTO job (id, kind, node, model, prompt, parent_id, position, placement, created_at,"
        " subject_from_parent) VALUES ('1-0000000e', 'critique', 'b', 'mb', '(held)', '1-0000000c',"
        " 512, 'fan-out', ?, 1)",
        (t,),
    )  # b's head, held until its parent is done
    db.execute(
        "INSERT INTO run (id, job_id, node, model, state, started_at, progress_at, finished_at, output)"
        " VALUES (1, '1-0000000a', 'a', 'ma', 'done', ?, ?, ?, 'the answer')",
        (t, t, t),
    )
    db.execute("INSERT INTO event (job_id, at, to_state, actor) VALUES ('1-0000000a', ?, 'queued', 'api')", (t,))
    db.execute("CREATE VIEW stale_heads AS SELECT id FROM job WHERE state = 'running'")
    db.commit()
    db.close()


async def test_an_old_database_is_migrated_with_everything_in_it(tmp_path):
    path = tmp_path / "old.db"
    old_database(path)
    store = Store(path, max_bytes=64 * 1024 * 1024)  # with the size cap set, as gpuq.toml may
    await store.open()
    try:
        await store.configure({"stale_after_s": 600, "stale_grace_s": 30, "max_runtime_s": 3600}, [])
        task = await store.job_detail("1-0000000a")
        assert (task["prompt"], task["output"], task["state"]) == ("the task", "the answer", "done")
        assert [e["to_state"] for e in task["events"]] == ["queued"]
        assert [c["id"] for c in task["children"]] == ["1-0000000b"]
        _, queued, count = await store.queue("a", 10)
        assert count == 1
        assert_listed(queued[0], large_prompt("old"))
        waiting = await store.job_detail("1-0000000c")
        assert waiting["prompt"] == large_prompt("old")
        assert (waiting["think"], waiting["options"]) == ('"high"', '{"num_ctx": 8192}')
        assert (await store.job("1-0000000e"))["waiting_for"] == "1-0000000c"  # still held
        assert (await store.claim("b"))["id"] == "1-0000000b"  # the held head is passed over
        nodes = [NodeInfo("a", 1, ("task", "critique"), "ma", True), NodeInfo("b", 2, ("critique",), "mb", True)]
        new = await store.submit(NewJob("task", "ünïcode", node="a"), nodes, "api")
        [listed] = [j for j in await store.jobs() if j["id"] == new[0]["id"]]
        assert (listed["prompt_excerpt"], listed["prompt_bytes"]) == ("ünïcode", len("ünïcode".encode()))
    finally:
        await store.close()
    db = sqlite3.connect(path)
    try:
        # The long values last (005, and 016 after 014 appended columns behind them): a listing's
        # columns are all read without walking a prompt's overflow pages.
        columns = [r[1] for r in db.execute("PRAGMA table_xinfo(job)")]
        assert columns[-2:] == ["request", "prompt"], columns
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        try:  # the guard went with the old table: the rebuilt one has it again
            db.execute(
                "INSERT INTO job (id, kind, node, model, prompt, parent_id, position, placement,"
                " created_at) VALUES ('1-0000000d', 'critique', 'a', 'ma', 'x', '1-0000000a', 1, 'asked', 't')"
            )
            raise AssertionError("a critique was stored on its parent task's node")
        except sqlite3.IntegrityError as exc:
            assert "parent task's node" in str(exc)
    finally:
        db.close()
