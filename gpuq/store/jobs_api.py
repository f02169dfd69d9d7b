"""Store's API for jobs: a job's life (lifecycle.py: submitted, claimed, kept, finished, put
back) and the queue's control (control.py: move, preempt, delete, clear, retry), each verb run
on the one writer; and users' max_running, which every claim applies and a page reads."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial

from ..jobs import NewJob, NodeInfo
from . import control, lifecycle, parts
from .core import Core, handing_over, write, write_limited, write_untimed
from .steps import Row, dumps


class JobVerbs(Core):
    async def submit(
        self,
        new: NewJob,
        nodes: list[NodeInfo],
        actor: str,
        hand_over: Callable[[Row], None] | None = None,
        *,
        fair: bool = False,
        max_waiting: int | None = None,
    ) -> list[Row]:
        """Place and insert a job (a task, or a critique's whole fan-out), durably: answered
        only once its transaction has committed. On a node whose worker waits idle
        (NodeInfo.idle) the same commit claims the node's head, and `hand_over` gives it to
        that worker on the loop right after the commit, whether or not the caller still waits."""
        handed = handing_over(hand_over, nodes)
        verb = partial(
            lifecycle.submit_and_claim,
            new=new,
            nodes=nodes,
            actor=actor,
            now=self.clock(),
            fair=fair,
            max_waiting=max_waiting,
            max_running=self._max_running,
        )
        if self.submit_timeout_s is None:
            created, _ = await self._write(verb, handed)
        else:
            created, _ = await self._bounded_write(
                verb, handed, self.submit_timeout_s, "submit", "router.submit_timeout"
            )
        return created

    claim = write_limited(lifecycle.claim)
    heartbeat = write(lifecycle.heartbeat)
    work_done = write(lifecycle.work_done)
    save_output = write(lifecycle.append_output)
    finish = write_limited(lifecycle.finish)
    put_back = write(lifecycle.put_back)
    requeue_unsent = write(lifecycle.requeue_unsent)
    note = write(lifecycle.note)
    fail_orphans = write(lifecycle.fail_orphans)
    cancel_clientless = write(lifecycle.cancel_clientless)
    drop_unreferenced_parts = write_untimed(parts.drop_unreferenced)

    async def note_stale(self, now: float | None = None) -> list[Row]:
        """Write one event per newly stale head (not one per check); returns the new ones."""
        return await self._write(partial(lifecycle.note_stale, now=self.clock() if now is None else now))

    # -- the queue's control -----------------------------------------------------------------------

    move = write(control.move)
    preempt = write(control.preempt)
    delete = write(control.delete)
    clear = write(control.clear)
    retry = write(control.retry)

    # -- users' max_running ------------------------------------------------------------------------

    def set_max_running(self, limits: Mapping[str, int]) -> None:
        """Users' max_running ({user: limit}, gpuq.toml's), in force from the next write on: a
        claim skips a waiting job whose owner runs that many jobs already, even on a free node."""
        self._max_running = dict(limits)

    async def at_max_running(self, owners: Iterable[str | None]) -> dict[str, int]:
        """Which of `owners` run their max_running already (their waiting jobs wait for that, as
        the claim judges it: lifecycle.over_max_running), with how many jobs each runs."""
        limits = {o: self._max_running[o] for o in set(owners) if o is not None and o in self._max_running}
        if not limits:
            return {}
        found = await self.read(lifecycle.at_max_running_sql(self.engine), {"limits": dumps(limits)})
        return {r["owner"]: int(r["running"]) for r in found}
