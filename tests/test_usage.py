"""Usage over time (issue 45, item 3) through the real daemon: GET /api/usage by person and by
node, what a member and an admin each read, and the refusals of bad windows."""

from __future__ import annotations

import json
import tomllib

import tomli_w
from conftest import node_table, run_cli
from test_users import TOKENS, USERS

MODEL = "qwen3-coder:30b"


def auth(user: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


async def usage_lab(fakes, daemon_factory):
    """Two nodes, three users; alice ran two jobs on node-1, bob one on node-2 (4 tokens each)."""
    one, two = await fakes(MODEL, tokens=4), await fakes(MODEL, tokens=4)
    nodes = [node_table("node-1", one, 1, ["task"], MODEL), node_table("node-2", two, 2, ["task"], MODEL)]
    d = await daemon_factory(nodes, start=False)
    data = tomllib.loads(d.config.read_text())
    data["user"] = USERS
    d.config.write_text(tomli_w.dumps(data))
    await d.start()
    for user, node in (("alice", "node-1"), ("alice", "node-1"), ("bob", "node-2")):
        d.auth = auth(user)
        [job] = await d.submit(prompt=f"{user}'s job", node=node)
        await d.wait_state(job["id"], "done")
    return d


async def usage(d, user: str, query: str) -> dict:
    status, body = await d.request("GET", f"/api/usage?{query}", headers=auth(user))
    assert status == 200, (status, body)
    return body


def summary(body: dict) -> list[tuple]:
    return [(r["key"], r["jobs"], r["tokens_out"], sum(p["jobs"] for p in r["series"])) for r in body["rows"]]


async def test_usage_by_person_and_by_node_an_admin_reads_everyones_a_member_their_own(fakes, daemon_factory):
    d = await usage_lab(fakes, daemon_factory)
    everyone = await usage(d, "root", "by=user&since=1d&step=1h")
    assert (everyone["by"], everyone["step_s"], everyone["steps"], everyone["scope"]) == ("user", 3600, 25, "everyone")
    assert sorted(summary(everyone)) == [("alice", 2, 8, 2), ("bob", 1, 4, 1)]
    for row in everyone["rows"]:
        assert row["busy_s"] > 0 and row["tokens_in"] > 0 and row["wait_p50_s"] is not None
        assert row["wait_p50_s"] <= row["wait_p95_s"]
        assert everyone["since"] <= row["series"][0]["at"] <= everyone["until"]
    by_node = await usage(d, "root", "by=node&since=7d")
    assert sorted(summary(by_node)) == [("node-1", 2, 8, 2), ("node-2", 1, 4, 1)]
    assert [r["key"] for r in (await usage(d, "root", "by=model"))["rows"]] == [MODEL]

    own = await usage(d, "bob", "by=user&since=1d")
    assert own["scope"] == "own" and summary(own) == [("bob", 1, 4, 1)]
    assert summary(await usage(d, "bob", "by=node")) == [("node-2", 1, 4, 1)]  # his runs only
    assert summary(await usage(d, "alice", "by=node")) == [("node-1", 2, 8, 2)]


async def test_usage_refuses_a_bad_key_window_or_step_naming_it(fakes, daemon_factory):
    d = await usage_lab(fakes, daemon_factory)
    for query, words in (
        ("by=foo", "query parameter 'by' must be one of user, node, model, client, lane, got 'foo'"),
        ("since=-1", "query parameter 'since': expected a duration like '10m' or '30s', got '-1'"),
        ("since=0s", "query parameter 'since' must be at least 1s, got '0s'"),
        ("since=2y", "query parameter 'since': expected a duration"),
        ("step=10s", "query parameter 'step' must be at least 60s, got '10s'"),
        ("since=365d&step=1h", "steps; at most 2000: ask for a longer step or a shorter window"),
    ):
        status, body = await d.request("GET", f"/api/usage?{query}", headers=auth("root"))
        assert status == 400 and words in body["error"]["message"], (query, status, body)
    assert summary(await usage(d, "root", "by=user&since=365d&step=1d")) == [("alice", 2, 8, 2), ("bob", 1, 4, 1)]


async def test_gpuq_usage_prints_a_members_own_table_an_admins_everyone_and_json(fakes, daemon_factory):
    d = await usage_lab(fakes, daemon_factory)
    res = await run_cli("--router", d.url, "usage", "--by", "node", env={"GPUQ_TOKEN": TOKENS["bob"]})
    assert res.code == 0, res
    lines = res.out.splitlines()
    assert lines[0].startswith("usage by node from ") and lines[0].endswith("UTC to now (your own jobs)"), res
    assert lines[1].split() == "NODE JOBS GPU TIME LOAD TOKENS IN TOKENS OUT WAIT P50 WAIT P95".split()
    assert [line.split()[:2] for line in lines[2:]] == [["node-2", "1"]]  # bob's run only
    res = await run_cli("--router", d.url, "usage", "--since", "365d", env={"GPUQ_TOKEN": TOKENS["root"]})
    assert res.code == 0, res
    assert sorted(line.split()[:2] for line in res.out.splitlines()[2:]) == [["alice", "2"], ["bob", "1"]]
    res = await run_cli("--router", d.url, "usage", "--json", env={"GPUQ_TOKEN": TOKENS["alice"]})
    assert res.code == 0, res
    body = json.loads(res.out)
    assert body["scope"] == "own" and [(r["key"], r["jobs"], r["tokens_out"]) for r in body["rows"]] == [
        ("alice", 2, 8)
    ]
    res = await run_cli("--router", d.url, "usage", "--since", "-1", env={"GPUQ_TOKEN": TOKENS["root"]})
    assert res.code == 1 and "error 400 query parameter 'since': expected a duration" in res.err, res
