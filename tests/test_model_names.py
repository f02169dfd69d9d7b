"""Model names as Ollama matches them, and placement by the model a job names: a task goes to
the first free task node whose Ollama lists the model, never to a node that would refuse it."""

from __future__ import annotations

from conftest import eventually, node_table


async def heard_from_every_node(d) -> None:
    async def all_listed():
        return all(n["model_installed"] is not None for n in (await d.get("/api/nodes"))["nodes"])

    await eventually(all_listed, 15, what="every node's model list")


async def test_a_task_naming_a_model_goes_to_a_node_that_has_it(lab):
    await heard_from_every_node(lab)
    # node-1 is free and first by rank, but only node-3's Ollama has llama3.2.
    for name in ("llama3.2", "LLAMA3.2:latest", "registry.ollama.ai/library/llama3.2"):
        res = await lab.cli("task", "hello", "--model", name)
        assert res.code == 0, res.err
        job_id, arrow, node = res.out.split()[:3]
        assert node == "node-3"
        assert (await lab.wait_state(job_id, "done"))["node"] == "node-3"
    assert [r["model"] for r in lab.fakes["node-3"].chat_requests] == [
        "llama3.2",
        "LLAMA3.2:latest",
        "registry.ollama.ai/library/llama3.2",
    ]
    assert lab.fakes["node-1"].chat_requests == []


async def test_a_model_no_task_node_has_is_refused_naming_what_each_has(lab):
    await heard_from_every_node(lab)
    res = await lab.cli("task", "hello", "--model", "deepseek-r1:32b")  # only node-2, a critique node, has it
    assert res.code == 1
    assert res.err.splitlines() == [
        "error 422 model 'deepseek-r1:32b' is not installed on any task node (node-1: qwen3-coder:30b; "
        "node-3: llama3.2:latest); pull it on one or choose another model",
        "not retried",
    ]
    assert (await lab.get("/api/jobs"))["jobs"] == []


async def test_the_vram_check_matches_names_as_ollama_does(fakes, daemon_factory):
    """A job that names its model in other letters still has its unload verified: a model that
    will not leave VRAM flags the node (a case-sensitive check would see nothing loaded)."""
    fake = await fakes("qwen3:latest", unload="never")
    d = await daemon_factory([node_table("n", fake, 1, ["task"], "qwen3:latest")], unload_timeout="0.5s")
    await heard_from_every_node(d)
    [job] = await d.submit("task", "hi", model="Qwen3")
    await d.wait_state(job["id"], "done", "failed")

    async def flagged():
        return (await d.get("/api/nodes"))["nodes"][0]["vram_stuck"]

    message = await eventually(flagged, 10, what="the node to be flagged")
    assert "Qwen3 did not leave VRAM" in message
