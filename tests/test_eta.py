"""Start estimates as a pure function: the basis (median of the last 20 done runs for the model,
else the node's, else unknown with a reason), the running job's elapsed time, the jobs ahead
with held critiques counted, a held critique after its parent, a blocked node."""

from __future__ import annotations

from gpuq.eta import Estimate, History, NodePlan, Slot, estimate

NOW = 1_800_000_000.0


def test_the_median_of_the_models_runs_else_the_nodes_else_unknown():
    h = History({("n", "a"): [10, 30, 20], ("n", None): [10, 30, 20, 100, 100]})
    assert h.expected_s("n", "a") == 20
    assert h.expected_s("n", "b") == 30  # no run of b: the node's median
    assert h.expected_s("m", "a") is None


def test_only_the_last_20_runs_count():
    newest_first = [10.0] * 20 + [1000.0] * 30
    assert History({("n", "a"): newest_first}).expected_s("n", "a") == 10


def test_waiting_jobs_start_after_the_running_job_and_each_one_ahead():
    h = History({("n", "a"): [60], ("n", "b"): [120], ("n", None): [60, 120]})
    plan = NodePlan("n", Slot("r", "a", started_s=NOW - 20), (Slot("w1", "a"), Slot("w2", "b"), Slot("w3", "a")))
    e = estimate([plan], h, NOW)
    assert e["r"] == Estimate(NOW - 20, NOW + 40)  # 60 s expected, 20 s elapsed
    assert e["w1"] == Estimate(NOW + 40, NOW + 100)
    assert e["w2"] == Estimate(NOW + 100, NOW + 220)
    assert e["w3"] == Estimate(NOW + 220, NOW + 280)


def test_an_overdue_running_job_ends_any_moment_not_in_the_past():
    h = History({("n", None): [60]})
    e = estimate([NodePlan("n", Slot("r", "a", started_s=NOW - 300), (Slot("w", "a"),))], h, NOW)
    assert e["r"].finish_s == NOW and e["w"] == Estimate(NOW, NOW + 60)


def test_an_idle_node_starts_its_head_now():
    e = estimate([NodePlan("n", None, (Slot("w", "a"),))], History({("n", None): [5]}), NOW)
    assert e["w"] == Estimate(NOW, NOW + 5)


def test_no_history_is_unknown_with_the_reason():
    e = estimate([NodePlan("n", Slot("r", "a", started_s=NOW), (Slot("w", "a"),))], History(), NOW)
    assert e["r"].finish_s is None and "no finished run on n" in e["r"].reason
    assert e["w"].start_s is None and e["w"].finish_s is None
    assert e["w"].reason == "no finished run on n yet to time the running job r"
    idle = estimate([NodePlan("n", None, (Slot("w", "a"), Slot("x", "a")))], History(), NOW)
    assert idle["w"].start_s == NOW and idle["w"].finish_s is None  # it starts now; how long: unknown
    assert idle["x"].start_s is None and "job w ahead of it" in idle["x"].reason


def test_held_critiques_ahead_are_counted_and_a_held_one_waits_for_its_parent():
    h = History({("t", None): [100], ("c", None): [10]})
    tasks = NodePlan("t", Slot("parent", "m", started_s=NOW), ())
    crits = NodePlan("c", None, (Slot("held", "m", waiting_for="parent"), Slot("behind", "m")))
    e = estimate([crits, tasks], h, NOW)
    assert e["parent"].finish_s == NOW + 100
    assert e["held"] == Estimate(NOW + 100, NOW + 110)  # not before its parent is done
    assert e["behind"] == Estimate(NOW + 10, NOW + 20)  # the held one is counted in its place


def test_a_held_critique_whose_parent_has_no_estimate_says_so():
    e = estimate([NodePlan("c", None, (Slot("held", "m", waiting_for="p"),))], History({("c", None): [10]}), NOW)
    assert e["held"].start_s is None and e["held"].reason.startswith("waits for parent p")


def test_a_blocked_node_starts_nothing_but_its_running_job_still_ends():
    h = History({("n", None): [60]})
    plan = NodePlan("n", Slot("r", "a", started_s=NOW), (Slot("w", "a"),), blocked="n is down")
    e = estimate([plan], h, NOW)
    assert e["r"].finish_s == NOW + 60
    assert e["w"] == Estimate(None, None, "n is down")


def test_a_cold_job_pays_the_measured_load_and_a_warm_one_does_not():
    """Runs of 12 s of which 10 s loading (gpuq unloads after each job): 2 s warm, 12 s cold."""
    h = History({("n", "a"): [12, 12, 12], ("n", "b"): [12]}, {("n", "a"): [10, 10, 10], ("n", "b"): [10]})
    waiting = (Slot("w1", "a"), Slot("w2", "a"), Slot("w3", "b"))
    running = Slot("r", "a", started_s=NOW)
    after_each = estimate([NodePlan("n", running, waiting)], h, NOW)
    assert [after_each[s.id].finish_s for s in waiting] == [NOW + 24, NOW + 36, NOW + 48]  # each loads again
    when_idle = estimate([NodePlan("n", running, waiting, keeps_warm=True)], h, NOW)
    assert [when_idle[s.id].finish_s for s in waiting] == [NOW + 14, NOW + 16, NOW + 28]  # b loads
    # An idle node holding "a" warm (a call's keep_alive) starts its first "a" job warm, only it.
    idle = estimate([NodePlan("n", None, waiting, warm="a:latest")], h, NOW)
    assert [idle[s.id].finish_s for s in waiting] == [NOW + 2, NOW + 14, NOW + 26]


def test_runs_with_no_load_measured_keep_the_plain_median():
    assert History({("n", "a"): [10, 30, 20]}).expected_s("n", "a", cold=True) == 20
    assert History({("n", "a"): [10, 30, 20]}).expected_s("n", "a", cold=False) == 20
