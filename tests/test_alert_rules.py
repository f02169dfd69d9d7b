"""The pure parts of gpuq/upkeep/alerts.py: what fires, the backoff, the notice in each format."""

from __future__ import annotations

from types import SimpleNamespace

from gpuq.config import NodeConfig, Settings
from gpuq.upkeep.alerts import conditions, notice, request_for, retry_after_s


def node(name: str, up=True, checked=True, vram_stuck=None):
    return SimpleNamespace(
        name=name,
        up=up,
        checked=checked,
        since=1_800_000_000.0,
        last_error="cannot connect",
        vram_stuck=vram_stuck,
        stuck_model="m:1",
        stuck_since=1_800_000_100.0,
        stuck_job="j",
        config=NodeConfig(name, f"http://{name}:11434", 1, ("task",), "m:1"),
    )


def test_a_down_node_fires_only_with_waiting_jobs_and_only_once_checked():
    nodes = [node("a", up=False), node("b", up=False), node("c", up=False, checked=False)]
    fired = conditions([], nodes, {"a": 2, "c": 5})
    assert [(c.alert, c.node) for c in fired] == [("node_down", "a")]
    assert "2 jobs wait on it" in fired[0].message
    assert fired[0].fix == "restart Ollama on a (systemctl restart ollama); or cancel what waits: gpuq clear a"


def test_a_stuck_model_fires_whatever_waits():
    [c] = conditions([], [node("a", vram_stuck="unload failed: m:1 ...")], {})
    assert (c.alert, c.job, c.model, c.message) == ("vram_stuck", "j", "m:1", "unload failed: m:1 ...")
    assert c.fix == "OLLAMA_HOST=http://a:11434 ollama stop m:1; if it stays, restart Ollama on a"


def test_backoff_doubles_from_one_second_to_a_minute():
    assert [retry_after_s(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_ntfy_notice_of_a_node_alert_links_the_queue_page():
    row = {
        "alert": "node_down",
        "node": "a",
        "job_id": None,
        "since": "2026-01-01T00:00:00.000000Z",
        "message": "node a is down",
        "fix": "gpuq clear a",
        "resolution": "node a answers again",
    }
    settings = Settings(alert_url="https://ntfy.sh/t", alert_format="ntfy", public_url="http://box:8750")
    firing = request_for(notice(row, "firing"), settings, 7)
    assert firing["headers"]["Click"] == "http://box:8750/"
    assert firing["headers"]["Title"] == "gpuq: node down on a"
    assert firing["headers"]["Idempotency-Key"] == "gpuq-alert-7-firing"
    assert "Authorization" not in firing["headers"]
    assert firing["data"] == b"node a is down\nfix: gpuq clear a"
    resolved = notice(row, "resolved")
    assert resolved == {
        "status": "resolved",
        "alert": "node_down",
        "node": "a",
        "job": None,
        "since": "2026-01-01T00:00:00.000000Z",
        "message": "node a answers again",
        "fix": None,
    }
    as_json = request_for(resolved, Settings(alert_url="http://127.0.0.1:1/h", alert_token="s"), 7)
    assert as_json["json"] == resolved and as_json["headers"]["Authorization"] == "Bearer s"
