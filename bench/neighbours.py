"""Section `neighbours`: gpuq beside LiteLLM's proxy and ollama-herd, on the same simulated
Ollama nodes in the same run, calls interleaved system by system (bench/neighbour_procs.py starts
them, bench/neighbour_calls.py sends the calls).

On a one-node fleet: start to first answer; idle RSS; first-token overhead (through each one's
OpenAI `/v1/chat/completions` stream, and gpuq's `/api/chat`, minus the same call straight to
the node in the same round); and four behaviour probes, each a row saying what happened: three
calls at once (how many the node served at once), the model after a call (unloaded, or still
loaded), a client that leaves mid-stream (when the node's request ended), a SIGKILL of the
router with calls queued, then a restart (how many of them ran after it, what gpuq still lists).
On a 20-node fleet: router CPU per token with 20 paced streams at once (herd: its router and its
agents). A peer that cannot be installed or started is a row saying so; the rest goes on.

Run alone: `python -m bench.neighbours [--quick]` or `python -m bench.run --only neighbours`."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from .neighbour_calls import generations, most_at_once, stream
from .neighbour_procs import LABELS, MODEL, SYSTEMS, Gpuq, System, peer_venv_problem
from .procs import QUIET_S, Fakes, cpu_s, rss_mb

if TYPE_CHECKING:
    from .core import Bench

NODE = "s1"
CLIENTS = 20
PACE_S = 0.005  # 200 tokens/s per stream, as the front door's rows
START_LIMIT_S = 120.0


class Fleet:
    """The simulated nodes and the systems started on them, with the waits every step shares."""

    def __init__(self, bench: Bench, fakes: Fakes, session: aiohttp.ClientSession):
        self.bench = bench
        self.fakes = fakes
        self.session = session
        self.systems: list[System] = []  # those still measured
        self.started: list[System] = []  # every one started, to be stopped

    def drop(self, system: System, why: str) -> None:
        """A system that failed mid-measure: a row says so, the others go on without it."""
        failed(self.bench, system.name, why)
        if system in self.systems:
            self.systems.remove(system)

    async def quiet(self) -> None:
        """Every node idle (nothing streaming, gpuq's queue drained), then a quiet moment."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            busy = [n for n in self.fakes.urls if (await self.fakes.call("status", n))["in_flight"]]
            if not busy and all([await self._gpuq_idle(s) for s in self.systems]):
                await asyncio.sleep(QUIET_S)
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("the nodes did not go idle within 30 s")

    async def _gpuq_idle(self, system: System) -> bool:
        if not isinstance(system, Gpuq):
            return True
        async with self.session.get(system.router.url + "/api/queue?limit=0") as resp:
            body = await resp.json()
        return all(n["queued_count"] == 0 and n["running"] is None for n in body["nodes"])

    async def script(self, **query: float) -> None:
        for name in self.fakes.urls:
            await self.fakes.call("script", name, **query)

    async def first_answer(self, system: System) -> float:
        """Seconds from spawning `system` to its first streamed answer (polled every 0.2 s)."""
        deadline = time.monotonic() + START_LIMIT_S
        last = ""
        while time.monotonic() < deadline:
            gone = system.exited()
            if gone:
                raise RuntimeError(gone)
            try:
                call = await stream(self.session, system.url, "are you up?", headers=system.headers)
                if call.status == 200 and call.tokens:
                    return time.monotonic() - system.spawned
                last = f"{call.status} {call.error}"
            except (aiohttp.ClientError, RuntimeError, ValueError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.2)
        raise RuntimeError(f"no answer within {START_LIMIT_S:.0f} s (last: {last[:300]})")

    async def models_listed(self, system: System) -> float:
        """Seconds from (re)spawning `system` until its GET /v1/models lists the model: up
        again, without sending a call that would reach the node."""
        deadline = time.monotonic() + START_LIMIT_S
        while time.monotonic() < deadline:
            try:
                async with self.session.get(system.url + "/v1/models", headers=system.headers) as resp:
                    if resp.status == 200 and MODEL.split(":")[0] in await resp.text():
                        return time.monotonic() - system.spawned
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{system.name} did not list {MODEL} within {START_LIMIT_S:.0f} s of its restart")

    async def start_all(self, classes: list[type[System]], workdir: Path, timed: bool) -> None:
        for cls in classes:
            system = cls(workdir, dict(self.fakes.urls))
            self.started.append(system)
            try:
                await system.start()
                took = await self.first_answer(system)
            except (RuntimeError, OSError) as exc:
                await system.stop()
                failed(self.bench, system.name, f"did not start: {exc}")
                continue
            self.systems.append(system)
            if timed:
                label = f"neighbours: {LABELS[system.name]}, start to first answer"
                self.bench.metric(f"nb_start_{system.name}", label, "s", "ms").add_run(took)
            self.bench.say(f"neighbours: {system.name} answered {took:.1f} s after its start")

    async def stop_all(self) -> None:
        for system in self.started:
            await system.stop()


def failed(bench: Bench, name: str, why: str) -> None:
    """A row that says a peer was not measured, and why (never a silent skip)."""
    why = " ".join(why.replace("|", "/").split())  # one table cell
    if len(why) > 300:  # its start (what failed) and its end (a traceback's last line)
        why = why[:100] + " ... " + why[-200:]
    bench.say(f"neighbours: {name} not measured: {why}")
    bench.metric(f"nb_failed_{name}", f"neighbours: {LABELS[name]} NOT MEASURED: {why}", "", "count")


def rotated(items: list, by: int) -> list:
    return items[by % len(items) :] + items[: by % len(items)] if items else items


async def idle_rss(fleet: Fleet) -> None:
    """Each system's resident set, idle after its first answers (herd: router, agent, both)."""
    await fleet.quiet()
    await asyncio.sleep(1.0)  # idle a moment: what a user's `ps` would show
    for system in fleet.systems:
        parts = {part: sum(rss_mb(p) for p in pids) for part, pids in system.rss_parts().items()}
        name = LABELS[system.name]
        for part, mb in parts.items():
            label = f"neighbours: {name}, idle RSS, {part}" + (" (one per node)" if part == "agent" else "")
            fleet.bench.metric(f"nb_rss_{system.name}_{part}", label, "MB", "mb").add_run(mb)
        if len(parts) > 1:
            label = f"neighbours: {name}, idle RSS, router + 1 agent"
            fleet.bench.metric(f"nb_rss_{system.name}", label, "MB", "mb").add_run(sum(parts.values()))


async def first_tokens(fleet: Fleet) -> None:
    """Rounds of one call straight to the node, then one through each system (the order turned
    every round); each system's first token minus the round's direct one."""
    bench = fleet.bench
    await fleet.script(tokens=4, delay=0)
    node_url = fleet.fakes.urls[NODE]
    paths: list[tuple[str, System, bool]] = [(s.name, s, True) for s in fleet.systems]
    paths += [("gpuq_api", s, False) for s in fleet.systems if isinstance(s, Gpuq)]
    rows = {
        key: bench.metric(
            f"nb_ttft_{key}",
            f"neighbours: {LABELS[s.name]}, first-token overhead, {'/v1/chat/completions' if v1 else '/api/chat'}",
            "ms",
            "ms",
        )
        for key, s, v1 in paths
    }
    rounds = 10 if bench.quick else 20
    for rep in range(bench.repeats):
        runs: dict[str, list[float]] = {key: [] for key in rows}
        for i in range(rounds):
            await fleet.quiet()
            direct = await stream(fleet.session, node_url, "hello", openai=False)
            for key, system, v1 in rotated(paths, i):
                if system not in fleet.systems:
                    continue
                await fleet.quiet()
                try:
                    call = await stream(fleet.session, system.url, "hello", openai=v1, headers=system.headers)
                    if call.status != 200 or not call.tokens:
                        raise RuntimeError(f"{key}: {call.status} {call.error}")
                except (RuntimeError, ValueError, OSError, aiohttp.ClientError) as exc:
                    fleet.drop(system, f"a first-token call failed: {exc!r}")
                    continue
                runs[key].append(call.first_ms - direct.first_ms)
        for key, samples in runs.items():
            if samples:
                rows[key].add_run(samples)
        medians = ", ".join(f"{k} {statistics.median(v):.1f}" for k, v in runs.items() if v)
        bench.say(f"neighbours: first-token overhead run {rep + 1}/{bench.repeats} (ms, median): {medians}")


async def cpu_per_token(fleet: Fleet) -> None:
    """20 paced streams at once through each system in turn (the order turned every repeat):
    the CPU its processes used from the first call sent to the last token, per token received."""
    bench = fleet.bench
    tokens = 300 if bench.quick else 600
    await fleet.script(tokens=tokens, delay=PACE_S)
    rows = {
        s.name: bench.metric(
            f"nb_cpu_{s.name}",
            f"neighbours: {LABELS[s.name]}, router CPU per token, {CLIENTS} streams at 200 tokens/s"
            + (" (router + agents)" if s.name == "herd" else ""),
            "us",
            "ms",
        )
        for s in fleet.systems
    }
    for rep in range(bench.repeats):
        for system in rotated(list(fleet.systems), rep):
            await fleet.quiet()
            try:
                rows[system.name].add_run(await cpu_run(fleet, system, tokens))
            except (RuntimeError, ValueError, OSError, aiohttp.ClientError) as exc:
                fleet.drop(system, f"the 20 streams failed: {exc!r}")
        bench.say(f"neighbours: CPU per token run {rep + 1}/{bench.repeats} done")


async def cpu_run(fleet: Fleet, system: System, tokens: int) -> float:
    """One round of 20 streams through `system`: its processes' CPU per token received, in us."""
    pids = system.pids()
    before = sum(cpu_s(p) for p in pids)
    calls = await asyncio.gather(
        *(stream(fleet.session, system.url, f"stream {i}", headers=system.headers) for i in range(CLIENTS))
    )
    used = sum(cpu_s(p) for p in pids) - before
    got = sum(len(c.tokens) for c in calls)
    if got < tokens * CLIENTS:
        errors = {c.error or c.status for c in calls if len(c.tokens) < tokens}
        raise RuntimeError(f"{system.name}: {got} of {tokens * CLIENTS} tokens ({errors})")
    return used / got * 1e6


def probe_row(bench: Bench, key: str, system: System, words: str, value: float | None) -> None:
    row = bench.metric(f"nb_{key}_{system.name}", f"neighbours: {LABELS[system.name]}, {words}", "", "count")
    if value is not None:
        row.add_run(value)
    bench.say(f"neighbours: {system.name}: {words}")


async def probe_three(fleet: Fleet, system: System) -> None:
    """Three calls at once on a one-node fleet: how many did the node serve at the same time?"""
    await fleet.script(tokens=20, delay=0.05)  # a second each
    await fleet.quiet()
    since = time.monotonic()
    calls = await asyncio.gather(
        *(stream(fleet.session, system.url, f"three {i}", headers=system.headers) for i in range(3))
    )
    answered = sum(1 for c in calls if c.status == 200 and len(c.tokens) == 20)
    at_once = most_at_once(await fleet.fakes.log(NODE, since=since), since)
    how = "one at a time" if at_once == 1 else f"{at_once} at once"
    probe_row(fleet.bench, "three", system, f"three calls at once, one node: the node served {how}", at_once)
    if answered < 3:
        probe_row(fleet.bench, "three_answered", system, f"three calls at once: {answered} of 3 answered", answered)


async def loaded_models(fleet: Fleet) -> list[dict]:
    async with fleet.session.get(fleet.fakes.urls[NODE] + "/api/ps") as resp:
        return list((await resp.json())["models"])


async def unload_after(fleet: Fleet, system: System, key: str, how: str, call: Callable[[], Awaitable[object]]) -> None:
    """From an empty node, one call (`call`), then the node's /api/ps polled for 3 s: is the
    model unloaded after it?"""
    await fleet.script(tokens=4, delay=0)
    await fleet.quiet()
    unload = {"model": MODEL, "keep_alive": 0}
    async with fleet.session.post(fleet.fakes.urls[NODE] + "/api/generate", json=unload) as resp:
        await resp.read()  # start from an empty node
    await call()
    ended = time.monotonic()
    deadline = ended + 3.0
    models = await loaded_models(fleet)
    while models and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        models = await loaded_models(fleet)
    if not models:
        ms = (time.monotonic() - ended) * 1000
        when = "already unloaded as it ended" if ms < 1 else f"unloaded within {ms:.0f} ms"
        probe_row(fleet.bench, key, system, f"after {how}: the model {when}", ms)
        return
    words = f"after {how}: the model still loaded 3 s later, {expiry(models[0].get('expires_at'))}"
    probe_row(fleet.bench, key, system, words, None)


def expiry(stamp: str | None) -> str:
    """/api/ps's expires_at as words: in how long, or never (keep_alive -1 reads as year 2318+)."""
    try:
        left = datetime.fromisoformat(str(stamp)).timestamp() - time.time()
    except ValueError:
        return f"expires_at {stamp!r}"
    return "kept for ever" if left > 365 * 86400 else f"to be unloaded in {left / 60:.1f} min"


async def probe_unload(fleet: Fleet, system: System) -> None:
    """A call through the OpenAI API; for gpuq also a job (POST /api/jobs, followed to its end)."""

    async def openai_call() -> None:
        call = await stream(fleet.session, system.url, "unload probe", headers=system.headers)
        assert call.status == 200 and call.tokens, call.error

    await unload_after(fleet, system, "unload", "a /v1 call", openai_call)
    if isinstance(system, Gpuq):

        async def job() -> None:
            body = {"kind": "task", "prompt": "unload probe", "node": NODE}
            async with fleet.session.post(system.router.url + "/api/jobs", json=body) as resp:
                assert resp.status == 201, await resp.text()
                job_id = (await resp.json())["jobs"][0]["id"]
            async with fleet.session.get(system.router.url + f"/api/jobs/{job_id}/stream") as resp:
                await resp.read()  # to its end

        await unload_after(fleet, system, "unload_job", "a job (POST /api/jobs)", job)


async def probe_disconnect(fleet: Fleet, system: System) -> None:
    """A client that leaves after 3 tokens of a 4 s stream: when did the node's request end?"""
    tokens, delay = 200, 0.02
    await fleet.script(tokens=tokens, delay=delay)
    await fleet.quiet()
    call = await stream(fleet.session, system.url, "leaving early", headers=system.headers, stop_after=3)
    left = time.monotonic()
    deadline = left + tokens * delay + 5
    spans: list[tuple[float, float]] = []
    while time.monotonic() < deadline and not spans:
        spans = generations(await fleet.fakes.log(NODE, since=call.sent), call.sent)
        await asyncio.sleep(0.02)
    if not spans:
        probe_row(fleet.bench, "disconnect", system, "a client left: the node's request did not end", None)
        return
    arrive, end = spans[0]
    ms = (end - left) * 1000
    natural = arrive + tokens * delay
    cut = end < natural - 1.0  # ended well before its last token would have been written
    words = f"a client left mid-stream: the node's request {'cut' if cut else 'ran to its end'}, {ms:.0f} ms after"
    probe_row(fleet.bench, "disconnect", system, words, ms)


async def gpuq_records(fleet: Fleet, system: System, tag: str) -> str:
    """What gpuq still lists of the probe's calls after its restart: how many, in which states."""
    async with fleet.session.get(system.router.url + "/api/jobs?limit=100") as resp:
        jobs = (await resp.json())["jobs"]
    ours = Counter(str(j.get("state")) for j in jobs if tag in json.dumps(j))
    states = ", ".join(f"{n} {state}" for state, n in sorted(ours.items()))
    return f"{sum(ours.values())} of 4 recorded ({states or 'none'})"


async def probe_kill(fleet: Fleet, system: System) -> None:
    """Four calls on one node (one running, three waiting at the router or the node), the
    router SIGKILLed, then restarted: how many of them reached the node after the restart
    (watched from the restart until 5 s after the router lists its models again), and what the
    router still lists (gpuq's jobs)."""
    await fleet.script(tokens=40, delay=0.05)  # two seconds each
    await fleet.quiet()
    tag = f"kill probe {system.name}"
    tasks = [
        asyncio.create_task(stream(fleet.session, system.url, f"{tag} {i}", headers=system.headers)) for i in range(4)
    ]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (await fleet.fakes.call("status", NODE))["in_flight"]:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)  # the other three reach the router meanwhile
    await system.kill()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (await fleet.fakes.call("status", NODE))["in_flight"]:
        await asyncio.sleep(0.02)  # the node's request ends with its router's connection
    restarted = time.monotonic()
    await system.start()
    ready = await fleet.models_listed(system)
    await asyncio.sleep(5.0)  # the window in which a kept call would run again
    after = generations(await fleet.fakes.log(NODE, since=restarted), restarted)
    records = await gpuq_records(fleet, system, tag) if isinstance(system, Gpuq) else "records not checked"
    words = f"SIGKILL with 4 calls out, restart (up again in {ready:.1f} s): {len(after)} ran after it; {records}"
    probe_row(fleet.bench, "kill", system, words, len(after))


async def ratios(bench: Bench) -> None:
    """gpuq's row over each peer's, from the same run (below 1: gpuq lower/faster/smaller)."""
    m = bench.metrics
    pairs = {
        "first-token overhead p50": ("nb_ttft_{}", "median"),
        "first-token overhead p95": ("nb_ttft_{}", "p95"),
        "router CPU per token, 20 streams": ("nb_cpu_{}", "median"),
        "idle RSS (herd: router + 1 agent)": ("nb_rss_{}", "median"),
        "start to first answer": ("nb_start_{}", "median"),
    }
    for peer in ("litellm", "herd"):
        for words, (pattern, stat) in pairs.items():
            mine, theirs = pattern.format("gpuq"), pattern.format(peer)
            if peer == "litellm" and pattern == "nb_rss_{}":
                theirs = "nb_rss_litellm_router"
            if mine == "nb_rss_gpuq":
                mine = "nb_rss_gpuq_router"
            if mine not in m or theirs not in m or not m[mine].pooled or not m[theirs].pooled:
                continue
            a, b = m[mine].summary()[stat], m[theirs].summary()[stat]
            if b and b > 0 and a is not None and a > 0:
                label = f"neighbours: gpuq / {LABELS[peer]}, {words}"
                bench.metric(f"nb_ratio_{peer}_{mine}_{stat}", label, "", "ratio", better="lower").add_run(a / b)


async def one_node(bench: Bench, classes: list[type[System]], session: aiohttp.ClientSession) -> None:
    fakes = await Fakes({NODE: MODEL}, bench.workdir / "neighbours-fakes.log").start()
    fleet = Fleet(bench, fakes, session)
    try:
        await fleet.start_all(classes, bench.workdir / "neighbours-one", timed=True)
        await idle_rss(fleet)
        await first_tokens(fleet)
        probes: list[Callable[[Fleet, System], Awaitable[None]]] = [
            probe_three,
            probe_unload,
            probe_disconnect,
            probe_kill,
        ]
        for probe in probes:
            for system in fleet.systems:
                try:
                    await probe(fleet, system)
                except (RuntimeError, OSError, aiohttp.ClientError, AssertionError) as exc:
                    probe_row(bench, probe.__name__, system, f"{probe.__name__} failed: {exc!r}"[:300], None)
    finally:
        await fleet.stop_all()
        await fakes.stop()


async def twenty_nodes(bench: Bench, classes: list[type[System]], session: aiohttp.ClientSession) -> None:
    nodes = {f"c{i:02d}": MODEL for i in range(1, CLIENTS + 1)}
    fakes = await Fakes(nodes, bench.workdir / "neighbours-fleet-fakes.log").start()
    fleet = Fleet(bench, fakes, session)
    try:
        await fleet.start_all(classes, bench.workdir / "neighbours-fleet", timed=False)
        await cpu_per_token(fleet)
    finally:
        await fleet.stop_all()
        await fakes.stop()


async def neighbours_section(bench: Bench) -> None:
    classes = list(SYSTEMS)
    problem = await asyncio.to_thread(peer_venv_problem)
    if problem:
        for cls in SYSTEMS[1:]:
            failed(bench, cls.name, problem)
        classes = classes[:1]
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for part in (one_node, twenty_nodes):
            try:
                await part(bench, classes, session)
            except Exception as exc:  # noqa: BLE001 (said in a row; `make bench` goes on)
                failed(bench, "neighbours", f"{part.__name__} stopped: {exc!r}")
    await ratios(bench)


def main() -> int:
    from .core import Bench
    from .stats import table

    parser = argparse.ArgumentParser(prog="python -m bench.neighbours", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="2 repeats instead of 7, fewer rounds")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix=".work-", dir=Path(__file__).resolve().parent))
    bench = Bench(args.quick, {"neighbours"}, workdir)
    try:
        asyncio.run(neighbours_section(bench))
    except BaseException:
        print(f"bench failed; its logs are kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    print(table(list(bench.metrics.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
