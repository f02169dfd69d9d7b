"""A front-door request's large parts are stored once per content (issue 35): a chat UI that
resends the same photo with every turn stores it once, not once per turn; every job's request
reads back whole (the API, `gpuq show`), and the node gets the image each time. Against the real
daemon and the simulator, through the Ollama and OpenAI clients."""

from __future__ import annotations

import base64
import json
import sqlite3

import pytest
from test_front import CHAT_MODEL
from test_front_door_http import photo, start_lab

from gpuq.jobs import compact_json
from gpuq.store.parts import MARK, PART_BYTES, join_request, split_request

TURNS = 10


@pytest.fixture
async def front(fakes, daemon_factory):
    lab = await start_lab(fakes, daemon_factory)
    yield lab
    await lab.close()


def database(front) -> sqlite3.Connection:
    return sqlite3.connect(front.daemon.config.parent / "gpuq.db")


async def test_a_photo_resent_with_every_turn_is_stored_once(front):
    image = photo(1_000_000)
    encoded = base64.b64encode(image).decode()
    client = front.ollama(timeout=120)
    messages: list[dict] = [{"role": "user", "content": "what is in this photo?", "images": [image]}]
    for turn in range(TURNS):  # as a chat UI does: the whole conversation, the photo in it, each turn
        reply = await client.chat(model=CHAT_MODEL, messages=messages)
        messages += [
            {"role": "assistant", "content": reply.message.content},
            {"role": "user", "content": f"and {turn}?"},
        ]
    sent = [r for r in front.fakes["node-1"].requests if r.get("messages")]
    assert len(sent) == TURNS and all(r["messages"][0]["images"] == [encoded] for r in sent)

    db = database(front)
    try:
        parts = db.execute("SELECT bytes FROM request_part").fetchall()
        [(requests, request_bytes)] = db.execute(
            "SELECT COUNT(*), SUM(LENGTH(CAST(request AS BLOB))) FROM job WHERE endpoint IS NOT NULL"
        ).fetchall()
        [(links,)] = db.execute("SELECT COUNT(*) FROM job_part").fetchall()
    finally:
        db.close()
    # One copy of the photo for ten calls, not ten; the requests themselves hold only its mark.
    assert parts == [(len(encoded) + 2,)] and (requests, links) == (TURNS, TURNS)  # as JSON text, quoted
    assert request_bytes < TURNS * 10_000, request_bytes
    print(f"{TURNS} calls with a {len(encoded)}-byte image: 1 part, requests {request_bytes} bytes in all")

    # Every job's request reads back whole: the API (the page reads it there) and `gpuq show`.
    jobs = sorted(
        (j for j in (await front.daemon.get("/api/jobs?limit=100"))["jobs"] if j["endpoint"]),
        key=lambda j: j["created_at"],
    )
    for job, node_body in zip(jobs, sent, strict=True):
        detail = await front.daemon.job(job["id"])
        request = detail["request"] if isinstance(detail["request"], dict) else json.loads(detail["request"])
        assert request["body"]["messages"][0]["images"] == [encoded]
        assert request["body"]["messages"][1:] == node_body["messages"][1:]
    shown = await front.daemon.cli("show", jobs[-1]["id"], "--json")
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["request"]["body"]["messages"][0]["images"] == [encoded]


async def test_an_openai_data_url_is_stored_once_and_reaches_the_node_whole(front):
    image = photo(200_000)
    url = "data:image/jpeg;base64," + base64.b64encode(image).decode()
    client = front.openai()
    for _ in range(3):
        await client.chat.completions.create(
            model=CHAT_MODEL,
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": url}}],
                }
            ],
        )
    sent = [r for r in front.fakes["node-1"].requests if r.get("messages")]
    assert [r["messages"][-1]["images"] for r in sent] == [[base64.b64encode(image).decode()]] * 3
    db = database(front)
    try:
        assert db.execute("SELECT bytes FROM request_part").fetchall() == [(len(url) + 2,)]
    finally:
        db.close()


def test_a_request_splits_and_joins_back_to_the_very_text_it_was():
    big, text = "A" * PART_BYTES, "ünïcode “quoted” " * 5000  # over the threshold in UTF-8 bytes
    request = compact_json({"path": "/api/chat", "body": {"images": [big, "small"], "prompt": text, "n": [1, None]}})
    stored, parts = split_request(request)
    assert {json.loads(p) for p in parts.values()} == {big, text} and len(stored) < 300
    assert join_request(stored, lambda digests: {d: parts[d] for d in digests}) == request
    # A client's own object under the mark's key: the request is stored as it came, never misread.
    own = compact_json({"body": {"x": {MARK: "0" * 64}, "images": [big]}})
    assert split_request(own) == (own, {})
    assert split_request("not json" + big) == ("not json" + big, {})
