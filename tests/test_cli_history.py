"""`gpuq history`: finished jobs, newest first, filtered by state, node and time; and a `gpuq
task` that does not wait says where to look later."""

from __future__ import annotations

import json
import re
from datetime import datetime

from gpuq.jobs import parse_iso


async def three_ended_jobs(lab) -> dict[str, dict]:
    """One job done on node-3, then one failed on node-1, then one cancelled while waiting."""
    done = (await lab.submit("task", "the done one", node="node-3"))[0]["id"]
    await lab.wait_state(done, "done")
    lab.fakes["node-1"].script.error_after = 2
    failed = (await lab.submit("task", "the failing one", node="node-1"))[0]["id"]
    await lab.wait_state(failed, "failed")
    lab.fakes["node-3"].script.stall_after = 1
    head = (await lab.submit("task", "the stalled head", node="node-3"))[0]["id"]
    await lab.wait_state(head, "running")
    cancelled = (await lab.submit("task", "the cancelled one", node="node-3"))[0]["id"]
    assert (await lab.request("DELETE", f"/api/jobs/{cancelled}"))[0] == 200
    return {k: await lab.job(v) for k, v in (("done", done), ("failed", failed), ("cancelled", cancelled))}


async def test_history_lists_finished_jobs_newest_first_with_why_they_failed(lab):
    jobs = await three_ended_jobs(lab)
    res = await lab.cli("history")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert re.fullmatch(r"JOB +STATE +NODE +KIND +OWNER +ENDED +RAN  PROMPT", lines[0])
    rows = [line for line in lines[1:] if not line.startswith(" ")]
    assert [r.split()[:3] for r in rows] == [
        [jobs["cancelled"]["id"], "cancelled", "node-3"],
        [jobs["failed"]["id"], "failed", "node-1"],
        [jobs["done"]["id"], "done", "node-3"],
    ]
    assert rows[2].endswith("the done one") and re.search(r" \d+s ago +\d+s  the done one$", rows[2])
    assert re.search(r" ago +-  the cancelled one$", rows[0])  # it never ran
    # Under a failed job, why.
    assert lines[lines.index(rows[1]) + 1].strip() == jobs["failed"]["error"]

    res = await lab.cli("history", "--state", "failed")
    assert res.code == 0, res.err
    failed = res.out.splitlines()[1:]
    assert failed[0].split()[:2] == [jobs["failed"]["id"], "failed"] and len(failed) == 2  # the row, its error
    on_3 = [
        line.split()[0]
        for line in (await lab.cli("history", "--node", "node-3")).out.splitlines()[1:]
        if not line.startswith(" ")
    ]  # (under the cancelled one: who deleted it)
    assert on_3 == [jobs["cancelled"]["id"], jobs["done"]["id"]]
    res = await lab.cli("history", "--state", "done", "--node", "node-1")
    assert res.out == "no finished jobs match\n"


async def test_history_since_and_limit_and_json(lab):
    jobs = await three_ended_jobs(lab)
    # A moment between the done job's end and the failed one's: only the two later ones are since.
    cut = (parse_iso(jobs["done"]["finished_at"]) + parse_iso(jobs["failed"]["finished_at"])) / 2
    res = await lab.cli("history", "--since", datetime.fromtimestamp(cut).isoformat(), "--json")
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert [j["id"] for j in data["jobs"]] == [jobs["cancelled"]["id"], jobs["failed"]["id"]]
    assert data["more"] is False and data["jobs"][1]["error"] == jobs["failed"]["error"]
    assert len(json.loads((await lab.cli("history", "--since", "1h", "--json")).out)["jobs"]) == 3
    res = await lab.cli("history", "--limit", "1")
    assert res.out.splitlines()[1].split()[0] == jobs["cancelled"]["id"]
    assert (
        res.out.splitlines()[-1] == "… more: raise --limit (now 1), or narrow with --state, --node, --owner or --since"
    )
    res = await lab.cli("history", "--since", "yesterday")
    assert res.code == 2 and "expected a time ago like 30m, 2h or 3d" in res.err


async def test_task_without_wait_says_where_to_look(lab):
    res = await lab.cli("task", "hello", "--node", "node-3")
    assert res.code == 0, res.err
    job_id = res.out.split()[0]
    assert len(res.out.splitlines()) == 3  # the id, the preview link, the estimate: what scripts read
    assert res.err.splitlines() == [
        f"not waiting: follow it with `gpuq wait {job_id}` or the preview link; later, "
        f"`gpuq show {job_id}` or `gpuq history` says how it ended"
    ]
