"""A job that retention deleted (issue 43, item 8): asked for by id, the router's 404 says it is
not in the database because retention deleted it, and names `gpuq archive search ID`; the API,
`gpuq show` and the job page all say so. The real daemon, a real SQLite file, its retention
sweep (POST /api/prune) after the job's end was set back in the file with the router stopped
(as a person at the sqlite3 shell could), the real CLI, the page in headless Chromium."""

from __future__ import annotations

import gzip
import signal
import tomllib

import pytest
import tomli_w
from conftest import node_table, run_cli
from playwright.async_api import expect
from test_page import browser, page  # noqa: F401 (fixtures)
from test_retention import DAY, sql

from gpuq.upkeep import archive
from gpuq.upkeep.archived import ArchiveIndex

MODEL = "qwen3-coder:30b"
NEVER = "1765000000-0123abcd"  # well-formed, never made


async def deleted_job(fakes, daemon_factory) -> tuple:
    """A router whose retention deleted one done job (archived first), and kept another."""
    fake = await fakes(MODEL, tokens=4, thinking_tokens=0)
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], MODEL)], start=False)
    data = tomllib.loads(d.config.read_text())
    data["retention"] = {"delete_after": "1d"}
    d.config.write_text(tomli_w.dumps(data))
    await d.start()
    [old] = await d.submit("task", "last quarter's incident summary")
    [kept] = await d.submit("task", "this week's incident summary")
    for job in (old, kept):
        await d.wait_state(job["id"], "done", timeout=30)
    await d.kill(signal.SIGTERM)
    # It ended two days ago (only its end: it stays in the archive's file of the month it was made).
    shift = f"-{2 * DAY} seconds"
    db = d.config.parent / "gpuq.db"
    sql(
        db, "UPDATE job SET finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', finished_at, ?) WHERE id = ?", shift, old["id"]
    )
    await d.start()
    status, swept = await d.request("POST", "/api/prune", {})
    assert status == 200 and swept["deleted"]["jobs"] == 1, swept
    return d, old["id"], kept["id"]


async def test_a_job_retention_deleted_says_so_and_where_it_is(fakes, daemon_factory):
    d, gone, kept = await deleted_job(fakes, daemon_factory)
    status, body = await d.request("GET", f"/api/jobs/{gone}")
    assert status == 404, body
    said = body["error"]["message"]
    assert said.startswith(f"job {gone} is not in the database: retention deleted it; the archive has it (archived ")
    assert said.endswith(f"): gpuq archive search {gone}")
    res = await d.cli("show", gone)
    assert res.code == 1 and f"error 404 {said}" in res.err, res
    # What it names finds it, on the router's machine.
    res = await run_cli("archive", "search", gone, "--config", str(d.config))
    assert res.code == 0 and res.out.startswith(f"{gone}  task  done  on node-1"), res
    # An id never made: retention may have deleted it, and where to look.
    status, body = await d.request("GET", f"/api/jobs/{NEVER}")
    assert status == 404 and body["error"]["message"] == (
        f"no job with id '{NEVER}': not in the database; retention may have deleted it: gpuq archive search {NEVER}"
    )
    res = await d.cli("show", NEVER)
    assert res.code == 1 and "retention may have deleted it: gpuq archive search" in res.err, res
    assert (await d.job(kept))["state"] == "done"  # the other one is there, as it was


@pytest.mark.browser
async def test_the_job_page_of_a_deleted_job_names_the_archive(fakes, daemon_factory, page):
    d, gone, _ = await deleted_job(fakes, daemon_factory)
    await page.goto(f"{d.url}/jobs/{gone}")
    notice = page.locator(".notice")
    await expect(notice).to_contain_text(f"job {gone} is not in the database: retention deleted it")
    await expect(notice).to_contain_text(f"gpuq archive search {gone}")


def archived(job_id: str, created_at: str) -> dict:
    return {"id": job_id, "kind": "task", "state": "done", "node": "n", "created_at": created_at, "runs": []}


def test_the_archive_is_read_once_per_append_and_never_past_a_cut_member(tmp_path):
    """The lookup behind the 404: the id's month file and its neighbours, each member read once;
    a member cut short by a crash ends the reading, as `gpuq archive search` reads it."""
    index = ArchiveIndex(tmp_path)
    first = "1764547200-00000001"  # 2025-12-01T00:00:00Z
    archive.append(tmp_path, [archived(first, "2025-12-01T00:00:00.000000Z")], "delete", 1764600000.0)
    found = index.find(first)
    assert found is not None and found.archived_for == "delete" and found.file.name == "jobs-2025-12.jsonl.gz"
    assert found.archived_at.startswith("2025-12-01T14:40:00")
    # Made a second before the month turned, by its clock: filed under November, found all the same.
    edge = "1764547201-00000002"
    archive.append(tmp_path, [archived(edge, "2025-11-30T23:59:59.000000Z")], "delete", 1764600000.0)
    assert index.find(edge) is not None and index.find(edge).file.name == "jobs-2025-11.jsonl.gz"
    # A sweep appends: the new member is read, not the file again.
    later = "1764547300-00000003"
    archive.append(tmp_path, [archived(later, "2025-12-01T00:01:40.000000Z")], "prune", 1764600000.0)
    assert index.find(later) is not None and index.find(later).archived_for == "prune"
    # Half a member (a crash mid-append): what came before it is still found, nothing after.
    month = tmp_path / "jobs-2025-12.jsonl.gz"
    whole = month.read_bytes()
    member = gzip.compress(b'{"id":"1764547400-00000004","created_at":"2025-12-01"}\n')
    month.write_bytes(whole + member[: len(member) // 2])
    assert index.find(first) is not None and index.find(later) is not None
    assert index.find("1999999999-00000005") is None  # a month the archive does not have
