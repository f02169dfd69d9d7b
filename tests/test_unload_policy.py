"""The unload policy. By default every job ends with its model out of VRAM, verified. With
unload = "when-idle" (opt-in), back-to-back jobs of one model keep it loaded; it leaves VRAM,
verified as always, when the node goes idle or the next job wants another model."""

from __future__ import annotations

from conftest import eventually, node_table


def unloads(fake) -> list[str]:
    """The explicit unload requests (an empty chat with keep_alive 0), in order, with the
    generations between them: 'gen:<model>' or 'unload:<model>'."""
    return [("unload:" if not (r.get("messages") or r.get("prompt")) else "gen:") + r["model"] for r in fake.requests]


async def test_when_idle_keeps_one_model_loaded_across_back_to_back_jobs(fakes, daemon_factory):
    fake = await fakes("qwen3:latest", token_delay_s=0.05, tokens=6)
    d = await daemon_factory([dict(node_table("n", fake, 1, ["task"], "qwen3:latest"), unload="when-idle")])
    ids = [(await d.submit("task", f"job {i}"))[0]["id"] for i in range(3)]
    for job_id in ids:
        await d.wait_state(job_id, "done")
    await eventually(lambda: fake.loaded == {}, 10, what="the model to leave VRAM once the node is idle")
    assert unloads(fake) == ["gen:qwen3:latest"] * 3 + ["unload:qwen3:latest"]
    assert {r["keep_alive"] for r in fake.chat_requests} == {"10m"}


async def test_when_idle_unloads_before_switching_model(fakes, daemon_factory):
    fake = await fakes("qwen3:latest", "llama3.2:latest", token_delay_s=0.05, tokens=6)
    d = await daemon_factory([dict(node_table("n", fake, 1, ["task"], "qwen3:latest"), unload="when-idle")])
    first = (await d.submit("task", "on the node's model"))[0]["id"]
    other = (await d.submit("task", "on another model", model="llama3.2"))[0]["id"]
    await d.wait_state(other, "done")
    await eventually(lambda: fake.loaded == {}, 10, what="the last model to leave VRAM")
    assert unloads(fake) == ["gen:qwen3:latest", "unload:qwen3:latest", "gen:llama3.2", "unload:llama3.2"]
    assert (await d.job(first))["state"] == "done"


async def test_the_default_unloads_after_every_job(fakes, daemon_factory):
    fake = await fakes("qwen3:latest", token_delay_s=0.05, tokens=6)
    d = await daemon_factory([node_table("n", fake, 1, ["task"], "qwen3:latest")])
    ids = [(await d.submit("task", f"job {i}"))[0]["id"] for i in range(2)]
    for job_id in ids:
        await d.wait_state(job_id, "done")
    assert {r["keep_alive"] for r in fake.chat_requests} == {0}
    assert fake.loaded == {}


async def test_a_bad_unload_policy_stops_the_router_naming_the_key(fakes, daemon_factory):
    fake = await fakes("qwen3:latest")
    d = await daemon_factory(
        [dict(node_table("n", fake, 1, ["task"], "qwen3:latest"), unload="sometimes")], start=False
    )
    res = await d.cli("serve", "--config", str(d.config))
    assert res.code == 78
    assert "node 'n'.unload: expected \"after-each\" or \"when-idle\", got 'sometimes'" in res.err
