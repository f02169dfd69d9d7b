"""`python -m bench.sqliteab --pairs N DIR_A DIR_B`: A/B of gpuq on SQLite between two checkouts,
alternately in one run (A B, B A, A B, ...: the order swapped every pair, so a machine getting
busier or quieter falls on both alike). Each turn runs the checkout's own bench sections
(default: peers, submit, first_token, growth; `--quick` sizes) in a fresh interpreter with that
checkout first on sys.path, its routers included, and keeps every sample; the table pools them
per side: the median and the pessimistic p95 (the 5th percentile where higher is better), and
B against A."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .stats import fmt, percentile

BENCH_DIR = Path(__file__).resolve().parent

# Run in the checkout (cwd and PYTHONPATH: its gpuq and its bench): one quick pass of the
# sections, every sample of every row written as JSON to argv[2].
CHILD = r"""
import asyncio, json, shutil, sys, tempfile
from pathlib import Path
import bench.run as entry
from bench.run import Bench
only, out, where = sys.argv[1], sys.argv[2], sys.argv[3]
workdir = Path(tempfile.mkdtemp(prefix=".work-ab-", dir=where))
bench = Bench(True, set(only.split(",")), workdir)
try:
    # A checkout from before bench/core.py ran its sections as Bench.run().
    asyncio.run(entry.run_sections(bench) if hasattr(entry, "run_sections") else bench.run())
finally:
    shutil.rmtree(workdir, ignore_errors=True)
Path(out).write_text(json.dumps({k: {"label": m.label, "unit": m.unit, "kind": m.kind, "better": m.better,
                                     "runs": m.runs} for k, m in bench.metrics.items()}))
"""

# The rows issue 27 asks about ("nothing about SQLite got slower"), in the table's order.
ROWS = (
    "store_rt",
    "store_rt_ms",
    "store_rt_rest_ms",
    "store_read",
    "submit_1",
    "submit_32",
    "ttft_overhead",
    "ttft_gpuq",
    "ttft_submit",
    "growth_claim_100",
    "growth_claim_100000",
    "growth_claim_sql_100",
    "growth_claim_sql_100000",
    "growth_submit_100000",
)


def one_turn(checkout: Path, only: str, python: str, where: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    try:
        subprocess.run(
            [python, "-c", CHILD, only, out, str(where)],
            cwd=checkout,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=1800,
        )
        return json.loads(Path(out).read_text())
    finally:
        os.unlink(out)


def summary(samples: list[float], kind: str, better: str) -> tuple[float, float]:
    return statistics.median(samples), percentile(samples, 5 if better == "higher" else 95)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sqliteab", description=__doc__)
    parser.add_argument("a", help="checkout A (the old code)")
    parser.add_argument("b", help="checkout B (the new code)")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--only", default="peers,submit,first_token,growth")
    parser.add_argument("--python", default=sys.executable, help="the interpreter both run under")
    parser.add_argument("--dir", default=str(BENCH_DIR), help="where the databases live (gpuq's disk)")
    parser.add_argument("--out", default="", help="every sample of both sides as JSON")
    args = parser.parse_args()
    sides = {"A": Path(args.a).resolve(), "B": Path(args.b).resolve()}
    pooled: dict[str, dict[str, dict]] = {"A": {}, "B": {}}
    started = time.time()
    for pair in range(args.pairs):
        for side in ("A", "B") if pair % 2 == 0 else ("B", "A"):
            t = time.perf_counter()
            got = one_turn(sides[side], args.only, args.python, Path(args.dir))
            for key, m in got.items():
                row = pooled[side].setdefault(key, {**m, "runs": []})
                row["runs"].extend(m["runs"])
            print(
                f"[sqliteab {time.strftime('%H:%M:%S')}] pair {pair + 1}/{args.pairs} {side}"
                f" ({sides[side].name}) in {time.perf_counter() - t:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    keys = [k for k in ROWS if k in pooled["A"] and k in pooled["B"]]
    print(f"| measure | unit | A {sides['A'].name} median (p95) | B {sides['B'].name} median (p95) | B / A |")
    print("| --- | --- | --- | --- | --- |")
    for key in keys:
        a, b = pooled["A"][key], pooled["B"][key]
        sa = [v for run in a["runs"] for v in run]
        sb = [v for run in b["runs"] for v in run]
        (ma, pa), (mb, pb) = summary(sa, a["kind"], a["better"]), summary(sb, b["kind"], b["better"])
        print(
            f"| {b['label'].strip()} | {b['unit']} | {fmt(ma, a['kind'])} ({fmt(pa, a['kind'])}) |"
            f" {fmt(mb, b['kind'])} ({fmt(pb, b['kind'])}) | {mb / ma:.2f}x |"
        )
    print(
        f"\n{args.pairs} pairs, {time.time() - started:.0f}s; runs per side: "
        + ", ".join(f"{k} {len(pooled['A'][k]['runs'])}" for k in keys[:1])
    )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {"sides": {k: str(v) for k, v in sides.items()}, "pairs": args.pairs, "metrics": pooled}, indent=1
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
