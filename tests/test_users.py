"""[[user]] entries against the real daemon and the real CLI: who sent each job (owner and client,
from the router's API, the CLI and the front door), who may act on it (a member on their own
jobs only, an admin on all), events that name the user, history and the queue by owner,
per-owner counters, and users changed live by a reload."""

from __future__ import annotations

import json
import signal
import tomllib

import ollama
import pytest
import tomli_w
from conftest import eventually, free_port, node_table, run_cli

MODEL = "qwen3-coder:30b"
TOKENS = {"alice": "alice-token", "bob": "bob-token", "root": "root-token"}
USERS = [
    {"name": "alice", "token": TOKENS["alice"], "role": "member"},
    {"name": "bob", "token": TOKENS["bob"], "role": "member"},
    {"name": "root", "token": TOKENS["root"], "role": "admin"},
]


def edit_config(daemon, change) -> None:
    data = tomllib.loads(daemon.config.read_text())
    change(data)
    daemon.config.write_text(tomli_w.dumps(data))


async def users_lab(fakes, daemon_factory, users=USERS, **router):
    """One node whose jobs run long (the first runs, the rest wait), and `users` in gpuq.toml."""
    fake = await fakes(MODEL, token_delay_s=0.05, tokens=4000)
    daemon = await daemon_factory([node_table("node-1", fake, 1, ["task", "critique"], MODEL)], start=False, **router)
    edit_config(daemon, lambda data: data.update(user=users))
    await daemon.start()
    return daemon


def auth(user: str) -> dict:
    return {"Authorization": f"Bearer {TOKENS[user]}"}


async def as_user(daemon, user: str, *args: str):
    """The real CLI with the user's token in $GPUQ_TOKEN."""
    return await run_cli("--router", daemon.url, *args, env={"GPUQ_TOKEN": TOKENS[user]})


async def cli_task(daemon, user: str, prompt: str) -> dict:
    res = await as_user(daemon, user, "task", prompt, "--json")
    assert res.code == 0, res
    return json.loads(res.out)


async def running(daemon, job_id: str) -> None:
    async def started():
        return (await job(daemon, job_id))["state"] == "running"

    await eventually(started, 15, what=f"job {job_id} to run")


async def job(daemon, job_id: str, user: str = "root") -> dict:
    status, body = await daemon.request("GET", f"/api/jobs/{job_id}", headers=auth(user))
    assert status == 200, (status, body)
    return body


async def test_a_member_acts_only_on_their_own_jobs_and_an_admin_on_all(fakes, daemon_factory):
    daemon = await users_lab(fakes, daemon_factory)
    blocker = await cli_task(daemon, "root", "runs first")
    await running(daemon, blocker["id"])
    bobs = await cli_task(daemon, "bob", "bob's sweep")
    alices = await cli_task(daemon, "alice", "alice's question")

    res = await as_user(daemon, "alice", "delete", bobs["id"])
    assert res.code != 0
    assert f"job {bobs['id']} belongs to bob; a member acts only on their own jobs" in res.err
    assert (await job(daemon, bobs["id"]))["state"] == "queued"  # nothing changed
    for verb, path in (("move", "move"), ("preempt", "preempt")):
        status, body = await daemon.request(
            "POST", f"/api/jobs/{bobs['id']}/{path}", {"position": 1} if verb == "move" else {}, headers=auth("alice")
        )
        assert status == 403 and "belongs to bob" in body["error"]["message"], (verb, status, body)
    # Clearing the node would cancel bob's jobs and root's too: refused, naming them, nothing cancelled.
    res = await as_user(daemon, "alice", "clear", "node-1", "--yes", "--running")
    assert res.code != 0 and "node-1 also has jobs of bob, root" in res.err, res
    assert (await job(daemon, alices["id"]))["state"] == "queued"
    status, body = await daemon.request("POST", "/api/reload", {}, headers=auth("alice"))
    assert status == 403 and "for an admin" in body["error"]["message"], body

    # Preempting her own job would interrupt root's running one: acting on it, refused.
    status, body = await daemon.request("POST", f"/api/jobs/{alices['id']}/preempt", {}, headers=auth("alice"))
    assert (
        status == 403
        and f"would interrupt job {blocker['id']} on node-1, which belongs to root" in body["error"]["message"]
    ), body
    assert (await job(daemon, blocker["id"]))["state"] == "running"
    res = await as_user(daemon, "alice", "move", alices["id"], "--to", "1")  # her own: yes
    assert res.code == 0, res
    assert (await job(daemon, alices["id"]))["queue_position"] == 1

    res = await as_user(daemon, "root", "delete", bobs["id"])  # an admin: on anyone's
    assert res.code == 0, res
    gone = await job(daemon, bobs["id"])
    assert gone["state"] == "cancelled"
    assert gone["events"][-1]["actor"] == "root (cli 127.0.0.1)"
    assert gone["error"] == "deleted by root (cli 127.0.0.1)"

    res = await as_user(daemon, "bob", "show", alices["id"])  # anyone may look
    assert res.code == 0, res
    assert "owner: alice   client: gpuq-cli/" in res.out
    assert "-> queued by alice (cli 127.0.0.1)" in res.out  # her submit and her move: events of hers


async def test_owner_and_client_are_recorded_for_the_api_and_the_cli(fakes, daemon_factory):
    daemon = await users_lab(fakes, daemon_factory)
    status, body = await daemon.request(
        "POST",
        "/api/jobs",
        {"kind": "task", "prompt": "from a script"},
        headers={**auth("bob"), "User-Agent": "nightly-sweep/2.1"},
    )
    assert status == 201, body
    api_job = await job(daemon, body["jobs"][0]["id"])
    assert (api_job["owner"], api_job["client"]) == ("bob", "nightly-sweep/2.1")
    cli_job = await job(daemon, (await cli_task(daemon, "alice", "from the shell"))["id"])
    assert cli_job["owner"] == "alice" and cli_job["client"].startswith("gpuq-cli/")
    assert cli_job["events"][0]["actor"] == "alice (cli 127.0.0.1)"

    # A token of no user is 401 at the router's API, as a wrong token always was.
    status, body = await daemon.request("GET", "/api/queue", headers={"Authorization": "Bearer nobody's"})
    assert status == 401, body
    res = await run_cli("--router", daemon.url, "queue", env={"GPUQ_TOKEN": "nobody's"})
    assert res.code != 0 and "401" in res.err + res.out


async def test_queue_mine_history_by_owner_and_per_owner_counters(fakes, daemon_factory):
    daemon = await users_lab(fakes, daemon_factory)
    first = await cli_task(daemon, "root", "root runs first")
    await running(daemon, first["id"])
    mine = [await cli_task(daemon, "alice", f"alice {i}") for i in range(2)]
    theirs = await cli_task(daemon, "bob", "bob 0")
    res = await as_user(daemon, "root", "queue")
    assert res.code == 0, res
    assert "OWNER" in res.out and " alice " in res.out and " bob " in res.out and " root " in res.out
    res = await as_user(daemon, "alice", "queue", "--mine")
    assert res.code == 0, res
    assert all(j["id"] in res.out for j in mine) and theirs["id"] not in res.out and first["id"] not in res.out
    assert "someone else's job" in res.out

    for j in [*mine, theirs]:
        res = await as_user(daemon, "root", "delete", j["id"])
        assert res.code == 0, res
    res = await as_user(daemon, "bob", "history", "--owner", "alice", "--json")
    assert res.code == 0, res
    assert sorted(j["id"] for j in json.loads(res.out)["jobs"]) == sorted(j["id"] for j in mine)
    status, body = await daemon.request("GET", "/api/history?owner=bob", headers=auth("bob"))
    assert status == 200 and [j["id"] for j in body["jobs"]] == [theirs["id"]]
    res = await as_user(daemon, "bob", "history", "--owner", "bob")
    assert res.code == 0 and theirs["id"] in res.out and " bob " in res.out

    async def counted():
        status, text = await daemon.request("GET", "/metrics", headers=auth("root"))
        assert status == 200
        return (
            'gpuq_user_jobs_finished_total{owner="alice",state="cancelled"} 2.0' in text
            and 'gpuq_user_jobs_finished_total{owner="bob",state="cancelled"} 1.0' in text
        )

    await eventually(counted, 15, what="per-owner counters")


async def test_the_single_token_still_works_as_the_admin(fakes, daemon_factory):
    daemon = await users_lab(fakes, daemon_factory, users=[USERS[0]], token="legacy-token")
    first = (
        await daemon.request(
            "POST",
            "/api/jobs",
            {"kind": "task", "prompt": "old script"},
            headers={"Authorization": "Bearer legacy-token"},
        )
    )[1]["jobs"][0]
    second = await cli_task(daemon, "alice", "hers")
    assert (await job(daemon, first["id"], "alice"))["owner"] == "admin"
    res = await run_cli("--router", daemon.url, "delete", second["id"], env={"GPUQ_TOKEN": "legacy-token"})
    assert res.code == 0, res
    assert (await job(daemon, second["id"], "alice"))["events"][-1]["actor"] == "admin (cli 127.0.0.1)"
    res = await as_user(daemon, "alice", "delete", first["id"])
    assert res.code != 0 and "belongs to admin" in res.err


async def test_front_door_calls_are_owned_by_the_tokens_user_with_the_client_program(fakes, daemon_factory):
    fake = await fakes(MODEL)
    port = free_port()
    daemon = await daemon_factory(
        [node_table("node-1", fake, 1, ["task"], MODEL)], start=False, ollama_listen=f"127.0.0.1:{port}"
    )
    edit_config(daemon, lambda data: data.update(user=USERS))
    await daemon.start()
    door = f"http://127.0.0.1:{port}"

    async def model_known():
        async with daemon.session.get(door + "/api/tags", headers=auth("alice")) as resp:
            return resp.status == 200 and (await resp.json())["models"]

    await eventually(model_known, 15, what="the front door to know the node's model")
    async with ollama.AsyncClient(host=door, headers=auth("alice")) as client:
        reply = await client.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert reply.message.content
    status, body = await daemon.request("GET", "/api/jobs?limit=10", headers=auth("root"))
    [made] = body["jobs"]
    assert made["owner"] == "alice" and made["client"].startswith("ollama-python/"), made
    assert (await job(daemon, made["id"]))["events"][0]["actor"] == "alice (ollama 127.0.0.1)"
    async with ollama.AsyncClient(host=door, headers={"Authorization": "Bearer nobody's"}) as stranger:
        with pytest.raises(ollama.ResponseError) as refused:
            await stranger.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 401


async def test_users_change_live_on_reload_and_are_named_without_their_tokens(fakes, daemon_factory):
    port = free_port()
    daemon = await users_lab(fakes, daemon_factory, ollama_listen=f"127.0.0.1:{port}")
    first = await cli_task(daemon, "root", "root runs first")
    await running(daemon, first["id"])
    alices = await cli_task(daemon, "alice", "hers")
    res = await run_cli("--router", daemon.url, "queue", env={"GPUQ_TOKEN": "carol-token"})
    assert res.code != 0  # no carol yet

    def add_carol(data):
        data["user"].append({"name": "carol", "token": "carol-token", "role": "member"})
        data["user"][1]["role"] = "admin"  # bob

    edit_config(daemon, add_carol)
    res = await as_user(daemon, "root", "reload")
    assert res.code == 0, res
    assert "users: added carol; bob's role: member -> admin" in res.out
    assert "carol-token" not in res.out and "carol-token" not in daemon.log.read_text()
    carols = await run_cli("--router", daemon.url, "task", "carol's first", "--json", env={"GPUQ_TOKEN": "carol-token"})
    assert carols.code == 0, carols
    assert (await job(daemon, json.loads(carols.out)["id"]))["owner"] == "carol"
    async with daemon.session.get(
        f"http://127.0.0.1:{port}/api/tags", headers={"Authorization": "Bearer carol-token"}
    ) as resp:
        assert resp.status == 200  # the front door reads the live users too
    res = await as_user(daemon, "bob", "delete", alices["id"])  # an admin now
    assert res.code == 0, res

    edit_config(daemon, lambda data: data.update(user=[u for u in data["user"] if u["name"] != "carol"]))
    daemon.proc.send_signal(signal.SIGHUP)
    await eventually(lambda: "users: removed carol" in daemon.log.read_text(), 20, what="the SIGHUP's reload")
    res = await run_cli("--router", daemon.url, "queue", env={"GPUQ_TOKEN": "carol-token"})
    assert res.code != 0 and "401" in res.err + res.out
