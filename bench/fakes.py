"""Fake Ollama nodes for the bench, in their own process so they do not share a core's event
loop with the load generator.

`TimedFake` is gpuq's FakeOllama with a request log: for every request, when it reached the
fake and when the fake's handler returned (for a streamed chat, after its final byte was
written and the stream closed), and the moment a model that unloads with a delay left
(`MODEL_LEFT`, as its own log entry). It behaves exactly like FakeOllama, except that the bench
may *hold* generation requests (they wait before answering) to line up a queue before a
measurement, or to stand in for the minutes-long jobs a real lab runs.

Run: `python -m bench.fakes name=model ...`; prints one JSON line {"control": url,
"nodes": {name: url}}, then serves until stdin closes."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field

from aiohttp import web

from gpuq.demo import FakeOllama, Script

MODEL_LEFT = "(model left VRAM)"  # the log's path for the moment a delayed unload completed


@dataclass
class TimedFake(FakeOllama):
    log: list[tuple[str, float, float, bool]] = field(default_factory=list)  # path, arrive, end, generation
    # Each generation's prompt (its first line) with its arrival and its end: the storm bench
    # matches them to its calls (when the client left -> when the node's request ended).
    spans: list[tuple[str, float, float]] = field(default_factory=list)
    held: bool = False
    waiting: int = 0  # generation requests held at the gate now
    _gate: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = super().app()
        app.middlewares.append(self._timed)
        return app

    @web.middleware
    async def _timed(self, request: web.Request, handler):
        arrive = time.monotonic()
        generation = False
        tag = ""
        if request.method == "POST" and request.path in ("/api/chat", "/api/generate"):
            try:
                body = json.loads(await request.read())  # aiohttp caches it for the handler
                generation = bool(body.get("messages") or body.get("prompt"))
                tag = (body.get("prompt") or "").split("\n", 1)[0][:80]
            except ValueError:
                pass
            if generation and self.held:
                self.waiting += 1  # the bench may count what the router did before this request
                try:
                    await self._gate.wait()
                finally:
                    self.waiting -= 1
        try:
            return await handler(request)
        finally:
            end = time.monotonic()
            self.log.append((request.path, arrive, end, generation))
            if generation and tag:
                self.spans.append((tag, arrive, end))

    def _forget(self, name, m) -> None:
        super()._forget(name, m)
        if name not in self.loaded:
            now = time.monotonic()
            self.log.append((MODEL_LEFT, now, now, False))

    def hold(self) -> None:
        self.held = True
        self._gate.clear()

    def release(self) -> None:
        self.held = False
        self._gate.set()


async def serve(specs: list[str]) -> None:
    fakes: dict[str, TimedFake] = {}
    for spec in specs:
        name, model = spec.split("=", 1)
        fake = TimedFake(models={model}, script=Script(tokens=4))
        await fake.start()
        fakes[name] = fake

    async def control(request: web.Request) -> web.Response:
        fake = fakes[request.query["node"]]
        action = request.match_info["action"]
        if action == "log":
            since = float(request.query.get("since", "0"))
            return web.json_response({"log": [e for e in fake.log if e[1] >= since]})
        if action == "spans":
            return web.json_response({"spans": fake.spans})
        if action == "hold":
            fake.hold()
        elif action == "release":
            fake.release()
        elif action == "reset":
            fake.log.clear()
            fake.spans.clear()
            fake.requests.clear()
        elif action == "script":  # reply length and pace; how long an unload takes
            q = request.query
            fake.script.tokens = int(q.get("tokens", fake.script.tokens))
            fake.script.token_delay_s = float(q.get("delay", fake.script.token_delay_s))
            if "unload_delay" in q:  # seconds the model stays listed by /api/ps after keep_alive: 0
                fake.script.unload_delay_s = float(q["unload_delay"])
                fake.script.unload = "delay" if fake.script.unload_delay_s > 0 else "immediate"
        elif action != "status":  # status: only the answer below
            return web.json_response({"error": f"unknown action {action}"}, status=404)
        return web.json_response({"ok": True, "held": fake.held, "waiting": fake.waiting, "in_flight": fake.in_flight})

    app = web.Application()
    app.router.add_route("*", "/{action}", control)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(
        json.dumps({"control": f"http://127.0.0.1:{port}", "nodes": {name: f.url for name, f in fakes.items()}}),
        flush=True,
    )
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # until the bench closes our stdin
    for fake in fakes.values():
        fake.release()
        await fake.stop()
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1:]))
