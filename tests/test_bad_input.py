"""Bad input, table-driven, through HTTP, the CLI and the config file.

Each mistake gets the right status, a message that names the problem, and changes nothing:
the job, run and event row counts are the same after it as before. One router serves the
HTTP and CLI tables (its jobs are all finished first, so nothing else writes meanwhile)."""

from __future__ import annotations

import io
import json
import math
import sqlite3
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import tomli_w
import yarl
from conftest import Daemon, eventually, free_port, node_table, write_config

from gpuq.config import ConfigError, load_config, parse_config
from gpuq.demo import FakeOllama, Script

IN_WORLD = pytest.mark.asyncio(loop_scope="module")  # the tests that share the module's router

LIMIT = 64  # router.max_prompt_bytes
UNKNOWN_ID = "1700000000-deadbeef"
NOT_AN_ID = "(ids look like 1760883402-9f3a7c21)"
NODES = " (the nodes: node-1, node-2, node-3)"  # what an unknown node's message lists


FRONT_LIMIT = 1 << 20  # front.max_request_bytes (its least)


@dataclass
class World:
    daemon: Daemon
    db: Path
    task: str  # a done task
    critique: str  # a done critique
    tmp: Path
    front: str  # the front door's URL


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_input")
    f1 = FakeOllama(models={"qwen3-coder:30b", "llama3.2:latest"}, script=Script(tokens=4))
    f2 = FakeOllama(models={"deepseek-r1:32b"}, script=Script(tokens=4))
    f3 = FakeOllama(models={"llama3.2:latest"}, script=Script(tokens=4))
    for f in (f1, f2, f3):
        await f.start()
    port, front_port = free_port(), free_port()
    config = write_config(
        tmp / "gpuq.toml",
        [
            node_table("node-1", f1, 1, ["task", "critique"], "qwen3-coder:30b"),
            node_table("node-2", f2, 2, ["critique"], "deepseek-r1:32b"),
            node_table("node-3", f3, 3, ["task"], "llama3.2:latest"),
        ],
        port,
        max_prompt_bytes=LIMIT,
        ollama_listen=f"127.0.0.1:{front_port}",
        front={"max_request_bytes": FRONT_LIMIT},
    )
    session = aiohttp.ClientSession()
    d = Daemon(config=config, url=f"http://127.0.0.1:{port}", log=tmp / "daemon.log", session=session)
    await d.start()
    try:

        async def all_checked():
            return all(n["checked"] and n["up"] for n in (await d.get("/api/nodes"))["nodes"])

        await eventually(all_checked, what="every node's first health check")
        [task] = await d.submit("task", "a task", node="node-1")
        [critique] = await d.submit("critique", "a critique", node="node-2")
        # An explicitly named model that is installed (named without its tag) is accepted.
        [tagless] = await d.submit("task", "another model", node="node-1", model="llama3.2")
        for job in (task, critique, tagless):
            await d.wait_state(job["id"], "done")
        yield World(d, tmp / "gpuq.db", task["id"], critique["id"], tmp, f"http://127.0.0.1:{front_port}")
    finally:
        await d.kill()
        await session.close()
        for f in (f1, f2, f3):
            await f.stop()


STORED = ("job", "run", "event", "batch", "batch_line", "batch_file", "batch_file_chunk")


def counts(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in STORED}
    finally:
        conn.close()


class Starts(str):
    """An expected message of which only the beginning is fixed (the rest is the parser's)."""


def matches(expected: str, actual: str) -> bool:
    return actual.startswith(expected) if isinstance(expected, Starts) else actual == expected


def task(**fields: Any) -> dict:
    return {"kind": "task", "prompt": "fine", **fields}


# name: (method, path, body, status, message). A bytes body is sent as is, anything else as
# JSON. {T} is a done task's id, {C} a done critique's.
HTTP: dict[str, tuple[str, str, Any, int, str]] = {
    # The body itself.
    "malformed JSON": (
        "POST",
        "/api/jobs",
        b'{"kind": "task", "prompt": ',
        400,
        "malformed JSON: Expecting value: line 1 column 28 (char 27)",
    ),
    "empty body": ("POST", "/api/jobs", b"", 400, "missing request body: expected a JSON object"),
    "a JSON array": ("POST", "/api/jobs", b'["task"]', 400, "expected a JSON object, got a JSON array"),
    "JSON null": ("POST", "/api/jobs", b"null", 400, "expected a JSON object, got a JSON null"),
    "a JSON number": ("POST", "/api/jobs", b"42", 400, "expected a JSON object, got a JSON number"),
    "nested too deep": ("POST", "/api/jobs", b"[" * 50_000, 400, "malformed JSON: nested too deeply"),
    "non-UTF-8 bytes": (
        "POST",
        "/api/jobs",
        b'{"kind": "task", "prompt": "\xff\xfe"}',
        400,
        "request body is not valid UTF-8",
    ),
    "a lone surrogate": (
        "POST",
        "/api/jobs",
        b'{"kind": "task", "prompt": "\\ud800 half a character"}',
        400,
        "field 'prompt' is not valid text: it holds a lone surrogate (\\ud800)",
    ),
    "a lone surrogate inside options": (
        "POST",
        "/api/jobs",
        b'{"kind": "task", "prompt": "x", "options": {"stop": ["ok", "\\udfff"]}}',
        400,
        "field 'options.stop[1]' is not valid text: it holds a lone surrogate (\\udfff)",
    ),
    "a lone surrogate in a key": (
        "POST",
        "/api/jobs",
        b'{"kind": "task", "prompt": "x", "\\ud800": 1}',
        400,
        "the request body has a key that is not valid text: it holds a lone surrogate (\\ud800)",
    ),
    "body over the size limit": (
        "POST",
        "/api/jobs",
        json.dumps(task(prompt="x" * 70_000)).encode(),
        413,
        Starts("request body too large"),
    ),
    # Fields.
    "unknown field": (
        "POST",
        "/api/jobs",
        task(urgency=1),
        400,
        "unknown field 'urgency' (allowed: kind, model, node, options, parent, priority, prompt, think, timeout)",
    ),
    "unknown priority": (
        "POST",
        "/api/jobs",
        task(priority="urgent"),
        400,
        "field 'priority' must be 'interactive' or 'batch', got 'urgent'",
    ),
    "missing kind": ("POST", "/api/jobs", {"prompt": "x"}, 400, "missing field 'kind'"),
    "kind of the wrong type": ("POST", "/api/jobs", task(kind=5), 400, "field 'kind' must be a string, got 5"),
    "prompt of the wrong type": (
        "POST",
        "/api/jobs",
        task(prompt=["x"]),
        400,
        "field 'prompt' must be a string, got [\"x\"]",
    ),
    "timeout as a string": (
        "POST",
        "/api/jobs",
        task(timeout="10"),
        400,
        "field 'timeout' must be a number, got \"10\"",
    ),
    "timeout as a boolean": (
        "POST",
        "/api/jobs",
        task(timeout=True),
        400,
        "field 'timeout' must be a number, got true",
    ),
    "node as a number": ("POST", "/api/jobs", task(node=1), 400, "field 'node' must be a string, got 1"),
    "unknown kind": (
        "POST",
        "/api/jobs",
        task(kind="batch"),
        400,
        "unknown kind 'batch' (expected 'task' or 'critique')",
    ),
    "empty prompt": ("POST", "/api/jobs", task(prompt=""), 400, "field 'prompt' must not be empty"),
    "whitespace prompt": ("POST", "/api/jobs", task(prompt=" \n\t "), 400, "field 'prompt' must not be empty"),
    "no prompt": ("POST", "/api/jobs", {"kind": "task"}, 400, "field 'prompt' must not be empty"),
    "prompt over the limit": (
        "POST",
        "/api/jobs",
        task(prompt="x" * (LIMIT + 1)),
        413,
        f"prompt is {LIMIT + 1} bytes, over the limit of {LIMIT} (router.max_prompt_bytes)",
    ),
    "prompt over the limit in UTF-8 bytes": (
        "POST",
        "/api/jobs",
        task(prompt="é" * 33),
        413,
        f"prompt is 66 bytes, over the limit of {LIMIT} (router.max_prompt_bytes)",
    ),
    "empty model": ("POST", "/api/jobs", task(model="  "), 400, "field 'model' must not be empty"),
    "unknown node": ("POST", "/api/jobs", task(node="node-9"), 422, f"unknown node 'node-9'{NODES}"),
    "node without the role": (
        "POST",
        "/api/jobs",
        task(node="node-2"),
        409,
        "node 'node-2' does not take task jobs (its roles: critique)",
    ),
    "unknown model": (
        "POST",
        "/api/jobs",
        task(node="node-3", model="nonexistent:7b"),
        422,
        "model 'nonexistent:7b' is not installed on node node-3 (its Ollama lists: "
        "llama3.2:latest); pull it there or choose another model",
    ),
    "unknown parent": (
        "POST",
        "/api/jobs",
        {"kind": "critique", "parent": UNKNOWN_ID},
        422,
        f"unknown parent job '{UNKNOWN_ID}'",
    ),
    "unknown parent with a prompt": (
        "POST",
        "/api/jobs",
        {"kind": "critique", "prompt": "x", "parent": UNKNOWN_ID},
        422,
        f"unknown parent job '{UNKNOWN_ID}'",
    ),
    "a parent that is not a task": (
        "POST",
        "/api/jobs",
        {"kind": "critique", "parent": "{C}"},
        422,
        "parent job '{C}' is a critique, not a task",
    ),
    "a task with a parent": ("POST", "/api/jobs", task(parent="{T}"), 400, "only a critique takes a parent"),
    "parent with a path trick": (
        "POST",
        "/api/jobs",
        {"kind": "critique", "parent": "../../etc/passwd"},
        400,
        f"'../../etc/passwd' is not a job id {NOT_AN_ID}",
    ),
    "parent with SQL": (
        "POST",
        "/api/jobs",
        {"kind": "critique", "parent": "1' OR '1'='1"},
        400,
        f"'1' OR '1'='1' is not a job id {NOT_AN_ID}",
    ),
    # Huge numbers.
    "huge timeout": (
        "POST",
        "/api/jobs",
        task(timeout=1e308),
        400,
        "field 'timeout' must be between 0 and 604800 seconds, got 1e+308",
    ),
    "infinite timeout": (
        "POST",
        "/api/jobs",
        b'{"kind": "task", "prompt": "x", "timeout": 1e400}',
        400,
        "field 'timeout' must be between 0 and 604800 seconds, got inf",
    ),
    "NaN timeout": (
        "POST",
        "/api/jobs",
        b'{"kind": "task", "prompt": "x", "timeout": NaN}',
        400,
        "field 'timeout' must be between 0 and 604800 seconds, got nan",
    ),
    "huge integer timeout": (
        "POST",
        "/api/jobs",
        task(timeout=10**30),
        400,
        f"field 'timeout' must be between 0 and 604800 seconds, got {10**30}",
    ),
    "integer with 5000 digits": (
        "POST",
        "/api/jobs",
        b'{"kind": "task", "prompt": "x", "timeout": 1' + b"0" * 5000 + b"}",
        400,
        Starts("malformed JSON: Exceeds the limit"),
    ),
    "negative timeout": (
        "POST",
        "/api/jobs",
        task(timeout=-1),
        400,
        "field 'timeout' must be between 0 and 604800 seconds, got -1",
    ),
    "huge position": (
        "POST",
        "/api/jobs/{T}/move",
        {"position": 10**20},
        400,
        f"field 'position' must be from 1 to 1000000000, got {10**20}",
    ),
    "position zero": (
        "POST",
        "/api/jobs/{T}/move",
        {"position": 0},
        400,
        "field 'position' must be from 1 to 1000000000, got 0",
    ),
    "position as a fraction": (
        "POST",
        "/api/jobs/{T}/move",
        {"position": 1.5},
        400,
        "field 'position' must be a whole number, got 1.5",
    ),
    "huge limit": (
        "GET",
        "/api/jobs?limit=99999999999999999999",
        None,
        400,
        "query parameter 'limit' must be a whole number from 1 to 10000, got '99999999999999999999'",
    ),
    "limit in superscript digits": (
        "GET",
        "/api/jobs?limit=%C2%B2",
        None,
        400,
        "query parameter 'limit' must be a whole number from 1 to 10000, got '²'",
    ),
    "negative queue limit": (
        "GET",
        "/api/queue?limit=-1",
        None,
        400,
        "query parameter 'limit' must be a whole number from 0 to 100000, got '-1'",
    ),
    "unknown state": ("GET", "/api/jobs?state=bogus", None, 400, "unknown state 'bogus'"),
    # Job ids and node names in paths.
    "unknown job id": (
        "GET",
        f"/api/jobs/{UNKNOWN_ID}",
        None,
        404,
        f"no job with id '{UNKNOWN_ID}': not in the database; retention may have deleted it: "
        f"gpuq archive search {UNKNOWN_ID}",
    ),
    "id with an encoded path trick": (
        "GET",
        "/api/jobs/..%2F..%2Fgpuq.db",
        None,
        400,
        f"'../../gpuq.db' is not a job id {NOT_AN_ID}",
    ),
    "id that is dot-dot": ("GET", "/api/jobs/%2e%2e", None, 404, "no route for /api/"),
    "id with SQL": ("GET", "/api/jobs/1'%20OR%20'1'%3D'1", None, 400, f"'1' OR '1'='1' is not a job id {NOT_AN_ID}"),
    "delete an id with SQL": (
        "DELETE",
        "/api/jobs/1'%20OR%20'1'%3D'1",
        None,
        400,
        f"'1' OR '1'='1' is not a job id {NOT_AN_ID}",
    ),
    "delete an unknown job": ("DELETE", f"/api/jobs/{UNKNOWN_ID}", None, 404, f"no job with id '{UNKNOWN_ID}'"),
    "delete a done job": (
        "DELETE",
        "/api/jobs/{T}",
        None,
        409,
        "job {T} is already done; only queued or running jobs can be deleted",
    ),
    "move an unknown job": (
        "POST",
        f"/api/jobs/{UNKNOWN_ID}/move",
        {"position": 1},
        404,
        f"no job with id '{UNKNOWN_ID}'",
    ),
    "move a done job": ("POST", "/api/jobs/{T}/move", {"position": 1}, 409, "job {T} is done; only queued jobs move"),
    "move nowhere": (
        "POST",
        "/api/jobs/{T}/move",
        {},
        400,
        "say where to move the job: 'position', 'before', 'after' or 'node'",
    ),
    "move before a path trick": (
        "POST",
        "/api/jobs/{T}/move",
        {"before": "../x"},
        400,
        f"'../x' is not a job id {NOT_AN_ID}",
    ),
    "preempt an unknown job": ("POST", f"/api/jobs/{UNKNOWN_ID}/preempt", None, 404, f"no job with id '{UNKNOWN_ID}'"),
    "preempt a done job": (
        "POST",
        "/api/jobs/{T}/preempt",
        None,
        409,
        "job {T} is done; only a queued job can preempt",
    ),
    "retry a done job": (
        "POST",
        "/api/jobs/{T}/retry",
        None,
        409,
        "job {T} is done; only failed or cancelled jobs can be retried",
    ),
    "clear an unknown node": ("POST", "/api/nodes/node-9/clear", None, 422, f"unknown node 'node-9'{NODES}"),
    "clear a node with a path trick": (
        "POST",
        "/api/nodes/..%2F..%2Fnode-1/clear",
        None,
        422,
        f"unknown node '../../node-1'{NODES}",
    ),
    "clear with a wrong flag": (
        "POST",
        "/api/nodes/node-1/clear",
        {"running": "yes"},
        400,
        "field 'running' must be a boolean, got \"yes\"",
    ),
    # A batch's submit (`gpuq batch submit`): the same bodies as a job's.
    "batch: malformed JSON": ("POST", "/api/batches", b'{"input": ', 400, Starts("malformed JSON: Expecting value")),
    "batch: empty body": ("POST", "/api/batches", b"", 400, "missing request body: expected a JSON object"),
    "batch: a JSON array": ("POST", "/api/batches", b'["x"]', 400, "expected a JSON object, got a JSON array"),
    "batch: JSON null": ("POST", "/api/batches", b"null", 400, "expected a JSON object, got a JSON null"),
    "batch: a JSON number": ("POST", "/api/batches", b"42", 400, "expected a JSON object, got a JSON number"),
    "batch: nested too deep": ("POST", "/api/batches", b"[" * 50_000, 400, "malformed JSON: nested too deeply"),
    "batch: non-UTF-8 bytes": (
        "POST",
        "/api/batches",
        b'{"input": "\xff\xfe"}',
        400,
        "request body is not valid UTF-8",
    ),
    "batch: a lone surrogate in a key": (
        "POST",
        "/api/batches",
        b'{"input": "x", "\\ud800": 1}',
        400,
        "the request body has a key that is not valid text: it holds a lone surrogate (\\ud800)",
    ),
    "batch: body over the size limit": (
        "POST",
        "/api/batches",
        json.dumps({"input": "x" * 70_000}).encode(),
        413,
        Starts("request body too large"),
    ),
    "batch: unknown field": (
        "POST",
        "/api/batches",
        {"input": "x", "model": "m"},
        400,
        "unknown field 'model' (allowed: completion_window, endpoint, input, name)",
    ),
    "batch: no input": ("POST", "/api/batches", {"name": "n"}, 400, "missing field 'input'"),
    "batch: input of the wrong type": (
        "POST",
        "/api/batches",
        {"input": ["x"]},
        400,
        "field 'input' must be a string, got [\"x\"]",
    ),
    "batch: an empty input": ("POST", "/api/batches", {"input": "\n"}, 400, Starts("file file-")),
    "batch: unknown endpoint": (
        "POST",
        "/api/batches",
        {"input": "x", "endpoint": "/v1/nope"},
        400,
        Starts("field 'endpoint' must be one of /v1/chat/completions"),
    ),
    "batch: unknown batch": ("GET", "/api/batches/batch_nope", None, 404, "no batch 'batch_nope'"),
    "batch: results of an unknown batch": (
        "GET",
        "/api/batches/batch_nope/results",
        None,
        404,
        "no batch 'batch_nope'",
    ),
    "batch: retry without failed": ("POST", "/api/batches/batch_nope/retry", {}, 400, Starts("retry takes")),
    # Routes.
    "unknown route": ("GET", "/api/nope", None, 404, "no route for /api/nope"),
    "wrong method": ("PUT", "/api/jobs", None, 405, "Method Not Allowed"),
}


@IN_WORLD
@pytest.mark.parametrize("name", list(HTTP))
async def test_http_bad_input_is_refused_and_changes_nothing(name, world):
    method, path, body, status, message = HTTP[name]
    fill = {"{T}": world.task, "{C}": world.critique}
    for key, value in fill.items():
        path, message = path.replace(key, value), message.replace(key, value)
    if isinstance(body, dict):
        body = json.loads(json.dumps(body).replace("{T}", world.task).replace("{C}", world.critique))
    before = counts(world.db)
    raw = body if isinstance(body, bytes) else None
    got_status, got = await world.daemon.request(method, path, None if raw is not None else body, raw=raw)
    assert got_status == status, got
    assert got == {"error": {"status": status, "message": got["error"]["message"]}}
    assert matches(Starts(message) if isinstance(HTTP[name][4], Starts) else message, got["error"]["message"]), got
    assert counts(world.db) == before


# The front door's batch routes (OpenAI's /v1/files and /v1/batches, Anthropic's
# /v1/messages/batches): name -> (method, path, body, content type, status, message). A bytes body
# is sent as is, anything else as JSON; the message is read from each API's error envelope.
BOUNDARY = "b0undary"
MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"
INCOMPLETE = "the upload ended before its closing multipart boundary: incomplete upload"
NOT_MULTIPART = "a file is uploaded as multipart/form-data with the fields 'purpose' and 'file'"


def form(*parts: tuple[str, str | None, bytes], close: bool = True) -> bytes:
    out = b""
    for name, filename, data in parts:
        named = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{BOUNDARY}\r\nContent-Disposition: {named}\r\n\r\n".encode() + data + b"\r\n"
    return out + (f"--{BOUNDARY}--\r\n".encode() if close else b"")


LINES = b"".join(
    b'{"custom_id": "c-%d", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n' % i for i in range(20)
)
WHOLE = form(("purpose", None, b"batch"), ("file", "in.jsonl", LINES))
TOO_BIG = form(("purpose", None, b"batch"), ("file", "in.jsonl", b"x" * FRONT_LIMIT))


def bodies(path: str) -> dict[str, tuple[str, str, Any, str, int, str]]:
    """The body cases of every JSON route, for one front-door route."""
    over = json.dumps({"requests": [], "pad": "x" * FRONT_LIMIT}).encode()
    return {
        f"{path}: malformed JSON": ("POST", path, b'{"a": ', "application/json", 400, Starts("invalid character")),
        f"{path}: empty body": ("POST", path, b"", "application/json", 400, "missing request body"),
        f"{path}: a JSON array": ("POST", path, b"[1]", "application/json", 400, "expected a JSON object, got array"),
        f"{path}: JSON null": ("POST", path, b"null", "application/json", 400, "expected a JSON object, got null"),
        f"{path}: a JSON number": ("POST", path, b"42", "application/json", 400, "expected a JSON object, got number"),
        f"{path}: nested too deep": (
            "POST",
            path,
            b"[" * 50_000,
            "application/json",
            400,
            "malformed JSON: nested too deeply",
        ),
        f"{path}: non-UTF-8 bytes": (
            "POST",
            path,
            b'{"a": "\xff\xfe"}',
            "application/json",
            400,
            "request body is not valid UTF-8",
        ),
        f"{path}: a lone surrogate": (
            "POST",
            path,
            b'{"a": "\\ud800 half"}',
            "application/json",
            400,
            "field 'a' is not valid text: it holds a lone surrogate (\\ud800)",
        ),
        f"{path}: body over the size limit": (
            "POST",
            path,
            over,
            "application/json",
            413,
            Starts(f"request body too large: Maximum request body size {FRONT_LIMIT} exceeded"),
        ),
    }


FRONT: dict[str, tuple[str, str, Any, str, int, str]] = {
    **bodies("/v1/batches"),
    **bodies("/v1/messages/batches"),
    # An upload.
    "upload: cut at a line": (
        "POST",
        "/v1/files",
        WHOLE[: WHOLE.index(b'{"custom_id": "c-12"')],
        MULTIPART,
        400,
        INCOMPLETE,
    ),
    "upload: no closing boundary": (
        "POST",
        "/v1/files",
        form(("purpose", None, b"batch"), ("file", "in.jsonl", LINES), close=False),
        MULTIPART,
        400,
        INCOMPLETE,
    ),
    "upload: cut inside the closing boundary": ("POST", "/v1/files", WHOLE[:-6], MULTIPART, 400, INCOMPLETE),
    "upload: cut after its purpose": (
        "POST",
        "/v1/files",
        WHOLE[: WHOLE.index(b"--" + BOUNDARY.encode(), 10) + 4],
        MULTIPART,
        400,
        INCOMPLETE,
    ),
    "upload: empty body": ("POST", "/v1/files", b"", MULTIPART, 400, Starts(NOT_MULTIPART)),
    "upload: not a form": ("POST", "/v1/files", b"hello", MULTIPART, 400, Starts(NOT_MULTIPART)),
    "upload: JSON": ("POST", "/v1/files", {"purpose": "batch"}, "application/json", 400, NOT_MULTIPART),
    "upload: a form without its boundary": (
        "POST",
        "/v1/files",
        WHOLE,
        "multipart/form-data",
        400,
        Starts(NOT_MULTIPART),
    ),
    "upload: no purpose": (
        "POST",
        "/v1/files",
        form(("file", "in.jsonl", LINES)),
        MULTIPART,
        400,
        "Missing required parameter: 'purpose'.",
    ),
    "upload: no file": (
        "POST",
        "/v1/files",
        form(("purpose", None, b"batch")),
        MULTIPART,
        400,
        "Missing required parameter: 'file'.",
    ),
    "upload: another purpose": (
        "POST",
        "/v1/files",
        form(("purpose", None, b"fine-tune"), ("file", "in.jsonl", LINES)),
        MULTIPART,
        400,
        "purpose 'fine-tune': gpuq keeps only batch input files (purpose 'batch')",
    ),
    "upload: another purpose after the file": (
        "POST",
        "/v1/files",
        form(("file", "in.jsonl", LINES), ("purpose", None, b"assistants")),
        MULTIPART,
        400,
        "purpose 'assistants': gpuq keeps only batch input files (purpose 'batch')",
    ),
    "upload: a purpose of 2 KB": (
        "POST",
        "/v1/files",
        form(("purpose", None, b"b" * 2048), ("file", "in.jsonl", LINES)),
        MULTIPART,
        400,
        "form field 'purpose': over 1024 bytes",
    ),
    "upload: a gzipped file": (
        "POST",
        "/v1/files",
        WHOLE.replace(b'filename="in.jsonl"\r\n', b'filename="in.jsonl"\r\nContent-Encoding: gzip\r\n'),
        MULTIPART,
        400,
        "the file's encoding (binary, gzip) is not one gpuq reads: send it as is, or in base64",
    ),
    "upload: over the size limit": (
        "POST",
        "/v1/files",
        TOO_BIG,
        MULTIPART,
        413,
        f"request body too large: Maximum request body size {FRONT_LIMIT} exceeded, actual body size {len(TOO_BIG)}"
        " (front.max_request_bytes)",
    ),
    # A batch's fields.
    "batch: no input file": (
        "POST",
        "/v1/batches",
        {"endpoint": "/v1/chat/completions", "completion_window": "24h"},
        "application/json",
        400,
        "input_file_id: the id of an uploaded file (purpose 'batch') is required",
    ),
    "batch: an unknown input file": (
        "POST",
        "/v1/batches",
        {"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        "application/json",
        404,
        "no file 'file-nope'",
    ),
    "batch: a window that is no duration": (
        "POST",
        "/v1/batches",
        {"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "soon"},
        "application/json",
        400,
        Starts("completion_window"),
    ),
    "message batch: no requests": (
        "POST",
        "/v1/messages/batches",
        {"requests": []},
        "application/json",
        400,
        "requests: a list of at least one request is required",
    ),
    "message batch: a request without params": (
        "POST",
        "/v1/messages/batches",
        {"requests": [{"custom_id": "a"}]},
        "application/json",
        400,
        "requests.0.params: an object (a Messages request) is required",
    ),
    "file: content of an unknown file": ("GET", "/v1/files/file-nope/content", None, "", 404, "no file 'file-nope'"),
    "message batch: results of an unknown batch": (
        "GET",
        "/v1/messages/batches/msgbatch_nope/results",
        None,
        "",
        404,
        "no batch 'msgbatch_nope'",
    ),
}


def error_message(got: Any) -> str:
    """The message of OpenAI's error envelope, or of Anthropic's."""
    assert isinstance(got, dict) and isinstance(got.get("error"), dict), got
    return got["error"]["message"]


@IN_WORLD
@pytest.mark.parametrize("name", list(FRONT))
async def test_batch_routes_bad_input_is_refused_and_changes_nothing(name, world):
    method, path, body, content_type, status, message = FRONT[name]
    before = counts(world.db)
    kwargs: dict[str, Any] = {"headers": {"Content-Type": content_type} if content_type else {}}
    if isinstance(body, bytes):
        kwargs["data"] = io.BytesIO(body)  # (sent with its Content-Length, in pieces)
    elif body is not None:
        kwargs["data"] = json.dumps(body).encode()
    async with world.daemon.session.request(method, world.front + path, **kwargs) as resp:
        got_status, text = resp.status, await resp.text()
    got = json.loads(text)
    assert got_status == status, got
    assert matches(message, error_message(got)), got
    assert counts(world.db) == before


@IN_WORLD
@pytest.mark.parametrize(
    "path",
    [
        "/static/..%2fgpuq.toml.example",
        "/static/%2e%2e/pyproject.toml",
        "/static/%2e%2e%2fpyproject.toml",
        "/static/../README.md",
        "/static/..%5cpyproject.toml",
        "/jobs/..%2F..%2Fgpuq.db",
    ],
)
async def test_paths_never_escape_the_web_directory(path, world):
    # Sent exactly as written (encoded=True): the client must not tidy the trick away first.
    async with world.daemon.session.get(yarl.URL(world.daemon.url + path, encoded=True)) as resp:
        text = await resp.text()
        assert resp.status in (400, 403, 404), (resp.status, text[:200])
        assert "[project]" not in text and "[router]" not in text and "# gpuq" not in text


# name: (CLI arguments, stdin, exit code, stderr lines). {T}/{C} as above; {tmp} a temp dir.
CLI: dict[str, tuple[list[str], bytes | None, int, list[str]]] = {
    "empty prompt": (["task", ""], None, 1, ["error 400 field 'prompt' must not be empty", "not retried"]),
    "whitespace prompt": (["task", "   "], None, 1, ["error 400 field 'prompt' must not be empty", "not retried"]),
    "prompt file over the limit": (
        ["task", "--file", "{tmp}/big.md"],
        None,
        1,
        [f"error 413 prompt is {LIMIT + 1} bytes, over the limit of {LIMIT} (router.max_prompt_bytes)", "not retried"],
    ),
    "prompt file not UTF-8": (
        ["task", "--file", "{tmp}/latin1.md"],
        None,
        1,
        [
            "error - cannot read {tmp}/latin1.md: 'utf-8' codec can't decode byte 0xe9 in "
            "position 3: invalid continuation byte",
            "not retried",
        ],
    ),
    "stdin not UTF-8": (
        ["task", "--file", "-"],
        b"caf\xe9\n",
        1,
        [
            "error - cannot read stdin: 'utf-8' codec can't decode byte 0xe9 in position 3: invalid continuation byte",
            "not retried",
        ],
    ),
    "unknown node": (
        ["task", "x", "--node", "node-9"],
        None,
        1,
        [f"error 422 unknown node 'node-9'{NODES}", "not retried"],
    ),
    "unknown model": (
        ["task", "x", "--node", "node-3", "--model", "nonexistent:7b"],
        None,
        1,
        [
            "error 422 model 'nonexistent:7b' is not installed on node node-3 (its Ollama lists: "
            "llama3.2:latest); pull it there or choose another model",
            "not retried",
        ],
    ),
    "infinite timeout": (
        ["task", "x", "--timeout", "1e400"],
        None,
        1,
        ["error 400 field 'timeout' must be between 0 and 604800 seconds, got inf", "not retried"],
    ),
    "unknown parent": (
        ["critique", "--parent", UNKNOWN_ID],
        None,
        1,
        [f"error 422 unknown parent job '{UNKNOWN_ID}'", "not retried"],
    ),
    "a parent that is not a task": (
        ["critique", "--parent", "{C}"],
        None,
        1,
        ["error 422 parent job '{C}' is a critique, not a task", "not retried"],
    ),
    "show a path trick": (
        ["show", "../../etc/passwd"],
        None,
        1,
        [f"error 400 '../../etc/passwd' is not a job id {NOT_AN_ID}", "not retried"],
    ),
    "show an id with SQL": (
        ["show", "1' OR '1'='1"],
        None,
        1,
        [f"error 400 '1' OR '1'='1' is not a job id {NOT_AN_ID}", "not retried"],
    ),
    "delete an id with SQL": (
        ["delete", "1' OR '1'='1"],
        None,
        1,
        [f"error 400 '1' OR '1'='1' is not a job id {NOT_AN_ID}", "not retried"],
    ),
    "move to position zero": (
        ["move", "{T}", "--to", "0"],
        None,
        1,
        ["error 400 field 'position' must be from 1 to 1000000000, got 0", "not retried"],
    ),
    "move to a huge position": (
        ["move", "{T}", "--to", "99999999999999999999"],
        None,
        1,
        ["error 400 field 'position' must be from 1 to 1000000000, got 99999999999999999999", "not retried"],
    ),
    "preempt an unknown job": (
        ["preempt", UNKNOWN_ID],
        None,
        1,
        [f"error 404 no job with id '{UNKNOWN_ID}'", "not retried"],
    ),
    "clear a node path trick": (
        ["clear", "../node-1", "--yes"],
        None,
        1,
        [f"error 422 unknown node '../node-1'{NODES}", "not retried"],
    ),
    "retry a done job": (
        ["retry", "{T}"],
        None,
        1,
        ["error 409 job {T} is done; only failed or cancelled jobs can be retried", "not retried"],
    ),
}


@IN_WORLD
@pytest.mark.parametrize("name", list(CLI))
async def test_cli_bad_input_is_refused_and_changes_nothing(name, world):
    args, stdin, code, err = CLI[name]
    (world.tmp / "big.md").write_text("x" * (LIMIT + 1))
    (world.tmp / "latin1.md").write_bytes("café au lait".encode("latin-1"))

    def fill(text: str) -> str:
        return text.replace("{T}", world.task).replace("{C}", world.critique).replace("{tmp}", str(world.tmp))

    before = counts(world.db)
    res = await world.daemon.cli(*[fill(a) for a in args], stdin=stdin)
    assert (res.code, res.err.splitlines()) == (code, [fill(line) for line in err]), res
    assert res.out == ""
    assert counts(world.db) == before


@IN_WORLD
async def test_cli_option_of_the_wrong_type_is_a_usage_error(world):
    res = await world.daemon.cli("task", "x", "--timeout", "soon")
    assert res.code == 2 and "Invalid value for '--timeout': 'soon' is not a valid float." in res.err


@IN_WORLD
@pytest.mark.parametrize(
    "args,message",
    [
        (["task", "the prompt", "--file", "{tmp}/plan.md"], "Error: give a PROMPT or --file, not both"),
        (["task"], "Error: give a PROMPT, or --file PATH (- for stdin)"),
        (["critique"], "Error: give a FILE to critique, or --parent ID"),
    ],
)
async def test_a_missing_or_doubled_prompt_is_a_usage_error(args, message, world):
    # A PROMPT next to --file used to be dropped without a word, and the file's text sent instead.
    (world.tmp / "plan.md").write_text("the file's text")
    before = counts(world.db)
    res = await world.daemon.cli(*[a.replace("{tmp}", str(world.tmp)) for a in args])
    assert res.code == 2 and res.out == "", res
    assert res.err.splitlines()[0].startswith("Usage: ") and res.err.splitlines()[-1] == message, res.err
    assert counts(world.db) == before


# -- the config file ----------------------------------------------------------------------------


def base() -> dict:
    return {
        "router": {},
        "node": [
            {"name": "node-1", "url": "http://node-1:11434", "rank": 1, "roles": ["task", "critique"], "model": "m:1"},
            {"name": "node-2", "url": "http://node-2:11434", "rank": 2, "roles": ["critique"], "model": "m:2"},
        ],
    }


def router(**keys):
    return lambda d: d["router"].update(keys)


def node1(**keys):
    return lambda d: d["node"][0].update(keys)


# name: (change to a good config, the message). Every message names the key that is wrong.
CONFIG = {
    "unknown top-level key": (
        lambda d: d.update(nodes=[]),
        "unknown key 'nodes' (expected [router], [front], [retention], [backup], [storage], [[node]] and [[user]] tables)",
    ),
    "unknown router key": (router(listn="x"), Starts("router: unknown key 'listn' (known: ")),
    "unknown node key": (node1(gpu="a100"), Starts("node[1]: unknown key 'gpu' (known: ")),
    "router is not a table": (lambda d: d.update(router=5), "router: expected a [router] table"),
    "node is one table": (lambda d: d.update(node=d["node"][0]), "node: expected [[node]] tables"),
    "node entry is not a table": (lambda d: d.update(node=[1]), "node[1]: expected a [[node]] table"),
    "missing name": (lambda d: d["node"][0].pop("name"), "node[1]: missing required key 'name'"),
    "missing url": (lambda d: d["node"][0].pop("url"), "node 'node-1': missing required key 'url'"),
    "missing rank": (lambda d: d["node"][0].pop("rank"), "node 'node-1': missing required key 'rank'"),
    "missing roles": (lambda d: d["node"][0].pop("roles"), "node 'node-1': missing required key 'roles'"),
    "missing model": (lambda d: d["node"][0].pop("model"), "node 'node-1': missing required key 'model'"),
    "duplicate node name": (lambda d: d["node"][1].update(name="node-1"), "node 'node-1'.name: duplicate node name"),
    "duplicate rank": (
        lambda d: d["node"][1].update(rank=1),
        "node 'node-2'.rank: rank 1 is already used by node 'node-1'",
    ),
    "bad node name": (node1(name="node 1"), "node[1].name: use letters, digits, '.', '_' or '-', got 'node 1'"),
    "url without a scheme": (
        node1(url="node-1:11434"),
        "node 'node-1'.url: expected an http:// or https:// URL, got 'node-1:11434'",
    ),
    "url with another scheme": (
        node1(url="ftp://node-1"),
        "node 'node-1'.url: expected an http:// or https:// URL, got 'ftp://node-1'",
    ),
    "url with a bad port": (
        node1(url="http://node-1:99999"),
        "node 'node-1'.url: the URL's port is not a number from 0 to 65535: 'http://node-1:99999'",
    ),
    "url of the wrong type": (node1(url=11434), "node 'node-1'.url: expected str, got 11434"),
    "bad public_url": (
        router(public_url="localhost"),
        "router.public_url: expected an http:// or https:// URL, got 'localhost'",
    ),
    "listen without a port": (router(listen="127.0.0.1"), "router.listen: expected 'host:port', got '127.0.0.1'"),
    "listen on port zero": (
        router(listen="127.0.0.1:0"),
        "router.listen: expected 'host:port' with a port from 1 to 65535, got '127.0.0.1:0'",
    ),
    "listen as a number": (router(listen=8750), "router.listen: expected 'host:port', got 8750"),
    "rank as a string": (node1(rank="1"), "node 'node-1'.rank: expected int, got '1'"),
    "rank as a boolean": (node1(rank=True), "node 'node-1'.rank: expected int, got True"),
    "rank beyond 64 bits": (node1(rank=2**70), f"node 'node-1'.rank: must fit in 64 bits, got {2**70}"),
    "roles as a string": (node1(roles="task"), "node 'node-1'.roles: expected list, got 'task'"),
    "unknown role": (
        node1(roles=["gpu"]),
        "node 'node-1'.roles: expected a non-empty list of 'task' and/or 'critique', got ['gpu']",
    ),
    "no roles": (node1(roles=[]), "node 'node-1'.roles: expected a non-empty list of 'task' and/or 'critique', got []"),
    "a role twice": (
        node1(roles=["task", "task"]),
        "node 'node-1'.roles: expected a non-empty list of 'task' and/or 'critique', got ['task', 'task']",
    ),
    "empty model": (node1(model="  "), "node 'node-1'.model: must not be empty"),
    "model as a number": (node1(model=3), "node 'node-1'.model: expected str, got 3"),
    "duration in words": (
        router(stale_after="ten minutes"),
        "router.stale_after: expected a duration like '10m' or '30s', got 'ten minutes'",
    ),
    "duration with an unknown unit": (
        router(stall_timeout="5x"),
        "router.stall_timeout: expected a duration like '10m' or '30s', got '5x'",
    ),
    "negative duration": (router(unload_timeout=-5), "router.unload_timeout: a duration cannot be negative, got -5"),
    "duration as a boolean": (
        router(health_interval=True),
        "router.health_interval: expected a duration like '10m' or '30s', got True",
    ),
    "infinite duration": (
        router(busy_timeout=math.inf),
        "router.busy_timeout: a duration must be a finite number, got inf",
    ),
    "NaN duration": (router(max_runtime=math.nan), "router.max_runtime: a duration must be a finite number, got nan"),
    "huge duration": (
        router(stale_after="99999h"),
        "router.stale_after: a duration longer than a year is surely a mistake, got '99999h'",
    ),
    "bad node max_runtime": (
        node1(max_runtime="forever"),
        "node 'node-1'.max_runtime: expected a duration like '10m' or '30s', got 'forever'",
    ),
    # Zero where zero turns a guard off or fails every job; floors where tiny values spin.
    "stale_after zero": (
        router(stale_after="0s"),
        "router.stale_after: must be more than 0 (0 would call every running job stale), got '0s'",
    ),
    "stale_grace zero": (
        router(stale_grace=0),
        "router.stale_grace: must be more than 0 (0 would call every job stale while it closes), got 0",
    ),
    "max_runtime zero": (
        router(max_runtime="0m"),
        "router.max_runtime: must be more than 0 (0 would fail every job at once), got '0m'",
    ),
    "job_timeout zero": (
        router(job_timeout=0),
        "router.job_timeout: must be more than 0 (0 would fail every job at once; leave it out for no limit), got 0",
    ),
    "stall_timeout zero": (
        router(stall_timeout="0s"),
        "router.stall_timeout: must be more than 0 (0 would turn stall detection off), got '0s'",
    ),
    "unload_timeout zero": (router(unload_timeout=0), Starts("router.unload_timeout: must be more than 0 (")),
    "connect_timeout zero": (
        router(connect_timeout="0ms"),
        "router.connect_timeout: must be more than 0 (0 would wait for an unreachable node forever), got '0ms'",
    ),
    "health_interval zero": (
        router(health_interval=0),
        "router.health_interval: must be at least 100ms (checking more than ten times a second only burns CPU), got 0",
    ),
    "health_interval negative": (
        router(health_interval=-1),
        "router.health_interval: a duration cannot be negative, got -1",
    ),
    "health_interval that spins": (
        router(health_interval="10ms"),
        Starts("router.health_interval: must be at least 100ms"),
    ),
    "busy_timeout zero": (
        router(busy_timeout=0),
        "router.busy_timeout: must be at least 1ms (SQLite would give up on the first lock), got 0",
    ),
    "busy_timeout under a millisecond": (
        router(busy_timeout=0.0004),
        Starts("router.busy_timeout: must be at least 1ms"),
    ),
    "node max_runtime zero": (
        node1(max_runtime="0s"),
        "node 'node-1'.max_runtime: must be more than 0 (0 would fail every job at once), got '0s'",
    ),
    # URLs: gpuq appends its paths; what cannot survive that, or would leak, is refused.
    "url with a query": (
        node1(url="http://node-1:11434/?key=1"),
        Starts("node 'node-1'.url: a URL with a query ('?') or fragment ('#') cannot take gpuq's paths"),
    ),
    "url with a fragment": (
        node1(url="http://node-1:11434#top"),
        Starts("node 'node-1'.url: a URL with a query ('?') or fragment ('#')"),
    ),
    "url with a password": (
        node1(url="http://me:pw@node-1:11434"),
        "node 'node-1'.url: a user or password in the URL would be shown on the page and in "
        "errors; remove the '...@' part, got 'http://me:pw@node-1:11434'",
    ),
    "url with a space": (
        node1(url="http://node 1:11434"),
        "node 'node-1'.url: a URL must not contain spaces or control characters, got 'http://node 1:11434'",
    ),
    "url with a trailing newline": (
        node1(url="http://node-1:11434\n"),
        Starts("node 'node-1'.url: a URL must not contain spaces or control characters"),
    ),
    "public_url with a query": (
        router(public_url="http://127.0.0.1:8750?x=1"),
        Starts("router.public_url: a URL with a query ('?')"),
    ),
    "public_url with a user": (
        router(public_url="http://me@127.0.0.1:8750"),
        Starts("router.public_url: a user or password in the URL"),
    ),
    "public_url with a space": (
        router(public_url=" http://127.0.0.1:8750"),
        Starts("router.public_url: a URL must not contain spaces"),
    ),
    # Tokens a client could never send back (the router strips the Bearer value).
    "empty token": (router(token=""), "router.token: must not be empty (leave it out for no token)"),
    "blank token": (router(token="   "), "router.token: must not be empty (leave it out for no token)"),
    "padded token": (
        router(token="s3cret\n"),
        "router.token: remove the spaces or newlines around the token; no client sends them",
    ),
    "non-ASCII token": (router(token="café-token"), Starts("router.token: use printable ASCII only")),
    "max_prompt_bytes absurd": (
        router(max_prompt_bytes=10**9),
        f"router.max_prompt_bytes: must be at most {64 * 1024 * 1024} (64 MiB), got {10**9}",
    ),
    "database of the wrong type": (router(database=5), "router.database: expected str, got 5"),
    "token of the wrong type": (router(token=12345), "router.token: expected str, got 12345"),
    "max_prompt_bytes as a string": (
        router(max_prompt_bytes="1MB"),
        "router.max_prompt_bytes: expected int, got '1MB'",
    ),
    "max_prompt_bytes zero": (router(max_prompt_bytes=0), "router.max_prompt_bytes: must be at least 1, got 0"),
    "max_database_bytes too small": (
        router(max_database_bytes=100),
        "router.max_database_bytes: must be at least 65536, got 100",
    ),
    "critique_template without the subject": (
        router(critique_template="Review it."),
        "router.critique_template: must contain '{subject}'",
    ),
    "header_timeout zero": (
        router(header_timeout="0s"),
        "router.header_timeout: must be more than 0 (0 would close every new connection before its request), got '0s'",
    ),
    "keepalive_timeout zero": (
        router(keepalive_timeout=0),
        "router.keepalive_timeout: must be more than 0 (0 would close every connection after its first request), got 0",
    ),
    "max_connections too few": (router(max_connections=2), "router.max_connections: must be from 8 to 1000000, got 2"),
    "max_connections as a string": (router(max_connections="many"), "router.max_connections: expected int, got 'many'"),
}


@pytest.mark.parametrize("name", list(CONFIG))
def test_each_config_mistake_is_refused_naming_its_key(name, tmp_path):
    mutate, message = CONFIG[name]
    data = base()
    mutate(data)
    with pytest.raises(ConfigError) as exc:
        parse_config(data, tmp_path)
    assert matches(message, exc.value.message), exc.value.message


@pytest.mark.parametrize(
    "text,message",
    [
        ("[router\n", Starts("{path}: not valid TOML: ")),
        ('[router]\nlisten = "a:1"\nlisten = "b:2"\n', Starts("{path}: not valid TOML: Cannot overwrite a value")),
        (b'[router]\ntoken = "caf\xe9"\n', Starts("{path}: not valid TOML: 'utf-8' codec can't decode byte 0xe9")),
        ("[router]\n", "{path}: node: at least one [[node]] is required"),
    ],
)
def test_a_config_file_that_is_not_a_config_is_refused(text, message, tmp_path):
    path = tmp_path / "gpuq.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    assert matches(type(message)(message.replace("{path}", str(path))), exc.value.message), exc.value.message
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.toml")


@IN_WORLD
@pytest.mark.parametrize(
    "name",
    [
        "unknown router key",
        "duplicate rank",
        "infinite duration",
        "rank beyond 64 bits",
        "empty token",
        "health_interval zero",
    ],
)
async def test_serve_exits_78_naming_the_key(name, world, tmp_path):
    mutate, message = CONFIG[name]
    data = base()
    data["router"]["database"] = "never-created.db"
    mutate(data)
    config = tmp_path / "gpuq.toml"
    config.write_text(tomli_w.dumps(data))
    res = await world.daemon.cli("serve", "--config", str(config))
    assert res.code == 78
    assert res.err.startswith("gpuq: config error: ") and message.split(":")[0] in res.err, res.err
    assert matches(message, res.err.strip().removeprefix("gpuq: config error: "))
    assert not (tmp_path / "never-created.db").exists()  # it stopped before touching anything


def test_config_table_covers_a_good_config(tmp_path):
    # The base config the table mutates is itself valid: each refusal comes from its one mistake.
    settings = parse_config(tomllib.loads(tomli_w.dumps(base())), tmp_path)
    assert [n.name for n in settings.nodes] == ["node-1", "node-2"]


def test_the_limits_themselves_and_a_path_prefix_are_accepted(tmp_path):
    # Each refusal above is at its boundary: the smallest sensible values still parse, and an
    # Ollama behind a reverse proxy keeps its path prefix (the client appends /api/... to it).
    data = base()
    data["router"].update(
        health_interval="100ms",
        busy_timeout="1ms",
        stall_timeout="1ms",
        max_prompt_bytes=64 * 1024 * 1024,
        token="a-token with inner spaces",
        public_url="https://gpuq.example.ts.net/queue/",
    )
    data["node"][0]["url"] = "https://proxy.example.ts.net/ollama/node-1/"
    settings = parse_config(data, tmp_path)
    assert (settings.health_interval_s, settings.busy_timeout_s) == (0.1, 0.001)
    assert settings.max_prompt_bytes == 64 * 1024 * 1024
    assert settings.public_url == "https://gpuq.example.ts.net/queue"
    assert settings.nodes[0].url == "https://proxy.example.ts.net/ollama/node-1"


def write_base(tmp_path: Path, **router_keys) -> Path:
    data = base()
    data["router"].update(router_keys)
    path = tmp_path / "gpuq.toml"
    path.write_text(tomli_w.dumps(data))
    return path


@pytest.mark.parametrize(
    "value,message",
    [
        ("", "$GPUQ_TOKEN: must not be empty (leave it out for no token)"),
        (" tok-123", "$GPUQ_TOKEN: remove the spaces or newlines around the token; no client sends them"),
        ("tok-123\n", "$GPUQ_TOKEN: remove the spaces or newlines around the token; no client sends them"),
    ],
)
def test_a_bad_token_from_the_environment_is_refused_naming_the_variable(value, message, tmp_path, monkeypatch):
    # Set but empty is refused, not ignored: the router would otherwise run without a token.
    monkeypatch.setenv("GPUQ_TOKEN", value)
    with pytest.raises(ConfigError) as exc:
        load_config(write_base(tmp_path))
    assert exc.value.message == message
    # The file's own token wins, so the variable is not used and not judged.
    assert load_config(write_base(tmp_path, token="from-file")).token == "from-file"


def newer_schema(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute(
        "CREATE TABLE schema_migration (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
    )
    db.execute("INSERT INTO schema_migration VALUES (999, '999_future', '2030-01-01T00:00:00.000000Z')")
    db.commit()
    db.close()


@IN_WORLD
@pytest.mark.parametrize("case", ["written by a newer gpuq", "a directory"])
async def test_serve_refuses_a_database_it_cannot_use_exits_2_and_does_not_hang(case, world, tmp_path):
    data = base()
    data["router"]["database"] = "q.db"
    data["router"]["listen"] = f"127.0.0.1:{free_port()}"
    config = tmp_path / "gpuq.toml"
    config.write_text(tomli_w.dumps(data))
    if case == "a directory":
        (tmp_path / "q.db").mkdir()
        message = f"cannot start: cannot open the database {tmp_path / 'q.db'}: unable to open database file"
    else:
        newer_schema(tmp_path / "q.db")
        message = (
            f"cannot start: {tmp_path / 'q.db'} was written by a newer gpuq (schema version 999; this gpuq knows up to "
        )
    res = await world.daemon.cli("serve", "--config", str(config), timeout=20)  # it used to hang here
    assert res.code == 2, res.err
    assert message in res.err
