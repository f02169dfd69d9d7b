"""`gpuq models` (issue 45, item 1): every node's models as its Ollama lists them (/api/tags,
/api/ps), with the config's choice, their use and measured speed, through the real daemon and
the simulated Ollama; a node that does not answer says so."""

from __future__ import annotations

import json

import aiohttp
from conftest import eventually, free_port, node_table

from gpuq.jobs import parse_iso

MODEL = "qwen3-coder:30b"
OTHER = "llama3.2:latest"


async def tags_of(url: str) -> dict[str, dict]:
    async with aiohttp.ClientSession() as s, s.get(url + "/api/tags") as resp:
        return {m["name"]: m for m in (await resp.json())["models"]}


async def test_gpuq_models_lists_each_nodes_models_loaded_configured_used_and_timed(fakes, daemon_factory):
    one = await fakes(MODEL, OTHER, token_delay_s=0.01, tokens=10)
    two = await fakes(MODEL)
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens: the node is down
    d = await daemon_factory(
        [
            node_table("node-1", one, 1, ["task"], MODEL),
            node_table("node-2", two, 2, ["task"], "mistral:7b"),
            {"name": "node-3", "url": gone, "rank": 3, "roles": ["task"], "model": MODEL},
        ]
    )
    [job] = await d.submit("task", "count", node="node-1")
    done = await d.wait_state(job["id"], "done", timeout=20)
    one.script.hold_after = 1  # a job of the other model holds it loaded while we look
    [held] = await d.submit("task", "hold", node="node-1", model=OTHER)
    await d.wait_state(held["id"], "running")
    await eventually(lambda: one.loaded.get(OTHER) is not None, what="the held job's model to load")

    async def answer() -> dict | None:
        data = json.loads((await d.cli("models", "--json")).out)
        nodes = {n["name"]: n for n in data["nodes"]}
        return nodes if len(nodes["node-2"]["models"]) == 2 else None  # node-2's tags read

    nodes = await eventually(answer, what="gpuq models to list node-2's installed models")
    text = (await d.cli("models")).out
    one.script.hold_after = None
    one.script.released.set()

    listed = await tags_of(one.url)
    [other, model] = nodes["node-1"]["models"]
    assert (model["name"], other["name"]) == (MODEL, OTHER)
    details = listed[MODEL]["details"]
    assert (model["size"], model["family"], model["parameter_size"], model["quantization"]) == (
        listed[MODEL]["size"],
        details["family"],
        details["parameter_size"],
        details["quantization_level"],
    )
    assert (model["installed"], model["loaded"], model["configured"], model["jobs_30d"]) == (True, False, True, 1)
    assert parse_iso(model["last_used"]) == parse_iso(done["finished_at"])
    assert model["speed"]["runs"] == 1 and model["speed"]["output_tokens_per_s"] > 0
    # Loaded now by the held job, not named by the config, its run not ended: no use yet.
    assert (other["installed"], other["loaded"], other["configured"], other["jobs_30d"]) == (True, True, False, 0)
    assert other["last_used"] is None and other["speed"]["runs"] == 0
    # node-2: the config names a model it does not have.
    assert [(m["name"], m["installed"], m["configured"]) for m in nodes["node-2"]["models"]] == [
        ("mistral:7b", False, True),
        (MODEL, True, False),
    ]
    # node-3 answers nothing: what it has loaded is unknown, and why is said.
    down = nodes["node-3"]
    assert down["up"] is False and down["ps_error"]
    assert [(m["name"], m["installed"], m["loaded"]) for m in down["models"]] == [(MODEL, False, None)]

    lines = text.splitlines()
    assert lines[0].split()[:3] == ["NODE", "MODEL", "SIZE"]
    [row] = [line for line in lines if line.startswith("node-1") and MODEL in line]
    assert row.split()[:3] == ["node-1", "*", MODEL] and " no " in row and " 1 " in row
    [row] = [line for line in lines if line.startswith("node-1") and OTHER in line]
    assert " yes " in row and row.split()[-4:] == ["never", "-", "-", "-"]
    assert any(line.strip().startswith("node-3") and "(not installed)" in line for line in lines)
    assert any(line.strip() == f"loaded now unknown: {down['ps_error']}" for line in lines)


async def test_gpuq_models_counts_a_models_short_name_with_its_full_one(fakes, daemon_factory):
    """A job that asked for "llama3.2" ran "llama3.2:latest": one model, one count."""
    fake = await fakes(OTHER)
    d = await daemon_factory([node_table("node-1", fake, 1, ["task"], OTHER)])
    for model in ("llama3.2", OTHER):
        [job] = await d.submit("task", "hi", model=model)
        await d.wait_state(job["id"], "done", timeout=20)
    [node] = json.loads((await d.cli("models", "--json")).out)["nodes"]
    [model] = node["models"]
    assert (model["name"], model["jobs_30d"], model["speed"]["runs"]) == (OTHER, 2, 2)
