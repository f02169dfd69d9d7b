"""Dispatcher edge cases that the daemon tests cannot time on purpose."""

from __future__ import annotations


from conftest import eventually

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
        rt = dispatcher.nodes["n"]
        await dispatcher.loops.stop()  # no worker of its own may claim: this test claims by hand
        await store.submit(NewJob("task", "never sent"), [NodeInfo("n", 1, ("task",), "m:latest", True)], "api")
        job = await store.claim("n")
        _, interrupted = await store.delete(job["id"], "cli")
        dispatcher.abort(interrupted, "deleted")  # the worker has not taken the job up yet
        await dispatcher._run(rt, job)
        assert fake.chat_requests == []
        assert (await store.job(job["id"]))["state"] == "cancelled"
        assert rt.aborted_runs == {}
    finally:
        await dispatcher.stop()
        await store.close()


async def test_a_long_stream_is_stored_exactly_and_each_token_written_once(tmp_path, fakes, monkeypatch):
    """Output is written once: with a heartbeat after every token, the text the worker hands the
    store adds up to the output itself (not the output so far at every heartbeat, O(n^2)), and
    after each heartbeat the stored output is exactly what streamed so far, which is what a
    router killed at that moment would leave behind."""
    monkeypatch.setattr("gpuq.dispatcher.HEARTBEAT_S", 0.0)
    fake = await fakes("m:latest", tokens=300)
    settings = Settings(database=tmp_path / "q.db", nodes=(NodeConfig("n", fake.url, 1, ("task",), "m:latest"),))
    store = Store(settings.database)
    await store.open()
    written = []

    def counting(verb):
        real = getattr(store, verb)

        async def write(run_id, output, *args, **kwargs):
            await real(run_id, output, *args, **kwargs)
            written.append(output or "")
            if verb == "heartbeat":  # what a crash right now would leave stored
                [run] = await store.read("SELECT output FROM run WHERE id = ?", (run_id,))
                assert run["output"] == "".join(written)
        monkeypatch.setattr(store, verb, write)
    for verb in ("heartbeat", "work_done"):
        counting(verb)
    dispatcher = Dispatcher(settings, store, Bus())
    await dispatcher.start()
    try:
        [job] = await store.submit(NewJob("task", "stream a long answer"), [NodeInfo("n", 1, ("task",), "m:latest", True)], "api")
        dispatcher.wake("n")
        async def done():
            return (await store.job(job["id"]))["state"] == "done"
        await eventually(done, what="the job to finish")
        detail = await store.job_detail(job["id"])
    finally:
        await dispatcher.stop()
        await store.close()
    assert len(written) > 100  # heartbeat-rich: one write per token or so
    assert len(detail["output"].split()) == 300
    assert "".join(written) == detail["output"]  # every character handed to the store once
