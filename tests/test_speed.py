"""Each node's measured speed (issue 45, item 4): prompt and output tokens per second and the
load time of a node's model, from its own done runs, through the real daemon and the simulated
Ollama, as `gpuq nodes` and /api/nodes show them."""

from __future__ import annotations

import json

import pytest
from conftest import node_table
from playwright.async_api import expect
from test_page import browser, open_queue, page  # noqa: F401 (the page tests' fixtures)

from gpuq.jobs import parse_iso
from gpuq.speed import num_text

MODEL = "qwen3-coder:30b"
LOAD_S = 0.3  # the simulator's cold load; gpuq unloads after each job, so every run pays it


async def two_nodes(fakes, daemon_factory):
    busy = await fakes(MODEL, token_delay_s=0.01, tokens=20, load_delay_s=LOAD_S)
    idle = await fakes(MODEL)
    return await daemon_factory(
        [
            node_table("node-1", busy, 1, ["task", "critique"], MODEL),
            node_table("node-2", idle, 2, ["task", "critique"], MODEL),
        ]
    )


async def test_gpuq_nodes_shows_each_nodes_measured_speed_from_its_runs(fakes, daemon_factory):
    d = await two_nodes(fakes, daemon_factory)
    done = []
    for i in range(2):
        [job] = await d.submit("task", f"count to {i}", node="node-1")
        done.append(await d.wait_state(job["id"], "done", timeout=20))

    nodes = {n["name"]: n for n in json.loads((await d.cli("nodes", "--json")).out)["nodes"]}
    speed = nodes["node-1"]["speed"]
    # Output tokens per second: the runs' own tokens over their own generation time, as Ollama
    # reported them (each job shows its count and duration).
    tokens = sum(j["eval_count"] for j in done)
    seconds = sum(j["eval_duration_ns"] for j in done) / 1e9
    assert speed["runs"] == 2 and tokens == 40
    assert abs(speed["output_tokens_per_s"] - tokens / seconds) <= 0.1, (speed, tokens, seconds)
    assert speed["prompt_tokens_per_s"] > 0
    # The load: what a cold run paid, at least the simulator's load and no longer than a run.
    longest = max(parse_iso(j["finished_at"]) - parse_iso(j["started_at"]) for j in done)
    assert LOAD_S <= speed["load_s"] <= longest, (speed, longest)
    assert nodes["node-2"]["speed"] == {
        "runs": 0,
        "prompt_tokens_per_s": None,
        "output_tokens_per_s": None,
        "load_s": None,
    }

    res = await d.cli("nodes")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("node-1 "))
    assert lines[at + 1].split() == [
        "speed:",
        "prompt",
        num_text(speed["prompt_tokens_per_s"]),
        "tok/s,",
        "output",
        num_text(speed["output_tokens_per_s"]),
        "tok/s,",
        "load",
        num_text(speed["load_s"]),
        "s",
        "(2",
        "runs)",
    ]
    assert [line for line in lines if "speed:" in line] == [lines[at + 1]]  # node-2: nothing measured, no line


async def test_a_job_asked_by_the_models_short_name_counts_for_its_speed(fakes, daemon_factory):
    """Ollama runs "m" as "m:latest": a node configured with one is measured on runs of both."""
    fake = await fakes("llama3.2:latest")
    d = await daemon_factory([node_table("node-1", fake, 1, ["task", "critique"], "llama3.2:latest")])
    for model in ("llama3.2", "llama3.2:latest"):
        [job] = await d.submit("task", "hi", model=model)
        await d.wait_state(job["id"], "done", timeout=20)
    [node] = json.loads((await d.cli("nodes", "--json")).out)["nodes"]
    assert node["speed"]["runs"] == 2 and node["speed"]["output_tokens_per_s"] > 0


async def test_the_eta_counts_the_load_only_for_a_job_that_finds_its_model_cold(fakes, daemon_factory):
    """A node that keeps its model between back-to-back jobs (unload = "when-idle"): its past
    runs each loaded the model (the node went idle between them), the jobs waiting behind a
    running job of the same model will not. Their estimated run time leaves the load out; the
    plain median of the past runs (each over LOAD_S) would not."""
    load_s = 1.5
    fake = await fakes(MODEL, token_delay_s=0.02, tokens=2, load_delay_s=load_s)
    d = await daemon_factory([dict(node_table("node-1", fake, 1, ["task"], MODEL), unload="when-idle")])
    for i in range(2):  # the history: cold runs
        [job] = await d.submit("task", f"past {i}")
        past = await d.wait_state(job["id"], "done", timeout=20)
        assert parse_iso(past["finished_at"]) - parse_iso(past["started_at"]) >= load_s

    fake.script.hold_after = 1  # the running job holds until released: its followers wait
    [running] = await d.submit("task", "runs first")
    await d.wait_state(running["id"], "running")
    waiting = [(await d.submit("task", f"waits {i}"))[0]["id"] for i in range(3)]
    shown = [await d.job(job_id) for job_id in waiting]
    fake.script.hold_after = None
    fake.script.released.set()

    spans = [parse_iso(j["eta_finish"]) - parse_iso(j["eta_start"]) for j in shown]
    assert all(span < load_s for span in spans), spans
    for job_id in waiting:  # and they did run warm: no load
        job = await d.wait_state(job_id, "done", timeout=20)
        assert parse_iso(job["finished_at"]) - parse_iso(job["started_at"]) < load_s, job


@pytest.mark.browser
async def test_the_node_card_shows_its_measured_speed_once_a_run_is_done(fakes, daemon_factory, page):
    d = await two_nodes(fakes, daemon_factory)
    d.fakes = {"node-1": None, "node-2": None}  # open_queue counts the columns by them
    await open_queue(page, d)
    line = page.locator('.col[data-node="node-1"] .col-speed')
    await expect(line).to_have_count(0)  # nothing measured yet: no line
    [job] = await d.submit("task", "count", node="node-1")
    await d.wait_state(job["id"], "done", timeout=20)
    [node] = [n for n in (await d.get("/api/nodes"))["nodes"] if n["name"] == "node-1"]
    s = node["speed"]
    await expect(line).to_have_text(
        f"speed: prompt {num_text(s['prompt_tokens_per_s'])} tok/s · output {num_text(s['output_tokens_per_s'])}"
        f" tok/s · load {num_text(s['load_s'])} s"
    )
    await expect(page.locator('.col[data-node="node-2"] .col-speed')).to_have_count(0)
