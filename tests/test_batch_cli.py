"""`gpuq batch` with the real CLI against the real daemon (issue 37): submit, show, list,
results; a router killed mid-batch resumes it (the line running at the crash fails loudly, the
counts say so) and `gpuq batch retry ID --failed` runs it again on purpose; max_waiting counts a
batch's lines (429 naming the limit, nothing stored); interactive calls go ahead of its lines."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from conftest import eventually, free_port, node_table, shell
from test_batches import chat_line, jsonl
from test_front import CHAT_MODEL
from test_users import TOKENS, USERS, edit_config

TOKEN = "s3cret"


async def batch_lab(fakes, daemon_factory, tmp_path, users=None, **script):
    fake = await fakes(CHAT_MODEL, **script)
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", fake, 1, ["task"], CHAT_MODEL)],
        start=False,
        ollama_listen=f"127.0.0.1:{port}",
        **({} if users else {"token": TOKEN}),
    )
    if users:
        edit_config(daemon, lambda data: data.update(user=users))
    await daemon.start()
    daemon.auth = {"Authorization": f"Bearer {TOKENS['root'] if users else TOKEN}"}
    daemon.front_url = f"http://127.0.0.1:{port}"
    return daemon, fake


def input_file(tmp_path, n: int, prefix: str = "line") -> str:
    path = tmp_path / "sweep.jsonl"
    path.write_bytes(jsonl(*(chat_line(f"{prefix}-{i}", f"{prefix} {i}") for i in range(n))))
    return str(path)


async def ended(daemon, batch_id: str, timeout: float = 30.0) -> dict:
    async def done():
        b = (await daemon.get(f"/api/batches/{batch_id}"))["batch"]
        return b if b["status"] in ("completed", "failed", "cancelled") else None

    return await eventually(done, timeout, what=f"batch {batch_id} to end")


async def test_submit_wait_show_list_and_results(fakes, daemon_factory, tmp_path):
    daemon, _ = await batch_lab(fakes, daemon_factory, tmp_path)
    res = await daemon.cli("batch", "submit", input_file(tmp_path, 3), "--name", "eval-sweep", "--wait", timeout=60)
    assert res.code == 0, res
    assert "completed" in res.out and "3 of 3 done" in res.out
    listed = await daemon.cli("batch", "list", "--json")
    [b] = json.loads(listed.out)["batches"]
    assert (b["name"], b["status"], b["request_counts"]) == (
        "eval-sweep",
        "completed",
        {"total": 3, "completed": 3, "failed": 0},
    )
    shown = await daemon.cli("batch", "show", b["id"])
    assert shown.code == 0 and "3 of 3 done" in shown.out and "eval-sweep" in shown.out
    out = await daemon.cli("batch", "results", b["id"])
    lines = [json.loads(line) for line in out.out.splitlines()]
    assert [line["custom_id"] for line in lines] == ["line-0", "line-1", "line-2"]
    assert all(line["response"]["status_code"] == 200 for line in lines)
    status, text = await daemon.request("GET", "/metrics")
    assert status == 200 and 'gpuq_batches{status="completed"} 1.0' in text
    assert 'gpuq_batch_lines{state="done"} 0.0' in text  # only the batches in progress count here
    missing = await daemon.cli("batch", "show", "batch_nope")
    assert missing.code == 1 and "error 404 no batch 'batch_nope'" in missing.err


async def test_a_file_of_garbage_fails_whole_and_the_cli_names_its_lines(fakes, daemon_factory, tmp_path):
    daemon, _ = await batch_lab(fakes, daemon_factory, tmp_path)
    path = tmp_path / "garbage.jsonl"
    path.write_bytes(b"\x00\x01garbage\nmore garbage\n")
    res = await daemon.cli("batch", "submit", str(path))
    assert res.code == 1 and "failed" in res.out
    assert "line 1: invalid_json_line" in res.err and "line 2: invalid_json_line" in res.err
    assert shell(daemon, "SELECT COUNT(*) FROM job") == [(0,)]


async def test_a_router_killed_mid_batch_resumes_it_and_retry_failed_runs_the_lost_line(
    fakes, daemon_factory, tmp_path
):
    daemon, fake = await batch_lab(fakes, daemon_factory, tmp_path, token_delay_s=0.05, tokens=30)
    res = await daemon.cli("batch", "submit", input_file(tmp_path, 4), "--json")
    assert res.code == 0, res
    batch_id = json.loads(res.out)["id"]

    async def first_running():
        b = (await daemon.get(f"/api/batches/{batch_id}"))["batch"]
        return b["counts"]["running"] == 1

    await eventually(first_running, 15, what="the batch's first line to run")
    status, text = await daemon.request("GET", "/metrics")
    assert 'gpuq_batches{status="in_progress"} 1.0' in text
    assert 'gpuq_batch_lines{state="running"} 1.0' in text and 'gpuq_batch_lines{state="queued"} 3.0' in text
    await daemon.kill()
    fake.script.token_delay_s = 0.0
    await daemon.start()
    done = await ended(daemon, batch_id)
    # The line running at the crash failed, loudly; the waiting ones ran after the restart.
    assert done["status"] == "completed" and done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    shown = await daemon.cli("batch", "show", batch_id)
    assert "failed lines:" in shown.out and "line-0" in shown.out and "router" in shown.out
    retried = await daemon.cli("batch", "retry", batch_id, "--failed")
    assert retried.code == 0 and "1 lines queued again" in retried.out
    again = await ended(daemon, batch_id)
    assert again["request_counts"] == {"total": 4, "completed": 4, "failed": 0} and again["error_file_id"] is None
    out = await daemon.cli("batch", "results", batch_id)
    assert [json.loads(line)["response"]["status_code"] for line in out.out.splitlines()] == [200] * 4


async def test_max_waiting_counts_a_batchs_lines_and_interactive_calls_go_first(fakes, daemon_factory, tmp_path):
    users = [dict(USERS[0], max_waiting=3), USERS[1], USERS[2]]
    daemon, fake = await batch_lab(fakes, daemon_factory, tmp_path, users=users, token_delay_s=0.05, tokens=2000)
    alice = openai.AsyncOpenAI(base_url=daemon.front_url + "/v1", api_key=TOKENS["alice"], max_retries=0)
    bob = openai.AsyncOpenAI(base_url=daemon.front_url + "/v1", api_key=TOKENS["bob"], max_retries=0)
    try:
        big = await alice.files.create(
            file=("big.jsonl", jsonl(*(chat_line(f"b{i}", f"b {i}") for i in range(5)))), purpose="batch"
        )
        with pytest.raises(openai.RateLimitError) as exc:
            await alice.batches.create(input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert "max_waiting is 3" in exc.value.message and "5 jobs would pass it" in exc.value.message
        assert shell(daemon, "SELECT COUNT(*) FROM batch") == [(0,)] and shell(daemon, "SELECT COUNT(*) FROM job") == [
            (0,)
        ]
        small = await alice.files.create(
            file=("s.jsonl", jsonl(*(chat_line(f"s{i}", f"sweep {i}") for i in range(3)))), purpose="batch"
        )
        batch = await alice.batches.create(
            input_file_id=small.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.request_counts.total == 3
        await eventually(
            lambda: shell(daemon, "SELECT COUNT(*) FROM job WHERE state = 'running'") == [(1,)],
            15,
            what="a line to run",
        )
        call = asyncio.create_task(
            bob.chat.completions.create(model=CHAT_MODEL, messages=[{"role": "user", "content": "interactive"}])
        )

        async def bob_first():
            queue = (await daemon.get("/api/queue"))["nodes"]
            waiting = [j for n in queue for j in n.get("queued", [])]
            return [j["prompt_excerpt"] for j in waiting][:1] == ["interactive"]

        await eventually(bob_first, 15, what="bob's call ahead of alice's waiting lines")
        call.cancel()
    finally:
        await alice.close()
        await bob.close()


async def test_a_file_past_the_apis_request_limit_is_refused_naming_the_way_round(fakes, daemon_factory, tmp_path):
    fake = await fakes(CHAT_MODEL)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task"], CHAT_MODEL)], max_prompt_bytes=1000)
    path = tmp_path / "big.jsonl"
    path.write_bytes(jsonl(*(chat_line(f"b{i}", "x" * 500) for i in range(200))))  # ~140 kB
    res = await daemon.cli("batch", "submit", str(path))
    assert res.code == 1 and res.err.startswith("error 413 ") and "client.files.create" in res.err
    assert shell(daemon, "SELECT COUNT(*) FROM batch") == [(0,)]


def age_batch(daemon, batch_id: str, days: float) -> None:
    """The batch and its lines' jobs ended (and were made) `days` ago, as a person at the
    sqlite3 shell could make it so while the router is stopped."""
    import sqlite3

    shift = f"-{days * 86400} seconds"
    stamp = "strftime('%Y-%m-%dT%H:%M:%fZ', {0}, ?)"
    db = sqlite3.connect(daemon.config.parent / "gpuq.db")
    with db:
        db.execute(
            f"UPDATE batch SET created_at = {stamp.format('created_at')}, finalizing_at ="
            f" {stamp.format('finalizing_at')}, completed_at = {stamp.format('completed_at')} WHERE id = ?",
            (shift, shift, shift, batch_id),
        )
        db.execute(
            f"UPDATE job SET created_at = {stamp.format('created_at')}, finished_at = {stamp.format('finished_at')}"
            " WHERE id IN (SELECT job_id FROM batch_line WHERE batch_id = ?)",
            (shift, shift, batch_id),
        )
    db.close()


async def test_retention_prunes_an_old_batchs_files_then_deletes_it_archiving_it_first(fakes, daemon_factory, tmp_path):
    """Past prune_after an ended batch keeps its status and counts, not its files or replies
    (410 naming retention, through the front door and the CLI); past delete_after it goes, and
    then its jobs; each time archived first, one line per batch in batches-YYYY-MM.jsonl.gz."""
    import gzip
    import signal

    daemon, _ = await batch_lab(fakes, daemon_factory, tmp_path)
    client = openai.AsyncOpenAI(base_url=daemon.front_url + "/v1", api_key=TOKEN, max_retries=0)
    try:
        submitted = await daemon.cli("batch", "submit", input_file(tmp_path, 2, "kept"), "--json")
        b = json.loads(submitted.out)
        done = await ended(daemon, b["id"])
        assert done["output_file_id"] is not None and done["pruned_at"] is None
        await daemon.kill(signal.SIGTERM)
        age_batch(daemon, b["id"], 40)
        await daemon.start()

        dry = await daemon.cli("prune", "--dry-run")
        assert "batches: would prune the files of 1 (2 file(s)," in dry.out, dry
        pruned = json.loads((await daemon.cli("prune", "--json")).out)
        assert pruned["sweeps"] == {"pruned": 1, "deleted": 0, "lines": 0, "files": 2, "archived": 1}
        shown = (await daemon.get(f"/api/batches/{b['id']}"))["batch"]
        assert shown["pruned_at"] is not None and shown["status"] == "completed"
        assert shown["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
        with pytest.raises(openai.APIStatusError) as exc:
            await client.files.content(done["output_file_id"])
        assert exc.value.status_code == 410 and "pruned by retention" in exc.value.message
        with pytest.raises(openai.APIStatusError) as exc:
            await client.files.retrieve(done["input_file_id"])
        assert exc.value.status_code == 410
        results = await daemon.cli("batch", "results", b["id"])
        assert results.code == 1 and results.err.startswith("error 410 ") and "retention" in results.err, results

        await daemon.kill(signal.SIGTERM)
        age_batch(daemon, b["id"], 400)
        await daemon.start()
        said = await daemon.cli("prune")
        assert said.code == 0, said
        assert (
            "batches: pruned the files and replies of 0, deleted 1 with 2 line(s); 0 file(s) and 1 archive line(s)"
            in said.out
        ), said.out
        assert said.out.startswith("deleted 2 job(s)")  # its jobs went after it, in the same sweep
        status, _ = await daemon.request("GET", f"/api/batches/{b['id']}")
        assert status == 404

        archived = []
        for path in sorted((tmp_path / "gpuq-archive").glob("batches-*.jsonl.gz")):
            with gzip.open(path, "rt") as f:
                archived += [json.loads(line) for line in f]
        archived.sort(key=lambda a: a["archived_at"])  # (each in its month's file: the month it was made)
        assert [(a["id"], a["archived_for"]) for a in archived] == [(b["id"], "prune"), (b["id"], "delete")]
        first = archived[0]
        assert [line["custom_id"] for line in first["lines"]] == ["kept-0", "kept-1"]
        assert all(json.loads(line["response"])["choices"] for line in first["lines"])
        assert {f["id"] for f in first["files"]} == {done["input_file_id"], done["output_file_id"]}
        assert '"custom_id": "kept-0"' in next(f for f in first["files"] if f["id"] == done["input_file_id"])["content"]
        assert archived[1]["pruned_at"] is not None and archived[1]["files"] == []
    finally:
        await client.close()
