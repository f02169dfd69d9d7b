"""Load: 50 concurrent clients submit and control 10,000 jobs while the nodes run. No errors
but intended refusals, nothing lost, one job per node throughout (the fakes never see two
generations at once). GPUQ_LOAD_JOBS changes the size; the figures are printed."""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest
from conftest import node_table

JOBS = int(os.environ.get("GPUQ_LOAD_JOBS", "10000"))
CLIENTS = 50
REFUSALS = {409}  # a job that started or finished before the client's move/delete/preempt reached it
# No bound on the total time, which a busy 2-core machine stretches (84 s alone, idle; past 240 s
# beside another test worker): the drain fails when no job finished for STALL_S, and the whole
# test has a hang guard.
STALL_S = 30
TIMEOUT_S = 1200


@pytest.mark.timeout(TIMEOUT_S)
async def test_fifty_clients_ten_thousand_jobs(fakes, daemon_factory):
    models = ["qwen3-coder:30b", "deepseek-r1:32b", "llama3.2:latest"]
    # node-3's generations last a few milliseconds (not an instant), so two at once there would
    # overlap and show in its max_in_flight; the others stay instant to keep the test quick.
    fs = [await fakes(m, tokens=3, token_delay_s=0.002 if m == models[2] else 0.0, unload_delay_s=0.0) for m in models]
    d = await daemon_factory(
        [
            node_table("node-1", fs[0], 1, ["task", "critique"], models[0]),
            node_table("node-2", fs[1], 2, ["task", "critique"], models[1]),
            node_table("node-3", fs[2], 3, ["task"], models[2]),
        ],
        health_interval="5s",
    )
    accepted: list[str] = []
    statuses: dict[int, int] = {}
    unexpected: list[tuple] = []
    rng = random.Random(int(os.environ.get("GPUQ_LOAD_SEED", "7")))
    per_client = JOBS // CLIENTS

    def tally(status, body, what):
        statuses[status] = statuses.get(status, 0) + 1
        if status >= 300 and status not in REFUSALS:
            unexpected.append((what, status, body))

    async def client(n: int):
        mine: list[str] = []
        for i in range(per_client):
            status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": f"c{n} j{i}"})
            tally(status, body, "submit")
            if status == 201:
                mine.append(body["jobs"][0]["id"])
                accepted.append(body["jobs"][0]["id"])
            if mine and rng.random() < 0.3:
                target = rng.choice(mine)
                op = rng.choice(["move", "move", "delete", "preempt"])
                if op == "move":
                    status, body = await d.request(
                        "POST",
                        f"/api/jobs/{target}/move",
                        {"position": rng.randint(1, 5), "node": rng.choice(["node-1", "node-2", "node-3"])},
                    )
                elif op == "delete":
                    status, body = await d.request("DELETE", f"/api/jobs/{target}")
                else:
                    status, body = await d.request("POST", f"/api/jobs/{target}/preempt")
                tally(status, body, op)

    started = time.monotonic()
    await asyncio.gather(*(client(n) for n in range(CLIENTS)))
    submitted_s = time.monotonic() - started

    await drain(d)
    total_s = time.monotonic() - started

    assert unexpected == []
    assert len(accepted) == per_client * CLIENTS
    states: dict[str, int] = {}
    rows = (await d.get(f"/api/jobs?limit={JOBS}"))["jobs"]
    assert {r["id"] for r in rows} == set(accepted)  # nothing lost
    for r in rows:
        states[r["state"]] = states.get(r["state"], 0) + 1
    failed = [(r["id"], r["error"]) for r in rows if r["state"] == "failed"]
    assert set(states) <= {"done", "cancelled"}, failed[:5]
    assert [f.max_in_flight for f in fs] == [1, 1, 1]
    print(
        f"\nload: {len(accepted)} jobs from {CLIENTS} clients; submit phase {submitted_s:.1f}s "
        f"({len(accepted) / submitted_s:.0f} jobs/s with control ops), drained in {total_s:.1f}s; "
        f"statuses {statuses}; final states {states}"
    )


async def drain(d) -> None:
    """Wait for the queue to empty while it keeps moving: fail once nothing has finished for STALL_S."""
    left, moved = None, time.monotonic()
    while True:
        health = await d.get("/health")
        now_left = health["queue_depth"] + health["running"]
        if now_left == 0:
            return
        if now_left != left:
            left, moved = now_left, time.monotonic()
        assert time.monotonic() - moved < STALL_S, (
            f"the queue stopped draining: {left} jobs left, none ended in {STALL_S}s"
        )
        await asyncio.sleep(0.5)  # a poll's pace, not a synchronisation
