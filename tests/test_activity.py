"""Busy spans per node over a window, from run rows: clipped, merged, running runs included."""

from __future__ import annotations

from gpuq.activity import activity
from gpuq.jobs import iso

T = 1_800_000_000.0


def run(node, state, start, end):
    return {
        "node": node,
        "state": state,
        "started_at": iso(T + start),
        "finished_at": None if end is None else iso(T + end),
    }


def test_spans_are_clipped_to_the_window_merged_and_counted():
    runs = [
        run("a", "done", -50, 20),  # began before the window
        run("a", "failed", 20, 40),  # touches the last one: merged
        run("a", "preempted", 100, 130),
        run("a", "done", 500, None) | {"state": "running"},  # running: busy up to the end
        run("b", "cancelled", 10, 30),
        run("b", "done", 1100, 1200),  # after the window: not seen
    ]
    got = activity(runs, T, T + 1000)
    assert got["a"].busy == [(T, T + 40), (T + 100, T + 130), (T + 500, T + 1000)]
    assert got["a"].busy_s == 40 + 30 + 500
    assert got["a"].finished == 2  # done and failed runs that ended inside the window
    assert got["b"].busy == [(T + 10, T + 30)] and got["b"].finished == 0


def test_an_idle_node_is_absent():
    assert activity([], T, T + 10) == {}
