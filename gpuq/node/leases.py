"""This router's hold on its nodes: a lease per node in the store (gpuq/store/leases.py),
taken at start-up, renewed every third of [router] lease, taken when free or expired, released at
a clean stop. A node's worker claims only while this router holds the node's lease; a node gained
wakes its worker; a node lost while it ran a job stops that worker relaying it (the router that
took the node failed the job, naming this one)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable

from ..errors import GpuqError
from ..store import Store
from ..store.leases import Router, Taken

log = logging.getLogger("gpuq")

# The clock a lease's end is judged by here: one that keeps counting while the machine sleeps
# (Linux's CLOCK_MONOTONIC stops in a suspend, CLOCK_BOOTTIME does not; macOS's CLOCK_MONOTONIC
# counts sleep), so a laptop that wakes after its lease ran out claims nothing until the store
# says the node is still its own.
_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def awake_clock() -> float:
    return time.clock_gettime(_CLOCK)


def pid_alive(pid: int) -> bool:
    """Is there a process `pid` on this machine (another user's counts)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Leases:
    """The leases this router holds, and the loop that keeps them. `nodes()`: the nodes it drives
    (configured, and removed ones still finishing a job); `gained(node)` / `lost(node)`: told when
    the store says this router took a node, or that another router has it now."""

    def __init__(
        self,
        store: Store,
        router: Router,
        lease_s: Callable[[], float],
        nodes: Callable[[], list[str]],
        gained: Callable[[str], None],
        lost: Callable[[str], None],
    ):
        self.store = store
        self.router = router
        self.lease_s = lease_s
        self.nodes = nodes
        self.gained = gained
        self.lost = lost
        # SQLite: no other router lives (the lock file), so a lease this router could not renew
        # (a person holds the write lock) is still its own: its workers go on.
        self.alone: bool = store.alone
        self.until: dict[str, float] = {}  # node -> when its lease runs out unrenewed (awake_clock)
        self.wake = asyncio.Event()  # a reload added nodes: take them now

    def holds(self, node: str) -> bool:
        """Does this router drive the node now (may its worker claim)?"""
        until = self.until.get(node)
        return until is not None and (self.alone or awake_clock() < until)

    def held(self) -> list[str]:
        return sorted(n for n in self.until if self.holds(n))

    async def start(self) -> Taken:
        """At start-up: take every node this router may; on SQLite every node (every other router
        is dead), and every job still running fails, naming the router that ran it. On PostgreSQL a
        router this machine ran whose process is gone (a crash, a SIGKILL: the restart's usual
        case) loses its leases first, so its nodes are taken now, not after the lease time."""
        if not self.alone:
            freed = await self.store.end_dead_routers(self.router, pid_alive)
            if freed:
                log.info("leases of this machine's dead router(s) ended: %s", ", ".join(freed))
        return await self._take(self.nodes(), alone=self.alone)

    async def _take(self, nodes: list[str], alone: bool = False) -> Taken:
        asked = awake_clock()  # before the write: the store's expiry is no earlier than this
        taken = await self.store.take_nodes(self.router, nodes, self.lease_s(), alone=alone)
        self._heard(nodes, taken.held, asked)
        return taken

    async def renew(self) -> None:
        """One heartbeat: renew the leases held, take the nodes free or expired. On SQLite the
        router is alone: its leases are read, not renewed, so an idle router writes nothing."""
        nodes = self.nodes()
        mine = [n for n in nodes if n in self.until]
        if mine:
            asked = awake_clock()
            if self.alone:
                held = await self.store.still_held(self.router, mine)
            else:
                held = await self.store.renew_nodes(self.router, mine, self.lease_s())
            self._heard(mine, held, asked)
        others = [n for n in nodes if n not in self.until]
        if others or not (mine or self.alone):  # (on PostgreSQL the router's row is seen again by either)
            taken = await self._take(others)
            for job in taken.failed:
                log.warning("job=%s node=%s state=failed reason=%r", job["id"], job["node"], job["error"])
        for node in [n for n in self.until if n not in nodes]:  # a node a reload removed, its job ended
            del self.until[node]

    def _heard(self, asked: list[str], held: list[str], at: float) -> None:
        """The store's answer for `asked`: `held` are this router's until `at` + lease; the rest
        another router holds now."""
        for node in asked:
            if node in held:
                if node not in self.until:
                    log.info("node=%s lease taken by router %s", node, self.router.id)
                    self.until[node] = at + self.lease_s()
                    self.gained(node)
                else:
                    self.until[node] = at + self.lease_s()
            elif node in self.until:
                del self.until[node]
                log.error("node=%s lease lost: another router holds it now; this router stops driving it", node)
                self.lost(node)

    async def run(self) -> None:
        """The heartbeat, every third of the lease; a refused write is said, and tried again at
        the next beat (the workers stop claiming once a lease runs out unrenewed)."""
        while True:
            try:
                async with asyncio.timeout(self.lease_s() / 3):
                    await self.wake.wait()
            except TimeoutError:
                pass
            self.wake.clear()
            try:
                await self.renew()
            except GpuqError as exc:
                log.error(
                    "leases not renewed (this router holds %s): %s", ", ".join(self.held()) or "no node", exc.message
                )

    async def release(self) -> None:
        """A clean stop: the next router takes the nodes at once."""
        try:
            freed = await self.store.release_nodes(self.router)
        except GpuqError as exc:  # they expire after the lease time instead
            log.error("leases not released (they expire in %gs): %s", self.lease_s(), exc.message)
            return
        self.until.clear()
        if freed:
            log.info("leases released: %s", ", ".join(freed))
