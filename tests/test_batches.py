"""OpenAI's Batch API on the front door (issue 37), with the real `openai` SDK against the real
daemon and the simulated nodes: files uploaded as the SDK sends them, batches created, polled to
completed and their output read; a cancel; bad inputs each answered as the hosted API answers
them, nothing stored half."""

from __future__ import annotations

import json

import openai
import pytest
from conftest import eventually, shell
from test_front import CHAT_MODEL, EMBED_MODEL, start_front_lab

TOKEN = "s3cret"


@pytest.fixture
async def front(fakes, daemon_factory):
    lab = await start_front_lab(fakes, daemon_factory, token=TOKEN)
    lab.daemon.auth = {"Authorization": f"Bearer {TOKEN}"}
    yield lab
    await lab.close()


def jsonl(*requests: dict) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in requests)


def chat_line(custom_id: str, content: str, model: str = CHAT_MODEL, **extra) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


async def ended(client: openai.AsyncOpenAI, batch_id: str, timeout: float = 30.0):
    """Poll batches.retrieve, as a script does, until the batch has ended."""

    async def done():
        batch = await client.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "cancelled", "expired") else None

    return await eventually(done, timeout, what=f"batch {batch_id} to end")


def lines_of(content: bytes) -> list[dict]:
    return [json.loads(line) for line in content.splitlines() if line.strip()]


async def test_a_chat_batch_runs_every_line_and_its_output_file_has_each_reply(front):
    client = front.openai(api_key=TOKEN)
    uploaded = await client.files.create(
        file=("sweep.jsonl", jsonl(*(chat_line(f"q-{i}", f"question {i}") for i in range(5)))), purpose="batch"
    )
    assert uploaded.purpose == "batch" and uploaded.filename == "sweep.jsonl" and uploaded.id.startswith("file-")
    assert (await client.files.retrieve(uploaded.id)).bytes == uploaded.bytes
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"name": "eval-sweep"},
    )
    assert batch.status == "in_progress" and batch.request_counts.total == 5
    assert batch.metadata == {"name": "eval-sweep"}
    # Each line is a job in the batch lane, owned by the token's user, placed by its model.
    jobs = [j for j in await front.jobs() if j["prompt_excerpt"].startswith("question ")]
    assert len(jobs) == 5 and {j["lane"] for j in jobs} == {"batch"} and {j["node"] for j in jobs} == {"node-1"}
    done = await ended(client, batch.id)
    assert done.status == "completed" and done.error_file_id is None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (5, 5, 0)
    assert done.completed_at >= done.in_progress_at >= done.created_at
    output = lines_of((await client.files.content(done.output_file_id)).content)
    assert [line["custom_id"] for line in output] == [f"q-{i}" for i in range(5)]
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
        assert line["id"] == "batch_req_" + line["response"]["request_id"]
    # The SDK's list pages through them, newest first.
    listed = [b.id async for b in client.batches.list(limit=1)]
    assert listed[0] == batch.id


async def test_an_embeddings_batch_keeps_its_vectors(front):
    client = front.openai(api_key=TOKEN)
    line = {
        "custom_id": "e-1",
        "method": "POST",
        "url": "/v1/embeddings",
        "body": {"model": EMBED_MODEL, "input": ["one", "two"]},
    }
    uploaded = await client.files.create(file=("e.jsonl", jsonl(line)), purpose="batch")
    batch = await client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    done = await ended(client, batch.id)
    [out] = lines_of((await client.files.content(done.output_file_id)).content)
    body = out["response"]["body"]
    assert body["object"] == "list" and len(body["data"]) == 2 and len(body["data"][0]["embedding"]) > 0


async def test_an_unknown_model_on_one_line_is_that_lines_error_and_the_others_run(front):
    client = front.openai(api_key=TOKEN)
    uploaded = await client.files.create(
        file=("m.jsonl", jsonl(chat_line("ok", "fine"), chat_line("bad", "nope", model="no-such:model"))),
        purpose="batch",
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await ended(client, batch.id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    [ok] = lines_of((await client.files.content(done.output_file_id)).content)
    [bad] = lines_of((await client.files.content(done.error_file_id)).content)
    assert ok["custom_id"] == "ok" and bad["custom_id"] == "bad"
    assert bad["response"]["status_code"] == 404 and "no-such:model" in bad["response"]["body"]["error"]["message"]


async def test_a_file_of_bad_lines_fails_the_batch_in_validation_naming_each_line(front):
    client = front.openai(api_key=TOKEN)
    content = b"".join(
        [
            b"this is not json\n",
            jsonl({**chat_line("a", "x"), "method": "GET"}),
            jsonl({**chat_line("b", "x"), "url": "/v1/embeddings"}),
            jsonl(chat_line("c", "x"), chat_line("c", "y")),
            jsonl({"method": "POST", "url": "/v1/chat/completions", "body": {}}),
        ]
    )
    uploaded = await client.files.create(file=("bad.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed" and batch.failed_at is not None
    assert batch.errors is not None and batch.errors.data is not None
    errors = [(e.line, e.code) for e in batch.errors.data]
    assert errors == [
        (1, "invalid_json_line"),
        (2, "invalid_method"),
        (3, "mismatched_endpoint"),
        (5, "duplicate_custom_id"),
        (6, "missing_required_parameter"),
    ]
    # Nothing of it was queued.
    assert not [j for j in await front.jobs() if j["prompt_excerpt"] in ("x", "y")]
    assert (await client.batches.retrieve(batch.id)).status == "failed"


async def test_refusals_of_the_whole_request_store_nothing(front):
    client = front.openai(api_key=TOKEN)
    empty = await client.files.create(file=("empty.jsonl", b""), purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:
        await client.batches.create(input_file_id=empty.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "has no requests" in exc.value.message
    with pytest.raises(openai.NotFoundError):
        await client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError) as exc:
        await client.batches.create(input_file_id=empty.id, endpoint="/v1/moderations", completion_window="24h")  # type: ignore[arg-type]
    assert "/v1/moderations" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        await client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    assert "purpose" in exc.value.message
    assert shell(front.daemon, "SELECT COUNT(*) FROM batch") == [(0,)]


async def test_a_file_over_the_size_limit_is_refused_413_naming_the_limit(fakes, daemon_factory):
    lab = await start_front_lab(fakes, daemon_factory, token=TOKEN, front={"max_request_bytes": 1 << 20})
    try:
        client = lab.openai(api_key=TOKEN)
        with pytest.raises(openai.APIStatusError) as exc:
            await client.files.create(file=("big.jsonl", b"x" * ((1 << 20) + 10)), purpose="batch")
        assert exc.value.status_code == 413 and "front.max_request_bytes" in exc.value.message
        assert shell(lab.daemon, "SELECT COUNT(*) FROM batch_file") == [(0,)]
    finally:
        await lab.close()


async def test_cancel_ends_the_waiting_lines_and_the_running_one_finishes(front):
    """As OpenAI's: cancelling stops what waits; what runs ends, and its reply is in the output."""
    client = front.openai(api_key=TOKEN)
    front.fakes["node-1"].script.token_delay_s, front.fakes["node-1"].script.tokens = 0.05, 40
    uploaded = await client.files.create(
        file=("c.jsonl", jsonl(*(chat_line(f"c-{i}", f"waiting {i}") for i in range(3)))), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    await front.job_with("waiting 0", "running")
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    done = await ended(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 2)
    [ran] = lines_of((await client.files.content(done.output_file_id)).content)
    assert ran["custom_id"] == "c-0" and ran["response"]["status_code"] == 200
    errors = lines_of((await client.files.content(done.error_file_id)).content)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("c-1", "batch_cancelled"),
        ("c-2", "batch_cancelled"),
    ]
    with pytest.raises(openai.ConflictError):
        await client.batches.cancel(batch.id)


async def test_files_list_retrieve_delete_and_anothers_file_is_not_found(front):
    client = front.openai(api_key=TOKEN)
    a = await client.files.create(file=("a.jsonl", jsonl(chat_line("a", "x"))), purpose="batch")
    b = await client.files.create(file=("b.jsonl", jsonl(chat_line("b", "x"))), purpose="batch")
    assert [f.id async for f in client.files.list(purpose="batch")] == [b.id, a.id]
    deleted = await client.files.delete(a.id)
    assert deleted.deleted and deleted.id == a.id
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(a.id)
    assert [f.id async for f in client.files.list()] == [b.id]


async def test_a_batch_runs_the_same_on_each_engine(fakes, daemon_factory, database):
    """On PostgreSQL too: the file kept as bytea, the lines queued in one commit, the output."""
    lab = await start_front_lab(fakes, daemon_factory, token=TOKEN, database=str(database))
    try:
        client = lab.openai(api_key=TOKEN)
        uploaded = await client.files.create(
            file=("pg.jsonl", jsonl(*(chat_line(f"p-{i}", f"engine {i}") for i in range(3)))), purpose="batch"
        )
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = await ended(client, batch.id)
        assert done.status == "completed" and done.request_counts.completed == 3
        output = lines_of((await client.files.content(done.output_file_id)).content)
        assert [line["custom_id"] for line in output] == ["p-0", "p-1", "p-2"]
    finally:
        await lab.close()


async def test_lines_take_a_calls_model_rules_local_dropped_aliases_applied_cloud_refused(fakes, daemon_factory):
    """A line's model is read as a front-door call's (gpuq/front/names.py): `:local` dropped,
    [front] model_aliases applied, an ollama.com cloud name refused as that line's error."""
    lab = await start_front_lab(fakes, daemon_factory, token=TOKEN, front={"model_aliases": {"gpt-5*": CHAT_MODEL}})
    lab.daemon.auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        client = lab.openai(api_key=TOKEN)
        uploaded = await client.files.create(
            file=(
                "names.jsonl",
                jsonl(
                    chat_line("local", "asked local", model=CHAT_MODEL + ":local"),
                    chat_line("alias", "asked alias", model="gpt-5-mini"),
                    chat_line("cloud", "asked cloud", model="gpt-oss:120b-cloud"),
                ),
            ),
            purpose="batch",
        )
        batch = await client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = await ended(client, batch.id)
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
        jobs = {j["prompt_excerpt"]: j for j in await lab.jobs() if j["prompt_excerpt"].startswith("asked ")}
        assert {p: j["model"] for p, j in jobs.items()} == {"asked local": CHAT_MODEL, "asked alias": CHAT_MODEL}
        output = lines_of((await client.files.content(done.output_file_id)).content)
        assert [line["custom_id"] for line in output] == ["local", "alias"]
        [cloud] = lines_of((await client.files.content(done.error_file_id)).content)
        assert cloud["custom_id"] == "cloud" and cloud["response"]["status_code"] == 403
        assert "cloud" in cloud["response"]["body"]["error"]["message"]
    finally:
        await lab.close()


async def test_a_batch_past_its_completion_window_expires_with_the_files_of_what_finished(front):
    """As OpenAI's: at expires_at the lines still waiting are cancelled as expired (the error
    file says `batch_expired`), what ran is in the output, and the batch ends `expired`."""
    client = front.openai(api_key=TOKEN)
    front.fakes["node-1"].script.token_delay_s, front.fakes["node-1"].script.tokens = 0.05, 60
    uploaded = await client.files.create(
        file=("x.jsonl", jsonl(*(chat_line(f"x-{i}", f"slow {i}") for i in range(4)))), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="2s"
    )
    assert batch.completion_window == "2s" and batch.expires_at - batch.created_at == 2
    done = await ended(client, batch.id)
    assert done.status == "expired" and done.expired_at is not None and done.expired_at >= batch.expires_at
    assert done.completed_at is None and done.cancelled_at is None
    counts = done.request_counts
    assert counts.total == 4 and counts.completed >= 1 and counts.completed + counts.failed == 4
    output = lines_of((await client.files.content(done.output_file_id)).content)
    assert output[0]["custom_id"] == "x-0" and all(line["response"]["status_code"] == 200 for line in output)
    errors = lines_of((await client.files.content(done.error_file_id)).content)
    assert len(errors) == counts.failed and errors[-1]["custom_id"] == "x-3"
    for line in errors:
        assert line["response"] is None and line["error"]["code"] == "batch_expired"
        assert "completion window expired" in line["error"]["message"]
    # The lines were cancelled, not failed: a retry runs them again, with a new window.
    front.fakes["node-1"].script.token_delay_s = 0
    retried = await front.daemon.request("POST", f"/api/batches/{batch.id}/retry", {"failed": True})
    assert retried[0] == 200 and len(retried[1]["retried"]) == counts.failed
    again = await ended(client, batch.id)
    assert again.status == "completed" and again.request_counts.completed == 4
    assert again.expires_at > done.expires_at


async def test_a_bad_completion_window_is_refused_naming_it(front):
    client = front.openai(api_key=TOKEN)
    uploaded = await client.files.create(file=("w.jsonl", jsonl(chat_line("w", "x"))), purpose="batch")
    for window in ("soon", "0s"):
        with pytest.raises(openai.BadRequestError) as exc:
            await client.batches.create(
                input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window=window
            )
        assert "completion_window" in exc.value.message


async def test_deleting_a_batchs_files_as_the_sdk_reads_it(front):
    """OpenAI's file DELETE: `{id, object: "file", deleted: true}`; the batch keeps naming the
    file (as OpenAI's does) while its content is gone (404); a second delete is 404."""
    client = front.openai(api_key=TOKEN)
    uploaded = await client.files.create(file=("f.jsonl", jsonl(chat_line("f", "filed"))), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await ended(client, batch.id)
    for file_id in (uploaded.id, done.output_file_id):
        deleted = await client.files.delete(file_id)
        assert (deleted.id, deleted.object, deleted.deleted) == (file_id, "file", True)
        with pytest.raises(openai.NotFoundError):
            await client.files.content(file_id)
        with pytest.raises(openai.NotFoundError):
            await client.files.delete(file_id)
    again = await client.batches.retrieve(batch.id)
    assert (again.input_file_id, again.output_file_id, again.status) == (uploaded.id, done.output_file_id, "completed")
    assert [f.id async for f in client.files.list()] == []


async def test_a_line_that_is_not_text_or_too_deep_fails_the_batch_in_validation_never_500(front):
    """A lone surrogate in a line's custom_id, content or model (JSON escapes half a UTF-16 pair
    that no UTF-8 can hold) and a line nested deeper than JSON is read are that line's
    validation errors, on the front door and on the router's API alike: no 500, nothing queued."""
    surrogate = "\\ud800"  # as it stands in the file: an escape json.loads decodes to half a pair
    lines = [
        json.dumps(chat_line("ok", "fine")),
        json.dumps(chat_line("id-X", "x")).replace("id-X", f"id-{surrogate}"),
        json.dumps(chat_line("c", "text-X")).replace("text-X", f"text-{surrogate}"),
        json.dumps(chat_line("m", "y", model="model-X")).replace("model-X", f"model-{surrogate}"),
        '{"custom_id": "deep", "body": ' + "[" * 100_000 + "]" * 100_000 + "}",
    ]
    content = ("\n".join(lines) + "\n").encode()
    client = front.openai(api_key=TOKEN)
    uploaded = await client.files.create(file=("bad.jsonl", content), purpose="batch")
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed" and batch.errors is not None and batch.errors.data is not None
    found = [(e.line, e.code) for e in batch.errors.data]
    assert found == [(2, "invalid_text"), (3, "invalid_text"), (4, "invalid_text"), (5, "invalid_json_line")]
    named = {e.line: e.message for e in batch.errors.data}
    assert "custom_id" in named[2] and "messages[0].content" in named[3] and "model" in named[4], named
    status, body = await front.daemon.request("POST", "/api/batches", {"input": content.decode()})
    assert status == 200 and body["batch"]["status"] == "failed", body
    assert [e["code"] for e in body["batch"]["errors"]] == ["invalid_text"] * 3 + ["invalid_json_line"]
    assert not [j for j in await front.jobs() if j["prompt_excerpt"] in ("fine", "x", "y")]
