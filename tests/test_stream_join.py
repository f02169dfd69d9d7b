"""A follower that joins a job's stream just as the job ends still gets all of its output as
text lines (a fast job can end between the stream's first read and its first live look)."""

from __future__ import annotations

import json

from aiohttp.test_utils import TestClient, TestServer
from conftest import eventually

from gpuq.api.app import create_app
from gpuq.api.state import STORE
from gpuq.config import NodeConfig, Settings
from gpuq.demo import FakeOllama, Script


async def test_a_job_that_ended_while_the_follower_joined_streams_its_output(tmp_path):
    fake = FakeOllama(models={"m:latest"}, script=Script(reply="one two three"))
    await fake.start()
    settings = Settings(
        database=tmp_path / "gpuq.db",
        health_interval_s=60,
        nodes=(NodeConfig("n1", fake.url, 1, ("task",), "m:latest"),),
    )
    client = TestClient(TestServer(create_app(settings)))
    await client.start_server()
    try:
        resp = await client.post("/api/jobs", json={"kind": "task", "prompt": "p"})
        job_id = (await resp.json())["jobs"][0]["id"]

        async def done():
            return (await (await client.get(f"/api/jobs/{job_id}")).json())["state"] == "done"

        await eventually(done, what="the job to finish")

        store = client.server.app[STORE]
        real = store.job_detail
        first = True

        async def stale_then_real(jid):  # the first read was taken just before the job ended
            nonlocal first
            row = await real(jid)
            if first:
                first = False
                return dict(row, state="running", output="")
            return row

        store.job_detail = stale_then_real

        pieces, final = [], None
        async with client.get(f"/api/jobs/{job_id}/stream") as stream:
            async for raw in stream.content:
                line = json.loads(raw)
                pieces += [line["text"]] if "text" in line else []
                final = line["job"] if line.get("done") else final
        assert final["state"] == "done" and final["output"] == "one two three"
        assert "".join(pieces) == "one two three"
    finally:
        await client.close()
        await fake.stop()
