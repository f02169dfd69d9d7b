"""Dispatcher edge cases that the daemon tests cannot time on purpose."""

from __future__ import annotations


from gpuq.bus import Bus
from gpuq.config import NodeConfig, Settings
from gpuq.dispatcher import Dispatcher
from gpuq.store import NewJob, NodeInfo, Store


async def test_a_delete_that_lands_between_claim_and_start_never_reaches_ollama(tmp_path, fakes):
    fake = await fakes("m:latest")
    settings = Settings(database=tmp_path / "q.db", nodes=(NodeConfig("n", fake.url, 1, ("task",), "m:latest"),))
    store = Store(settings.database)
    await store.open()
    dispatcher = Dispatcher(settings, store, Bus())
    await dispatcher.start()
    try:
        worker = dispatcher.workers["n"]
        await dispatcher.loops.stop()  # no worker of its own may claim: this test claims by hand
        await store.submit(NewJob("task", "never sent"), [NodeInfo("n", 1, ("task",), "m:latest", True)], "api")
        job = await store.claim("n")
        _, interrupted = await store.delete(job["id"], "cli")
        dispatcher.abort(interrupted, "deleted")  # the worker has not taken the job up yet
        await worker._run(job)
        assert fake.chat_requests == []
        assert (await store.job(job["id"]))["state"] == "cancelled"
        assert worker.aborted_runs == {}
    finally:
        await dispatcher.stop()
        await store.close()
