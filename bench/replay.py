"""The lab's day, replayed (issue 28): bench/trace.py's seeded day played against the real router
(`gpuq serve`, a subprocess) and three simulated nodes (gpuq.demo's simulator in this process:
per-model cold loads, a paced token, a delayed unload), once per policy gpuq offers, each on a
fresh router and cold nodes, the policies interleaved in every repeat.

Per policy: the interactive calls' wait (sent to first token at the client; those sent while
batch work was queued judged against one model load + 1 s, both scaled), the sweeps' completion
(first submit to last task or critique finished) and the day's last batch job, the GPUs' busy
share while work waits (sampled every 50 ms: of the nodes that are up, the share with a request
loading or generating, over the samples where a job is queued), the cold loads the nodes paid,
jobs failed, and jobs lost (neither done nor failed once the queues drained).

`python -m bench.replay [--seed N] [--day SECONDS] [--repeats N] [--policies a,b]`, or the
section `replay` of `python -m bench.run`."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import tomli_w

from gpuq.demo import FakeOllama, Script

from . import trace as tr
from .procs import Router, free_port
from .stats import percentile

if TYPE_CHECKING:
    from .core import Bench

# name: (interactive lane and fair share, [router] unload, the front door's kept models,
# [router] interactive_preempts)
POLICIES = {
    "fifo": (False, "after-each", False, False),
    "lanes": (True, "after-each", False, False),
    "lanes+when-idle": (True, "when-idle", False, False),
    "lanes+kept": (True, "after-each", True, False),
    "lanes+preempts": (True, "when-idle", False, True),
    "defaults": (True, "after-each", True, True),
}
LABELS = {
    "fifo": "FIFO (every job in the batch lane, no fair share)",
    "lanes": "interactive lane + fair share, unload after-each",
    "lanes+when-idle": "lanes, [router] unload = when-idle",
    "lanes+kept": "lanes, front door keeps the editor's model (keep_alive)",
    "lanes+preempts": "lanes + interactive preempts, unload when-idle",
    "defaults": "the defaults: lanes, kept models, interactive preempts, unload after-each",
}
SAMPLE_S = 0.05
BACK_TO_BACK_S = 0.5  # a node's gap between two jobs shorter than this: the next one was waiting
DAY_S = 12.0  # the day's ten hours, in replay seconds
TOKENS = re.compile(r"\((\d+) tokens\)")
PEOPLE = (*tr.PEOPLE,)


def token(who: str) -> str:
    return f"replay-token-{who}"


@dataclass
class ReplayNode(FakeOllama):
    """The simulator with each model's own cold load, the reply length a prompt names, and a
    count of the loads it paid."""

    loads: int = 0
    _seen: set[int] = field(default_factory=set)
    spans: list[tuple[float, float]] = field(default_factory=list)  # each generation: arrived, ended

    async def _chat(self, request):
        arrived = time.monotonic()
        try:
            body = json.loads(await request.read())  # aiohttp keeps it for the handler
        except ValueError:
            body = {}
        try:
            return await super()._chat(request)
        finally:
            if isinstance(body, dict) and (body.get("messages") or body.get("prompt")):
                self.spans.append((arrived, time.monotonic()))

    def _reply_words(self, body: dict, chat: bool) -> list[str]:
        if body.get("format") in (None, ""):
            prompt = ((body["messages"][-1] or {}).get("content") or "") if chat else body.get("prompt", "")
            m = TOKENS.search(prompt)
            if m:
                return ["token "] * int(m.group(1))
        return super()._reply_words(body, chat)

    async def _acquire(self, name, body, num_ctx):
        self.script.load_delay_s = tr.LOAD_S.get(name, tr.LOAD_S[tr.CODER])
        entry = await super()._acquire(name, body, num_ctx)
        if id(entry) not in self._seen:
            self._seen.add(id(entry))
            self.loads += 1
        return entry

    @property
    def busy(self) -> bool:
        return any(m.refcount > 0 for m in self.loaded.values())


class LabRouter(Router):
    """The real router with the lab's users."""

    def __init__(self, *args, users: list[dict], **kwargs):
        self.users = users
        super().__init__(*args, **kwargs)

    def _configure(self) -> None:
        super()._configure()
        import tomllib

        data = tomllib.loads(self.config.read_text())
        data["user"] = self.users
        self.config.write_text(tomli_w.dumps(data))


@dataclass
class Day:
    """What one policy's replay measured."""

    waits: list[float] = field(default_factory=list)  # every interactive call, s
    waits_batch_queued: list[float] = field(default_factory=list)  # those sent while batch work waited
    queued_s: list[float] = field(default_factory=list)  # of each wait: its job's submit to its claim
    started_s: list[float] = field(default_factory=list)  # and its claim to the first token (a load, if cold)
    sweeps: list[float] = field(default_factory=list)  # first submit to its last job finished, s
    last_batch_s: float = 0.0  # the day's start to its last batch job finished
    busy: int = 0  # samples: nodes up, busy, while work waited
    up: int = 0  # samples: nodes up while work waited
    idle_own: int = 0  # of the idle ones: work waited in the node's own queue (between jobs)
    idle_elsewhere: int = 0  # its own queue empty, work waiting on other nodes' queues only
    loads: int = 0
    failed: int = 0
    lost: int = 0
    batch_gpu_s: float = 0.0  # every batch run's time on its node, s
    thrown_s: float = 0.0  # of it, the preempted runs' (their work is done again), s
    errors: list[str] = field(default_factory=list)  # each failed job's error, or the call's answer
    gaps: list[float] = field(default_factory=list)  # a node's generation's end to its next one's arrival, back to back
    jobs: int = 0
    seconds: float = 0.0

    @property
    def busy_share(self) -> float:
        return self.busy / self.up if self.up else 1.0


class Replay:
    def __init__(self, trace: tr.Trace, policy: str, workdir: Path, nodes: dict[str, ReplayNode]):
        self.trace = trace
        self.policy = policy
        self.workdir = workdir
        self.nodes = nodes
        self.day = Day()
        self.batch_queued = False  # the sampler's last look: a job not from the front door waits
        self.batch_ids: dict[str, list[str]] = {}  # sweep key -> its jobs (tasks and critiques)
        self.front_ids = 0
        self.front_jobs: list[tuple[str, str, float]] = []  # (job id, who, wait) of each call answered
        self.calls: list[dict] = []  # every call: job, who, sent (wall clock), wait, batch queued (for --keep)
        self.tasks: list[asyncio.Task] = []

    def config(self) -> tuple[list[dict], dict, dict, list[dict]]:
        lanes, unload, kept, preempts = POLICIES[self.policy]
        nodes = [
            {"name": name, "url": self.nodes[name].url, "rank": rank, "roles": ["task", "critique"], "model": model}
            for rank, (name, (model, _)) in enumerate(tr.NODES.items(), 1)
        ]
        router = {"unload": unload, "fair_share": lanes, "health_interval": "0.25s"}
        router["interactive_preempts"] = preempts
        front = {} if kept else {"max_keep_alive": "0s"}
        users = [
            dict({"name": who, "token": token(who), "role": "member"}, **({} if lanes else {"lanes": ["batch"]}))
            for who in PEOPLE
        ]
        return nodes, router, front, users

    async def run(self) -> Day:
        nodes, router_table, front, users = self.config()
        port = free_port()
        router = await LabRouter(
            self.workdir,
            nodes,
            self.workdir / f"replay-{self.policy}-{time.monotonic_ns()}.db",
            front=front or None,
            users=users,
            ollama_listen=f"127.0.0.1:{port}",
            **router_table,
        ).start()
        self.api, self.front = router.url, f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=300), connector=aiohttp.TCPConnector(limit=0)
            ) as self.session:
                await self._wait_ready()
                self.t0 = time.monotonic()
                self.wall = time.time() - self.t0  # monotonic -> wall clock, for --keep's record
                sampler = asyncio.create_task(self._sample())
                try:
                    for event in self.trace.events:
                        delay = self.t0 + event.at - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        self.tasks.append(asyncio.create_task(self._play(event)))
                    await asyncio.gather(*self.tasks)
                    await self._drain(120.0)
                finally:
                    sampler.cancel()
                    await asyncio.gather(sampler, return_exceptions=True)
                self.day.seconds = time.monotonic() - self.t0
                await self._account()
        finally:
            await router.stop()
        self.record = {
            "policy": self.policy,
            "database": str(router.database),
            "log": str(router.log),
            "calls": self.calls,
            "spans": {name: [(a + self.wall, e + self.wall) for a, e in n.spans] for name, n in self.nodes.items()},
        }
        self.day.loads = sum(n.loads for n in self.nodes.values())
        for node in self.nodes.values():  # back to back: the next job came within BACK_TO_BACK_S
            spans = sorted(node.spans)
            self.day.gaps += [
                arrived - end for (_, end), (arrived, _) in zip(spans, spans[1:]) if 0 <= arrived - end < BACK_TO_BACK_S
            ]
        return self.day

    # -- the day's parts ----------------------------------------------------------------------

    async def _play(self, event: tr.Event) -> None:
        if event.kind == "sweep":
            await self._sweep(event)
        elif event.kind in ("editor", "chat"):
            await self._burst(event)
        elif event.kind == "down":
            node = self.nodes[event.node]
            await node.stop()
            node.loaded.clear()  # it comes back with nothing loaded
        elif event.kind == "up":
            await self.nodes[event.node].start(self.nodes[event.node].port)

    def _auth(self, who: str) -> dict:
        return {"Authorization": f"Bearer {token(who)}"}

    async def _sweep(self, event: tr.Event) -> None:
        key = f"{event.who}@{event.at}"
        ids = self.batch_ids.setdefault(key, [])
        watch = []
        for i, (tokens, critiqued) in enumerate(zip(event.tokens, event.critiqued)):
            body = {"kind": "task", "prompt": f"{event.who} sweep item {i} ({tokens} tokens)", "model": event.model}
            async with self.session.post(self.api + "/api/jobs", json=body, headers=self._auth(event.who)) as resp:
                assert resp.status == 201, await resp.text()
                job = (await resp.json())["jobs"][0]
            ids.append(job["id"])
            if critiqued:
                watch.append(self._critique_when_done(job["id"], event.who, ids))
        await asyncio.gather(*watch)

    async def _critique_when_done(self, job_id: str, who: str, ids: list[str]) -> None:
        """A person's script fans a critique out once its task is done."""
        while True:
            async with self.session.get(f"{self.api}/api/jobs/{job_id}", headers=self._auth(who)) as resp:
                state = (await resp.json())["state"]
            if state not in ("queued", "running"):
                break
            await asyncio.sleep(0.1)
        if state != "done":
            return
        body = {"kind": "critique", "prompt": f"review the result of {job_id}", "parent": job_id}
        async with self.session.post(self.api + "/api/jobs", json=body, headers=self._auth(who)) as resp:
            assert resp.status == 201, await resp.text()
            ids.extend(j["id"] for j in (await resp.json())["jobs"])

    async def _burst(self, event: tr.Event) -> None:
        for i, call in enumerate(event.calls):
            if i:
                await asyncio.sleep(call.pause_s)
            body = {
                "model": event.model,
                "stream": True,
                "messages": [{"role": "user", "content": f"{event.kind} {event.at} {i} ({call.tokens} tokens)"}],
            }
            if event.kind == "editor":
                body["keep_alive"] = "5m"  # as Continue sends
            queued = self.batch_queued
            sent = time.monotonic()
            first = None
            ok = False
            why = "no answer"
            self.front_ids += 1
            try:
                async with self.session.post(
                    self.front + "/api/chat", json=body, headers=self._auth(event.who)
                ) as resp:
                    job_id = resp.headers.get("X-Gpuq-Job")
                    if resp.status == 200:
                        async for raw in resp.content:
                            line = raw.strip()
                            if not line:
                                continue
                            chunk = json.loads(line)
                            if "error" in chunk:
                                why = chunk["error"]
                                break
                            if first is None and chunk.get("message", {}).get("content"):
                                first = time.monotonic()
                            if chunk.get("done"):
                                ok = True
                    else:
                        why = f"{resp.status} {(await resp.read())[:200]!r}"
            except aiohttp.ClientError as exc:
                why = repr(exc)
            if not ok:
                self.day.failed += 1
                self.day.errors.append(f"{event.kind} call: {why}")
            self.calls.append(
                {
                    "job": job_id,
                    "who": event.who,
                    "kind": event.kind,
                    "sent": sent + self.wall,
                    "wait": None if first is None else first - sent,
                    "batch_queued": queued,
                }
            )
            if first is not None:
                wait = first - sent
                self.day.waits.append(wait)
                if job_id:
                    self.front_jobs.append((job_id, event.who, wait))
                if queued:
                    self.day.waits_batch_queued.append(wait)

    # -- watching -----------------------------------------------------------------------------

    async def _queue(self, limit: int = 200) -> dict:
        async with self.session.get(f"{self.api}/api/queue?limit={limit}", headers=self._auth(PEOPLE[0])) as resp:
            return await resp.json()

    async def _sample(self) -> None:
        while True:
            try:
                q = await self._queue()
            except (aiohttp.ClientError, ValueError):
                await asyncio.sleep(SAMPLE_S)
                continue
            waiting = [j for n in q["nodes"] for j in n["queued"]]
            self.batch_queued = any(not j.get("endpoint") for j in waiting)
            if q["queue_depth"]:
                waiting_on = {n["name"]: n["queued_count"] for n in q["nodes"]}
                for name, node in self.nodes.items():
                    if node._runner is None:  # down
                        continue
                    self.day.up += 1
                    if node.busy:
                        self.day.busy += 1
                    elif waiting_on.get(name):
                        self.day.idle_own += 1
                    else:
                        self.day.idle_elsewhere += 1
            await asyncio.sleep(SAMPLE_S)

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                q = await self._queue(0)
                if all(n["up"] for n in q["nodes"]):
                    return
            except (aiohttp.ClientError, ValueError):
                pass
            await asyncio.sleep(0.05)
        raise RuntimeError("the replay's nodes were not all up within 30 s")

    async def _drain(self, limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            q = await self._queue(0)
            if q["queue_depth"] == 0 and all(n["running"] is None for n in q["nodes"]):
                return
            await asyncio.sleep(0.1)

    async def _account(self) -> None:
        """Each batch job's end; failed and lost jobs (front-door calls counted as they ended)."""
        last = 0.0
        for ids in self.batch_ids.values():
            created, finished = [], []
            for job_id in ids:
                async with self.session.get(f"{self.api}/api/jobs/{job_id}", headers=self._auth(PEOPLE[0])) as resp:
                    job = await resp.json()
                self.day.jobs += 1
                if job["state"] == "failed":
                    self.day.failed += 1
                    self.day.errors.append(f"{job['kind']} on {job['node']}: {job.get('error')}")
                elif job["state"] != "done":
                    self.day.lost += 1
                created.append(_ts(job["created_at"]))
                for run in job.get("runs") or []:
                    if run.get("started_at") and run.get("finished_at"):
                        spent = _ts(run["finished_at"]) - _ts(run["started_at"])
                        self.day.batch_gpu_s += spent
                        self.day.thrown_s += spent if run["state"] == "preempted" else 0.0
                if job.get("finished_at"):
                    finished.append(_ts(job["finished_at"]))
            if finished:
                self.day.sweeps.append(max(finished) - min(created))
                last = max(last, max(finished))
        self.day.jobs += self.front_ids
        for job_id, who, wait in self.front_jobs:  # where each interactive call's wait went
            async with self.session.get(f"{self.api}/api/jobs/{job_id}", headers=self._auth(who)) as resp:
                job = await resp.json()
            if job.get("started_at"):
                queued = _ts(job["started_at"]) - _ts(job["created_at"])
                self.day.queued_s.append(queued)
                self.day.started_s.append(wait - queued)
        # The day's start on the router's wall clock: now minus how long the day has run.
        start_wall = time.time() - (time.monotonic() - self.t0)
        self.day.last_batch_s = last - start_wall if last else 0.0


def _ts(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def replay(
    seed: int, day_s: float, repeats: int, policies: list[str], workdir: Path, say=print, keep: bool = False
) -> dict[str, list[Day]]:
    """Every policy once per repeat (the order turned around each repeat), each on a fresh
    router and cold nodes."""
    trace = tr.generate(seed, day_s)
    results: dict[str, list[Day]] = {p: [] for p in policies}
    for rep in range(repeats):
        for policy in policies if rep % 2 == 0 else policies[::-1]:
            nodes = {}
            for name, (_, models) in tr.NODES.items():
                node = ReplayNode(
                    models=set(models),
                    script=Script(token_delay_s=tr.TOKEN_S, unload="delay", unload_delay_s=tr.UNLOAD_S),
                )
                await node.start()
                nodes[name] = node
            try:
                play = Replay(trace, policy, workdir, nodes)
                day = await play.run()
                if keep:  # each run's calls and spans beside its database and the router's log
                    (workdir / f"replay-{policy}-{rep + 1}.json").write_text(json.dumps(play.record))
            finally:
                for node in nodes.values():
                    await node.stop()
            results[policy].append(day)
            say(
                f"replay {policy} run {rep + 1}/{repeats}: interactive p50 {_p(day.waits, 50):.2f} s p95"
                f" {_p(day.waits, 95):.2f} s, sweeps median {_med(day.sweeps):.1f} s, busy {day.busy_share:.0%},"
                f" thrown away {day.thrown_s:.1f} of {day.batch_gpu_s:.1f} GPU-s, loads {day.loads}, failed {day.failed},"
                f" lost {day.lost}, {day.seconds:.0f} s"
            )
    return results


def _p(xs: list[float], q: float) -> float:
    return percentile(xs, q) if xs else float("nan")


def _med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def target_wait_s() -> float:
    """One cold load of the editor's model plus one second, both at the replay's scale."""
    return tr.LOAD_S[tr.CODER] + 1.0 / tr.SCALE


async def replay_section(bench: Bench) -> None:
    day_s = DAY_S
    repeats = 1 if bench.quick else 3
    results = await replay(bench.seed, day_s, repeats, list(POLICIES), bench.workdir, bench.say)
    target = target_wait_s()
    for policy, days in results.items():
        label = LABELS[policy]
        k = policy.replace("+", "_").replace("-", "_")
        waits = bench.metric(f"replay_{k}_wait", f"replay, {label}: interactive wait (sent to first token)", "ms", "ms")
        queued = bench.metric(
            f"replay_{k}_wait_q",
            f"  replay {policy}: interactive wait, calls sent while batch work was queued",
            "ms",
            "ms",
            f"p95 <= {target * 1000:.0f} ms (a load + 1 s, scaled)",
        )
        split = {
            part: bench.metric(
                f"replay_{k}_wait_{part}", f"    replay {policy}: of each interactive wait, {what}", "ms", "ms"
            )
            for part, what in (
                ("queued", "queued for its node (submit to claim)"),
                ("started", "claim to first token (its load, if cold)"),
            )
        }
        gaps = bench.metric(
            f"replay_{k}_gap",
            f"    replay {policy}: a node's gap between back-to-back jobs"
            " (a generation's end to the next one's request)",
            "ms",
            "ms",
        )
        sweeps = bench.metric(
            f"replay_{k}_sweep",
            f"  replay {policy}: a sweep's completion (first submit to its last job done)",
            "ms",
            "ms",
        )
        last = bench.metric(
            f"replay_{k}_last", f"  replay {policy}: the day's last batch job done, from its start", "s", "count"
        )
        idle = {
            part: bench.metric(
                f"replay_{k}_idle_{part}",
                f"    replay {policy}: GPUs idle while work waits, {what}",
                "ratio",
                "ratio",
                better="lower",
            )
            for part, what in (
                ("own", "work in their own queue (between jobs)"),
                ("elsewhere", "their own queue empty (work waits on other nodes)"),
            )
        }
        busy = bench.metric(
            f"replay_{k}_busy",
            f"  replay {policy}: GPUs busy while work waits",
            "ratio",
            "ratio",
            ">= 0.90x",
            better="higher",
        )
        thrown = bench.metric(
            f"replay_{k}_thrown",
            f"  replay {policy}: batch GPU time thrown away (preempted runs, of all batch runs' time)",
            "ratio",
            "ratio",
            better="lower",
        )
        loads = bench.metric(f"replay_{k}_loads", f"  replay {policy}: cold loads", "loads", "count")
        failed = bench.metric(f"replay_{k}_failed", f"  replay {policy}: jobs failed", "jobs", "count")
        lost = bench.metric(
            f"replay_{k}_lost", f"  replay {policy}: jobs lost (neither done nor failed)", "jobs", "count", "== 0"
        )
        for day in days:
            waits.add_run([w * 1000 for w in day.waits])
            queued.add_run([w * 1000 for w in day.waits_batch_queued] or [0.0])
            split["queued"].add_run([w * 1000 for w in day.queued_s])
            split["started"].add_run([w * 1000 for w in day.started_s])
            sweeps.add_run([s * 1000 for s in day.sweeps])
            last.add_run(day.last_batch_s)
            busy.add_run(day.busy_share)
            gaps.add_run([g * 1000 for g in day.gaps] or [0.0])
            idle["own"].add_run(day.idle_own / day.up if day.up else 0.0)
            idle["elsewhere"].add_run(day.idle_elsewhere / day.up if day.up else 0.0)
            thrown.add_run(day.thrown_s / day.batch_gpu_s if day.batch_gpu_s else 0.0)
            loads.add_run(day.loads)
            failed.add_run(day.failed)
            lost.add_run(day.lost)
        queued.met = queued.summary()["p95"] <= target * 1000
        busy.met = min(busy.per_run) >= 0.90
        lost.met = max(lost.per_run) == 0


# -- step by step (--steps DIR: a --keep run's records) -----------------------------------------

LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) gpuq \w+ job=(\S+) node=(\S+) (.*)$")


def _log_times(path: Path) -> dict[tuple[str, str], float]:
    """(preempted job, the call that preempted it) -> when its worker logged the abort."""
    seen: dict[tuple[str, str], float] = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        m = LOG_LINE.match(line)
        if m and m.group(4).startswith("aborted: preempted by "):
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC).timestamp()
            seen.setdefault((m.group(2), m.group(4).split()[3]), at)
    return seen


def _steps_of(record: dict) -> tuple[list[dict], list[dict]]:
    """Each answered call's steps and each back-to-back gap's steps, from one run's database,
    router log and spans (wall clock, s)."""
    import sqlite3

    db = sqlite3.connect(record["database"])
    db.row_factory = sqlite3.Row
    runs = [
        dict(r)
        for r in db.execute(
            "SELECT run.*, job.lane, job.endpoint FROM run JOIN job ON job.id = run.job_id ORDER BY run.id"
        )
    ]
    for r in runs:
        for k in ("started_at", "work_done_at", "finished_at"):
            r[k] = _ts(r[k]) if r[k] else None
    logged = _log_times(Path(record["log"]))
    spans = {n: sorted(s) for n, s in record["spans"].items()}

    def arrival(node: str, after: float) -> tuple[float, float] | None:
        return next(((a, e) for a, e in spans.get(node, []) if a >= after - 0.002), None)

    calls = []
    for c in record["calls"]:
        if not c["job"] or c["wait"] is None:
            continue
        job = db.execute("SELECT created_at FROM job WHERE id = ?", (c["job"],)).fetchone()
        mine = [r for r in runs if r["job_id"] == c["job"]]
        if job is None or not mine:
            continue
        run = mine[0]
        node, claim, created = run["node"], run["started_at"], _ts(job["created_at"])
        first = c["sent"] + c["wait"]
        step = {
            "call": c["job"],
            "node": node,
            "wait": c["wait"],
            "batch_queued": c["batch_queued"],
            "sent_to_created": created - c["sent"],
        }
        pre = db.execute(
            "SELECT job_id, at FROM event WHERE reason LIKE ? AND to_state = 'queued' AND from_state = 'running'",
            (f"%preempted for interactive call {c['job']}%",),
        ).fetchone()
        before = [
            r
            for r in runs
            if r["node"] == node
            and r["id"] != run["id"]
            and r["finished_at"]
            and r["started_at"] < created <= r["finished_at"] + 0.001
        ]
        if pre is not None:
            at = _ts(pre["at"])
            step["how"] = "preempted a batch job"
            step["created_to_preempt"] = at - created
            aborted = logged.get((pre["job_id"], c["job"]))
            if aborted is not None:
                step["preempt_to_abort_logged"] = aborted - at
                step["abort_logged_to_claim"] = claim - aborted
            step["preempt_to_claim"] = claim - at
        elif before:
            prev = before[-1]
            step["how"] = f"behind a running {prev['lane']} job ({prev['state']})"
            step["created_to_prev_finished"] = prev["finished_at"] - created
            step["prev_finished_to_claim"] = claim - prev["finished_at"]
        else:
            step["how"] = "node idle"
            step["created_to_claim"] = claim - created
        got = arrival(node, claim)
        if got is not None and got[0] < first:
            step["claim_to_request"] = got[0] - claim
            step["request_to_first_token"] = first - got[0]
        step["queued"] = claim - created
        calls.append(step)

    gaps = []
    by_node: dict[str, list[dict]] = {}
    for r in runs:
        by_node.setdefault(r["node"], []).append(r)
    for node, rs in by_node.items():
        for r1, r2 in zip(rs, rs[1:]):
            if r1["work_done_at"] is None or r1["state"] != "done":
                continue
            s1 = next(((a, e) for a, e in spans.get(node, []) if a >= r1["started_at"] - 0.002), None)
            s2 = arrival(node, r2["started_at"])
            if s1 is None or s2 is None or not 0 <= s2[0] - s1[1] < BACK_TO_BACK_S:
                continue
            gaps.append(
                {
                    "node": node,
                    "same_model": normalize(r1["model"]) == normalize(r2["model"]),
                    "gap": s2[0] - s1[1],
                    "stream_end_to_work_done": r1["work_done_at"] - s1[1],
                    "work_done_to_finished": r1["finished_at"] - r1["work_done_at"],
                    "finished_to_next_claim": r2["started_at"] - r1["finished_at"],
                    "claim_to_request": s2[0] - r2["started_at"],
                }
            )
    db.close()
    return calls, gaps


def normalize(model: str) -> str:
    return model if ":" in model else model + ":latest"


def steps(workdirs: list[Path], share: float = 0.05) -> None:
    """The slowest calls (sent while batch work was queued) and the gaps between back-to-back
    jobs, step by step, pooled over every kept run in `workdirs`: each slow call's steps, then
    each step's median and p95 in ms."""
    calls, gaps = [], []
    for workdir in workdirs:
        for path in sorted(workdir.glob("replay-*.json")):
            c, g = _steps_of(json.loads(path.read_text()))
            calls += c
            gaps += g
    queued = sorted((c for c in calls if c["batch_queued"]), key=lambda c: -c["wait"])
    slow = queued[: max(1, round(len(queued) * share))]
    print(f"{len(queued)} calls sent while batch work was queued; the slowest {len(slow)} ({share:.0%}), ms:")
    for c in slow:
        parts = ", ".join(f"{k} {v * 1000:.0f}" for k, v in c.items() if isinstance(v, float) and k not in ("wait",))
        print(f"  {c['call']} on {c['node']}: wait {c['wait'] * 1000:.0f}, {c['how']}: {parts}")
    hows: dict[str, int] = {}
    for c in queued:
        if c["wait"] > target_wait_s():
            hows[c["how"]] = hows.get(c["how"], 0) + 1
    print(f"over the target ({target_wait_s():.2f} s): {sum(hows.values())} of {len(queued)}: {hows}")
    for how in sorted({c["how"] for c in slow}):
        group = [c for c in slow if c["how"] == how]
        keys = [k for k in group[0] if isinstance(group[0][k], float)]
        print(
            f"  slowest, {how} ({len(group)}): "
            + ", ".join(f"{k} {_med([c[k] * 1000 for c in group if k in c]):.0f}" for k in keys)
        )
    for same in (True, False):
        gs = [g for g in gaps if g["same_model"] == same]
        if not gs:
            continue
        print(f"gaps between back-to-back jobs, {'the same' if same else 'another'} model ({len(gs)}), ms:")
        for k in (
            "gap",
            "stream_end_to_work_done",
            "work_done_to_finished",
            "finished_to_next_claim",
            "claim_to_request",
        ):
            xs = [g[k] * 1000 for g in gs]
            print(f"  {k}: median {_med(xs):.1f}, p95 {_p(xs, 95):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.replay", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--day", type=float, default=DAY_S, help="the day's length in replay seconds")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep each run's database, router log and a JSON of its"
        " calls (replay-POLICY-N.json) in the work directory, for --steps)",
    )
    parser.add_argument(
        "--steps",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="read a --keep run's work directory: the slowest"
        " 5%% of the calls and the gaps between jobs, step by step (nothing is replayed)",
    )
    args = parser.parse_args()
    if args.steps:
        steps(args.steps)
        return
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = set(policies) - set(POLICIES)
    if unknown:
        parser.error(f"unknown policies: {', '.join(sorted(unknown))}; known: {', '.join(POLICIES)}")
    workdir = Path(tempfile.mkdtemp(prefix="gpuq-replay-"))
    trace = tr.generate(args.seed, args.day)
    print(
        f"seed {args.seed}, a {args.day:g} s day: {trace.count('task')} tasks, {trace.count('critique')} critiques"
        f" (fanned out), {trace.count('editor')} editor calls, {trace.count('chat')} chat calls, {tr.DOWN_NODE}"
        f" down for {trace.hour_s:g} s"
    )
    try:
        results = asyncio.run(replay(args.seed, args.day, args.repeats, policies, workdir, keep=args.keep))
    except BaseException:
        print(f"replay failed; its databases and logs are kept in {workdir}")
        raise
    if args.keep:
        print(f"kept: {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    target = target_wait_s()
    print(
        f"\n| policy | interactive wait p50 / p95 (s) | p95 while batch queued (target <= {target:.2f} s) |"
        " of which queued / claim to first token, p95 (s) | sweep completion median (s) | last batch job (s) | GPUs busy while work waits (>= 90%) |"
        " gap between back-to-back jobs p50 / p95 (ms) | cold loads | failed | lost |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for policy, days in results.items():
        waits = [w for d in days for w in d.waits]
        wq = [w for d in days for w in d.waits_batch_queued]
        print(
            f"| {policy} | {_p(waits, 50):.2f} / {_p(waits, 95):.2f} | {_p(wq, 95):.2f} ({len(wq)} calls) |"
            f" {_p([w for d in days for w in d.queued_s], 95):.2f} / {_p([w for d in days for w in d.started_s], 95):.2f} |"
            f" {_med([s for d in days for s in d.sweeps]):.1f} | {_med([d.last_batch_s for d in days]):.1f} |"
            f" {_med([d.busy_share for d in days]):.0%}; {_med([d.idle_own / max(d.up, 1) for d in days]):.0%} /"
            f" {_med([d.idle_elsewhere / max(d.up, 1) for d in days]):.0%} |"
            f" {_p([g * 1000 for d in days for g in d.gaps], 50):.0f} / {_p([g * 1000 for d in days for g in d.gaps], 95):.0f} | {_med([d.loads for d in days]):g} |"
            f" {_med([d.failed for d in days]):g} | {_med([d.lost for d in days]):g} |"
        )
    for policy, days in results.items():
        for error in sorted({e for d in days for e in d.errors}):
            print(f"{policy}, failed: {error}")


if __name__ == "__main__":
    main()
