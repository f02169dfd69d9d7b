"""The lab at scale (issue 28): 50 nodes and 10,000 waiting jobs, 100 live pages, 1,000
front-door calls waiting at once. Every row is measured at a small and a large size side by
side (sample by sample, or in alternating turns), and each has its growth ratio: the large
size's cost / the small size's, beside how much the work grew. Nothing should grow faster
than the work (a ratio per unit of work at or under 1.00x; the claim does the same work at
any depth, so its ratio should stay near 1.00x).

- `fifty_nodes`: databases seeded by direct SQL (bench/growth.py) with 1,000 and 10,000 jobs
  waiting over 50 nodes (20 and 200 per node). `Store.claim` on each, alternately; then one
  router per database (its 50 nodes down: nothing listens on their ports, so every job stays
  queued): `GET /api/queue` (the API's default limit, 1,000 per node, and the page's own,
  `?limit=200`), bytes and ms; and the queue page's first render in headless Chromium:
  from navigation to the first frame showing the board drawn from the router's answers, painted
  (a task queued in that frame, read as `performance.now()`: the page's clock starts at
  navigation).
- `live_pages`: 10 and 100 clients of `/api/events` (the stream every open queue page
  holds; raw sockets, so that the bench's own CPU does not dominate two cores: 100 Chromium
  pages would measure Chromium, not the router) while 4 simulated nodes stream tokens at 200
  tokens/s each. Counted: the token events delivered to all clients per second, and the
  router's CPU (schedstat, as bench/front.py) per event delivered.
- `front_waiting`: 100 and 1,000 `POST /api/chat` calls through the front door waiting at once
  behind one busy node (its first call held by the simulator), from 20 loopback addresses
  (each under the per-peer cap): the router's RSS and open fds beyond its idle ones, per call."""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from gpuq.store import Store

from . import growth
from .core import SETTINGS
from .http import Conn
from .procs import Fakes, Router, cpu_s, free_port, node_table, rss_mb

if TYPE_CHECKING:
    from .core import Bench

NODES = 50
MODEL = "qwen3-coder:30b"
WAITING = (1_000, 10_000)
PAGE_LIMIT = 200  # what the queue page asks for (web/queue.js LIMIT_STEP)
CLIENTS = (10, 100)
STREAMING_NODES = 4
PACE_S = 0.005  # 200 tokens/s per stream
CALLS = (100, 1_000)
PEERS = 20  # loopback source addresses for the front-door calls (the per-peer cap is 64)
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]


async def scale_section(bench: Bench) -> None:
    await fifty_nodes(bench)
    await live_pages(bench)
    await front_waiting(bench)


def growth_row(bench: Bench, key: str, what: str, work: float, low, high, per_work: bool = True) -> None:
    """The large size's cost / the small one's, per run; `per_work`: divided by how much the work
    grew (1.00x: linear in the work)."""
    label = f"  {what}: {WAITING[1]:,} / {WAITING[0]:,} waiting"
    label += f", per unit of work (the work grew {work:g}x)" if per_work else " (the same work at either size)"
    row = bench.metric(key, label, "ratio", "ratio", "<= 1.00x" if per_work else "<= 2.00x", better="lower")
    for a, b in zip(low.per_run, high.per_run):
        row.add_run(b / a / (work if per_work else 1))


# -- 50 nodes, 10,000 waiting -----------------------------------------------------------------


async def fifty_nodes(bench: Bench) -> None:
    nodes = [(f"s{i:02d}", MODEL) for i in range(1, NODES + 1)]
    sizes = WAITING
    samples = 15 if bench.quick else 40
    claim = {
        n: bench.metric(f"scale_claim_{n}", f"claim (Store.claim), {NODES} nodes, {n:,} waiting", "ms", "ms")
        for n in sizes
    }
    q_default = {
        n: bench.metric(f"scale_q_ms_{n}", f"GET /api/queue, {NODES} nodes, {n:,} waiting", "ms", "ms") for n in sizes
    }
    q_default_kb = {n: bench.metric(f"scale_q_kb_{n}", "  its size", "KB", "mb") for n in sizes}
    q_page = {
        n: bench.metric(
            f"scale_qp_ms_{n}",
            f"GET /api/queue?limit={PAGE_LIMIT} (the page's), {NODES} nodes, {n:,} waiting",
            "ms",
            "ms",
        )
        for n in sizes
    }
    q_page_kb = {n: bench.metric(f"scale_qp_kb_{n}", "  its size", "KB", "mb") for n in sizes}
    page = {
        n: bench.metric(
            f"scale_page_{n}",
            f"queue page, first render in Chromium (navigation -> board painted), {NODES} nodes, {n:,} waiting",
            "ms",
            "ms",
            "< 1000 ms" if n == sizes[-1] else "",
        )
        for n in sizes
    }
    cards = {
        n: bench.metric(
            f"scale_page_cards_{n}", f"  cards in the DOM after that render, {n:,} waiting", "cards", "count"
        )
        for n in sizes
    }
    paths = {}
    for n in sizes:
        t0 = time.perf_counter()
        paths[n] = await growth.seed(bench.workdir / f"scale-{n}.db", 100, n, nodes, time.time(), SETTINGS)
        bench.say(f"scale: seeded {n:,} waiting over {NODES} nodes in {time.perf_counter() - t0:.1f}s")
    for _rep in range(bench.repeats):
        stores = {n: Store(paths[n]) for n in sizes}
        for store in stores.values():
            await store.open()
        try:
            runs = {n: [] for n in sizes}
            for i in range(samples):
                node = nodes[i % NODES][0]
                for n, store in stores.items():
                    t = time.perf_counter()
                    job = await store.claim(node)
                    runs[n].append((time.perf_counter() - t) * 1000)
                    await store.finish(job["id"], job["run_id"], "done", None, "out")
        finally:
            for store in stores.values():
                await store.close()
        for n in sizes:
            claim[n].add_run(runs[n])
    # One router per database, side by side, on 50 simulated nodes that each hold the job they
    # are sent (a lab's jobs run for minutes): each node's first job runs, the rest wait.
    fakes = await Fakes(dict(nodes), bench.workdir / "scale-nodes.log").start()
    for name, _ in nodes:
        await fakes.call("hold", name)
    table = [node_table(name, fakes.urls[name], rank, model) for rank, (name, model) in enumerate(nodes, 1)]
    routers = {}
    try:
        for n in sizes:
            routers[n] = await Router(bench.workdir, table, paths[n], shutdown_grace="0.1s").start()
        conns = {n: await r.connect() for n, r in routers.items()}
        deadline = time.monotonic() + 60
        for conn in conns.values():
            while True:
                _, body = await conn.request("GET", "/api/queue?limit=0")
                if sum(1 for x in body["nodes"] if x["running"]) == NODES:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("the 50 nodes did not each start a job within 60s")
                await asyncio.sleep(0.2)
        try:
            for _rep in range(bench.repeats):
                got = {(n, p): [] for n in sizes for p in ("d", "p")}
                size = {}
                for _ in range(3 if bench.quick else 5):
                    for conn in conns.values():
                        for p, path in (("d", "/api/queue"), ("p", f"/api/queue?limit={PAGE_LIMIT}")):
                            t = time.perf_counter()
                            status, raw = await conn.send(conn.encode("GET", path))
                            got[n, p].append((time.perf_counter() - t) * 1000)
                            assert status == 200, (status, raw[:300])
                            size[n, p] = len(raw) / 1000
                for n in sizes:
                    q_default[n].add_run(got[n, "d"])
                    q_page[n].add_run(got[n, "p"])
                    q_default_kb[n].add_run(size[n, "d"])
                    q_page_kb[n].add_run(size[n, "p"])
        finally:
            for conn in conns.values():
                await conn.close()
        await page_renders(bench, routers, page, cards)
    finally:
        for r in routers.values():
            await r.stop()
        await fakes.stop()
        for n in sizes:
            for suffix in ("", "-wal", "-shm"):
                Path(str(paths[n]) + suffix).unlink(missing_ok=True)
    work = sizes[1] / sizes[0]
    growth_row(bench, "scale_claim_ratio", "claim", work, claim[sizes[0]], claim[sizes[1]], per_work=False)
    growth_row(bench, "scale_q_ratio", "GET /api/queue", work, q_default[sizes[0]], q_default[sizes[1]])
    growth_row(bench, "scale_qp_ratio", f"GET /api/queue?limit={PAGE_LIMIT}", work, q_page[sizes[0]], q_page[sizes[1]])
    growth_row(bench, "scale_page_ratio", "queue page's first render", work, page[sizes[0]], page[sizes[1]])
    for n in sizes:
        bench.say(
            f"scale @ {n:,} waiting: claim {statistics.median(claim[n].pooled):.2f} ms,"
            f" /api/queue {statistics.median(q_default[n].pooled):.0f} ms ({q_default_kb[n].pooled[0]:,.0f} KB),"
            f" ?limit={PAGE_LIMIT} {statistics.median(q_page[n].pooled):.0f} ms,"
            f" page {statistics.median(page[n].pooled):.0f} ms ({cards[n].pooled[0]:,.0f} cards)"
        )


async def page_renders(bench: Bench, routers: dict, page: dict, cards: dict) -> None:
    """The queue page opened fresh (a new context: nothing cached) on each router in turn; where
    its time goes: navigation -> the first answers in (the page's four reads: /api/queue,
    /health, the recent jobs, /api/activity), and the board drawn from them (script only)."""
    parts = {}
    for n in routers:
        parts[n, "answered"] = bench.metric(
            f"scale_page_answered_{n}", f"  navigation -> the page's first answers in, {n:,} waiting", "ms", "ms"
        )
        parts[n, "drawn"] = bench.metric(
            f"scale_page_drawn_{n}", f"  answers in -> the board drawn (script), {n:,} waiting", "ms", "ms"
        )
        parts[n, "full"] = bench.metric(
            f"scale_page_full_{n}",
            f"  navigation -> the board complete (a paged board: its"
            f" first read; a small one: {PAGE_LIMIT} per column, its second), {n:,} waiting",
            "ms",
            "ms",
        )
    try:
        from playwright.async_api import async_playwright
    except ImportError as exc:  # the test extra brings it
        raise RuntimeError("the scale section needs Playwright (pip install -e '.[test]')") from exc
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            for router in routers.values():  # warm: Chromium's first page, the router's first read
                await first_render(browser, router.url)
            for rep in range(bench.repeats):
                runs = {(n, k): [] for n in routers for k in ("all", "answered", "drawn", "full")}
                for _ in range(1 if bench.quick else 3):
                    for n, router in routers.items():
                        ms, count, answered, drawn, full = await first_render(browser, router.url)
                        runs[n, "all"].append(ms)
                        runs[n, "full"].append(full)
                        runs[n, "answered"].append(answered)
                        runs[n, "drawn"].append(drawn - answered)
                        if not cards[n].runs:
                            cards[n].add_run(count)
                for n in routers:
                    page[n].add_run(runs[n, "all"])
                    parts[n, "answered"].add_run(runs[n, "answered"])
                    parts[n, "drawn"].add_run(runs[n, "drawn"])
                    parts[n, "full"].add_run(runs[n, "full"])
                bench.say(
                    f"scale page run {rep + 1}/{bench.repeats}: "
                    + ", ".join(f"{n:,} waiting {statistics.median(runs[n, 'all']):.0f} ms" for n in routers)
                )
        finally:
            await browser.close()


# The first frame that shows the board, painted: a poll in every frame (registered a frame
# earlier, so it runs before the page's own callbacks of that frame) sees the first answers
# drawn, and a task queued then runs once that frame is done (before the page's own tasks queued
# in the frame: a large board's margins, drawn after its first paint).
PAINTED = """(() => { const poll = () => {
  if (window.gpuq && window.gpuq.shown > 0 && document.querySelector('#board .col'))
    setTimeout(() => { window.__painted = performance.now(); }, 0);
  else requestAnimationFrame(poll); };
  requestAnimationFrame(poll); })();"""


async def first_render(browser, url: str) -> tuple[float, int]:
    context = await browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        pg = await context.new_page()
        await pg.add_init_script(PAINTED)
        await pg.goto(url + "/", wait_until="commit")
        await pg.wait_for_function("() => window.__painted > 0", polling="raf", timeout=120_000)
        ms, answered, drawn = await pg.evaluate(
            "() => [window.__painted, window.gpuq.answeredAt || 0, window.gpuq.drawnAt || 0]"
        )
        # Then the whole board: the page's first load asks for a screenful per column, the next for
        # all; a large board is paged (each column's part in view read as it scrolls): its first.
        await pg.wait_for_function("() => window.gpuq.fullAt > 0", polling="raf", timeout=120_000)
        full, count = await pg.evaluate(
            "() => { document.body.offsetHeight;"
            " return [performance.now(), document.querySelectorAll('.card').length]; }"
        )
        return ms, count, answered, drawn, full
    finally:
        await context.close()


# -- 100 live pages ---------------------------------------------------------------------------


async def sse_client(
    port: int, counts: list[int], i: int, ready: asyncio.Event, opened: list[int], stop: asyncio.Event
) -> None:
    # Spread over loopback addresses: one address may hold at most 64 connections (429 beyond).
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(f"127.0.0.{2 + i % PEERS}", 0))
    try:
        writer.write(
            f"GET /api/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"/api/events answered {head[:200]!r}")
        hello = False
        while not stop.is_set():
            try:
                chunk = await asyncio.wait_for(reader.read(65536), 0.5)
            except TimeoutError:
                continue
            if not chunk:
                return
            if not hello and b"event: hello" in chunk:
                hello = True
                opened[0] += 1
                if opened[0] == len(counts):
                    ready.set()
            counts[i] += chunk.count(b"event: tokens")
    finally:
        writer.close()


async def live_pages(bench: Bench) -> None:
    names = {f"l{i}": MODEL for i in range(1, STREAMING_NODES + 1)}
    fakes = await Fakes(names, bench.workdir / "scale-fakes.log").start()
    table = [node_table(n, fakes.urls[n], rank, MODEL) for rank, n in enumerate(names, 1)]
    router = await Router(bench.workdir, table, bench.workdir / "scale-live.db").start()
    tokens = 200 if bench.quick else 400
    rate = {
        c: bench.metric(
            f"scale_events_{c}",
            f"token events delivered per second to {c} live pages"
            f" (/api/events; {STREAMING_NODES} nodes x {1 / PACE_S:.0f} tokens/s)",
            "events/s",
            "rate",
        )
        for c in CLIENTS
    }
    share = {
        c: bench.metric(
            f"scale_events_share_{c}", f"  of the tokens made x clients, {c} pages", "ratio", "ratio", better="higher"
        )
        for c in CLIENTS
    }
    cpu = {
        c: bench.metric(f"scale_events_cpu_{c}", f"  router CPU per event delivered, {c} pages", "us", "ms")
        for c in CLIENTS
    }
    cpu_s_row = {
        c: bench.metric(f"scale_events_cpus_{c}", f"  router CPU, {c} pages (CPU-seconds per second)", "cores", "count")
        for c in CLIENTS
    }
    for n in names:
        await fakes.call("script", n, tokens=tokens, delay=PACE_S)
    conn = await router.connect()
    try:
        for rep in range(bench.repeats):
            for c in CLIENTS:
                counts, opened = [0] * c, [0]
                ready, stop = asyncio.Event(), asyncio.Event()
                clients = [
                    asyncio.create_task(sse_client(router.port, counts, i, ready, opened, stop)) for i in range(c)
                ]
                try:
                    waiter = asyncio.create_task(ready.wait())
                    await asyncio.wait([waiter, *clients], timeout=30, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    for task in clients:
                        if task.done():
                            task.result()  # a client that failed says why
                    if not ready.is_set():
                        raise RuntimeError(f"only {opened[0]} of {c} event streams opened within 30s")
                    before, t = cpu_s(router.pid), time.perf_counter()
                    ids = []
                    for n in names:
                        status, body = await conn.request(
                            "POST", "/api/jobs", {"kind": "task", "prompt": "go", "node": n}
                        )
                        assert status == 201, body
                        ids.append(body["jobs"][0]["id"])
                    deadline = time.monotonic() + 60
                    for job in ids:
                        while True:
                            status, body = await conn.request("GET", f"/api/jobs/{job}")
                            if status == 503:  # a store slow to answer on a loaded machine: ask again
                                pass
                            elif status != 200:
                                raise RuntimeError(f"GET /api/jobs/{job}: {status} {str(body)[:300]}")
                            elif body["state"] not in ("queued", "running"):
                                break
                            if time.monotonic() > deadline:
                                raise RuntimeError(f"job {job} did not finish within 60s")
                            await asyncio.sleep(0.05)
                    # Events still in flight to slow readers: wait until the counts stop growing.
                    last = -1
                    while sum(counts) != last and time.monotonic() < deadline:
                        last = sum(counts)
                        await asyncio.sleep(0.2)
                    elapsed, used = time.perf_counter() - t, cpu_s(router.pid) - before
                finally:
                    stop.set()
                    await asyncio.gather(*clients, return_exceptions=True)
                delivered = sum(counts)
                rate[c].add_run(delivered / elapsed)
                share[c].add_run(delivered / (tokens * STREAMING_NODES * c))
                cpu[c].add_run(used / max(delivered, 1) * 1e6)
                cpu_s_row[c].add_run(used / elapsed)
            bench.say(
                f"scale live pages run {rep + 1}/{bench.repeats}: "
                + ", ".join(
                    f"{c} pages {rate[c].runs[-1][0]:,.0f} events/s, {cpu[c].runs[-1][0]:.1f} us each" for c in CLIENTS
                )
            )
    finally:
        await conn.close()
        await router.stop()
        await fakes.stop()
    low, high = CLIENTS
    work = high / low
    row = bench.metric(
        "scale_events_cpu_ratio",
        f"  router CPU per event delivered: {high} / {low} pages (1.00x: linear)",
        "ratio",
        "ratio",
        "<= 1.00x",
        better="lower",
    )
    for a, b in zip(cpu[low].per_run, cpu[high].per_run):
        row.add_run(b / a)
    row = bench.metric(
        "scale_events_rate_ratio",
        f"  events delivered per second: {high} / {low} pages, per page (1.00x: every page gets as many)",
        "ratio",
        "ratio",
        better="higher",
    )
    for a, b in zip(rate[low].per_run, rate[high].per_run):
        row.add_run(b / a / work)


# -- 1,000 front-door calls waiting at once ---------------------------------------------------


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def front_waiting(bench: Bench) -> None:
    fakes = await Fakes({"w1": MODEL}, bench.workdir / "scale-front-fakes.log").start()
    port = free_port()
    router = await Router(
        bench.workdir,
        [node_table("w1", fakes.urls["w1"], 1, MODEL, roles=("task",))],
        bench.workdir / "scale-front.db",
        ollama_listen=f"127.0.0.1:{port}",
        max_connections=2000,
    ).start()
    rss = {
        n: bench.metric(
            f"scale_front_rss_{n}", f"router RSS beyond idle, {n:,} front-door calls waiting at once", "MB", "mb"
        )
        for n in CALLS
    }
    fds = {
        n: bench.metric(f"scale_front_fds_{n}", f"  open fds beyond idle, {n:,} calls waiting", "fds", "count")
        for n in CALLS
    }
    per_call = {
        n: bench.metric(f"scale_front_kb_{n}", f"  RSS per waiting call, {n:,} calls", "KB", "mb") for n in CALLS
    }
    idle_rss = bench.metric("scale_front_rss_idle", "router RSS, idle, before the calls (front door on)", "MB", "mb")
    conn = await router.connect()
    try:
        await asyncio.sleep(0.5)  # the node's first health check
        idle_rss.add_run(rss_mb(router.pid))
        for rep in range(max(bench.repeats // 2, 1)):
            for n in CALLS:
                base_rss, base_fds = rss_mb(router.pid), open_fds(router.pid)
                await fakes.call("hold", "w1")
                raw = Conn("127.0.0.1", port).encode(
                    "POST",
                    "/api/chat",
                    {"model": MODEL, "messages": [{"role": "user", "content": "waiting"}], "stream": True},
                )
                callers = []
                try:
                    for i in range(n):
                        reader, writer = await asyncio.open_connection(
                            "127.0.0.1", port, local_addr=(f"127.0.0.{2 + i % PEERS}", 0)
                        )
                        writer.write(raw)
                        callers.append((reader, writer))
                    deadline = time.monotonic() + 120
                    while True:  # every call a job: one running (held by the node), the rest queued
                        _, body = await conn.request("GET", "/api/queue?limit=0")
                        if body["queue_depth"] >= n - 1:
                            break
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"only {body['queue_depth']} of {n} calls queued within 120s")
                        await asyncio.sleep(0.1)
                    used = rss_mb(router.pid) - base_rss
                    rss[n].add_run(used)
                    fds[n].add_run(open_fds(router.pid) - base_fds)
                    per_call[n].add_run(used * 1024 / n)
                finally:
                    for _, writer in callers:  # a caller that hangs up cancels its job
                        writer.close()
                    await fakes.call("release", "w1")
                deadline = time.monotonic() + 120
                while True:
                    _, body = await conn.request("GET", "/api/queue?limit=0")
                    if body["queue_depth"] == 0 and all(x["running"] is None for x in body["nodes"]):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError("the cancelled calls' jobs did not leave the queue within 120s")
                    await asyncio.sleep(0.1)
            bench.say(
                f"scale front door run {rep + 1}: "
                + ", ".join(f"{n:,} calls +{rss[n].runs[-1][0]:.1f} MB, +{fds[n].runs[-1][0]:.0f} fds" for n in CALLS)
            )
    finally:
        await conn.close()
        await router.stop()
        await fakes.stop()
    low, high = CALLS
    for key, what, metric in (("scale_front_rss_ratio", "RSS", rss), ("scale_front_fds_ratio", "open fds", fds)):
        row = bench.metric(
            key,
            f"  {what} beyond idle: {high:,} / {low:,} calls per call (1.00x: linear)",
            "ratio",
            "ratio",
            "<= 1.00x",
            better="lower",
        )
        for a, b in zip(metric[low].per_run, metric[high].per_run):
            if a >= (0.5 if what == "RSS" else 1):  # memory the router kept from a repeat before: no cost to compare
                row.add_run(b / a / (high / low))
