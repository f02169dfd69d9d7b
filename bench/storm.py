"""The autocomplete storm (issue 36): editors (Continue, Twinny, llama.vscode) send a
fill-in-the-middle call at each pause in typing and abandon most of them as the person types on.
5 editors, a call each 250-400 ms, 70% abandoned by the client 50-300 ms after it was sent, on
warm simulated nodes (no load; 250 tokens/s, 80 tokens: a completion streams for about 320 ms),
through the front door, and the same schedule straight to the nodes in the same repeat.

Measured: an abandoned call's node request ended after the client left (both clocks
CLOCK_MONOTONIC: the bench's close, and the simulator's handler ending, which it does at its next
token write, within one token's 4 ms, as a real Ollama stops at its next token); the p95 first
token of the kept calls, through the front door and straight to a free node; the router's CPU
per call; the bytes the router writes per abandoned call (a storm of abandoned calls only, its
WAL checkpointed before and after, as bench/written.py counts a job); and that nothing is lost:
every call is one job, ended (kept: done; abandoned: cancelled, or done when it ended before the
client left), and no node still runs a request once the storm is over."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import aiohttp

from . import peers
from .front import _idle, _wait_front
from .procs import Fakes, Router, cpu_s, free_port, node_table
from .stats import percentile
from .written import checkpoint, write_bytes

if TYPE_CHECKING:
    from .core import Bench

MODEL = "qwen2.5-coder:1.5b"  # a coder model whose template has .Suffix: it takes fill-in-the-middle
EDITORS = 5
NODES = 10  # enough free nodes that a kept call never waits behind another: its first token is the router's
GAP_S = (0.25, 0.40)  # typing between two calls of one editor
ABANDONED = 0.7
ABANDON_S = (0.05, 0.30)  # how long an abandoned call lives before its editor drops it
TOKENS = 80
PACE_S = 0.004  # 250 tokens/s: a small coder model on a fast GPU
PREFIX = "def export(rows):\n    " + "retries = budget(rows)  # keep trying\n    " * 150  # ~6 KB of the file above
SUFFIX = "\n    return rows\n" + "# the rest of the file\n" * 90  # ~2 KB below the cursor


@dataclass
class Call:
    editor: int
    n: int
    start_s: float  # from the storm's start
    abandon_s: float | None  # None: kept (read to the end)

    @property
    def tag(self) -> str:
        return f"# storm e{self.editor} c{self.n}"


@dataclass
class Outcome:
    call: Call
    sent: float
    first: float | None = None  # the first token at the client
    left: float | None = None  # when the client dropped it (abandoned, before its end)
    ended: bool = False  # the whole reply was read
    node: str = ""


def schedule(seed: int, seconds: float) -> list[Call]:
    rng = random.Random(seed)
    calls = []
    for editor in range(EDITORS):
        t, n = rng.uniform(0, GAP_S[1]), 0
        while t < seconds:
            abandon = rng.uniform(*ABANDON_S) if rng.random() < ABANDONED else None
            calls.append(Call(editor, n, t, abandon))
            t += rng.uniform(*GAP_S)
            n += 1
    return sorted(calls, key=lambda c: c.start_s)


def body(call: Call) -> dict:
    return {
        "model": MODEL,
        "prompt": f"{call.tag}\n{PREFIX}",
        "suffix": SUFFIX,
        "stream": True,
        "raw": False,
        "keep_alive": "5m",  # as Continue sends it: the model stays warm between calls
        "options": {"temperature": 0.01, "num_predict": TOKENS},
    }


async def one_call(session: aiohttp.ClientSession, url: str, call: Call) -> Outcome:
    """The call as an editor makes it: streamed, read to the end if kept, else dropped (the
    connection closed) `abandon_s` after it was sent, wherever it is then."""
    out = Outcome(call, time.monotonic())
    holder: dict = {}

    async def run() -> None:
        async with session.post(url + "/api/generate", json=body(call)) as resp:
            holder["resp"] = resp
            if resp.status != 200:
                raise RuntimeError(f"storm call refused: {resp.status} {(await resp.text())[:200]}")
            async for raw in resp.content:
                if out.first is None and raw.strip() and json.loads(raw).get("response"):
                    out.first = time.monotonic()
        out.ended = True

    task = asyncio.create_task(run())
    if call.abandon_s is None:
        await task
        return out
    done, _ = await asyncio.wait([task], timeout=call.abandon_s)
    if done:
        task.result()  # it ended before the editor would have dropped it
        return out
    out.left = time.monotonic()
    task.cancel()
    resp = holder.get("resp")
    if resp is not None:
        resp.close()  # the connection goes: what the router (or the node) sees as the client leaving
    try:
        await task
    except asyncio.CancelledError:
        pass
    return out


class FreeNodes:
    """Straight to the nodes, a call goes to the first free one by rank (as gpuq places it)."""

    def __init__(self, urls: dict[str, str]):
        self.urls = urls
        self.busy: set[str] = set()

    def url_for(self):
        name = next((n for n in self.urls if n not in self.busy), None) or min(self.urls)
        self.busy.add(name)
        return self.urls[name], lambda: self.busy.discard(name)


async def storm(session, calls: list[Call], url_for) -> list[Outcome]:
    """Every call at its time; `url_for()` -> (url, release) for each."""
    start = time.monotonic()

    async def at(call: Call) -> Outcome:
        await asyncio.sleep(max(call.start_s - (time.monotonic() - start), 0))
        url, release = url_for()
        try:
            return await one_call(session, url, call)
        finally:
            release()

    return await asyncio.gather(*(at(c) for c in calls))


async def spans_by_tag(fakes: Fakes) -> dict[str, tuple[float, float]]:
    found = {}
    for name in fakes.urls:
        for tag, arrive, end in (await fakes.call("spans", name))["spans"]:
            found[tag] = (arrive, end)
    return found


def cancel_latencies(outcomes: list[Outcome], spans: dict[str, tuple[float, float]]) -> tuple[list[float], int, int]:
    """(ms from the client leaving to its node request ending, for each abandoned call that had
    reached a node; how many never reached one; how many reached one only after the client left)."""
    ms, never, late = [], 0, 0
    for o in outcomes:
        if o.left is None:
            continue
        span = spans.get(o.call.tag)
        if span is None:
            never += 1
            continue
        if span[0] > o.left:
            late += 1
        ms.append((span[1] - o.left) * 1000)
    return ms, never, late


def kept_ttfts(outcomes: list[Outcome]) -> list[float]:
    return [(o.first - o.sent) * 1000 for o in outcomes if o.call.abandon_s is None and o.first is not None]


def editors_p95(outcomes: list[Outcome]) -> list[float]:
    """Each editor's kept calls' first token p95, the five overlapping (one list per editor)."""
    by_editor: dict[int, list[Outcome]] = {}
    for o in outcomes:
        by_editor.setdefault(o.call.editor, []).append(o)
    return sorted(percentile(kept_ttfts(calls), 95) for calls in by_editor.values() if kept_ttfts(calls))


async def job_ids(session, router: Router) -> set[str]:
    async with session.get(router.url + "/api/jobs?limit=10000") as resp:
        return {j["id"] for j in (await resp.json())["jobs"]}


async def nothing_lost(
    session, router: Router, fakes: Fakes, outcomes: list[Outcome], before: set[str]
) -> tuple[int, int]:
    """(problems, unread): every kept call is one job, done, read to its end; every call its
    client left is one job, cancelled (or done: it ended as its client left), or none when the
    client left before the router had read its request (`unread`, not a problem: nothing was
    asked of gpuq); no job is left queued or running, no node runs a request."""
    await _idle(session, router)
    async with session.get(router.url + "/api/jobs?limit=10000") as resp:
        jobs = [j for j in (await resp.json())["jobs"] if j["id"] not in before]
    by_tag: dict[str, list[dict]] = {}
    for job in jobs:
        by_tag.setdefault(job["prompt_excerpt"].split("\n", 1)[0], []).append(job)
    problems = unread = 0
    for o in outcomes:
        found = by_tag.get(o.call.tag, [])
        if len(found) > 1:
            problems += len(found) - 1  # one call, one job
        if not found:
            if o.left is None:
                problems += 1  # a kept call with no job
            else:
                unread += 1
            continue
        state = found[0]["state"]
        if o.left is None and (state != "done" or not o.ended):
            problems += 1
        elif o.left is not None and state not in ("cancelled", "done"):
            problems += 1
    problems += sum(1 for j in jobs if j["state"] in ("queued", "running"))
    for name in fakes.urls:
        problems += (await fakes.call("status", name))["in_flight"]
    return problems, unread


async def storm_section(bench: Bench) -> None:
    nodes = {f"s{i:02d}": MODEL for i in range(1, NODES + 1)}
    fakes = await Fakes(nodes, bench.workdir / "storm-fakes.log").start()
    for name in nodes:
        await fakes.call("script", name, tokens=TOKENS, delay=PACE_S)
    port = free_port()
    table = [node_table(n, fakes.urls[n], rank, MODEL, roles=("task",)) for rank, n in enumerate(nodes, 1)]
    router = await Router(bench.workdir, table, bench.workdir / "storm.db", ollama_listen=f"127.0.0.1:{port}").start()
    front_url = f"http://127.0.0.1:{port}"
    seconds = 8.0 if bench.quick else 20.0
    m = rows(bench)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            await _wait_front(session, front_url, len(nodes))
            await one_call(session, front_url, Call(99, 0, 0, None))  # the router's first call, outside the count
            for rep in range(bench.repeats):
                calls = schedule(bench.seed * 1000 + rep, seconds)
                for name in nodes:
                    await fakes.call("reset", name)
                d_out = await storm(session, calls, FreeNodes(fakes.urls).url_for)
                d_cancel, _, _ = cancel_latencies(d_out, await spans_by_tag(fakes))
                for name in nodes:
                    await fakes.call("reset", name)
                await _idle(session, router)
                before = await job_ids(session, router)
                cpu = cpu_s(router.pid)
                f_out = await storm(session, calls, lambda: (front_url, lambda: None))
                await _idle(session, router)
                cpu_per_call = (cpu_s(router.pid) - cpu) / len(calls) * 1000
                f_cancel, never, late = cancel_latencies(f_out, await spans_by_tag(fakes))
                lost, unread = await nothing_lost(session, router, fakes, f_out, before)
                ttft_f, ttft_d = kept_ttfts(f_out), kept_ttfts(d_out)
                m["calls"].add_run(len(calls))
                m["abandoned"].add_run(sum(1 for o in f_out if o.left is not None))
                m["cancel"].add_run(f_cancel)
                m["cancel_direct"].add_run(d_cancel)
                m["never"].add_run(never)
                m["late"].add_run(late)
                m["ttft"].add_run(ttft_f)
                m["ttft_direct"].add_run(ttft_d)
                m["ttft_p95_diff"].add_run(percentile(ttft_f, 95) - percentile(ttft_d, 95))
                editors_f, editors_d = editors_p95(f_out), editors_p95(d_out)
                m["editor_best"].add_run(editors_f[0])
                m["editor_worst"].add_run(editors_f[-1])
                m["editor_worst_diff"].add_run(editors_f[-1] - editors_d[-1])
                m["cpu"].add_run(cpu_per_call)
                m["lost"].add_run(lost)
                m["unread"].add_run(unread)
                bench.say(
                    f"storm run {rep + 1}/{bench.repeats}: {len(calls)} calls, cancel p95 "
                    f"{percentile(f_cancel, 95):.1f} ms (direct {percentile(d_cancel, 95):.1f}), kept first token p95 "
                    f"{percentile(ttft_f, 95):.1f} ms (direct {percentile(ttft_d, 95):.1f}), CPU/call "
                    f"{cpu_per_call:.2f} ms, lost {lost}"
                )
            await written_per_abandoned_call(bench, session, router, front_url, m)
    finally:
        await router.stop()
        await fakes.stop()


async def written_per_abandoned_call(bench: Bench, session, router: Router, front_url: str, m: dict) -> None:
    """A storm of abandoned calls only: the router's bytes written (its write_bytes, less its
    log's growth, plus the checkpoint that copies their pages into the database) per call."""
    count = 20 if bench.quick else 60
    for rep in range(max(bench.repeats // 2, 1)):
        await _idle(session, router)
        checkpoint(router.database)
        log_size, before = router.log.stat().st_size, write_bytes(router.pid)
        calls = [Call(7, n, n * 0.3, 0.15) for n in range(count)]
        outs = await storm(session, calls, lambda: (front_url, lambda: None))
        await _idle(session, router)
        by_router = write_bytes(router.pid) - before - (router.log.stat().st_size - log_size)
        total = by_router + checkpoint(router.database)
        left = sum(1 for o in outs if o.left is not None)
        m["written"].add_run(total / max(left, 1) / 1024)
        bench.say(f"storm written run {rep + 1}: {total / max(left, 1) / 1024:.1f} KB per abandoned call ({left})")
    m["request"].add_run(len(json.dumps(body(Call(0, 0, 0, None)))) / 1024)
    # Where those bytes come from: a few abandoned calls, their WAL counted (the queue idle,
    # the WAL emptied first, too few pages for an automatic checkpoint to restart it).
    for _ in range(max(bench.repeats // 2, 1)):
        await _idle(session, router)
        peers.restart_wal(router.database)
        few = [Call(8, n, n * 0.3, 0.15) for n in range(5)]
        outs = await storm(session, few, lambda: (front_url, lambda: None))
        await _idle(session, router)
        commits, frames, page = wal_frames(router.database)
        left = max(sum(1 for o in outs if o.left is not None), 1)
        m["commits"].add_run(commits / left)
        m["pages"].add_run(frames / left)
        m["page_kb"].add_run(frames * page / left / 1024)
        owners = frame_owners(router.database)
        for group in PAGE_GROUPS:
            m["pages_" + group].add_run(owners.get(group, 0) / left)
        bench.say("storm pages per abandoned call: " + ", ".join(f"{g} {n / left:.1f}" for g, n in owners.items()))


def wal_frames(database) -> tuple[int, int, int]:
    """(commits, frames, page size) in the WAL since it last restarted (bench/peers.py counts
    commits the same way): every transaction writes each page it changed, whole, as a frame."""
    from pathlib import Path

    data = Path(str(database) + "-wal").read_bytes()
    page = int.from_bytes(data[8:12], "big")
    salt, size = data[16:24], 24 + page
    commits = frames = 0
    offset = 32
    while offset + size <= len(data) and data[offset + 8 : offset + 16] == salt:
        commits += int.from_bytes(data[offset + 4 : offset + 8], "big") != 0
        frames += 1
        offset += size
    return commits, frames, page


# What a WAL frame's page holds, as the database stands after the calls (dbstat): the job's row
# with its overflow pages (its 6 KB prompt and 8.6 KB request, rewritten whole at each change of
# state), the job table's indexes, the events, the run (its row, indexes, output), the header
# and free-list pages (an overflow chain rewritten frees its old pages), and the rest.
PAGE_GROUPS = ("job_row", "job_indexes", "events", "run", "header_free", "other")


def page_group(name: str | None) -> str:
    if name is None or name == "sqlite_schema":
        return "header_free"
    if name == "job":
        return "job_row"
    if name.startswith(("job_", "sqlite_autoindex_job")):
        return "job_indexes"
    if name.startswith("event"):
        return "events"
    if name.startswith("run"):
        return "run"
    return "other"


def frame_owners(database) -> dict[str, int]:
    """The WAL's frames since it last restarted, counted by page_group of their page."""
    import sqlite3
    from pathlib import Path

    data = Path(str(database) + "-wal").read_bytes()
    page = int.from_bytes(data[8:12], "big")
    salt, size = data[16:24], 24 + page
    numbers, offset = [], 32
    while offset + size <= len(data) and data[offset + 8 : offset + 16] == salt:
        numbers.append(int.from_bytes(data[offset : offset + 4], "big"))
        offset += size
    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        owner = dict(db.execute("SELECT pageno, name FROM dbstat").fetchall())
    finally:
        db.close()
    counts: dict[str, int] = {}
    for number in numbers:
        group = page_group(owner.get(number))
        counts[group] = counts.get(group, 0) + 1
    return counts


def rows(bench: Bench) -> dict:
    label = f"{EDITORS} editors, a call each {GAP_S[0] * 1000:.0f}-{GAP_S[1] * 1000:.0f} ms, {ABANDONED:.0%} abandoned"
    return {
        "calls": bench.metric("storm_calls", f"autocomplete storm ({label}): calls per run", "calls", "count"),
        "abandoned": bench.metric("storm_abandoned", "  of which the client left mid-call", "calls", "count"),
        "cancel": bench.metric(
            "storm_cancel",
            "  abandoned call: client left -> its node request ended, through the front door",
            "ms",
            "ms",
            "p95 <= 20 ms",
        ),
        "cancel_direct": bench.metric(
            "storm_cancel_direct", "    the same, the call straight to the node (the node's own stop)", "ms", "ms"
        ),
        "never": bench.metric("storm_never", "    abandoned while waiting: never sent to a node", "calls", "count"),
        "late": bench.metric("storm_late", "    sent to its node only after the client left", "calls", "count"),
        "ttft": bench.metric("storm_ttft", "  kept call: first token, through the front door", "ms", "ms"),
        "ttft_direct": bench.metric("storm_ttft_direct", "    the same calls straight to a free node", "ms", "ms"),
        "ttft_p95_diff": bench.metric(
            "storm_ttft_p95_diff", "  kept call: first token p95, front door - direct (same run)", "ms", "ms", "<= 5 ms"
        ),
        "editor_best": bench.metric(
            "storm_editor_best",
            "  the 5 overlapping editors: kept calls' first token p95, the best editor's",
            "ms",
            "ms",
        ),
        "editor_worst": bench.metric(
            "storm_editor_worst", "    the worst editor's (each editor's own kept calls)", "ms", "ms"
        ),
        "editor_worst_diff": bench.metric(
            "storm_editor_worst_diff", "    the worst editor's, front door - direct (same run)", "ms", "ms", "<= 5 ms"
        ),
        "cpu": bench.metric("storm_cpu", "  router CPU per call (submit to end, all calls)", "ms", "ms"),
        "written": bench.metric(
            "storm_written", "  bytes written per abandoned call (WAL + database, checkpointed)", "KB", "mb", "<= 2 KB"
        ),
        "commits": bench.metric(
            "storm_commits", "    durable commits per abandoned call (counted in the WAL)", "commits", "count"
        ),
        "pages": bench.metric(
            "storm_pages",
            "    pages written per abandoned call (WAL frames: each changed page, whole)",
            "pages",
            "count",
        ),
        **{
            "pages_" + group: bench.metric(
                "storm_pages_" + group, f"      of which {words} (pages per abandoned call)", "pages", "count"
            )
            for group, words in zip(
                PAGE_GROUPS,
                (
                    "the job's row and its overflow (prompt and request)",
                    "the job table's indexes",
                    "events and their indexes",
                    "the run: its row, indexes, output",
                    "the header and free-list pages",
                    "the rest (node counts)",
                ),
                strict=True,
            )
        },
        "page_kb": bench.metric(
            "storm_page_kb", "    those pages, before the checkpoint copies them again", "KB", "mb"
        ),
        "request": bench.metric(
            "storm_request", "    the call's request as sent (8 KB of context: prefix and suffix)", "KB", "mb"
        ),
        "unread": bench.metric(
            "storm_unread",
            "    left before the router had read the request: no job (nothing asked of gpuq)",
            "calls",
            "count",
        ),
        "lost": bench.metric(
            "storm_lost", "  calls lost or unended, nodes left running (0: none)", "count", "count", "0"
        ),
    }


def judge(metrics: dict) -> None:
    def summary(key: str) -> dict | None:
        return metrics[key].summary() if key in metrics and metrics[key].pooled else None

    for key, ok in (
        ("storm_cancel", lambda s: s["p95"] <= 20.0),
        ("storm_ttft_p95_diff", lambda s: s["median"] <= 5.0),
        ("storm_editor_worst_diff", lambda s: s["median"] <= 5.0),
        ("storm_written", lambda s: s["median"] <= 2.0),
        ("storm_lost", lambda s: s["max"] == 0),
    ):
        found = summary(key)
        if found is not None:
            metrics[key].met = bool(ok(found))


if __name__ == "__main__":  # `python -m bench.storm [--quick]`: this section alone, its rows printed
    import sys
    import tempfile
    from pathlib import Path

    from .core import Bench
    from .stats import table

    async def alone() -> None:
        bench = Bench("--quick" in sys.argv, {"storm"}, Path(tempfile.mkdtemp(prefix="gpuq-storm-")))
        await storm_section(bench)
        judge(bench.metrics)
        print(table(list(bench.metrics.values())))
        print({k: statistics.median(v.pooled) for k, v in bench.metrics.items() if v.pooled})

    asyncio.run(alone())
