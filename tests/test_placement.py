"""Placement rules: pure functions, every rule and tie."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuq.errors import Conflict, Unprocessable
from gpuq.placement import (
    ASKED,
    FAN_OUT,
    FIRST_FREE,
    SHORTEST,
    SHORTEST_WITH_MODEL,
    Entry,
    NodeView,
    Placement,
    check_move,
    entries,
    entry,
    place_critique,
    place_task,
    position_between,
    preempt_elsewhere,
    reads_queue,
)


def node(name, rank, roles=("task", "critique"), up=True, running=False, queued=0, models=None):
    return NodeView(name, rank, tuple(roles), up, running, queued, models)


def test_task_goes_to_first_free_node_by_rank_not_by_list_order():
    nodes = [node("c", 3), node("a", 1, running=True), node("b", 2)]
    assert place_task(nodes).node == "b"
    assert place_task(nodes).reason == FIRST_FREE


def test_task_skips_nodes_without_task_role_and_down_nodes_for_free():
    nodes = [node("a", 1, roles=["critique"]), node("b", 2, up=False), node("c", 3)]
    assert place_task(nodes).node == "c"


def test_a_node_with_queued_jobs_is_not_free():
    nodes = [node("a", 1, queued=1), node("b", 2)]
    assert place_task(nodes).node == "b"


def test_all_busy_picks_shortest_queue_ties_by_rank():
    nodes = [
        node("a", 1, running=True, queued=2),
        node("b", 2, running=True, queued=1),
        node("c", 3, running=True, queued=1),
    ]
    placed = place_task(nodes)
    assert (placed.node, placed.reason) == ("b", SHORTEST)


def test_all_busy_prefers_an_up_node_over_a_down_one_with_a_shorter_queue():
    nodes = [node("a", 1, up=False), node("b", 2, running=True, queued=3)]
    assert place_task(nodes).node == "b"


def test_all_down_still_places_so_the_job_waits_visibly():
    nodes = [node("a", 1, up=False, queued=2), node("b", 2, up=False, queued=1)]
    assert place_task(nodes).node == "b"


def test_asked_node_must_exist_and_take_tasks():
    nodes = [node("a", 1), node("b", 2, roles=["critique"])]
    assert place_task(nodes, "a") == type(place_task(nodes, "a"))("a", ASKED)
    with pytest.raises(Conflict, match="node 'b' does not take task jobs"):
        place_task(nodes, "b")
    with pytest.raises(Unprocessable) as exc:
        place_task(nodes, "zz")
    assert exc.value.message == "unknown node 'zz' (the nodes: a, b)"


def test_no_task_node_is_a_conflict():
    with pytest.raises(Conflict, match="no node takes task jobs"):
        place_task([node("a", 1, roles=["critique"])])


def test_critique_fans_out_to_every_critique_node_in_rank_order():
    nodes = [node("b", 2), node("a", 1), node("t", 3, roles=["task"]), node("d", 4, roles=["critique"], up=False)]
    placed = place_critique(nodes)
    assert [p.node for p in placed] == ["a", "b", "d"]
    assert {p.reason for p in placed} == {FAN_OUT}


def test_critique_fan_out_excludes_the_parent_node():
    nodes = [node("a", 1), node("b", 2)]
    assert [p.node for p in place_critique(nodes, parent_node="a")] == ["b"]


def test_fan_out_with_no_node_left_is_a_clear_conflict():
    with pytest.raises(Conflict, match="no critique node is left"):
        place_critique([node("a", 1), node("t", 2, roles=["task"])], parent_node="a")
    with pytest.raises(Conflict, match="no node takes critique jobs"):
        place_critique([node("t", 1, roles=["task"])])


def test_check_move_rules():
    nodes = [node("b", 2, roles=["critique"]), node("a", 1)]
    check_move("critique", nodes, "b")
    with pytest.raises(Conflict, match="does not take task jobs"):
        check_move("task", nodes, "b")
    with pytest.raises(Unprocessable) as exc:
        check_move("task", nodes, "x")
    assert exc.value.message == "unknown node 'x' (the nodes: a, b)"


@pytest.mark.parametrize(
    "before,after,expected",
    [(None, None, 1024), (None, 1024, 0), (1024, None, 2048), (1024, 2048, 1536), (5, 6, None), (5, 7, 6)],
)
def test_position_between(before, after, expected):
    assert position_between(before, after, 1024) == expected


def test_a_task_naming_a_model_goes_to_the_first_free_node_that_has_it():
    nodes = [
        node("a", 1, models=frozenset({"qwen3:latest"})),
        node("b", 2, running=True, models=frozenset({"llama3.2:latest"})),
        node("c", 3, models=frozenset({"llama3.2:latest", "qwen3:latest"})),
    ]
    assert place_task(nodes, model="llama3.2").node == "c"
    assert place_task(nodes, model="Library/LLAMA3.2:latest").node == "c"  # as Ollama matches names
    assert place_task(nodes, model="qwen3").node == "a"


def test_when_every_node_with_the_model_is_busy_the_shortest_such_queue():
    nodes = [
        node("a", 1, models=frozenset({"qwen3:latest"})),
        node("b", 2, running=True, queued=3, models=frozenset({"llama3.2:latest"})),
        node("c", 3, running=True, queued=1, models=frozenset({"llama3.2:latest"})),
    ]
    placed = place_task(nodes, model="llama3.2")
    # "all busy" of the nodes with the model: node a is idle, it only lacks the model
    assert (placed.node, placed.reason) == ("c", SHORTEST_WITH_MODEL)


def test_a_model_no_task_node_has_is_422_naming_what_each_has():
    nodes = [
        node("a", 1, models=frozenset({"qwen3:latest"})),
        node("b", 2, roles=["critique"], models=frozenset({"mistral:latest"})),
        node("c", 3, models=frozenset()),
    ]
    with pytest.raises(Unprocessable) as exc:
        place_task(nodes, model="mistral")
    assert exc.value.message == (
        "model 'mistral' is not installed on any task node (a: qwen3:latest; "
        "c: nothing); pull it on one or choose another model"
    )


def test_a_node_not_heard_from_yet_may_have_the_model():
    nodes = [node("a", 1, models=frozenset({"qwen3:latest"})), node("b", 2)]
    assert place_task(nodes, model="mistral").node == "b"


def test_a_critique_naming_a_model_fans_out_to_the_nodes_that_have_it():
    nodes = [
        node("a", 1, models=frozenset({"qwen3:latest"})),
        node("b", 2, models=frozenset({"mistral:latest"})),
        node("c", 3, models=frozenset({"qwen3:latest"})),
    ]
    assert [p.node for p in place_critique(nodes, model="QWEN3")] == ["a", "c"]
    assert [p.node for p in place_critique(nodes, parent_node="a", model="qwen3")] == ["c"]
    with pytest.raises(Unprocessable):
        place_critique(nodes, asked="b", model="qwen3")


def test_placement_takes_an_asked_node_as_asked_and_leaves_the_guard_to_the_schema():
    nodes = [node("a", 1), node("b", 2)]
    assert place_critique(nodes, parent_node="a", asked="a")[0] == Placement("a", ASKED)


def test_a_pinned_model_cannot_move_to_a_node_without_it():
    target = node("b", 2, models=frozenset({"mistral:latest"}))
    with pytest.raises(Conflict) as exc:  # 409, as the front door's issue asks: the job stays put
        check_move("task", [target], "b", model="qwen3")
    assert exc.value.message == (
        "model 'qwen3' is not installed on node b (its Ollama lists: mistral:latest); the job stays where it is"
    )
    with pytest.raises(Conflict):
        check_move("embed", [target], "b", model="qwen3")
    check_move("task", [target], "b", model="Mistral")
    check_move("task", [target], "b", model=None)


# -- preempt_elsewhere ([router] interactive_preempts) ------------------------------------------

CODER, SMALL = "qwen3-coder:30b", "llama3.2:latest"
BOTH = frozenset({CODER, SMALL})


def busy(name, rank, lane, model, interactive=0, up=True, roles=("task",)):
    return NodeView(name, rank, tuple(roles), up, True, 0, BOTH, interactive, lane, model)


def test_a_call_behind_another_models_interactive_job_moves_to_preempt_a_batch_job():
    nodes = [busy("n1", 1, "interactive", SMALL), busy("n2", 2, "batch", SMALL), busy("n3", 3, "batch", SMALL)]
    assert preempt_elsewhere(nodes, "n1", CODER) == "n2"  # a load either way: the first by rank


def test_a_batch_job_of_the_calls_own_model_is_preferred_over_rank():
    nodes = [busy("n1", 1, "interactive", SMALL), busy("n2", 2, "batch", SMALL), busy("n3", 3, "batch", "qwen3-coder")]
    assert preempt_elsewhere(nodes, "n1", CODER) == "n2"  # "qwen3-coder" is qwen3-coder:latest: not the same
    nodes[2] = busy("n3", 3, "batch", CODER)
    assert preempt_elsewhere(nodes, "n1", CODER) == "n3"


def test_behind_an_interactive_job_of_its_own_model_it_stays_unless_a_batch_job_has_it_loaded():
    nodes = [busy("n1", 1, "interactive", CODER), busy("n2", 2, "batch", SMALL)]
    assert preempt_elsewhere(nodes, "n1", CODER) is None  # its model stays warm here: waiting is no worse
    nodes[1] = busy("n2", 2, "batch", CODER)
    assert preempt_elsewhere(nodes, "n1", CODER) == "n2"


def test_it_never_moves_from_a_node_running_a_batch_job_of_its_model_or_nothing():
    for here in (busy("n1", 1, "batch", CODER), node("n1", 1, models=BOTH), busy("n1", 1, None, None)):
        assert preempt_elsewhere([here, busy("n2", 2, "batch", CODER)], "n1", CODER) is None


def test_targets_must_be_up_take_tasks_have_the_model_and_have_no_interactive_job_waiting():
    here = busy("n1", 1, "interactive", SMALL)
    for other in (
        busy("n2", 2, "batch", CODER, up=False),
        busy("n2", 2, "batch", CODER, roles=("critique",)),
        busy("n2", 2, "batch", CODER, interactive=1),
        busy("n2", 2, "interactive", CODER),
        NodeView("n2", 2, ("task",), True, True, 0, frozenset({SMALL}), 0, "batch", SMALL),
    ):
        assert preempt_elsewhere([here, other], "n1", CODER) is None, other
    assert preempt_elsewhere([here], "n1", CODER) is None
    assert preempt_elsewhere([here, busy("n2", 2, "batch", SMALL)], "n1", None) is None  # no model: no move


def test_a_call_leaves_a_batch_job_of_another_model_only_for_one_running_its_own():
    nodes = [busy("n1", 1, "batch", SMALL), busy("n2", 2, "batch", SMALL), busy("n3", 3, "batch", CODER)]
    assert preempt_elsewhere(nodes, "n1", CODER) == "n3"  # no unload, no load there
    assert preempt_elsewhere(nodes[:2], "n1", CODER) is None  # a load anywhere: it stays


def test_a_job_that_asked_for_no_model_is_weighed_by_the_model_it_would_run_on_each_node():
    """It runs the default model of the node it is on: n3's batch job runs the model this job
    has on n1, but on n3 it would run n3's default, so n3 is no warmer than anywhere else."""
    nodes = [busy("n1", 1, "batch", SMALL), busy("n2", 2, "batch", SMALL), busy("n3", 3, "batch", CODER)]
    assert preempt_elsewhere(nodes, "n1", CODER, defaults={"n1": CODER, "n2": CODER, "n3": SMALL}) is None
    assert preempt_elsewhere(nodes, "n1", CODER, defaults={"n1": CODER, "n2": CODER, "n3": CODER}) == "n3"
    assert preempt_elsewhere(nodes, "n1", CODER, defaults={"n1": CODER, "n2": SMALL, "n3": CODER}) == "n2"  # by rank


WAITING = st.lists(st.tuples(st.sampled_from(["interactive", "batch"]), st.sampled_from(["ann", "bob", "cy", None])))


@given(waiting=WAITING, lane=st.sampled_from(["interactive", "batch"]), owner=st.sampled_from(["ann", "dan", None]))
@pytest.mark.parametrize("fair", [False, True])
def test_many_jobs_enter_where_one_entry_each_would_put_them(waiting, lane, owner, fair):
    """entries (a batch's lines, in one go) is entry applied to each job in turn, the ones before
    it already waiting: the same gaps among the jobs that waited, and the same reasons with
    their positions. (Held behind a waiting interactive job, a user's jobs entering at one gap
    keep their order in one go, where one by one a later one enters just ahead of an earlier
    one: the same gap, the reasons' positions told apart.)"""
    n = 5
    got = entries(waiting, lane, owner, fair, n)
    queue = [(ln, o, None) for ln, o in waiting]  # (lane, owner, index in `waiting` it stands before)
    for j in range(n):
        one = entry([(ln, o) for ln, o, _ in queue], lane, owner, fair)
        # the gap among the jobs first waiting: the first of those at or past one.index
        gap = next((i for i, (_, _, w) in enumerate(queue[one.index :]) if w is None), None)
        originals = [i for i, (_, _, w) in enumerate(queue) if w is None]
        index = len(waiting) if gap is None else originals.index(one.index + gap)
        assert got[j].index == index
        if lane == "interactive" or not any(ln == "interactive" for ln, _ in waiting):
            assert got[j] == Entry(index, one.reason)
        queue.insert(one.index, (lane, owner, index))


def test_a_batch_job_reads_the_queue_only_with_fair_share_an_interactive_one_always():
    assert reads_queue("interactive", False) and reads_queue("batch", True) and not reads_queue("batch", False)
