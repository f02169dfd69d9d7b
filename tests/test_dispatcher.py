"""Dispatcher edge cases that the daemon tests cannot time on purpose."""

from __future__ import annotations

from conftest import eventually

from gpuq.bus import Bus
from gpuq.config import NodeConfig, Settings
from gpuq.node.dispatcher import Dispatcher
from gpuq.node.worker import NOT_SENT
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


async def test_a_long_stream_is_stored_exactly_and_each_token_written_once(tmp_path, fakes, monkeypatch):
    """Output is written once: with a heartbeat after every token, the text the worker hands the
    store adds up to the output itself (not the output so far at every heartbeat, O(n^2)), and
    after each heartbeat the stored output is exactly what streamed so far, which is what a
    router killed at that moment would leave behind."""
    monkeypatch.setattr("gpuq.node.worker.HEARTBEAT_S", 0.0)
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
                assert (await store.run_texts([run_id]))[run_id]["output"] == "".join(written)

        monkeypatch.setattr(store, verb, write)

    for verb in ("heartbeat", "work_done"):
        counting(verb)
    dispatcher = Dispatcher(settings, store, Bus())
    await dispatcher.start()
    try:
        [job] = await store.submit(
            NewJob("task", "stream a long answer"), [NodeInfo("n", 1, ("task",), "m:latest", True)], "api"
        )
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


async def test_a_claim_the_stop_cut_off_goes_back_to_the_head_and_runs_after_the_restart(tmp_path, fakes):
    # The finish of one job claims the next in the same commit; a stop that cancels the worker
    # while that commit is on its way leaves a job running that never reached Ollama.
    fake = await fakes("m:latest", tokens=3)
    settings = Settings(database=tmp_path / "q.db", nodes=(NodeConfig("n", fake.url, 1, ("task",), "m:latest"),))
    nodes = [NodeInfo("n", 1, ("task",), "m:latest", True)]
    store = Store(settings.database)
    await store.open()
    try:
        dispatcher = Dispatcher(settings, store, Bus())
        await dispatcher.start()
        await dispatcher.loops.stop()  # the worker is gone, as a shutdown's cancel leaves it
        [first] = await store.submit(NewJob("task", "claimed, never sent"), nodes, "api")
        [second] = await store.submit(NewJob("task", "behind it"), nodes, "api")
        claimed = await store.claim("n")  # committed; the worker never got the answer
        assert claimed["id"] == first["id"]
        await dispatcher.stop()

        job = await store.job_detail(first["id"])
        assert job["state"] == "queued" and job["error"] is None
        running, queued, _ = await store.queue("n", 10)
        assert running is None and [j["id"] for j in queued] == [first["id"], second["id"]]  # at the head
        assert job["events"][-1]["to_state"] == "queued" and job["events"][-1]["reason"] == NOT_SENT
        assert [(r["state"], r["error"]) for r in job["runs"]] == [("cancelled", NOT_SENT)]

        restarted = Dispatcher(settings, store, Bus())
        await restarted.start()  # not an orphan: nothing to fail
        try:
            for job_id in (first["id"], second["id"]):
                await eventually(lambda job_id=job_id: state_of(store, job_id, "done"), what=f"{job_id} done")
        finally:
            await restarted.stop()
        assert [r["messages"][0]["content"] for r in fake.chat_requests] == ["claimed, never sent", "behind it"]
    finally:
        await store.close()


async def test_a_job_whose_request_was_sent_stays_an_orphan_of_the_stop(tmp_path, fakes):
    fake = await fakes("m:latest", tokens=50, token_delay_s=0.05)
    settings = Settings(database=tmp_path / "q.db", nodes=(NodeConfig("n", fake.url, 1, ("task",), "m:latest"),))
    store = Store(settings.database)
    await store.open()
    try:
        dispatcher = Dispatcher(settings, store, Bus())
        await dispatcher.start()
        [job] = await store.submit(NewJob("task", "streaming"), [NodeInfo("n", 1, ("task",), "m:latest", True)], "api")
        dispatcher.wake("n")
        await eventually(lambda: fake.chunk_sent.is_set(), what="the first tokens")
        await dispatcher.stop()  # it may have run: never run again silently
        assert (await store.job(job["id"]))["state"] == "running"
        [orphan] = await store.fail_orphans()
        assert orphan["id"] == job["id"]
    finally:
        await store.close()


async def state_of(store: Store, job_id: str, state: str) -> bool:
    return (await store.job(job_id))["state"] == state
