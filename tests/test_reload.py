"""gpuq.toml read again while the router runs (SIGHUP, `gpuq reload`), against the real daemon
and fake nodes: nodes added, re-ranked, moved to a new URL and removed follow the file without a
restart; what cannot change live is named; a bad file changes nothing and says why."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
import tomllib

import tomli_w
from conftest import LISTENING, eventually, free_port, node_table, run_cli


def edit_config(daemon, change) -> None:
    """Rewrite the router's gpuq.toml: `change` edits its parsed tables in place."""
    data = tomllib.loads(daemon.config.read_text())
    change(data)
    daemon.config.write_text(tomli_w.dumps(data))


def node_of(data: dict, name: str) -> dict:
    return next(n for n in data["node"] if n["name"] == name)


async def node_names(daemon) -> list[str]:
    return [n["name"] for n in (await daemon.get("/api/nodes"))["nodes"]]


def reloads(daemon) -> list[tuple]:
    db = sqlite3.connect(daemon.config.parent / "gpuq.db")
    try:
        return db.execute("SELECT actor, ok, changes, error FROM config_reload ORDER BY id").fetchall()
    finally:
        db.close()


async def test_sighup_adds_a_node_without_a_restart_and_a_job_placed_on_it_runs_there(fakes, daemon_factory):
    one = await fakes("qwen3-coder:30b")
    two = await fakes("llama3.2:latest")
    daemon = await daemon_factory([node_table("node-1", one, 1, ["task", "critique"], "qwen3-coder:30b")])
    pid = daemon.proc.pid
    edit_config(daemon, lambda data: data["node"].append(node_table("node-2", two, 2, ["task"], "llama3.2:latest")))
    daemon.proc.send_signal(signal.SIGHUP)

    async def node_2_up():
        return any(n["name"] == "node-2" and n["up"] for n in (await daemon.get("/api/nodes"))["nodes"])

    await eventually(node_2_up, 20, what="node-2 to be added and up")
    job = (await daemon.submit("task", "on the new node", node="node-2"))[0]
    assert job["node"] == "node-2"
    done = await daemon.wait_state(job["id"], "done", timeout=20)
    assert done["node"] == "node-2"
    assert len(two.chat_requests) == 1 and not one.chat_requests
    assert daemon.proc.pid == pid and daemon.proc.returncode is None  # the same router, never restarted
    assert "config reloaded from" in daemon.log.read_text() and "added node-2" in daemon.log.read_text()
    [(actor, ok, changes, error)] = reloads(daemon)
    assert actor == "signal SIGHUP" and ok == 1 and error is None
    assert json.loads(changes)["added"] == ["node-2"]


async def test_gpuq_reload_reranks_and_placement_follows(fakes, daemon_factory):
    one = await fakes("qwen3-coder:30b")
    three = await fakes("qwen3-coder:30b")
    daemon = await daemon_factory(
        [
            node_table("node-1", one, 1, ["task"], "qwen3-coder:30b"),
            node_table("node-3", three, 3, ["task"], "qwen3-coder:30b"),
        ]
    )
    await eventually(lambda: all_up(daemon), 20, what="both nodes up")
    first = (await daemon.submit("task", "first"))[0]
    assert first["node"] == "node-1"  # the first free node by rank
    await daemon.wait_state(first["id"], "done", timeout=20)

    def swap(data):
        node_of(data, "node-1")["rank"], node_of(data, "node-3")["rank"] = 3, 1

    edit_config(daemon, swap)
    res = await daemon.cli("reload")
    assert res.code == 0, res
    assert "node node-1: rank: 1 -> 3" in res.out and "node node-3: rank: 3 -> 1" in res.out
    assert "needs a restart" not in res.out
    second = (await daemon.submit("task", "second"))[0]
    assert second["node"] == "node-3", second
    await daemon.wait_state(second["id"], "done", timeout=20)
    assert len(three.chat_requests) == 1
    nodes = (await daemon.get("/api/nodes"))["nodes"]
    assert [(n["name"], n["rank"]) for n in sorted(nodes, key=lambda n: n["rank"])] == [("node-3", 1), ("node-1", 3)]


async def all_up(daemon) -> bool:
    return all(n["up"] for n in (await daemon.get("/api/nodes"))["nodes"])


async def test_gpuq_reload_gives_a_node_a_new_url_and_its_next_job_goes_there(fakes, daemon_factory):
    old = await fakes("qwen3-coder:30b")
    new = await fakes("qwen3-coder:30b")
    daemon = await daemon_factory([node_table("node-1", old, 1, ["task", "critique"], "qwen3-coder:30b")])
    await eventually(lambda: all_up(daemon), 20, what="node-1 up")
    edit_config(daemon, lambda data: node_of(data, "node-1").update(url=new.url))
    res = await daemon.cli("reload")
    assert res.code == 0, res
    assert f"node node-1: url: {old.url} -> {new.url}" in res.out
    job = (await daemon.submit("task", "to the new address"))[0]
    await daemon.wait_state(job["id"], "done", timeout=20)
    assert len(new.chat_requests) == 1 and not old.chat_requests
    node = (await daemon.get("/api/nodes"))["nodes"][0]
    assert node["url"] == new.url


async def test_removing_a_node_with_jobs_is_refused_naming_them_and_forced_fails_the_waiting_one(fakes, daemon_factory):
    one = await fakes("qwen3-coder:30b")
    two = await fakes("llama3.2:latest", token_delay_s=0.2, tokens=2000)
    daemon = await daemon_factory(
        [
            node_table("node-1", one, 1, ["task", "critique"], "qwen3-coder:30b"),
            node_table("node-2", two, 2, ["task"], "llama3.2:latest"),
        ],
        stall_timeout="120s",
    )
    await eventually(lambda: all_up(daemon), 20, what="both nodes up")
    running = (await daemon.submit("task", "a long one", node="node-2"))[0]["id"]
    await daemon.wait_state(running, "running", timeout=20)
    waiting = (await daemon.submit("task", "waits behind it", node="node-2"))[0]["id"]

    edit_config(daemon, lambda data: data["node"].remove(node_of(data, "node-2")))
    res = await daemon.cli("reload")
    assert res.code == 1, res
    assert res.err.startswith("error 409 not reloaded, nothing changed"), res.err
    assert f"node-2 has {running} running and {waiting} waiting" in res.err and "--force" in res.err
    assert await node_names(daemon) == ["node-1", "node-2"]  # nothing changed
    assert (await daemon.job(waiting))["state"] == "queued"
    assert (await daemon.job(running))["state"] == "running"

    res = await daemon.cli("reload", "--force")
    assert res.code == 0, res
    assert "removed node node-2" in res.out
    assert f"{waiting} failed on node-2: node removed from gpuq.toml" in res.out
    assert await node_names(daemon) == ["node-1"]
    failed = await daemon.job(waiting)
    assert failed["state"] == "failed" and failed["error"] == "node removed from gpuq.toml"
    shown = await daemon.cli("show", waiting)
    assert "node removed from gpuq.toml" in shown.out
    two.script.token_delay_s = 0  # the running job on the removed node is allowed to finish
    assert (await daemon.wait_state(running, "done", "failed", timeout=30))["state"] == "done"
    assert len(two.chat_requests) == 1  # the waiting job never reached it
    status, body = await daemon.request("POST", "/api/jobs", {"kind": "task", "prompt": "x", "node": "node-2"})
    assert status == 422 and "node-2" in body["error"]["message"]
    # Retried, the failed job would wait forever on a node no worker serves: refused, saying so.
    status, body = await daemon.request("POST", f"/api/jobs/{waiting}/retry")
    assert status == 409 and "node node-2 is no longer in gpuq.toml" in body["error"]["message"], body
    assert (await daemon.job(waiting))["state"] == "failed"
    assert [(ok, error is not None) for _, ok, _, error in reloads(daemon)] == [(0, True), (1, False)]


async def test_a_broken_file_changes_nothing_and_the_answer_says_why(fakes, daemon_factory):
    one = await fakes("qwen3-coder:30b")
    daemon = await daemon_factory([node_table("node-1", one, 1, ["task", "critique"], "qwen3-coder:30b")])
    good = daemon.config.read_text()
    daemon.config.write_text(good.replace("[router]", "[router", 1))
    res = await daemon.cli("reload")
    assert res.code == 1 and res.err.startswith("error 422 not reloaded, nothing changed:"), res
    assert "not valid TOML" in res.err

    daemon.config.write_text(good)
    edit_config(daemon, lambda data: node_of(data, "node-1").update(rank="first", url="http://elsewhere:1"))
    res = await daemon.cli("reload")
    assert res.code == 1 and "node 'node-1'.rank: expected int" in res.err, res
    daemon.proc.send_signal(signal.SIGHUP)  # the signal's answer is the log
    await eventually(
        lambda: daemon.log.read_text().count("config not reloaded") >= 3, 20, what="the SIGHUP's refusal in the log"
    )
    assert (await daemon.get("/api/nodes"))["nodes"][0]["url"] == one.url
    job = (await daemon.submit("task", "still served as before"))[0]
    await daemon.wait_state(job["id"], "done", timeout=20)
    assert [ok for _, ok, _, _ in reloads(daemon)] == [0, 0, 0]


async def test_what_needs_a_restart_is_named_and_kept_while_the_rest_changes(fakes, daemon_factory):
    one = await fakes("qwen3-coder:30b")
    daemon = await daemon_factory(
        [node_table("node-1", one, 1, ["task", "critique"], "qwen3-coder:30b")],
        token="old-token",
        env={"GPUQ_TOKEN": "old-token"},
    )
    status, _ = await daemon.request("POST", "/api/reload", {})
    assert status == 401  # behind the router's token, as every write

    def change(data):
        data["router"]["listen"] = "127.0.0.1:1"
        data["router"]["database"] = "other.db"
        data["router"]["stall_timeout"] = "7s"
        data["router"]["unload"] = "when-idle"
        data["router"]["token"] = "new-token"

    edit_config(daemon, change)
    res = await daemon.cli("reload")
    assert res.code == 0, res
    port = daemon.url.rsplit(":", 1)[1]
    assert f"needs a restart (kept as it was): listen: 127.0.0.1:{port} -> 127.0.0.1:1" in res.out
    assert "needs a restart (kept as it was): database:" in res.out
    assert "needs a restart (kept as it was): token: changed" in res.out and "new-token" not in res.out
    assert "  stall_timeout: 5s -> 7s" in res.out and "  unload: after-each -> when-idle" in res.out
    status, body = await daemon.request(
        "POST", "/api/jobs", {"kind": "task", "prompt": "still here"}, headers={"Authorization": "Bearer old-token"}
    )
    assert status == 201, body
    assert not (daemon.config.parent / "other.db").exists()


async def test_the_demo_has_no_file_to_reload_and_says_so(tmp_path):
    port = free_port()
    log = tmp_path / "demo.log"
    with open(log, "wb") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuq.cli",
            "serve",
            "--demo",
            "--listen",
            f"127.0.0.1:{port}",
            "--database",
            str(tmp_path / "demo.db"),
            stdout=out,
            stderr=out,
            cwd=str(tmp_path),
        )
    try:
        await eventually(lambda: LISTENING in log.read_text(), 30, what="the demo router to listen")
        res = await run_cli("--router", f"http://127.0.0.1:{port}", "reload")
        assert res.code == 1 and res.err.startswith("error 409 this router has no gpuq.toml to reload"), res
        proc.send_signal(signal.SIGHUP)
        await eventually(lambda: "no gpuq.toml to reload" in log.read_text(), 20, what="the SIGHUP's answer logged")
        assert proc.returncode is None  # still serving
    finally:
        proc.terminate()
        await proc.wait()
