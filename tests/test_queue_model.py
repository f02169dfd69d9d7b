"""A Hypothesis state machine: random sequences of submit, move, preempt, delete, clear, retry,
claim and finish against a plain Python model of the per-node queues, critiques held for their
parent's result included, in two lanes (interactive ahead of batch), with fair share among users'
batch jobs or without, and a user's max_running or not. After every step the database's order
equals the model's, positions within a queue are distinct and ordered, at most one job runs per
node, no job is lost, the guard holds, and each job's event log replays to its state; an arrival
never reorders the jobs already waiting (a person's move is never undone by it)."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import gpuq.store.steps
from gpuq.errors import BadRequest, Conflict, GuardMiss, GuardRefused, NoResultToCritique, NotFound, Unprocessable
from gpuq.store import NewJob, NodeInfo, Store

NODES = [
    NodeInfo("a", 1, ("task", "critique"), "ma", True),
    NodeInfo("b", 2, ("task", "critique"), "mb", True),
    NodeInfo("c", 3, ("task",), "mc", True),
]
ROLES = {n.name: n.roles for n in NODES}
NAMES = [n.name for n in NODES]
UNKNOWN = "1800000000-00000000"
OWNERS = ["alice", "bob", "carol", None]
LANES = ["interactive", "batch"]


class QueueMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        # The smallest gap that works (2), so that two moves to one spot exhaust it and the
        # renumber inside the move runs often.
        self.gap = mock.patch.object(gpuq.store.steps, "POSITION_GAP", 2)
        self.gap.start()
        self.dir = tempfile.mkdtemp(prefix="gpuq-model-")
        self.loop = asyncio.new_event_loop()
        self.store = Store(self.database())
        self.run(self.store.open())
        # The model: each node's waiting jobs in order, its running job, and every job's facts.
        self.queues: dict[str, list[str]] = {n: [] for n in NAMES}
        self.running: dict[str, tuple[str, int] | None] = {n: None for n in NAMES}
        self.state: dict[str, str] = {}
        self.node: dict[str, str] = {}
        self.kind: dict[str, str] = {}
        self.parent: dict[str, str | None] = {}
        self.from_parent: set[str] = set()  # critiques that review their parent's result
        self.lane: dict[str, str] = {}
        self.owner: dict[str, str | None] = {}
        self.fair = False  # fair share among users' batch jobs
        self.limits: dict[str, int] = {}  # users' max_running
        self.old_runs: list[tuple[str, int]] = []  # runs that ended: finishing them is refused

    def teardown(self):
        try:
            self.run(self.store.close())
        finally:
            self.loop.close()
            self.gap.stop()
            shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def attempt(self, expected: type | None, coro):
        """Run a store call; it must succeed (expected None) or raise exactly `expected`."""
        try:
            result = self.run(coro)
        except (BadRequest, Conflict, NotFound, Unprocessable, GuardMiss) as exc:
            assert type(exc) is expected, f"expected {expected and expected.__name__}, got {exc!r}"
            return None
        assert expected is None, f"expected {expected.__name__}, but the store allowed it"
        return result

    # -- model helpers --------------------------------------------------------------------------

    def _add(
        self, job_id: str, kind: str, node: str, parent: str | None, lane: str = "batch", owner: str | None = None
    ) -> int:
        """A new job enters its queue where the lanes (and fair share) say; returns its index."""
        self.state[job_id], self.node[job_id], self.kind[job_id] = "queued", node, kind
        self.parent[job_id] = parent
        self.lane[job_id], self.owner[job_id] = lane, owner
        index = self._entry(node, lane, owner, self.fair)
        self.queues[node].insert(index, job_id)
        return index

    def _entry(self, node: str, lane: str, owner: str | None, fair: bool) -> int:
        """The index where a job of this lane and owner enters the node's queue (the rule said plainly)."""
        queue = self.queues[node]
        after_interactive = max((i + 1 for i, j in enumerate(queue) if self.lane[j] == "interactive"), default=0)
        if lane == "interactive":
            index = after_interactive
        elif not fair:
            index = len(queue)
        else:  # round-robin: before the first batch job that is its owner's (k+1)-th, k this one's
            rounds: dict[str | None, int] = {}
            ahead = []
            for i, j in enumerate(queue):
                if self.lane[j] == "batch":
                    rounds[self.owner[j]] = rounds.get(self.owner[j], 0) + 1
                    ahead.append((i, rounds[self.owner[j]]))
            mine = sum(1 for j in queue if self.lane[j] == "batch" and self.owner[j] == owner) + 1
            index = next((i for i, r in ahead if r > mine), len(queue))
            index = max(index, after_interactive)
        return index

    def _over_limit(self, job: str) -> bool:
        owner = self.owner[job]
        if owner not in self.limits:
            return False
        running = sum(1 for r in self.running.values() if r is not None and self.owner[r[0]] == owner)
        return running >= self.limits[owner]

    def _end_run(self, node: str) -> str:
        job_id, run_id = self.running[node]
        self.running[node] = None
        self.old_runs.append((job_id, run_id))
        return job_id

    def _held(self, job: str) -> bool:
        return job in self.from_parent and self.state[self.parent[job]] != "done"

    def _end_held_critiques(self, task: str) -> None:
        """A task that ended without a result: its held critiques are cancelled."""
        for c in [c for c in self.from_parent if self.parent[c] == task and self.state[c] == "queued"]:
            self.queues[self.node[c]].remove(c)
            self.state[c] = "cancelled"

    def _critique_waits_on(self, task: str, node: str) -> bool:
        return any(
            p == task and self.node[c] == node and self.state[c] in ("queued", "running")
            for c, p in self.parent.items()
        )

    # -- drawing jobs ---------------------------------------------------------------------------

    def draw_job(self, data, *likely: str, busy_node: bool = False) -> str:
        """Mostly a job in one of the `likely` states (the operation's real work) -- on a node
        that is running something, if `busy_node` -- and sometimes any job at all (refusals)."""
        pool = [j for j in self.state if self.state[j] in likely]
        if busy_node and data.draw(st.booleans(), label="on a busy node"):
            pool = [j for j in pool if self.running[self.node[j]]] or pool
        if not pool or data.draw(st.integers(0, 4), label="any job") == 0:
            pool = list(self.state)
        return data.draw(st.sampled_from(pool), label="job")

    # -- rules ----------------------------------------------------------------------------------

    @initialize(
        nodes=st.lists(st.sampled_from(NAMES), min_size=2, max_size=10),
        busy=st.sets(st.sampled_from(NAMES)),
        fair=st.booleans(),
        limits=st.dictionaries(st.sampled_from(OWNERS[:3]), st.integers(1, 2)),
    )
    def fill(self, nodes, busy, fair, limits):
        """Start from a few waiting jobs, with some nodes already running their head."""
        self.fair, self.limits = fair, limits
        self.store.set_max_running(limits)
        for i, node in enumerate(nodes):
            self.submit_task(node, "batch", OWNERS[i % len(OWNERS)])
        for node in sorted(busy):
            self._claim(node)

    @rule(node=st.sampled_from(NAMES), lane=st.sampled_from(LANES), owner=st.sampled_from(OWNERS))
    def submit_task(self, node, lane, owner):
        before = list(self.queues[node])
        [job] = self.run(
            self.store.submit(NewJob("task", "p", node=node, lane=lane, owner=owner), NODES, "api", fair=self.fair)
        )
        index = self._add(job["id"], "task", node, None, lane, owner)
        assert job["position"] == index + 1
        waiting = self.run(
            self.store.read("SELECT id FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id", (node,))
        )
        assert [r["id"] for r in waiting if r["id"] != job["id"]] == before  # nothing already waiting moved

    @precondition(lambda self: self.state)
    @rule(data=st.data(), node=st.sampled_from(["a", "b"]), of_result=st.booleans())
    def submit_critique(self, data, node, of_result):
        """With a file (a prompt) or of the parent's result (no prompt: held until it is done)."""
        tasks = [j for j in self.state if self.kind[j] == "task"]
        unfinished = [j for j in tasks if self.state[j] in ("queued", "running") and self.node[j] != node]
        if of_result and unfinished and data.draw(st.booleans(), label="of an unfinished task"):
            tasks = unfinished  # the case that holds: make it common
        parent = data.draw(st.sampled_from(tasks), label="parent")
        expected = None
        if of_result and self.state[parent] in ("failed", "cancelled"):
            expected = NoResultToCritique
        elif self.node[parent] == node:  # the schema refuses the insert (migration 010)
            expected = GuardRefused
        lane, owner = data.draw(st.sampled_from(LANES), label="lane"), data.draw(st.sampled_from(OWNERS), label="owner")
        created = self.attempt(
            expected,
            self.store.submit(
                NewJob("critique", None if of_result else "c", node=node, parent=parent, lane=lane, owner=owner),
                NODES,
                "api",
                fair=self.fair,
            ),
        )
        if created is not None:
            self._add(created[0]["id"], "critique", node, parent, lane, owner)
            if of_result:
                self.from_parent.add(created[0]["id"])
            assert created[0]["waiting_for"] == (parent if self._held(created[0]["id"]) else None)

    @precondition(lambda self: self.state)
    @rule(
        data=st.data(),
        how=st.sampled_from(["position", "before", "after", "node"]),
        position=st.integers(1, 8),
        to=st.none() | st.sampled_from(NAMES),
    )
    def move(self, data, how, position, to):
        job = self.draw_job(data, "queued")
        target = to or self.node[job]
        other = None
        if how in ("before", "after"):
            waiting = self.queues[target]
            other = data.draw(
                st.sampled_from(waiting if waiting and data.draw(st.booleans()) else list(self.state)), label="other"
            )
        self._move(job, how, position, other, to)

    @precondition(lambda self: any(len(q) >= 3 for q in self.queues.values()))
    @rule(data=st.data(), spot=st.integers(1, 3))
    def crowd_one_spot(self, data, spot):
        """Several jobs moved in turn into one spot: the gap there runs out."""
        node = data.draw(st.sampled_from([n for n in NAMES if len(self.queues[n]) >= 3]), label="node")
        for job in reversed(self.queues[node][spot:]):
            self._move(job, "position", spot, None, None)

    def _move(self, job, how, position, other, to):
        target = to or self.node[job]
        where = {
            "position": {"position": position},
            "before": {"before": other},
            "after": {"after": other},
            "node": {},
        }[how]
        if to is not None:
            where["node"] = to
        expected = None
        if not where:
            expected = BadRequest
        elif other == job:
            expected = BadRequest
        elif self.state[job] != "queued":
            expected = Conflict
        elif target != self.node[job] and self.kind[job] not in ROLES[target]:
            expected = Conflict
        elif other is not None and other not in self.queues[target]:
            expected = Conflict
        elif target != self.node[job] and self.kind[job] == "critique" and self.node[self.parent[job]] == target:
            expected = GuardRefused  # the schema refuses the update of node
        elif target != self.node[job] and self.kind[job] == "task" and self._critique_waits_on(job, target):
            expected = GuardRefused
        moved = self.attempt(expected, self.store.move(job, NODES, "api", **where))
        if moved is None:
            return
        if how != "node" or target != self.node[job]:  # a bare move to its own node changes nothing
            self.queues[self.node[job]].remove(job)
            others = self.queues[target]
            index = {
                "position": position - 1,
                "node": len(others),
                "before": others.index(other) if other in others else None,
                "after": others.index(other) + 1 if other in others else None,
            }[how]
            others.insert(index, job)
            self.node[job] = target
        assert (moved["node"], moved["position"]) == (target, self.queues[target].index(job) + 1)

    @precondition(lambda self: self.state)
    @rule(data=st.data())
    def preempt(self, data):
        job = self.draw_job(data, "queued", busy_node=True)
        expected = None if self.state[job] == "queued" and not self._held(job) else Conflict
        result = self.attempt(expected, self.store.preempt(job, "api"))
        if result is None:
            return
        _, interrupted = result
        node = self.node[job]
        self.queues[node].remove(job)
        self.queues[node].insert(0, job)
        if self.running[node] is None:
            assert interrupted is None
            return
        victim = self._end_run(node)
        assert interrupted is not None and interrupted.job_id == victim
        self.state[victim] = "queued"
        self.queues[node].insert(1, victim)

    @precondition(lambda self: self.state)
    @rule(data=st.data())
    def delete(self, data):
        job = self.draw_job(data, "queued", "running")
        expected = None if self.state[job] in ("queued", "running") else Conflict
        result = self.attempt(expected, self.store.delete(job, "api"))
        if result is None:
            return
        _, interrupted = result
        node = self.node[job]
        if self.state[job] == "running":
            assert self._end_run(node) == job and interrupted.job_id == job
        else:
            assert interrupted is None
            self.queues[node].remove(job)
        self.state[job] = "cancelled"
        self._end_held_critiques(job)

    @rule(node=st.sampled_from(NAMES), running=st.booleans())
    def clear(self, node, running):
        ids, interrupted = self.run(self.store.clear(node, "api", running=running))
        expected = []
        if running and self.running[node] is not None:
            expected.append(self._end_run(node))
            assert interrupted is not None and interrupted.job_id == expected[0]
        else:
            assert interrupted is None
        expected += self.queues[node]
        self.queues[node] = []
        assert ids == expected
        for job in ids:
            self.state[job] = "cancelled"
            self._end_held_critiques(job)

    @precondition(lambda self: self.state)
    @rule(data=st.data())
    def retry(self, data):
        job = self.draw_job(data, "failed", "cancelled")
        expected = None
        if self.state[job] not in ("failed", "cancelled"):
            expected = Conflict
        elif job in self.from_parent and self.state[self.parent[job]] in ("failed", "cancelled"):
            expected = NoResultToCritique
        elif self.parent[job] is not None and self.node[self.parent[job]] == self.node[job]:
            expected = GuardRefused  # the schema refuses the requeue
        if self.attempt(expected, self.store.retry(job, "api")) is None:
            return
        self.state[job] = "queued"  # a batch job to the tail, an interactive one in its lane
        self.queues[self.node[job]].insert(self._entry(self.node[job], self.lane[job], self.owner[job], False), job)

    @rule(data=st.data())
    def claim(self, data):
        idle = [n for n in NAMES if self.queues[n] and not self.running[n]]
        self._claim(data.draw(st.sampled_from(idle if idle and data.draw(st.integers(0, 3)) else NAMES), label="node"))

    def _claim(self, node):
        claimed = self.run(self.store.claim(node))
        # a held critique blocks nothing, nor a job whose owner runs their max_running already
        ready = [j for j in self.queues[node] if not self._held(j) and not self._over_limit(j)]
        if self.running[node] is not None or not ready:
            assert claimed is None
            return
        job = ready[0]
        self.queues[node].remove(job)
        assert claimed is not None and claimed["id"] == job
        self.state[job] = "running"
        self.running[node] = (job, claimed["run_id"])

    @precondition(lambda self: any(self.running.values()))
    @rule(data=st.data(), ok=st.booleans())
    def finish(self, data, ok):
        node = data.draw(st.sampled_from([n for n in NAMES if self.running[n]]), label="node")
        job, run_id = self.running[node]
        state = "done" if ok else "failed"
        self.run(self.store.finish(job, run_id, state, None if ok else "boom", "out"))
        self._end_run(node)
        self.state[job] = state
        if state == "failed":
            self._end_held_critiques(job)

    @precondition(lambda self: self.old_runs)
    @rule(data=st.data())
    def finish_an_ended_run(self, data):
        job, run_id = data.draw(st.sampled_from(self.old_runs), label="ended run")
        self.attempt(GuardMiss, self.store.finish(job, run_id, "done", None, "late"))

    @rule(verb=st.sampled_from(["move", "preempt", "delete", "retry"]))
    def unknown_job(self, verb):
        call = {
            "move": lambda: self.store.move(UNKNOWN, NODES, "api", position=1),
            "preempt": lambda: self.store.preempt(UNKNOWN, "api"),
            "delete": lambda: self.store.delete(UNKNOWN, "api"),
            "retry": lambda: self.store.retry(UNKNOWN, "api"),
        }[verb]
        self.attempt(NotFound, call())

    # -- invariants ---------------------------------------------------------------------------

    @invariant()
    def database_equals_model(self):
        rows = self.run(
            self.store.read("SELECT id, kind, state, node, parent_id FROM job ORDER BY node, state, position, id")
        )
        assert {r["id"]: r["state"] for r in rows} == self.state  # no job lost, none invented
        assert {r["id"]: r["node"] for r in rows} == self.node
        for name in NAMES:
            queued = [r["id"] for r in rows if r["node"] == name and r["state"] == "queued"]
            assert queued == self.queues[name], name
            positions = [
                r["position"]
                for r in self.run(
                    self.store.read(
                        "SELECT position FROM job WHERE node = ? AND state = 'queued' ORDER BY position, id", (name,)
                    )
                )
            ]
            assert positions == sorted(set(positions)), (name, positions)  # distinct, in order
            running = [r["id"] for r in rows if r["node"] == name and r["state"] == "running"]
            assert len(running) <= 1
            assert running == ([self.running[name][0]] if self.running[name] else [])
        held = {r["id"] for r in self.run(self.store.read("SELECT id FROM held_job"))}
        assert held == {j for j in self.from_parent if self.state[j] == "queued" and self._held(j)}
        by_id = {r["id"]: r for r in rows}
        for r in rows:  # the guard: no critique waits or runs on its parent task's node
            if r["parent_id"] and r["state"] in ("queued", "running"):
                assert r["node"] != by_id[r["parent_id"]]["node"]

    @invariant()
    def event_log_replays_to_each_state(self):
        events = self.run(self.store.read("SELECT job_id, from_state, to_state FROM event ORDER BY id"))
        replayed: dict[str, str | None] = {}
        for e in events:
            assert e["from_state"] == replayed.get(e["job_id"]), e
            replayed[e["job_id"]] = e["to_state"]
        assert replayed == self.state

    def database(self):
        return Path(self.dir) / "q.db"


class QueueMachineOnPostgres(QueueMachine):
    """The same model, the same rules, on PostgreSQL: a fresh database of the session's
    throwaway cluster for each example (tests/pg.py), dropped after it."""

    def database(self):
        self.pg_name = CLUSTER[0].create_database()
        return CLUSTER[0].dsn(self.pg_name)

    def teardown(self):
        super().teardown()
        CLUSTER[0].drop_database(self.pg_name)


# The cluster, for the model's examples (a unittest-style case takes no fixture itself).
CLUSTER: list = []


@pytest.fixture(autouse=True)
def _cluster_for_the_model(request):
    if request.node.get_closest_marker("postgres"):
        CLUSTER[:] = [request.getfixturevalue("pg_cluster")]


SETTINGS = dict(
    stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
QueueMachine.TestCase.settings = settings(max_examples=100, **SETTINGS)
test_queue_model = QueueMachine.TestCase
QueueMachineOnPostgres.TestCase.settings = settings(max_examples=20, **SETTINGS)  # the same rules, once more
test_queue_model_on_postgres = pytest.mark.postgres(QueueMachineOnPostgres.TestCase)
