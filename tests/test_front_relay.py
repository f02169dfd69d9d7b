"""The seam between the node's worker and the front door (gpuq/node/calls.py, gpuq/front/relay.py):
the worker runs a called job as the front door prepares it, and knows no client API."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import eventually

from gpuq.bus import Bus
from gpuq.config import NodeConfig, Settings
from gpuq.front.relay import Relay
from gpuq.jobs import new_job_id
from gpuq.node.dispatcher import Dispatcher
from gpuq.store import NewJob, Store


def test_the_nodes_room_imports_nothing_of_the_front_door():
    code = (
        "import sys, gpuq.node.dispatcher, gpuq.node.worker; "
        "print(sorted(m for m in sys.modules if m.startswith('gpuq.front')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def called_job(tmp_path, fakes, calls):
    """A Dispatcher alone (no front door listening) given `calls`, and an OpenAI chat job called
    for on its one node; returns the store, the dispatcher and the job's id."""
    fake = await fakes("m:latest", tokens=5)
    settings = Settings(database=tmp_path / "q.db", nodes=(NodeConfig("n", fake.url, 1, ("task",), "m:latest"),))
    store = Store(settings.database)
    await store.open()
    dispatcher = Dispatcher(settings, store, Bus(), calls=calls)
    await dispatcher.start()
    body = {"model": "m:latest", "messages": [{"role": "user", "content": "relay me"}], "stream": True}
    job_id = new_job_id()
    return (
        store,
        dispatcher,
        job_id,
        NewJob(
            "task",
            "relay me",
            model="m:latest",
            endpoint="/v1/chat/completions",
            request=json.dumps({"path": "/v1/chat/completions", "body": body}),
            job_id=job_id,
        ),
    )


async def test_a_called_job_is_relayed_to_its_waiting_client_chunk_by_chunk(tmp_path, fakes):
    relay = Relay()
    store, dispatcher, job_id, new = await called_job(tmp_path, fakes, relay)
    try:
        waiting = relay.open(job_id)
        await dispatcher.submit(new, "openai 127.0.0.1")
        got = []

        async def finished():
            while not waiting.empty():
                got.append(waiting.get_nowait())
            return got and got[-1][0] == "chunk" and got[-1][2].get("done")

        await eventually(finished, what="the last chunk relayed")
        assert got[0] == ("start", "n")
        text = "".join(item[2]["message"]["content"] for item in got[1:])
        job = await eventually(lambda: _done(store, job_id), what="the job done")
        assert text and job["output"] == text  # what the client got is what the job kept
    finally:
        await dispatcher.stop()
        await store.close()


async def _done(store: Store, job_id: str):
    job = await store.job_detail(job_id)
    return job if job["state"] == "done" else None


async def test_a_dispatcher_with_no_front_door_wired_fails_a_called_job_naming_why(tmp_path, fakes):
    store, dispatcher, job_id, new = await called_job(tmp_path, fakes, None)
    try:
        await dispatcher.submit(new, "openai 127.0.0.1")

        async def failed():
            job = await store.job(job_id)
            return job if job["state"] == "failed" else None

        job = await eventually(failed, what="the job failed")
        assert "no front door is wired" in job["error"]
    finally:
        await dispatcher.stop()
        await store.close()


def node_lines(n: int) -> list[bytes]:
    return [json.dumps({"message": {"content": f"w{i:05d} "}, "done": i == n - 1}).encode() for i in range(n)]


def test_a_call_past_its_memory_spools_the_rest_and_gives_it_back_in_order(tmp_path):
    """What a slow client's call holds: the first lines in memory up to its limit, the rest in
    an unnamed file in the spool's directory (nothing left there by name), read back whole."""
    relay = Relay()
    inbox = relay.open("j", limit=4096, spool_dir=tmp_path)
    lines = node_lines(3000)
    for raw in lines:
        relay.chunk("j", raw, json.loads(raw))
    held = []
    while not inbox.empty():
        held.append(inbox.get_nowait())
    assert held[-1] == ("spooled",) and all(item[0] == "chunk" for item in held[:-1])
    assert inbox.held == 0 and list(tmp_path.iterdir()) == []  # on disk, under no name
    assert inbox.spool is not None
    back = []
    while piece := inbox.spool.read(1000):
        back += piece
    assert [item[1] for item in held[:-1]] + back == lines
    inbox.rejoin()  # caught up: the next line comes through memory again
    relay.chunk("j", b'{"done": true}', {"done": True})
    assert inbox.get_nowait()[0] == "chunk"


def test_a_call_whose_spool_cannot_be_written_is_told_it_fell_behind(tmp_path):
    """Where the spool cannot keep a line (its bound, or a full disk), the call is behind: told
    once, after what was spooled, and nothing more is held for it."""
    relay = Relay()
    inbox = relay.open("j", limit=4096, spool_dir=tmp_path)
    inbox.spool_max = 20_000
    for raw in node_lines(3000):
        relay.chunk("j", raw, json.loads(raw))
    kinds = []
    while not inbox.empty():
        kinds.append(inbox.get_nowait()[0])
    assert kinds[-2:] == ["spooled", "behind"] and inbox.behind
    assert inbox.dropped > 0 and inbox.spool is not None and inbox.spool.total <= 20_000
    relay.close("j")
    assert inbox.spool is None


def test_a_spool_that_cannot_be_made_ends_the_stream_behind(tmp_path):
    """A spool whose directory cannot take it (gone, or full): the call is behind at once."""
    relay = Relay()
    inbox = relay.open("j", limit=4096, spool_dir=tmp_path / "missing")
    for raw in node_lines(200):
        relay.chunk("j", raw, json.loads(raw))
    kinds = []
    while not inbox.empty():
        kinds.append(inbox.get_nowait()[0])
    assert kinds[-1] == "behind" and "spooled" not in kinds
