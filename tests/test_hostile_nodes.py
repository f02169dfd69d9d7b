"""No node can freeze, exhaust or redirect the router: the real daemon against a hostile node (a
small aiohttp server on loopback) that answers its health checks like Ollama and then compresses,
redirects, drips, or never ends. Each fails its job (or marks the node down) naming what the node
did, and the router keeps serving everyone else."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import zlib

import pytest
from aiohttp import web
from conftest import eventually, node_table

from gpuq.node.runtime import Current

MODEL = "qwen3-coder:30b"
BOMB_BYTES = 64 << 20  # unpacked: 64 MiB of empty lines, ~64 KiB on the wire


@functools.cache
def gzip_bomb() -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip container
    block = b"\n" * (1 << 20)
    return b"".join(packer.compress(block) for _ in range(BOMB_BYTES >> 20)) + packer.flush()


def chunk(text: str, done: bool = False) -> bytes:
    return (
        json.dumps(
            {
                "model": MODEL,
                "created_at": "2026-12-01T08:00:00Z",
                "message": {"role": "assistant", "content": text},
                "done": done,
            }
        )
        + "\n"
    ).encode()


class Hostile:
    """Ollama's health answers; its chat, /api/tags and /api/version as `chat`, `tags`, `version` say."""

    def __init__(self) -> None:
        self.chat = "ok"
        self.tags = "ok"
        self.version = "ok"
        self.target = ""  # where its redirects point
        self.chats = 0
        self.encodings: list[str | None] = []  # each request's Accept-Encoding
        self.gone = asyncio.Event()  # a stream it served was closed by the router
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/version", self._version)
        app.router.add_get("/api/tags", self._tags)
        app.router.add_get("/api/ps", self._ps)
        app.router.add_post("/api/chat", self._chat)
        app.middlewares.append(self._note)
        self.runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    @web.middleware
    async def _note(self, request, handler):
        self.encodings.append(request.headers.get("Accept-Encoding"))
        return await handler(request)

    async def _version(self, request):
        if self.version == "endless":
            return await self._endless(request, b'{"version": "', b"0" * 4096)
        return web.json_response({"version": "0.13.0"})

    async def _ps(self, request):
        return web.json_response({"models": []})

    async def _tags(self, request):
        mode = self.tags
        if mode == "endless":
            return await self._endless(request, b'{"models": [', b'{"name": "x"},' * 300)
        if mode == "redirect":
            raise web.HTTPFound(self.target + "/api/tags")
        body = json.dumps({"models": [{"name": MODEL, "model": MODEL}]}).encode()
        if mode == "gzip":
            packer = zlib.compressobj(9, zlib.DEFLATED, 31)
            return web.Response(
                body=packer.compress(body) + packer.flush(),
                content_type="application/json",
                headers={"Content-Encoding": "gzip"},
            )
        return web.Response(body=body, content_type="application/json")

    async def _chat(self, request):
        body = await request.json()
        if not body.get("messages"):  # an unload
            return web.json_response({"model": MODEL, "done": True, "done_reason": "unload"})
        self.chats += 1
        mode = self.chat
        if mode.startswith("redirect"):
            raise {"redirect307": web.HTTPTemporaryRedirect, "redirect302": web.HTTPFound}[mode](
                self.target + "/api/chat"
            )
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        if mode == "gzip":
            resp.headers["Content-Encoding"] = "gzip"
        try:
            await resp.prepare(request)
            if mode == "gzip":
                bomb = gzip_bomb()
                for at in range(0, len(bomb), 4096):
                    await resp.write(bomb[at : at + 4096])
                return resp
            await resp.write(chunk("w1 ") + chunk("w2 "))
            while mode != "ok":  # until the router hangs up
                await asyncio.sleep(0.1)
                # endless: 5,000 bytes of output a write, so max_output_bytes (64 KiB) is passed in
                # ~13 writes (~1.3 s), not 130
                await resp.write({"drip": b" ", "empty": chunk(""), "endless": chunk("word ") * 1000}[mode])
            await resp.write(chunk("", done=True))
        except ConnectionError:
            self.gone.set()
        return resp

    async def _endless(self, request, head: bytes, more: bytes):
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        try:
            await resp.prepare(request)
            await resp.write(head)
            while True:
                await resp.write(more)
                await asyncio.sleep(0)
        except ConnectionError:
            self.gone.set()
        return resp

    async def stop(self) -> None:
        await self.runner.cleanup()


@pytest.fixture
async def hostile():
    node = Hostile()
    await node.start()
    yield node
    await node.stop()


async def sick_and_well(hostile, fakes, daemon_factory, sick_extra: dict | None = None, **router):
    """`sick` is the hostile node, `well` a healthy fake; both up before the test goes on."""
    well = await fakes(MODEL)
    hostile.target = well.url
    d = await daemon_factory(
        [
            {**node_table("sick", hostile, 1, ["task"], MODEL), **(sick_extra or {})},
            node_table("well", well, 2, ["task"], MODEL),
        ],
        **{"unload_timeout": "1s", **router},
    )

    async def both_up():
        return all(n["up"] for n in (await d.get("/api/nodes"))["nodes"])

    await eventually(both_up, 10, what="both nodes to be up")
    return well, d


async def node(d, name: str) -> dict:
    return next(n for n in (await d.get("/api/nodes"))["nodes"] if n["name"] == name)


async def test_a_gzip_bomb_is_refused_and_the_router_answers_health_throughout(hostile, fakes, daemon_factory):
    well, d = await sick_and_well(hostile, fakes, daemon_factory)
    hostile.chat = "gzip"
    [job] = await d.submit("task", "answered with a gzip bomb", node="sick")
    [other] = await d.submit("task", "on the well node", node="well")
    worst = 0.0  # the slowest /health while the bomb is served
    while (await d.job(job["id"]))["state"] not in ("failed", "done"):
        started = time.monotonic()
        status, _ = await d.request("GET", "/health")
        worst = max(worst, time.monotonic() - started)
        assert status in (200, 503)
    failed = await d.job(job["id"])
    assert failed["error"] == (
        "sick answered /api/chat with Content-Encoding: gzip, though asked for identity; "
        "gpuq does not unpack a node's compressed replies"
    )
    assert worst < 2.0, f"/health took {worst:.2f}s while the node sent its bomb"
    await d.wait_state(other["id"], "done", timeout=20)
    assert set(hostile.encodings) == {"identity"}  # every request asked for the bytes as they are
    assert (await node(d, "sick"))["up"] and (await node(d, "well"))["up"]


@pytest.mark.parametrize("code", [307, 302])
async def test_a_redirected_chat_fails_naming_the_target_and_nothing_reaches_it(code, hostile, fakes, daemon_factory):
    well, d = await sick_and_well(hostile, fakes, daemon_factory)
    hostile.chat = f"redirect{code}"
    [job] = await d.submit("task", "redirected elsewhere", node="sick")
    failed = await d.wait_state(job["id"], "failed", "done", timeout=20)
    assert failed["error"] == (
        f"sick answered {code} redirect to {well.url}/api/chat; gpuq does not follow a node's redirects"
    )
    assert well.chat_requests == []  # the prompt never reached the other server
    assert hostile.chats == 1  # sent once, never again
    hostile.chat = "ok"
    [nxt] = await d.submit("task", "runs after it", node="sick")
    assert (await d.wait_state(nxt["id"], "done", timeout=20))["output"] == "w1 w2 "


@pytest.mark.parametrize("mode", ["drip", "empty"])
async def test_a_stream_without_new_tokens_stalls_though_bytes_come(mode, hostile, fakes, daemon_factory):
    """A byte (or an empty chunk) every 0.1 s is no progress: stall_timeout fires, not the job's timeout."""
    well, d = await sick_and_well(hostile, fakes, daemon_factory, stall_timeout="1s")
    hostile.chat = mode
    [job] = await d.submit("task", f"{mode}s", node="sick", timeout=30)
    failed = await d.wait_state(job["id"], "failed", "done", timeout=20)
    assert failed["error"] == "stalled: no new token from Ollama for 1s"
    assert failed["output"] == "w1 w2 "
    await asyncio.wait_for(hostile.gone.wait(), 10)  # the node is let go


async def test_an_endless_stream_fails_at_max_output_bytes_with_its_output_kept(hostile, fakes, daemon_factory):
    well, d = await sick_and_well(
        hostile, fakes, daemon_factory, sick_extra={"max_output_bytes": 65536}, max_output_bytes=1 << 20
    )
    hostile.chat = "endless"
    [job] = await d.submit("task", "never ends", node="sick")
    failed = await d.wait_state(job["id"], "failed", "done", timeout=20)
    assert failed["error"] == "the reply passed max_output_bytes (65536 bytes): request aborted, output so far kept"
    output = failed["output"]
    assert output.startswith("w1 w2 word word ") and 60_000 < len(output.encode()) <= 65536
    await asyncio.wait_for(hostile.gone.wait(), 10)  # the node's generation is cut
    hostile.chat = "ok"
    [nxt] = await d.submit("task", "runs after it", node="sick")
    assert (await d.wait_state(nxt["id"], "done", timeout=20))["output"] == "w1 w2 "


# which health answer, how, and the node's error
HEALTH = {
    "gzip /api/tags": (
        "tags",
        "gzip",
        "sick answered /api/tags with Content-Encoding: gzip, though asked for "
        "identity; gpuq does not unpack a node's compressed replies",
    ),
    "redirected /api/tags": (
        "tags",
        "redirect",
        "sick answered 302 redirect to {well}/api/tags; gpuq does not follow a node's redirects",
    ),
    "endless /api/tags": (
        "tags",
        "endless",
        "sick sent a /api/tags reply longer than 65536 bytes (max_reply_bytes), the most the router reads",
    ),
    "endless /api/version": (
        "version",
        "endless",
        "sick sent a /api/version reply longer than 65536 bytes (max_reply_bytes), the most the router reads",
    ),
}


@pytest.mark.parametrize("case", list(HEALTH))
async def test_a_hostile_health_answer_marks_the_node_down_naming_it(case, hostile, fakes, daemon_factory):
    what, mode, error = HEALTH[case]
    well, d = await sick_and_well(hostile, fakes, daemon_factory, max_reply_bytes=65536)
    setattr(hostile, what, mode)

    async def down():
        n = await node(d, "sick")
        return n if not n["up"] else None

    state = await eventually(down, 10, what="the node to be seen down")
    assert state["last_error"] == error.format(well=well.url)
    [other] = await d.submit("task", "on the well node", node="well")
    await d.wait_state(other["id"], "done", timeout=20)
    if mode == "endless":
        await asyncio.wait_for(hostile.gone.wait(), 10)  # the read was cut, not held
    setattr(hostile, what, "ok")

    async def up():
        return (await node(d, "sick"))["up"]

    await eventually(up, 10, what="the node to be up again")


def test_a_running_jobs_stored_pieces_are_joined_and_still_counted():
    """Millions of few-byte pieces cost ~60 bytes each: once stored they are joined into one,
    the text, what is left to store and the token counts unchanged."""
    cur = Current("j", 1)
    cur.output += ["a", "b", "c", "d"]
    cur.thinking += ["x", "y", "z"]
    cur.saved = (3, 2)
    cur.compact()
    assert (cur.output, cur.thinking) == (["abc", "d"], ["xy", "z"])
    assert cur.unsaved() == ("d", "z", (2, 2))
    assert (cur.tokens, cur.thinking_tokens) == (7, 3)
    cur.output.append("e")
    cur.saved = (3, 2)
    cur.compact()
    assert cur.output == ["abcde"] and cur.unsaved() == ("", None, (1, 1))
    assert (cur.tokens, cur.thinking_tokens) == (8, 3)
