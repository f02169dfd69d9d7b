"""Real Ollama's thinking models and limits, through the real daemon and the faithful simulator:
the reasoning is kept apart from the answer, a reply cut at the token limit fails loudly, a
prompt Ollama cut to fit its context window is a warning, and Ollama's own 400 for `think` on
a model that cannot think fails the job verbatim."""

from __future__ import annotations

import json
import re

import pytest
from conftest import eventually, node_table


@pytest.fixture
async def thinker(fakes, daemon_factory):
    fake = await fakes("qwen3:8b", "qwen3-coder:30b", token_delay_s=0.01)
    d = await daemon_factory([node_table("gpu", fake, 1, ["task", "critique"], "qwen3:8b")])
    d.fake = fake
    return d


async def stream_lines(d, job_id: str) -> list[dict]:
    async with d.session.get(f"{d.url}/api/jobs/{job_id}/stream") as resp:
        return [json.loads(line) async for line in resp.content if line.strip()]


async def test_the_reasoning_is_kept_apart_from_the_answer(thinker):
    d = thinker
    res = await d.cli("task", "why is the sky blue", "--wait")
    assert res.code == 0, res.err
    job_id = res.out.split()[0]
    job = await d.job(job_id)
    [run] = job["runs"]
    assert job["thinking"] and run["thinking"] == job["thinking"]
    assert job["output"] and job["thinking"] not in job["output"]  # output is the answer alone
    # gpuq task --wait marks the reasoning, then the answer.
    lines = res.out.splitlines()
    assert lines[2].startswith(("est. start", "started; est. finish", "already done")), lines[2]  # when it starts
    assert lines[3] == "-- thinking --"
    assert "-- answer --" in lines and lines[lines.index("-- answer --") + 1].startswith(job["output"][:20])
    # The stream replays both kinds, the reasoning first; the CLI's show has it too.
    replay = await stream_lines(d, job_id)
    assert [next(iter(k for k in ("thinking", "text", "done") if k in line)) for line in replay] == [
        "thinking",
        "text",
        "done",
    ]
    assert replay[0]["thinking"] == job["thinking"] and replay[1]["text"] == job["output"]
    shown = await d.cli("show", job_id)
    assert f"-- thinking --\n{job['thinking']}" in shown.out
    # Counted: eval_count covers reasoning and answer alike.
    assert job["eval_count"] >= len(job["thinking"].split()) + len(job["output"].split())


async def test_no_think_turns_the_reasoning_off(thinker):
    d = thinker
    res = await d.cli("task", "quick answer", "--no-think", "--wait")
    assert res.code == 0, res.err
    job = await d.job(res.out.split()[0])
    assert job["thinking"] is None and job["output"]
    assert d.fake.chat_requests[-1]["think"] is False


async def test_think_on_a_model_that_cannot_think_fails_with_ollamas_400(thinker):
    d = thinker
    [job] = await d.submit("task", "x", model="qwen3-coder:30b", think=True)
    failed = await d.wait_state(job["id"], "failed")
    assert failed["error"] == '"qwen3-coder:30b" does not support thinking'


async def test_a_reply_cut_at_the_token_limit_fails_loudly_and_keeps_its_output(thinker):
    d = thinker
    res = await d.cli("task", "a long essay", "--no-think", "--option", "num_predict=5", "--wait")
    assert res.code == 1
    job = await d.job(res.out.split()[0])
    assert job["state"] == "failed" and job["done_reason"] == "length"
    assert job["error"] == (
        "reply cut off at the token limit (done_reason length); output kept, `gpuq retry` to run it again"
    )
    assert len(job["output"].split()) == 5


async def test_a_prompt_cut_to_the_context_window_is_a_warning(thinker, tmp_path):
    d = thinker
    prompt = tmp_path / "long.md"
    prompt.write_text(" ".join(f"word{i}" for i in range(3000)))  # ~6,000 tokens by Ollama's count
    res = await d.cli("task", "--file", str(prompt), "--no-think", "--option", "num_ctx=2048", "--wait")
    assert res.code == 0, res.err
    job = await d.job(res.out.split()[0])
    warnings = [e["reason"] for e in job["events"] if (e["reason"] or "").startswith("warning: ")]
    assert len(warnings) == 1
    found = re.fullmatch(
        r"warning: prompt may have been truncated: (\d+) tokens, num_ctx 2048 "
        r"\(set a larger num_ctx in the node's or the job's options\)",
        warnings[0],
    )
    assert found and int(found.group(1)) == job["runs"][0]["prompt_eval_count"]
    assert warnings[0] in (await d.cli("show", job["id"])).out
    # The same prompt with room for it: no warning.
    res = await d.cli("task", "--file", str(prompt), "--no-think", "--option", "num_ctx=32768", "--wait")
    job = await d.job(res.out.split()[0])
    assert not [e for e in job["events"] if (e["reason"] or "").startswith("warning: ")]


async def test_a_critique_of_a_parent_reviews_its_answer_not_its_reasoning(fakes, daemon_factory):
    f1 = await fakes("qwen3:8b")
    f2 = await fakes("qwen3-coder:30b")
    d = await daemon_factory(
        [node_table("a", f1, 1, ["task"], "qwen3:8b"), node_table("b", f2, 2, ["critique"], "qwen3-coder:30b")]
    )
    [task] = await d.submit("task", "plan the export retry")
    done = await d.wait_state(task["id"], "done")
    assert done["thinking"]
    [crit] = await d.submit("critique", None, parent=task["id"])
    await d.wait_state(crit["id"], "done")
    reviewed = f2.chat_requests[-1]["messages"][0]["content"]
    assert done["output"] in reviewed and done["thinking"] not in reviewed


async def test_a_follower_joining_mid_run_is_told_the_token_counts_of_its_catch_up(fakes, daemon_factory):
    """The stream's catch-up of a running job carries its token count, taken at the same moment
    as the text: counting on from it with each live piece gives the node's whole count (the job
    page counted from an earlier read of the job, and missed the pieces in between)."""
    fake = await fakes("qwen3:8b", thinking_tokens=6, tokens=40, token_delay_s=0.05)
    d = await daemon_factory([node_table("gpu", fake, 1, ["task"], "qwen3:8b")])
    [job] = await d.submit("task", "think, then answer")

    async def thought():
        return (await d.job(job["id"])).get("thinking_tokens_so_far", 0) >= 3

    await eventually(thought, 15, what="a few reasoning tokens")
    counted = {"thinking": 0, "text": 0}
    async with d.session.get(f"{d.url}/api/jobs/{job['id']}/stream") as resp:
        async for raw in resp.content:
            line = json.loads(raw)
            kind = next((k for k in ("thinking", "text") if k in line), None)
            if kind and line.get("catch_up"):
                counted[kind] = line["tokens"]
            elif kind:
                counted[kind] += 1
            elif "done" in line:
                break
    assert counted == {"thinking": 6, "text": 40}
