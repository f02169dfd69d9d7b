"""The front door's rows (issue 14), each beside the same call made straight to the simulator in
the same run: the first token through `router.ollama_listen` minus direct on an idle node, and
the tokens per second relayed to 1 and to 20 concurrent clients (20 nodes of one model, so each
client's job runs at once on a node of its own) at a real GPU's pace and unpaced."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import time
from typing import TYPE_CHECKING

import aiohttp

from .procs import QUIET_S, Fakes, Router, cpu_s, first_stream_line, free_port, node_table

if TYPE_CHECKING:
    from .core import Bench

MODEL = "qwen3-coder:30b"
CLIENTS = 20
PACE_S = 0.005  # 200 tokens/s per stream: a fast GPU on a small model


async def _stream(session: aiohttp.ClientSession, url: str, prompt: str) -> tuple[float, list[float]]:
    """POST /api/chat streamed; (when it was sent, the arrival time of each token)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": True}
    arrivals = []
    sent = time.monotonic()
    async with session.post(url + "/api/chat", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.strip()
            if not line:
                continue
            chunk = json.loads(line)
            if "error" in chunk:
                raise RuntimeError(f"stream failed: {chunk['error']}")
            if chunk.get("message", {}).get("content"):
                arrivals.append(time.monotonic())
    return sent, arrivals


def _rate(arrivals: list[float]) -> float:
    return (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])


async def _idle(session: aiohttp.ClientSession, router: Router, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        async with session.get(router.url + "/api/queue?limit=0") as resp:
            body = await resp.json()
        if all(n["queued_count"] == 0 and n["running"] is None for n in body["nodes"]):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the router's nodes did not drain within {limit_s}s")


async def front_section(bench: Bench) -> None:
    nodes = {f"f{i:02d}": MODEL for i in range(1, CLIENTS + 1)}
    fakes = await Fakes(nodes, bench.workdir / "front-fakes.log").start()
    port = free_port()
    table = [node_table(name, fakes.urls[name], rank, MODEL, roles=("task",)) for rank, name in enumerate(nodes, 1)]
    router = await Router(bench.workdir, table, bench.workdir / "front.db", ollama_listen=f"127.0.0.1:{port}").start()
    front_url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await _wait_front(session, front_url, len(nodes))
            await first_token(bench, session, fakes, router, front_url)
            for paced in (True, False):
                await relay_rates(bench, session, fakes, router, front_url, paced)
    finally:
        await router.stop()
        await fakes.stop()


async def _wait_front(session: aiohttp.ClientSession, url: str, models_from: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            async with session.get(url + "/api/tags") as resp:
                if resp.status == 200 and (await resp.json())["models"]:
                    await asyncio.sleep(0.5)  # every node's first health check
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise RuntimeError("the front door did not answer within 30s")


async def first_token(bench: Bench, session, fakes: Fakes, router: Router, front_url: str) -> None:
    through = bench.metric("front_ttft", "front door: first token, POST /api/chat (a job), idle node", "ms", "ms")
    direct = bench.metric("front_ttft_direct", "  the same call straight to the simulator", "ms", "ms")
    overhead = bench.metric(
        "front_ttft_overhead", "front door: first-token overhead (minus direct, paired)", "ms", "ms", "p50 <= 2 ms"
    )
    bench.disk_share_rows("front_ttft")
    pairs = 10 if bench.quick else 20
    node = "f01"  # the first free node by rank takes every call of an idle lab
    await fakes.call("script", node, tokens=4, delay=0)
    await _stream(session, fakes.urls[node], "warm")
    await _stream(session, front_url, "warm")
    for rep in range(bench.repeats):
        g_run, d_run, o_run, parts = [], [], [], {}
        await fakes.call("reset", node)
        for _ in range(pairs):
            await _idle(session, router)
            await asyncio.sleep(QUIET_S)  # a quiet lab: the node idle a moment
            sent, arrivals = await _stream(session, fakes.urls[node], "hello")
            d = (arrivals[0] - sent) * 1000
            sent, arrivals = await _stream(session, front_url, "hello")
            g = (arrivals[0] - sent) * 1000
            d_run.append(d)
            g_run.append(g)
            o_run.append(g - d)
            log = await fakes.log(node, since=sent)
            chat = [e for e in log if e[3] and sent <= e[1] <= arrivals[0]]
            if chat:  # where the time goes, cut at what the node saw (both clocks are monotonic)
                bench.segments(
                    "front_ttft",
                    [
                        ("call sent", sent),
                        *bench.fake_points(log, sent, chat[0][1]),
                        ("chat request arrives", chat[0][1]),
                        ("first token at client", arrivals[0]),
                    ],
                    parts,
                )
        through.add_run(g_run)
        direct.add_run(d_run)
        overhead.add_run(o_run)
        bench.add_segments("front_ttft", parts)
        await _idle(session, router)
        await asyncio.sleep(QUIET_S)  # idle, as in the pairs
        await bench.disk_share(
            "front_ttft", fakes, node, router.database, lambda: _stream(session, front_url, "hello"), o_run
        )
        bench.say(
            f"front first-token run {rep + 1}/{bench.repeats}: front {statistics.median(g_run):.2f} ms,"
            f" direct {statistics.median(d_run):.2f} ms"
        )


async def relay_rates(bench: Bench, session, fakes: Fakes, router: Router, front_url: str, paced: bool) -> None:
    pace = f"{1 / PACE_S:.0f} tokens/s per stream" if paced else "unpaced"
    tokens = (300 if bench.quick else 600) if paced else (1000 if bench.quick else 3000)
    names = list(fakes.urls)
    for name in names:
        await fakes.call("script", name, tokens=tokens, delay=PACE_S if paced else 0)
    suffix = "" if paced else "_unpaced"
    for clients in (1, CLIENTS):
        rate_d = bench.metric(
            f"front_rate_{clients}{suffix}_direct",
            f"  straight to the simulator, {clients} client(s), {pace}",
            "tokens/s",
            "rate",
        )
        rate_f = bench.metric(
            f"front_rate_{clients}{suffix}",
            f"front door: tokens/s relayed to {clients} client(s), {pace}",
            "tokens/s",
            "rate",
        )
        ratio = bench.metric(
            f"front_rate_{clients}{suffix}_ratio",
            f"front door / direct, {clients} client(s), {pace} (same run)",
            "ratio",
            "ratio",
            ">= 0.95x" if paced else "",
            better="higher",
        )
        cost = bench.metric(
            f"front_cpu_{clients}{suffix}",
            f"  router CPU per relayed token, {clients} client(s), {pace} (submit to last token)",
            "us",
            "ms",
            "<= 50 us" if paced and clients == CLIENTS else "",
        )
        for rep in range(bench.repeats):
            d = await _aggregate(session, [fakes.urls[n] for n in names[:clients]], "relay")
            await _idle(session, router)
            cpu = cpu_s(router.pid)
            f = await _aggregate(session, [front_url] * clients, "relay")
            cost.add_run((cpu_s(router.pid) - cpu) / (tokens * clients) * 1e6)
            await _idle(session, router)
            rate_d.add_run(d)
            rate_f.add_run(f)
            ratio.add_run(f / d)
            bench.say(
                f"front relay {clients} client(s) {pace} run {rep + 1}/{bench.repeats}: "
                f"front {f:,.0f} tokens/s, direct {d:,.0f} tokens/s ({f / d:.3f}x)"
            )


async def _aggregate(session, urls: list[str], prompt: str) -> float:
    """Every client's tokens from the first token any client got to the last any got."""
    results = await asyncio.gather(*(_stream(session, url, f"{prompt} {i}") for i, url in enumerate(urls)))
    firsts = [a[0] for _, a in results]
    lasts = [a[-1] for _, a in results]
    count = sum(len(a) for _, a in results)
    if len(urls) == 1:
        return _rate(results[0][1])
    return (count - len(urls)) / (max(lasts) - min(firsts))


WARM_CALLS = 20
WARM_LOAD_S = 2.0  # a realistic cold load of a mid-sized model


async def warm_section(bench: Bench) -> None:
    """An editor's successive calls (Continue autocompletes on every pause in typing, sending
    keep_alive): 20 front-door calls one after another to one node with a 2 s cold load, the
    client's keep_alive honoured (the default) vs not ([front] max_keep_alive = 0: every call's
    model unloads after it, as before issue 25). Total seconds for the 20, each way."""
    from gpuq.demo import FakeOllama, Script

    totals = {
        how: bench.metric(
            f"warm_{how}",
            f"{WARM_CALLS} successive front-door calls, {WARM_LOAD_S:g} s cold"
            f" load, keep_alive {how.replace('_', ' ')}",
            "s",
            "count",
        )
        for how in ("honoured", "not_honoured")
    }
    ratio = bench.metric(
        "warm_ratio", "  keep_alive not honoured / honoured (same run)", "ratio", "ratio", better="higher"
    )
    fake = FakeOllama(
        models={MODEL},
        script=Script(tokens=10, token_delay_s=0.01, load_delay_s=WARM_LOAD_S, unload="delay", unload_delay_s=0.2),
    )
    await fake.start()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "complete"}], "stream": True, "keep_alive": "5m"}
    try:
        for rep in range(max(bench.repeats // 2, 1)):
            run = {}
            for how, front_table in (("honoured", None), ("not_honoured", {"max_keep_alive": "0s"})):
                port = free_port()
                router = await Router(
                    bench.workdir,
                    [node_table("n1", fake.url, 1, MODEL, roles=("task",))],
                    bench.workdir / f"warm-{how}-{rep}.db",
                    front=front_table,
                    ollama_listen=f"127.0.0.1:{port}",
                ).start()
                url = f"http://127.0.0.1:{port}"
                try:
                    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
                        await _wait_front(session, url, 1)
                        t = time.perf_counter()
                        for i in range(WARM_CALLS):
                            async with session.post(
                                url + "/api/chat",
                                json=dict(body, messages=[{"role": "user", "content": f"complete {i}"}]),
                            ) as resp:
                                assert resp.status == 200, await resp.text()
                                await resp.read()
                        run[how] = time.perf_counter() - t
                        totals[how].add_run(run[how])
                        await _idle(session, router)
                finally:
                    await router.stop()
                fake.loaded.clear()  # the next router starts cold
            ratio.add_run(run["not_honoured"] / run["honoured"])
            bench.say(f"warm run {rep + 1}: honoured {run['honoured']:.1f} s, not honoured {run['not_honoured']:.1f} s")
    finally:
        await fake.stop()


ROWS = ("1p", "20p", "1u", "20u")  # clients and pace (p: 200 tokens/s, u: unpaced) of the CPU rows


async def _via_stream(session: aiohttp.ClientSession, url: str, node: str) -> tuple[float, float]:
    """gpuq's own door: POST /api/jobs (to `node`), then GET its /stream to the first {"text"}
    line; (when the submit was sent, when that line came), read to the end."""
    sent = time.monotonic()
    async with session.post(url + "/api/jobs", json={"kind": "task", "prompt": "hello", "node": node}) as resp:
        assert resp.status == 201, await resp.text()
        job_id = (await resp.json())["jobs"][0]["id"]
    async with session.get(url + f"/api/jobs/{job_id}/stream") as resp:
        await first_stream_line(resp, "text")
        first = time.monotonic()
        async for _ in resp.content:  # to the end: the node is idle again after it
            pass
    return sent, first


async def ab(
    variants: dict[str, dict[str, str]],
    pairs: int = 10,
    ttft_pairs: int = 20,
    first_only: bool = False,
    rows: tuple[str, ...] = ROWS,
) -> dict[str, dict[str, list]]:
    """Two routers (each with its own environment: PYTHONPATH at another checkout, say) on one
    set of simulated nodes, measured alternately, the order swapped every pair, so load on the
    machine falls on both alike: the first-token overhead (the front door's, and gpuq's own
    submit then /stream) and the router CPU per relayed token (not with `first_only`; `rows`:
    which of its rows)."""
    import tempfile
    from pathlib import Path

    workdir = Path(tempfile.mkdtemp(prefix="gpuq-ab-"))
    nodes = {f"f{i:02d}": MODEL for i in range(1, CLIENTS + 1)}
    fakes = await Fakes(nodes, workdir / "fakes.log").start()
    table = [node_table(n, fakes.urls[n], rank, MODEL, roles=("task",)) for rank, n in enumerate(nodes, 1)]
    routers: dict[str, tuple[Router, str]] = {}
    results: dict[str, dict[str, list]] = {name: {} for name in variants}
    try:
        for name, env in variants.items():
            saved = dict(os.environ)
            os.environ.update(env)
            try:
                port = free_port()
                router = await Router(workdir, table, workdir / f"{name}.db", ollama_listen=f"127.0.0.1:{port}").start()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            routers[name] = (router, f"http://127.0.0.1:{port}")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            for _, url in routers.values():
                await _wait_front(session, url, len(nodes))
            await fakes.call("script", "f01", tokens=4, delay=0)
            for _, url in routers.values():
                await _stream(session, url, "warm")

            def order(i: int):
                return list(routers.items())[:: 1 if i % 2 == 0 else -1]

            for i in range(ttft_pairs):
                for name, (router, url) in order(i):
                    await _idle(session, router)
                    await asyncio.sleep(QUIET_S)
                    sent, arrivals = await _stream(session, fakes.urls["f01"], "hello")
                    direct = arrivals[0] - sent
                    cpu = cpu_s(router.pid)
                    sent, arrivals = await _stream(session, url, "hello")
                    results[name].setdefault("first-token overhead (ms)", []).append(
                        (arrivals[0] - sent - direct) * 1000
                    )
                    results[name].setdefault("  router CPU per front-door call, 4 tokens (us)", []).append(
                        (cpu_s(router.pid) - cpu) * 1e6
                    )
                    await _idle(session, router)
                    await asyncio.sleep(QUIET_S)
                    sent, arrivals = await _stream(session, fakes.urls["f01"], "hello")
                    direct = arrivals[0] - sent
                    cpu = cpu_s(router.pid)
                    sent, first = await _via_stream(session, router.url, "f01")
                    results[name].setdefault("first-token overhead, submit -> /stream (ms)", []).append(
                        (first - sent - direct) * 1000
                    )
                    results[name].setdefault("  router CPU per submit + /stream, 4 tokens (us)", []).append(
                        (cpu_s(router.pid) - cpu) * 1e6
                    )
            for paced, tokens in () if first_only else ((True, 300), (False, 1000)):
                if not any(f"{c}{'p' if paced else 'u'}" in rows for c in (1, CLIENTS)):
                    continue
                for n in nodes:
                    await fakes.call("script", n, tokens=tokens, delay=PACE_S if paced else 0)
                for i in range(pairs):
                    for clients in (1, CLIENTS):
                        if f"{clients}{'p' if paced else 'u'}" not in rows:
                            continue
                        for name, (router, url) in order(i):
                            await _idle(session, router)
                            cpu = cpu_s(router.pid)
                            await _aggregate(session, [url] * clients, "relay")
                            key = f"CPU per token, {clients} client(s), {'200 tokens/s' if paced else 'unpaced'} (us)"
                            results[name].setdefault(key, []).append(
                                (cpu_s(router.pid) - cpu) / (tokens * clients) * 1e6
                            )
    finally:
        for router, _ in routers.values():
            await router.stop()
        await fakes.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> None:
    """`python -m bench.front [--pairs N] [--first-only] DIR_A DIR_B [DIR_C...]`: the A/B above, DIR_A's and DIR_B's gpuq
    (each a checkout, put first on PYTHONPATH); a median and p95 per row, each variant."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--first-only", action="store_true", help="the first-token rows only (no CPU rows)")
    parser.add_argument("--ttft-pairs", type=int, default=None, help="first-token pairs (default: 2 x --pairs)")
    parser.add_argument(
        "--rows", default=",".join(ROWS), help="CPU rows, clients and pace: 1p,20p (200 tokens/s), 1u,20u (unpaced)"
    )
    parser.add_argument(
        "dirs", nargs="+", help="two checkouts (or more: each measured in turn, the order turned around every round)"
    )
    args = parser.parse_args()
    if len(args.dirs) < 2:
        parser.error("give two checkouts or more")
    variants = {d: {"PYTHONPATH": os.path.abspath(d)} for d in args.dirs}
    ttft = 2 * args.pairs if args.ttft_pairs is None else args.ttft_pairs
    results = asyncio.run(ab(variants, args.pairs, ttft, args.first_only, tuple(args.rows.split(","))))
    print(f"{args.pairs} pairs ({ttft} for the first token), alternating")
    for key in results[args.dirs[0]]:
        cells = []
        for d in args.dirs:
            xs = sorted(results[d][key])
            cells.append(f"{d}: {statistics.median(xs):.2f} (p95 {xs[min(len(xs) - 1, int(0.95 * len(xs)))]:.2f})")
        a, b = results[args.dirs[0]][key], results[args.dirs[1]][key]
        ratios = sorted(y / x for x, y in zip(a, b) if x > 0)  # pair by pair: load falls on both alike
        if ratios:
            cells.append(
                f"B/A per pair {statistics.median(ratios):.3f}"
                f" ({sum(r < 1 for r in ratios)} of {len(ratios)} pairs B lower)"
            )
        print(f"{key}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
