"""Alerts that reach a person: the real daemon POSTs to a real HTTP receiver on loopback (an
aiohttp app in the test) once per firing and once per resolution, as JSON or as ntfy's
publish request, retries a failing receiver with backoff, records every try, and keeps its
promises across a restart."""

from __future__ import annotations

import json
import signal
import tomllib
from dataclasses import dataclass, field

import pytest
import tomli_w
from aiohttp import web
from conftest import eventually, free_port, node_table

KEYS = {"status", "alert", "node", "job", "since", "message", "fix"}


@dataclass
class Receiver:
    """A webhook receiver: keeps every request; answers 503 while `failing` (or for the first
    `fail_first` requests)."""

    got: list[dict] = field(default_factory=list)  # the requests it accepted
    refused: int = 0
    fail_first: int = 0
    failing: bool = False
    url: str = ""
    runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if self.failing or self.refused < self.fail_first:
            self.refused += 1
            return web.Response(status=503, text="receiver down for maintenance")
        self.got.append({"path": request.path, "headers": dict(request.headers), "raw": raw})
        return web.json_response({"ok": True})

    def bodies(self) -> list[dict | None]:
        """The JSON notices (None for a request that is not JSON, such as ntfy's)."""
        return [
            json.loads(r["raw"]) if r["headers"]["Content-Type"].startswith("application/json") else None
            for r in self.got
        ]

    def statuses(self) -> list[tuple[str, str]]:
        return [(b["status"], b["alert"]) for b in self.bodies()]


@pytest.fixture
async def receiver():
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rec.handle)
    rec.runner = web.AppRunner(app, access_log=None)
    await rec.runner.setup()
    port = free_port()
    await web.TCPSite(rec.runner, "127.0.0.1", port).start()
    rec.url = f"http://127.0.0.1:{port}/hook"
    yield rec
    await rec.runner.cleanup()


async def one_node(fakes, daemon_factory, receiver, **router):
    fake = await fakes("qwen3-coder:30b")
    daemon = await daemon_factory(
        [node_table("node-1", fake, 1, ["task", "critique"], "qwen3-coder:30b")], alert_url=receiver.url, **router
    )
    return fake, daemon


async def stale_head(fake, d) -> tuple[str, str]:
    """A head that streams nothing (it goes stale after stale_after) and a job behind it."""
    fake.script.stall_after = 0
    [head] = await d.submit("task", "silent")
    [behind] = await d.submit("task", "behind")
    await d.wait_state(head["id"], "running")
    return head["id"], behind["id"]


async def got(receiver, n: int, what: str, timeout: float = 20) -> list[dict]:
    await eventually(lambda: len(receiver.got) >= n, timeout, what=what)
    return receiver.bodies()


async def delivered(d, ok: int = 0) -> list[dict]:
    """The firings with their delivery tries, once `ok` deliveries are recorded (the receiver
    may hold a notice a moment before the router has written that it was delivered)."""

    async def done():
        alerts = (await d.get("/api/alerts"))["alerts"]
        return sum(t["ok"] for a in alerts for t in a["deliveries"]) >= ok and alerts

    return await eventually(done, 10, what=f"{ok} deliveries to be recorded")


async def test_a_stale_head_fires_once_and_resolves_once(fakes, daemon_factory, receiver):
    fake, d = await one_node(fakes, daemon_factory, receiver, stale_after="0.5s", stall_timeout="60s")
    head, behind = await stale_head(fake, d)

    [firing] = await got(receiver, 1, "the firing notice")
    assert set(firing) == KEYS
    assert firing["status"] == "firing" and firing["alert"] == "stale_head"
    assert firing["node"] == "node-1" and firing["job"] == head
    assert firing["fix"] == f"gpuq delete {head}"
    assert f"job {head} is a stale head (no progress)" in firing["message"]
    assert "1 job waits behind it" in firing["message"]
    assert receiver.got[0]["headers"]["Content-Type"].startswith("application/json")
    stale = (await d.get("/api/stale"))["stale"]
    assert [s["since"] for s in stale] == [firing["since"]]

    fake.script.stall_after = None
    res = await d.cli("delete", head)
    assert res.code == 0, res.err
    firing_, resolved = await got(receiver, 2, "the resolved notice")
    assert firing_ == firing
    assert set(resolved) == KEYS and resolved["status"] == "resolved"
    assert (resolved["alert"], resolved["node"], resolved["job"], resolved["since"]) == (
        "stale_head",
        "node-1",
        head,
        firing["since"],
    )
    assert f"job {head} is cancelled now" in resolved["message"] and resolved["fix"] is None
    await d.wait_state(behind, "done")

    [alert] = await delivered(d, ok=2)
    assert alert["resolved_at"] and alert["fired_sent_at"] and alert["resolved_sent_at"]
    assert [(t["status"], t["attempt"], t["ok"], t["http_status"]) for t in alert["deliveries"]] == [
        ("firing", 1, 1, 200),
        ("resolved", 1, 1, 200),
    ]
    log = d.log.read_text()
    assert f"alert=stale_head node=node-1 job={head} firing:" in log
    assert f"alert=stale_head node=node-1 job={head} notice=firing attempt=1 delivered (HTTP 200)" in log
    assert f"alert=stale_head node=node-1 job={head} resolved:" in log
    assert receiver.statuses() == [("firing", "stale_head"), ("resolved", "stale_head")]


async def test_a_failing_receiver_gets_the_alert_after_retries_and_each_failure_is_recorded(
    fakes, daemon_factory, receiver
):
    receiver.fail_first = 2
    fake, d = await one_node(fakes, daemon_factory, receiver, stale_after="0.5s", stall_timeout="60s")
    head, _ = await stale_head(fake, d)

    [firing] = await got(receiver, 1, "the firing notice after two refusals")
    assert firing["status"] == "firing" and firing["job"] == head
    assert receiver.refused == 2
    [alert] = await delivered(d, ok=1)
    tries = [(t["status"], t["attempt"], t["ok"], t["http_status"]) for t in alert["deliveries"]]
    assert tries == [("firing", 1, 0, 503), ("firing", 2, 0, 503), ("firing", 3, 1, 200)]
    assert alert["deliveries"][0]["error"] == "HTTP 503 Service Unavailable: receiver down for maintenance"
    log = d.log.read_text()
    assert "notice=firing attempt=1 not delivered: HTTP 503 Service Unavailable" in log
    assert "trying again in 1s" in log and "trying again in 2s" in log


async def test_a_restart_neither_resends_a_delivered_firing_nor_forgets_a_resolution_owed(
    fakes, daemon_factory, receiver
):
    fake, d = await one_node(fakes, daemon_factory, receiver, stale_after="0.5s", stall_timeout="60s")
    head, _ = await stale_head(fake, d)
    await got(receiver, 1, "the firing notice")

    receiver.failing = True  # the receiver goes away before the resolution reaches it
    fake.script.stall_after = None
    assert (await d.cli("delete", head)).code == 0

    async def resolution_refused():
        [alert] = await delivered(d)
        return alert["resolved_at"] and any(not t["ok"] for t in alert["deliveries"])

    await eventually(resolution_refused, 20, what="the resolved notice to be refused once")
    await d.kill(signal.SIGKILL)
    receiver.failing = False
    await d.start()

    bodies = await got(receiver, 2, "the resolved notice after the restart")
    assert receiver.statuses() == [("firing", "stale_head"), ("resolved", "stale_head")]
    assert bodies[1]["job"] == head
    [alert] = await delivered(d, ok=2)
    assert [t["status"] for t in alert["deliveries"] if t["ok"]] == ["firing", "resolved"]


async def test_ntfy_gets_a_title_and_a_plain_text_message(fakes, daemon_factory, receiver):
    fake, d = await one_node(
        fakes,
        daemon_factory,
        receiver,
        stale_after="0.5s",
        stall_timeout="60s",
        alert_format="ntfy",
        alert_token="tk_test_token",
    )
    head, _ = await stale_head(fake, d)
    await got(receiver, 1, "the ntfy firing")
    fake.script.stall_after = None
    assert (await d.cli("delete", head)).code == 0
    await got(receiver, 2, "the ntfy resolution")

    firing, resolved = receiver.got
    h = firing["headers"]
    assert h["Title"] == "gpuq: stale head on node-1"
    assert h["Priority"] == "high" and h["Tags"] == "rotating_light"
    assert h["Authorization"] == "Bearer tk_test_token"
    assert h["Click"] == f"{d.url}/jobs/{head}"
    assert h["Content-Type"].startswith("text/plain")
    text = firing["raw"].decode()
    assert f"job {head} is a stale head" in text and text.endswith(f"\nfix: gpuq delete {head}")
    assert resolved["headers"]["Title"] == "gpuq: resolved: stale head on node-1"
    assert resolved["headers"]["Tags"] == "white_check_mark"
    assert f"job {head} is cancelled now" in resolved["raw"].decode()
    assert "fix:" not in resolved["raw"].decode()


async def test_a_node_down_with_waiting_jobs_fires_and_resolves_when_it_answers(fakes, daemon_factory, receiver):
    f1 = await fakes("qwen3-coder:30b")
    f2 = await fakes("qwen3-coder:30b")
    d = await daemon_factory(
        [
            node_table("node-1", f1, 1, ["task"], "qwen3-coder:30b"),
            node_table("node-2", f2, 2, ["task"], "qwen3-coder:30b"),
        ],
        alert_url=receiver.url,
    )
    port = f2.port
    await f2.stop()

    async def down():
        return not (await d.get("/api/nodes"))["nodes"][1]["up"]

    await eventually(down, 10, what="node-2 to be seen down")
    [job] = await d.submit("task", "for node-2", node="node-2")

    [firing] = await got(receiver, 1, "the node_down firing")
    assert (firing["status"], firing["alert"], firing["node"], firing["job"]) == ("firing", "node_down", "node-2", None)
    assert "node node-2 is down since" in firing["message"] and "1 job waits on it" in firing["message"]
    assert "cannot connect" in firing["message"]
    assert (
        firing["fix"]
        == "restart Ollama on 127.0.0.1 (systemctl restart ollama); or cancel what waits: gpuq clear node-2"
    )

    await f2.start(port=port)
    await d.wait_state(job["id"], "done", timeout=15)
    _, resolved = await got(receiver, 2, "the node_down resolution")
    assert (resolved["status"], resolved["alert"], resolved["node"]) == ("resolved", "node_down", "node-2")
    assert resolved["message"].startswith("node node-2 answers again")
    assert receiver.statuses() == [("firing", "node_down"), ("resolved", "node_down")]


async def test_a_model_stuck_in_vram_fires_survives_a_restart_and_resolves_when_it_leaves(
    fakes, daemon_factory, receiver
):
    fake, d = await one_node(fakes, daemon_factory, receiver, unload_timeout="0.5s")
    fake.script.unload = "never"
    [job] = await d.submit("task", "leaves its model behind")
    await d.wait_state(job["id"], "done")

    [firing] = await got(receiver, 1, "the vram_stuck firing")
    assert (firing["alert"], firing["node"], firing["job"]) == ("vram_stuck", "node-1", job["id"])
    assert firing["message"].startswith("unload failed: qwen3-coder:30b did not leave VRAM within ")
    assert "(unload_timeout 0.5s;" in firing["message"]
    assert firing["fix"] == (
        f"OLLAMA_HOST={fake.url} ollama stop qwen3-coder:30b; if it stays, restart Ollama on 127.0.0.1"
    )

    # A restart remembers the stuck model: the node stays flagged, nothing is sent again.
    await d.kill(signal.SIGTERM)
    await d.start()
    node = (await d.get("/api/nodes"))["nodes"][0]
    assert node["vram_stuck"] == firing["message"]
    [later] = await d.submit("task", "waits for VRAM")
    assert (await d.job(later["id"]))["state"] == "queued"

    fake.script.unload = "immediate"
    fake.loaded.clear()  # the stuck runner is killed by hand
    await d.wait_state(later["id"], "done", timeout=15)
    _, resolved = await got(receiver, 2, "the vram_stuck resolution")
    assert (resolved["status"], resolved["alert"], resolved["job"]) == ("resolved", "vram_stuck", job["id"])
    assert resolved["message"].startswith("qwen3-coder:30b left VRAM on node-1; it takes jobs again")
    assert receiver.statuses() == [("firing", "vram_stuck"), ("resolved", "vram_stuck")]


async def test_without_alert_url_firings_are_recorded_and_an_open_one_is_sent_once_one_is_set(
    fakes, daemon_factory, receiver
):
    fake = await fakes("qwen3-coder:30b")
    d = await daemon_factory(
        [node_table("node-1", fake, 1, ["task"], "qwen3-coder:30b")], stale_after="0.5s", stall_timeout="60s"
    )
    head, _ = await stale_head(fake, d)

    async def recorded():
        body = await d.get("/api/alerts")
        return body["alerts"] and body

    body = await eventually(recorded, 20, what="the firing to be recorded")
    assert body["alert_url_set"] is False
    [alert] = body["alerts"]
    assert (alert["alert"], alert["job_id"], alert["deliver"], alert["deliveries"]) == ("stale_head", head, 0, [])

    await d.kill(signal.SIGKILL)  # the head stays running in the database: still firing at the restart
    config = tomllib.loads(d.config.read_text())
    config["router"]["alert_url"] = receiver.url
    d.config.write_text(tomli_w.dumps(config))
    await d.start()
    # The restart fails the orphaned head, so the firing ends: its notices are both owed now.
    await got(receiver, 2, "the firing and its resolution")
    assert receiver.statuses() == [("firing", "stale_head"), ("resolved", "stale_head")]
    assert f"job {head} is failed now" in receiver.bodies()[1]["message"]
