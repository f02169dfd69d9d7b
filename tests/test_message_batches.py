"""Anthropic's Message Batches on the front door (issue 37), with the real `anthropic` SDK against
the real daemon and the simulated nodes: create, retrieve until ended, results as JSON Lines
(through the batch's results_url), list, cancel; a malformed request refuses the whole batch."""

from __future__ import annotations

import anthropic
import pytest
from conftest import eventually, shell
from test_front import CHAT_MODEL, start_front_lab

TOKEN = "s3cret"


@pytest.fixture
async def front(fakes, daemon_factory):
    lab = await start_front_lab(fakes, daemon_factory, token=TOKEN)
    lab.daemon.auth = {"Authorization": f"Bearer {TOKEN}"}
    yield lab
    await lab.close()


def client_for(lab) -> anthropic.AsyncAnthropic:
    client = anthropic.AsyncAnthropic(base_url=lab.url, api_key=TOKEN, max_retries=0)
    lab.clients.append(client)
    return client


def request(custom_id: str, content: str, model: str = CHAT_MODEL) -> dict:
    return {
        "custom_id": custom_id,
        "params": {"model": model, "max_tokens": 64, "messages": [{"role": "user", "content": content}]},
    }


async def ended(client: anthropic.AsyncAnthropic, batch_id: str):
    async def done():
        batch = await client.messages.batches.retrieve(batch_id)
        return batch if batch.processing_status == "ended" else None

    return await eventually(done, 30, what=f"message batch {batch_id} to end")


async def test_a_message_batch_runs_and_its_results_are_read_by_the_sdk(front):
    client = client_for(front)
    batch = await client.messages.batches.create(
        requests=[request("r-1", "first"), request("r-2", "second"), request("r-3", "third", model="no-such:model")]
    )
    assert batch.id.startswith("msgbatch_") and batch.type == "message_batch"
    assert batch.processing_status == "in_progress" and batch.results_url is None
    jobs = [j for j in await front.jobs() if j["prompt_excerpt"] in ("first", "second")]
    assert {(j["lane"], j["node"]) for j in jobs} == {("batch", "node-1")}
    done = await ended(client, batch.id)
    counts = done.request_counts
    assert (counts.succeeded, counts.errored, counts.processing, counts.canceled) == (2, 1, 0, 0)
    assert done.ended_at is not None and done.results_url.endswith(f"/v1/messages/batches/{batch.id}/results")
    results = {r.custom_id: r.result async for r in await client.messages.batches.results(batch.id)}
    assert results["r-1"].type == "succeeded" and results["r-1"].message.content[0].text
    assert results["r-1"].message.role == "assistant" and results["r-2"].type == "succeeded"
    assert results["r-3"].type == "errored" and "no-such:model" in results["r-3"].error.error.message
    assert [b.id async for b in client.messages.batches.list()] == [batch.id]


async def test_cancel_a_message_batch_its_waiting_requests_are_canceled(front):
    client = client_for(front)
    front.fakes["node-1"].script.token_delay_s, front.fakes["node-1"].script.tokens = 0.05, 40
    batch = await client.messages.batches.create(requests=[request(f"c-{i}", f"slow {i}") for i in range(3)])
    await front.job_with("slow 0", "running")
    canceling = await client.messages.batches.cancel(batch.id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
    done = await ended(client, batch.id)
    assert (done.request_counts.succeeded, done.request_counts.canceled) == (1, 2)
    results = {r.custom_id: r.result.type async for r in await client.messages.batches.results(batch.id)}
    assert results == {"c-0": "succeeded", "c-1": "canceled", "c-2": "canceled"}


async def test_a_malformed_request_refuses_the_whole_batch(front):
    client = client_for(front)
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.batches.create(requests=[request("same", "a"), request("same", "b")])
    assert "requests.1.custom_id" in exc.value.message
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.batches.create(requests=[])
    assert shell(front.daemon, "SELECT COUNT(*) FROM batch") == [(0,)]
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.batches.retrieve("msgbatch_nope")


async def test_a_message_batch_past_its_24_hours_ends_with_its_waiting_requests_expired(front):
    """Anthropic's batches expire after 24 hours: what had not run is `expired` in the results
    and the counts, what ran is `succeeded`. The day passes as a person at the database's shell
    would make it pass: its expires_at moved to a second ago."""
    import sqlite3
    import time

    from gpuq.store.steps import iso

    client = client_for(front)
    front.fakes["node-1"].script.token_delay_s, front.fakes["node-1"].script.tokens = 0.05, 40
    batch = await client.messages.batches.create(requests=[request(f"e-{i}", f"day {i}") for i in range(3)])
    await front.job_with("day 0", "running")
    db = sqlite3.connect(front.daemon.config.parent / "gpuq.db")
    with db:
        db.execute("UPDATE batch SET expires_at = ? WHERE id = ?", (iso(time.time() - 1), batch.id))
    db.close()
    done = await ended(client, batch.id)
    counts = done.request_counts
    assert (counts.succeeded, counts.expired, counts.canceled, counts.errored, counts.processing) == (1, 2, 0, 0, 0)
    assert done.ended_at is not None and done.results_url is not None
    results = {r.custom_id: r.result.type async for r in await client.messages.batches.results(batch.id)}
    assert results == {"e-0": "succeeded", "e-1": "expired", "e-2": "expired"}


async def test_delete_takes_an_ended_batch_only_as_the_sdk_expects(front):
    """Anthropic's DELETE: a batch still processing is refused (cancel it first); an ended one
    goes, `{"id", "type": "message_batch_deleted"}`, and is then not found; its jobs stay."""
    client = client_for(front)
    front.fakes["node-1"].script.token_delay_s, front.fakes["node-1"].script.tokens = 0.05, 40
    batch = await client.messages.batches.create(requests=[request("d-1", "to delete"), request("d-2", "to wait")])
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client.messages.batches.delete(batch.id)
    assert "cancel it first" in exc.value.message
    await client.messages.batches.cancel(batch.id)
    await ended(client, batch.id)
    deleted = await client.messages.batches.delete(batch.id)
    assert (deleted.id, deleted.type) == (batch.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.batches.retrieve(batch.id)
    with pytest.raises(anthropic.NotFoundError):
        await client.messages.batches.delete(batch.id)
    assert batch.id not in [b.id async for b in client.messages.batches.list()]
    assert shell(front.daemon, "SELECT COUNT(*) FROM batch_line") == [(0,)]
    jobs = [j for j in await front.jobs() if j["prompt_excerpt"] in ("to delete", "to wait")]
    assert len(jobs) == 2  # the history keeps what ran and what was cancelled
