"""The queue page's first render, A/B interleaved (issue 28): two checkouts of gpuq, one
database seeded as `--only scale` does (50 nodes, 10,000 waiting, each node's first job held
running by the simulated node), copied for each side's router; the page opened fresh in
Chromium (bench/scale.py's viewport and flags) on A and B in turn, the order swapped every pair.
`painted`: the first frame showing the board, painted (bench/scale.py's row); `render`: a forced
layout read after it (this page's earlier measure: it also takes what the page does right after
its first paint, a large board's margins).

    .venv/bin/python -m bench.page_ab /path/to/checkout-A /path/to/checkout-B --pairs 8

Each side's router runs its checkout's code (its own .venv, `make .venv/.installed`). Per render, from the page: navigation
-> first render (as bench/scale.py's row), -> its first answers in, answers -> board drawn
(script), the first /api/queue read's server time (request -> first byte), transfer (first ->
last byte) and size (Resource Timing), Chromium's own layout and style time up to the render
(CDP Performance.getMetrics), the cards and the "loading" cards in the DOM then. And, on B's
router alone, the page's first read timed from Python: `?limit=40` (every column's screenful),
`?limit=40&columns=7` (the columns in view) and `?limit=0` (counts and running jobs only)."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from . import growth
from .core import SETTINGS
from .procs import Fakes, Router, node_table
from .scale import CHROMIUM_ARGS, MODEL, NODES, PAINTED

KEYS = (
    "painted",
    "render",
    "margins",
    "parse",
    "answered",
    "drawn",
    "q_server",
    "q_transfer",
    "q_kb",
    "layout",
    "style",
    "script",
    "cards",
    "loading",
)


async def render(browser, url: str) -> dict:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        pg = await context.new_page()
        await pg.add_init_script(PAINTED)
        cdp = await context.new_cdp_session(pg)
        await cdp.send("Performance.enable")
        await pg.goto(url + "/", wait_until="commit")
        await pg.wait_for_function("() => window.__painted > 0", polling="raf", timeout=120_000)
        got = await pg.evaluate(
            "() => { document.body.offsetHeight; const t = performance.now();"
            " const q = performance.getEntriesByType('resource').find((e) => e.name.includes('/api/queue?'));"
            " return {painted: window.__painted || 0, render: t, answered: window.gpuq.answeredAt || 0, drawn: (window.gpuq.drawnAt || 0) - (window.gpuq.answeredAt || 0),"
            " q_server: q ? q.responseStart - q.requestStart : 0, q_transfer: q ? q.responseEnd - q.responseStart : 0,"
            " q_kb: q ? q.encodedBodySize / 1000 : 0, cards: document.querySelectorAll('#board .card').length,"
            " loading: document.querySelectorAll('#board .card.loading').length}; }"
        )
        if os.environ.get("PAGE_AB_TIMELINE"):
            print(
                await pg.evaluate(
                    "() => performance.getEntriesByType('resource').map((e) =>"
                    " `${e.name.replace(/^https?:\\/\\/[^/]+/, '')} ${e.startTime.toFixed(0)}-${e.responseEnd.toFixed(0)}`)"
                    ".concat([`answered ${window.gpuq.answeredAt.toFixed(0)} drawn ${window.gpuq.drawnAt.toFixed(0)}`]).join('\\n')"
                )
            )
        got["parse"] = await pg.evaluate(
            "async () => { const q = performance.getEntriesByType('resource').find((e) => e.name.includes('/api/queue?'));"
            " const text = await (await fetch(q.name)).text(); const t = performance.now(); JSON.parse(text);"
            " return performance.now() - t; }"
        )
        try:  # a page that draws a large board's margins after its first paint: when it has
            await pg.wait_for_function("() => window.gpuq.marginsAt > 0", polling="raf", timeout=3000)
            got["margins"] = await pg.evaluate("() => { document.body.offsetHeight; return performance.now(); }")
        except Exception:
            got["margins"] = got["render"]
        metrics = {m["name"]: m["value"] for m in (await cdp.send("Performance.getMetrics"))["metrics"]}
        got["layout"] = metrics.get("LayoutDuration", 0) * 1000
        got["style"] = metrics.get("RecalcStyleDuration", 0) * 1000
        got["script"] = metrics.get("ScriptDuration", 0) * 1000
        return got
    finally:
        await context.close()


def summary(values: list[float]) -> str:
    s = sorted(values)
    p95 = s[min(len(s) - 1, round(0.95 * (len(s) - 1)))]
    return f"{statistics.median(s):8.1f} {p95:8.1f}"


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--waiting", type=int, default=10_000)
    ap.add_argument("--serve", type=float, default=0, help="only serve both routers this many seconds (to profile)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="page-ab-"))
    nodes = [(f"s{i:02d}", MODEL) for i in range(1, NODES + 1)]
    seeded = await growth.seed(work / "seed.db", 100, args.waiting, nodes, time.time(), SETTINGS)
    fakes = await Fakes(dict(nodes), work / "nodes.log").start()
    for name, _ in nodes:
        await fakes.call("hold", name)
    table = [node_table(name, fakes.urls[name], rank, model) for rank, (name, model) in enumerate(nodes, 1)]
    routers = {}
    try:
        for side, code in (("A", args.a), ("B", args.b)):
            db = work / f"{side}.db"
            shutil.copy(seeded, db)
            (work / side).mkdir()
            # Its own venv's Python: gpuq and its web/ (an editable install maps gpuq.web to the checkout's).
            own, sys.executable = sys.executable, str(Path(code).resolve() / ".venv" / "bin" / "python")
            try:
                routers[side] = await Router(work / side, table, db, shutdown_grace="0.1s").start()
            finally:
                sys.executable = own
        for r in routers.values():
            conn = await r.connect()
            deadline = time.monotonic() + 60
            while True:
                _, body = await conn.request("GET", "/api/queue?limit=0")
                if sum(1 for x in body["nodes"] if x["running"]) == NODES:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the nodes did not each start a job within 60s")
                await asyncio.sleep(0.2)
            await conn.close()
        if args.serve:
            print("A", routers["A"].url, "B", routers["B"].url, flush=True)
            await asyncio.sleep(args.serve)
            return
        # The first read, timed from Python on B's router (the same database as A's).
        conn = await routers["B"].connect()
        reads = {}
        for _ in range(7):
            for path in ("/api/queue?limit=40", "/api/queue?limit=40&columns=7", "/api/queue?limit=0"):
                t = time.perf_counter()
                status, raw = await conn.send(conn.encode("GET", path))
                reads.setdefault(path, []).append(((time.perf_counter() - t) * 1000, len(raw) / 1000, status))
        await conn.close()
        for path, got in reads.items():
            print(
                f"{path:36s} {statistics.median(x[0] for x in got):7.1f} ms median, {got[0][1]:8.1f} KB, status {got[0][2]}"
            )
        from playwright.async_api import async_playwright

        chromium = shutil.which("chromium") or "/usr/bin/chromium"
        runs = {side: {k: [] for k in KEYS} for side in routers}
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            try:
                for r in routers.values():
                    await render(browser, r.url)  # warm
                for i in range(args.pairs):
                    order = ("A", "B") if i % 2 == 0 else ("B", "A")
                    for side in order:
                        got = await render(browser, routers[side].url)
                        for k in KEYS:
                            runs[side][k].append(got[k])
                    print(
                        f"pair {i + 1}: "
                        + "  ".join(f"{s} {runs[s]['render'][-1]:.0f} ms" for s in order)
                        + f"  (load {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
            finally:
                await browser.close()
        print(
            f"{'measure (ms; KB; cards)':28s} {'A median':>8s} {'A p95':>8s}   {'B median':>8s} {'B p95':>8s}   ({args.pairs} pairs)"
        )
        for k in KEYS:
            diff = statistics.median(b - a for a, b in zip(runs["A"][k], runs["B"][k]))
            print(f"{k:28s} {summary(runs['A'][k])}   {summary(runs['B'][k])}   B-A paired median {diff:+.1f}")
    finally:
        for r in routers.values():
            await r.stop()
        await fakes.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
