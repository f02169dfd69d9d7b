"""The VRAM policy's decisions (gpuq/node/vram.py), without a node: what a job's request asks
Ollama to do with its model, whether a model stays warm after a job, which kept model leaves
before the next job, when a kept model expires on an idle node, how an unload is checked, and
what a node flagged for a model stuck in VRAM says."""

from __future__ import annotations

import pytest

from gpuq.node.calls import Policy
from gpuq.node.vram import (
    KEEP_WARM,
    UNLOAD_POLL_MAX_S,
    UNLOAD_POLL_S,
    call_keep_alive,
    call_keep_s,
    idle_wait_s,
    keep_for_next,
    may_keep,
    next_poll_s,
    ollama_seconds,
    request_keep_alive,
    same_model,
    to_evict,
    unload_after,
    unload_asked,
    unload_failure,
    warm_expired,
    warm_until,
)


def policy(keep_alive: int | str = 0, front_keep_s: float = 300.0, front_max_keep_s: float = 1800.0) -> Policy:
    return Policy(None, None, keep_alive, front_keep_s, front_max_keep_s)


def test_a_jobs_own_request_unloads_its_model_unless_the_node_keeps_it_when_idle():
    assert request_keep_alive("after-each") == 0
    assert request_keep_alive("when-idle") == KEEP_WARM == "10m"  # bounded: a dead router pins nothing


def test_a_models_short_and_full_names_are_one_model():
    assert same_model("qwen3", "qwen3:latest")
    assert not same_model("qwen3:8b", "qwen3:latest")


@pytest.mark.parametrize(
    "asked, kept",
    [
        (60.0, 60.0),  # what the client asked
        (7200.0, 1800.0),  # never past [front] max_keep_alive
        (None, 1800.0),  # forever (a negative keep_alive) becomes the cap
        (0.0, 0.0),  # 0: unloaded at once, as Ollama does
        (-5.0, 0.0),  # never negative
    ],
)
def test_a_calls_keep_alive_is_capped_by_front_max_keep_alive(asked, kept):
    assert call_keep_s(asked, policy()) == kept


def test_a_call_asks_its_node_with_its_keep_alive_in_seconds_else_with_the_nodes_policy():
    assert call_keep_alive(60.0, policy()) == 60 and isinstance(call_keep_alive(60.0, policy()), int)
    assert call_keep_alive(1.5, policy()) == 1.5
    assert call_keep_alive(0.0, policy(keep_alive=0)) == 0
    assert call_keep_alive(0.0, policy(keep_alive=KEEP_WARM)) == "10m"
    assert ollama_seconds(30.0) == 30 and ollama_seconds(0.25) == 0.25


def test_a_model_may_stay_only_for_a_calls_keep_alive_or_under_when_idle():
    assert not may_keep(0.0, when_idle=False)  # after-each, no keep_alive: always unloaded
    assert may_keep(30.0, when_idle=False)
    assert may_keep(0.0, when_idle=True)


def test_a_model_stays_for_a_next_job_of_the_same_model_only():
    assert keep_for_next("qwen3:latest", 0.0, "qwen3")  # "when-idle": the next job wants it
    assert not keep_for_next("qwen3:latest", 0.0, "llama3.2")  # another model waits: unload
    assert not keep_for_next("qwen3:latest", 30.0, "llama3.2")  # even against a call's keep_alive
    assert not keep_for_next("qwen3:latest", 0.0, None)  # "when-idle" and nothing waits: unload now
    assert keep_for_next("qwen3:latest", 30.0, None)  # a call's keep_alive, nothing waiting: kept


def test_a_kept_model_stays_until_its_keep_alive_or_until_the_node_goes_idle():
    assert warm_until(30.0, 1000.0) == 1030.0
    assert warm_until(0.0, 1000.0) is None


def test_only_another_models_job_evicts_the_kept_model():
    assert to_evict(None, "qwen3") is None
    assert to_evict("qwen3:latest", "qwen3") is None  # runs on it, no load
    assert to_evict("qwen3:latest", "llama3.2") == "qwen3:latest"


def test_on_an_idle_node_when_idles_model_leaves_at_once_and_a_calls_when_its_time_is_up():
    assert not warm_expired(None, None, 1000.0)
    assert warm_expired("qwen3", None, 1000.0)  # "when-idle": idle now, so it goes
    assert not warm_expired("qwen3", 1000.5, 1000.0)  # a call's keep_alive still runs
    assert warm_expired("qwen3", 1000.0, 1000.0)


def test_a_clients_unload_ends_a_warm_idle_model_now_and_a_running_jobs_model_at_its_end():
    assert unload_asked("llama3.2", "llama3.2:latest", idle=True)
    assert not unload_asked("qwen3:8b", "qwen3:8b", idle=False)  # a job took the node
    assert not unload_asked("llama3.2", "qwen3:8b", idle=True)
    assert unload_after("llama3.2:latest", "llama3.2")  # the running job's model: at its end
    assert not unload_after("llama3.2", "qwen3:8b") and not unload_after(None, "qwen3:8b")


def test_an_idle_worker_wakes_when_a_kept_models_time_runs_out():
    assert idle_wait_s(None, 1000.0, 5.0) == 5.0
    assert idle_wait_s(1002.0, 1000.0, 5.0) == 2.0
    assert idle_wait_s(1010.0, 1000.0, 5.0) == 5.0
    assert idle_wait_s(999.0, 1000.0, 5.0) == 0  # overdue: at once


def test_an_unload_is_checked_often_and_less_often_only_once_it_is_slow():
    assert next_poll_s(UNLOAD_POLL_S, 0.5) == UNLOAD_POLL_S
    delay, slow = UNLOAD_POLL_S, []
    for _ in range(10):
        delay = next_poll_s(delay, 3.0)
        slow.append(delay)
    assert slow[0] == 2 * UNLOAD_POLL_S and slow[-1] == UNLOAD_POLL_MAX_S == 0.5


def test_a_stuck_model_is_named_with_what_ps_last_showed_and_the_node_flagged():
    assert unload_failure("m:1", "n", 1.04, 1.0, listed=True, last_error=None) == (
        "unload failed: m:1 did not leave VRAM within 1.0s (unload_timeout 1s; m:1 is still listed by /api/ps);"
        " node n flagged"
    )
    # A last check cut short must not hide that /api/ps listed the model.
    assert unload_failure("m:1", "n", 2.0, 1.5, listed=True, last_error="timed out") == (
        "unload failed: m:1 did not leave VRAM within 2.0s (unload_timeout 1.5s; m:1 is still listed by /api/ps;"
        " the last check: timed out); node n flagged"
    )
    assert unload_failure("m:1", "n", 1.0, 1.0, listed=False, last_error="cannot connect") == (
        "unload failed: m:1 did not leave VRAM within 1.0s (unload_timeout 1s; cannot connect); node n flagged"
    )
