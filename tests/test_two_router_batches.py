"""A batch shared by two routers on one PostgreSQL database (issue 37): a batch created through
router a's front door (the real `openai` SDK) has its lines run on the nodes a drives and on the
nodes b drives (no client waits on a line); either router answers for it with the same counts,
its files and its cancel; a router SIGKILLed mid-batch fails the line it ran, loudly, and the
rest finishes through the other, where `gpuq batch retry ID --failed` runs the lost line again;
and the batch is finalized once, with one output file, though both routers see its last line
end. Real routers (`gpuq serve` subprocesses), fake Ollama nodes, a throwaway PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import anthropic
import openai
import psycopg
import pytest
from conftest import Daemon, eventually, free_port, node_table
from test_batches import chat_line, jsonl, lines_of
from test_front import CHAT_MODEL

pytestmark = pytest.mark.postgres

TOKEN = "s3cret"
ENDED = ("completed", "failed", "cancelled", "expired")


@dataclass
class Lab:
    """Router a drives node-1; router b drives node-2 and lists node-1 too (it takes node-1 over
    when a's lease runs out). Each has its own front door."""

    a: Daemon
    b: Daemon
    doors: dict[str, str]  # router name -> its front door's URL
    fakes: dict[str, object]  # node -> its fake Ollama
    dsn: str
    clients: list = field(default_factory=list)

    def openai(self, router: str) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=self.doors[router] + "/v1", api_key=TOKEN, max_retries=0)
        self.clients.append(client)
        return client

    def anthropic(self, router: str) -> anthropic.AsyncAnthropic:
        client = anthropic.AsyncAnthropic(base_url=self.doors[router], api_key=TOKEN, max_retries=0)
        self.clients.append(client)
        return client

    async def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as db:
            return await (await db.execute(query, params)).fetchall()

    async def close(self) -> None:
        for client in self.clients:
            await client.close()


async def holds(router: Daemon, node: str) -> bool:
    health = await router.get("/health")
    return node in (health.get("router") or {}).get("nodes", [])


@pytest.fixture
async def lab(fakes, daemon_factory, pg_dsn):
    f1 = await fakes(CHAT_MODEL, token_delay_s=0.02, tokens=30)
    f2 = await fakes(CHAT_MODEL, token_delay_s=0.02, tokens=30)
    one = node_table("node-1", f1, 1, ["task"], CHAT_MODEL)
    two = node_table("node-2", f2, 2, ["task"], CHAT_MODEL)
    doors = {"a": f"127.0.0.1:{free_port()}", "b": f"127.0.0.1:{free_port()}"}
    common = {"database": pg_dsn, "token": TOKEN, "lease": "1s", "stall_timeout": "30s"}
    a = await daemon_factory([one], ollama_listen=doors["a"], **common)
    await eventually(lambda: holds(a, "node-1"), 15, what="router a to drive node-1")
    b = await daemon_factory([one, two], name="b", ollama_listen=doors["b"], **common)
    await eventually(lambda: holds(b, "node-2"), 15, what="router b to drive node-2")
    for d in (a, b):
        d.auth = {"Authorization": f"Bearer {TOKEN}"}
    made = Lab(a, b, {k: f"http://{v}" for k, v in doors.items()}, {"node-1": f1, "node-2": f2}, pg_dsn)

    async def models_recorded():  # b's monitor wrote node-2's models: a places lines there by them
        return await made.sql("SELECT 1 FROM node WHERE name = 'node-2' AND models LIKE %s", (f"%{CHAT_MODEL}%",))

    await eventually(models_recorded, 15, what="node-2's models on its row")
    yield made
    await made.close()


async def create(client: openai.AsyncOpenAI, n: int, prefix: str = "q", extra: tuple = ()) -> openai.types.Batch:
    lines = [chat_line(f"{prefix}-{i}", f"{prefix} {i}") for i in range(n)] + list(extra)
    uploaded = await client.files.create(file=(f"{prefix}.jsonl", jsonl(*lines)), purpose="batch")
    return await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )


async def ended(client: openai.AsyncOpenAI, batch_id: str, timeout: float = 30.0) -> openai.types.Batch:
    async def done():
        batch = await client.batches.retrieve(batch_id)
        return batch if batch.status in ENDED else None

    return await eventually(done, timeout, what=f"batch {batch_id} to end")


def counts(batch: openai.types.Batch) -> tuple[int, int, int]:
    c = batch.request_counts
    return (c.total, c.completed, c.failed)


async def nodes_of(lab: Lab, batch_id: str) -> dict[str, int]:
    """How many of the batch's lines were placed on each node."""
    rows = await lab.sql(
        "SELECT j.node, COUNT(*) FROM batch_line l JOIN job j ON j.id = l.job_id WHERE l.batch_id = %s GROUP BY j.node",
        (batch_id,),
    )
    return dict(rows)


async def test_a_batch_through_one_router_runs_on_both_routers_nodes_and_either_answers_for_it(lab):
    via_a, via_b = lab.openai("a"), lab.openai("b")
    batch = await create(via_a, 10, extra=(chat_line("bad", "nope", model="no-such:model"),))
    assert batch.status == "in_progress" and counts(batch) == (11, 0, 1)  # the unknown model: that line's error
    assert await nodes_of(lab, batch.id) == {"node-1": 5, "node-2": 5}  # a's node and b's, by their queues

    # a estimates its end over b's node too (by node-2's recent runs), once each node has run a line.
    async def estimated_through_a():
        shown = (await lab.a.get(f"/api/batches/{batch.id}"))["batch"]
        assert shown["status"] == "in_progress", shown
        return shown["eta"]["finish_s"] is not None

    await eventually(estimated_through_a, 20, what="router a's estimate of the batch's end")

    # While it runs, b answers with the counts a answers (read between two equal answers of a's:
    # the counts only grow, so b's must be the same).
    async def same_counts_while_running():
        first = await via_a.batches.retrieve(batch.id)
        theirs = await via_b.batches.retrieve(batch.id)
        again = await via_a.batches.retrieve(batch.id)
        if first.status != "in_progress" or counts(first) != counts(again) or counts(first)[1] == 0:
            return None
        assert counts(theirs) == counts(first) and theirs.status == "in_progress"
        return first

    await eventually(same_counts_while_running, 20, what="a moment with some lines done and the counts steady")

    # The last lines end as both routers poll at once (and both finalizers run): one finalize.
    async def polls(client):
        return await ended(client, batch.id)

    answers = await asyncio.gather(*(polls(c) for c in (via_a, via_b, via_a, via_b)))
    assert {(a.status, counts(a), a.output_file_id, a.error_file_id) for a in answers} == {
        ("completed", (11, 10, 1), answers[0].output_file_id, answers[0].error_file_id)
    }
    files = await lab.sql(
        "SELECT filename FROM batch_file WHERE filename LIKE %s ORDER BY filename", (f"{batch.id}_%",)
    )
    assert files == [(f"{batch.id}_errors.jsonl",), (f"{batch.id}_output.jsonl",)]
    # The lines ran where they were placed: node-1's by router a, node-2's by router b.
    runs = await lab.sql(
        "SELECT r.node, COUNT(DISTINCT r.router) FROM batch_line l JOIN run r ON r.job_id = l.job_id"
        " WHERE l.batch_id = %s GROUP BY r.node",
        (batch.id,),
    )
    assert dict(runs) == {"node-1": 1, "node-2": 1}
    assert len(lab.fakes["node-1"].chat_requests) == 5 and len(lab.fakes["node-2"].chat_requests) == 5

    # Its output (and error) file read through either router: the same bytes, every reply there.
    out_a = (await via_a.files.content(answers[0].output_file_id)).content
    assert (await via_b.files.content(answers[0].output_file_id)).content == out_a
    output = lines_of(out_a)
    assert [line["custom_id"] for line in output] == [f"q-{i}" for i in range(10)]
    assert all(line["response"]["status_code"] == 200 for line in output)
    [bad] = lines_of((await via_b.files.content(answers[0].error_file_id)).content)
    assert bad["custom_id"] == "bad" and bad["response"]["status_code"] == 404

    # Anthropic's Message Batches the other way round: created through b, read through a.
    msg_b, msg_a = lab.anthropic("b"), lab.anthropic("a")
    params = {"model": CHAT_MODEL, "max_tokens": 64}
    made = await msg_b.messages.batches.create(
        requests=[
            {"custom_id": f"m-{i}", "params": {**params, "messages": [{"role": "user", "content": f"m {i}"}]}}
            for i in range(4)
        ]
    )
    assert await nodes_of(lab, made.id) == {"node-1": 2, "node-2": 2}

    async def message_batch_ended():
        found = await msg_a.messages.batches.retrieve(made.id)
        return found if found.processing_status == "ended" else None

    done = await eventually(message_batch_ended, 30, what="the message batch to end")
    assert done.request_counts.succeeded == 4
    results = {r.custom_id: r.result.type async for r in await msg_a.messages.batches.results(made.id)}
    assert results == {f"m-{i}": "succeeded" for i in range(4)}


async def test_a_cancel_through_one_router_stops_the_lines_waiting_on_the_others_node(lab):
    for fake in lab.fakes.values():
        fake.script.token_delay_s, fake.script.tokens = 0.05, 60  # 3 s a line: the rest wait
    via_a, via_b = lab.openai("a"), lab.openai("b")
    batch = await create(via_a, 6)
    assert await nodes_of(lab, batch.id) == {"node-1": 3, "node-2": 3}

    async def both_running():
        return all(f.in_flight == 1 for f in lab.fakes.values())

    await eventually(both_running, 15, what="a line to run on each node")
    # A waiting line moved from a's node to b's, through b: no client waits on it (a call's would be 409).
    [(moved,)] = await lab.sql(
        "SELECT j.id FROM batch_line l JOIN job j ON j.id = l.job_id WHERE l.batch_id = %s AND j.node = 'node-1'"
        " AND j.state = 'queued' ORDER BY j.position DESC LIMIT 1",
        (batch.id,),
    )
    status, body = await lab.b.request("POST", f"/api/jobs/{moved}/move", {"node": "node-2"})
    assert status == 200 and body["job"]["node"] == "node-2", body
    cancelling = await via_b.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    # Every waiting line is cancelled at once, a's node's too; the two running end as they would.
    waiting = await lab.sql(
        "SELECT j.node, j.state, COUNT(*) FROM batch_line l JOIN job j ON j.id = l.job_id WHERE l.batch_id = %s"
        " GROUP BY j.node, j.state ORDER BY j.node, j.state",
        (batch.id,),
    )
    assert set(waiting) == {("node-1", "cancelled", 1), ("node-1", "running", 1)} | {
        ("node-2", "cancelled", 3),
        ("node-2", "running", 1),
    }
    seen_by_a = await via_a.batches.retrieve(batch.id)
    assert seen_by_a.status == "cancelling" and counts(seen_by_a) == (6, 0, 4)
    done = await ended(via_a, batch.id)
    assert done.status == "cancelled" and counts(done) == (6, 2, 4)
    assert all(len(f.chat_requests) == 1 for f in lab.fakes.values())  # no waiting line reached a node
    output = lines_of((await via_b.files.content(done.output_file_id)).content)
    assert sorted(line["custom_id"] for line in output) == ["q-0", "q-1"]
    # Its cancelled lines retried through a: those on b's node too, each on the node it waited on.
    for fake in lab.fakes.values():
        fake.script.token_delay_s, fake.script.tokens = 0.01, 10
    retried = await lab.a.cli("batch", "retry", batch.id, "--failed")
    assert retried.code == 0 and "4 lines queued again" in retried.out, retried
    again = await ended(via_b, batch.id)
    assert again.status == "completed" and counts(again) == (6, 6, 0)
    assert [len(lab.fakes[n].chat_requests) for n in ("node-1", "node-2")] == [2, 4]


async def test_a_router_killed_mid_batch_fails_its_line_and_the_other_finishes_the_batch(lab):
    for fake in lab.fakes.values():
        fake.script.token_delay_s, fake.script.tokens = 0.05, 30  # 1.5 s a line
    via_a, via_b = lab.openai("a"), lab.openai("b")
    batch = await create(via_a, 6)
    assert await nodes_of(lab, batch.id) == {"node-1": 3, "node-2": 3}

    async def running_on_a():
        rows = await lab.sql(
            "SELECT l.custom_id, r.router FROM batch_line l JOIN job j ON j.id = l.job_id JOIN run r ON r.id = j.run_id"
            " WHERE l.batch_id = %s AND j.state = 'running' AND j.node = 'node-1'",
            (batch.id,),
        )
        return rows[0] if rows else None

    lost, a_id = await eventually(running_on_a, 15, what="a line to run on router a's node")
    await lab.a.kill()  # SIGKILL: no clean stop, its lease on node-1 runs out (1 s) and b takes it
    await eventually(lambda: holds(lab.b, "node-1"), 15, what="router b to take node-1 over")
    done = await ended(via_b, batch.id)
    # The line a ran failed, naming a; the others ran (node-1's rest through b): the counts say so.
    assert done.status == "completed" and counts(done) == (6, 5, 1)
    [failed] = lines_of((await via_b.files.content(done.error_file_id)).content)
    message = failed["response"]["body"]["error"]["message"]
    assert failed["custom_id"] == lost and failed["response"]["status_code"] == 500 and a_id in message
    shown = await lab.b.cli("batch", "show", batch.id)
    assert shown.code == 0 and "failed lines:" in shown.out and lost in shown.out
    retried = await lab.b.cli("batch", "retry", batch.id, "--failed")
    assert retried.code == 0 and "1 lines queued again" in retried.out, retried
    again = await ended(via_b, batch.id)
    assert again.status == "completed" and counts(again) == (6, 6, 0) and again.error_file_id is None
    output = lines_of((await via_b.files.content(again.output_file_id)).content)
    assert [line["custom_id"] for line in output] == [f"q-{i}" for i in range(6)]
    assert json.dumps(output).count('"status_code": 200') == 6
