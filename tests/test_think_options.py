"""`think` and Ollama model `options`, per node (gpuq.toml) and per job (API, CLI), merged job
over node and passed through to Ollama as given."""

from __future__ import annotations

import pytest
from conftest import node_table

from gpuq.errors import EX_CONFIG


@pytest.fixture
async def node_with_defaults(fakes, daemon_factory):
    fake = await fakes("gpt-oss:20b")
    table = dict(
        node_table("n", fake, 1, ["task", "critique"], "gpt-oss:20b"),
        think=False,
        options={"num_ctx": 8192, "temperature": 0.7},
    )
    d = await daemon_factory([table])
    d.fake = fake
    return d


async def test_node_defaults_reach_ollama(node_with_defaults):
    d = node_with_defaults
    [job] = await d.submit("task", "hi")
    await d.wait_state(job["id"], "done")
    [req] = d.fake.chat_requests
    assert req["think"] is False and req["options"] == {"num_ctx": 8192, "temperature": 0.7}


async def test_a_jobs_own_think_and_options_win_over_the_nodes(node_with_defaults):
    d = node_with_defaults
    res = await d.cli(
        "task",
        "hi",
        "--think-level",
        "high",
        "--option",
        "temperature=0.1",
        "--option",
        "seed=42",
        "--option",
        'stop=["END"]',
        "--wait",
    )
    assert res.code == 0, res.err
    [req] = d.fake.chat_requests
    assert req["think"] == "high"
    assert req["options"] == {"num_ctx": 8192, "temperature": 0.1, "seed": 42, "stop": ["END"]}
    job_id = res.out.split()[0]
    job = await d.job(job_id)
    assert job["think"] == "high" and job["options"] == {"temperature": 0.1, "seed": 42, "stop": ["END"]}
    shown = await d.cli("show", job_id)
    assert 'asked: think "high" temperature=0.1 seed=42 stop=["END"]' in shown.out


async def test_a_null_option_is_unset_as_ollama_reads_it(node_with_defaults):
    # LangChain's ChatOllama sends every option it knows, null where the user set none; Ollama
    # skips nulls (api/types.go Options.FromMap), so the node's own value stays.
    d = node_with_defaults
    [job] = await d.submit("task", "hi", options={"num_ctx": None, "temperature": 0.2, "stop": None})
    await d.wait_state(job["id"], "done")
    [req] = d.fake.chat_requests
    assert req["options"] == {"num_ctx": 8192, "temperature": 0.2}


async def test_options_ollama_takes_are_taken(node_with_defaults):
    # A float for an integer option (Ollama truncates it) and a key Ollama does not know (it
    # logs and ignores it) are not errors at Ollama, so not at gpuq either.
    d = node_with_defaults
    [job] = await d.submit("task", "hi", options={"num_predict": 64.0, "some_future_knob": {"on": True}})
    await d.wait_state(job["id"], "done")
    [req] = d.fake.chat_requests
    assert req["options"]["num_predict"] == 64 and req["options"]["some_future_knob"] == {"on": True}


@pytest.mark.parametrize(
    "field, value, message",
    [
        (
            "options",
            [1, 2],
            "field 'options': expected an object of Ollama model options such as {\"num_ctx\": 32768}, got [1, 2]",
        ),
        ("options", {"num_ctx": "big"}, "field 'options': option 'num_ctx' must be a whole number, got \"big\""),
        ("options", {"temperature": True}, "field 'options': option 'temperature' must be a number, got true"),
        # Ollama's own words (api/types.go ThinkValue), as the front door and gpuq.toml say them.
        ("think", "lots", 'invalid think value: "lots" (must be "high", "medium", "low", "max", true, or false)'),
        ("think", 5, 'think must be a boolean or string ("high", "medium", "low", "max", true, or false)'),
    ],
)
async def test_bad_think_or_options_are_400_naming_the_field(node_with_defaults, field, value, message):
    d = node_with_defaults
    status, body = await d.request("POST", "/api/jobs", {"kind": "task", "prompt": "x", field: value})
    assert (status, body["error"]["message"]) == (400, message)
    assert (await d.get("/api/jobs"))["jobs"] == []


async def test_every_think_level_ollama_takes_is_taken_max_too(node_with_defaults):
    # Ollama 0.22 takes "max" (api/types.go ThinkValue); the API, the CLI and gpuq.toml take what it takes.
    d = node_with_defaults
    [job] = await d.submit("task", "by the API", think="max")
    await d.wait_state(job["id"], "done")
    res = await d.cli("task", "by the CLI", "--think-level", "max", "--wait")
    assert res.code == 0, res.err
    assert [r["think"] for r in d.fake.chat_requests] == ["max", "max"]
    shown = await d.cli("task", "--help")
    assert "[high|medium|low|max]" in shown.out


async def test_cli_usage_errors_for_think_and_option(node_with_defaults):
    d = node_with_defaults
    res = await d.cli("task", "x", "--think", "--think-level", "low")
    assert res.code == 2 and "give --think/--no-think or --think-level, not both" in res.err
    res = await d.cli("task", "x", "--option", "num_ctx")
    assert res.code == 2 and "expected KEY=VALUE, got 'num_ctx'" in res.err


async def test_bad_node_options_stop_the_router_naming_the_key(fakes, daemon_factory):
    fake = await fakes("m:latest")
    table = dict(node_table("n", fake, 1, ["task"], "m:latest"), options={"num_ctx": 0})
    d = await daemon_factory([table], start=False)
    res = await d.cli("serve", "--config", str(d.config))
    assert res.code == EX_CONFIG  # a config error: a service manager does not restart it
    assert "node 'n'.options: option 'num_ctx' must be at least 1, got 0" in res.err


async def test_the_nodes_think_is_for_its_own_model_only(fakes, daemon_factory):
    # A node set to think = false for gpt-oss may also hold a model that does not think at all:
    # Ollama answers think for that one with 400, so it gets none; the node's options still hold.
    fake = await fakes("gpt-oss:20b", "llama3.2:latest")
    table = dict(node_table("n", fake, 1, ["task"], "gpt-oss:20b"), think="low", options={"num_ctx": 8192})
    d = await daemon_factory([table])
    [own] = await d.submit("task", "own model")
    [other] = await d.submit("task", "other model", model="llama3.2:latest")
    assert (await d.wait_state(other["id"], "done"))["error"] is None
    by_model = {r["model"]: r for r in fake.chat_requests}
    assert by_model["gpt-oss:20b"]["think"] == "low"
    assert "think" not in by_model["llama3.2:latest"] and by_model["llama3.2:latest"]["options"] == {"num_ctx": 8192}
