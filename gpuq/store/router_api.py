"""Store's API for the router's own records: its settings and nodes in force, reloads, node
health and alerts (records.py, control.remove_nodes), the leases by which exactly one router
drives a node and runs a maintenance service (leases.py, on the leases' clock), and, on
PostgreSQL, other routers' changes (postgres.watch)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from ..jobs import NodeInfo
from . import control, leases, postgres, records
from .core import Core, write, write_untimed


class RouterRecords(Core):
    # -- the router's own records: its settings, nodes, reloads and alerts (records.py) ------------

    configure = write_untimed(records.configure)
    remove_nodes = write(control.remove_nodes)
    record_reload = write(records.record_reload)
    set_node_health = write(records.set_node_health)
    record_node_models = write_untimed(records.record_node_models)
    record_asked_unload = write_untimed(records.record_asked_unload)
    fire_alert = write(records.fire_alert)
    resolve_alert = write(records.resolve_alert)
    owe_open_alerts = write_untimed(records.owe_open_alerts)
    record_delivery = write(records.record_delivery)

    # -- other routers' changes (PostgreSQL) --------------------------------------------------

    async def watch(self, on_change: Callable[[dict[str, Any] | None], None], poll_s: float = 1.0) -> None:
        """Until it fails: each job change another router commits, as postgres.watch tells it
        (on SQLite no other router writes: nothing to watch, returns at once)."""
        if self.dsn:
            await postgres.watch(self.dsn, self.busy_timeout_s, on_change, self._writer_pid, poll_s)

    def _writer_pid(self) -> int | None:
        db = self._writer.db if self._writer is not None else None
        return getattr(db, "backend_pid", None)

    # -- per-node leases (gpuq/store/leases.py): exactly one router drives a node ----------------

    @property
    def alone(self) -> bool:
        """SQLite: one router per database file (its lock file), so every other router is dead and
        a router starting takes every node at once. On PostgreSQL other routers may be alive."""
        return self.dsn is None

    def _lease_now(self) -> float | None:
        """The clock leases are written with: the router's on SQLite (it is alone); on PostgreSQL
        None, the server's own (leases.clock), so routers whose clocks disagree still agree on
        when a lease runs out."""
        return self.clock() if self.dsn is None else None

    async def _lease_clock(self) -> float:
        """Now, by the clock leases are judged by (the database server's on PostgreSQL), for a read."""
        now = self._lease_now()
        return now if now is not None else float((await self.read(leases.DB_NOW_SQL + " AS now"))[0]["now"])

    async def take_nodes(
        self, router: leases.Router, nodes: list[str], lease_s: float, alone: bool = False
    ) -> leases.Taken:
        """Take (or renew) the leases this router may hold; the jobs left running on nodes taken
        from dead routers fail, naming them."""
        return await self._write(
            partial(leases.take, router=router, nodes=nodes, lease_s=lease_s, now=self._lease_now(), alone=alone)
        )

    async def end_dead_routers(self, router: leases.Router, alive: Callable[[int], bool]) -> list[str]:
        """Routers this host ran whose process is gone (`alive(pid)` says no): their leases end
        now. Returns the nodes freed."""
        rows = await self.read(leases.ON_HOST_SQL, (router.host, router.id))
        dead = [r["id"] for r in rows if not alive(r["pid"])]
        return await self._write(partial(leases.end_dead, router_ids=dead, now=self._lease_now())) if dead else []

    async def nodes_driven_elsewhere(self, router_id: str) -> list[NodeInfo]:
        """The nodes other live routers drive now (their lease not run out, by the database's
        clock on PostgreSQL), as their rows say them: health, installed models (migration 023).
        None is idle for this router (their workers are the others'). On SQLite the router is
        alone (its start ended every other router's leases): none."""
        rows = await self.read(leases.DRIVEN_ELSEWHERE_SQL, (router_id, await self._lease_clock()))
        return [leases.node_info(r) for r in rows]

    async def renew_nodes(self, router: leases.Router, nodes: list[str], lease_s: float) -> list[str]:
        """Renew this router's leases; returns the nodes it still holds."""
        return await self._write(
            partial(leases.renew, router=router, nodes=nodes, lease_s=lease_s, now=self._lease_now())
        )

    async def release_nodes(self, router: leases.Router) -> list[str]:
        """A clean stop: this router's leases are freed for the next router."""
        return await self._write(partial(leases.release, router=router, now=self.clock()))

    async def still_held(self, router: leases.Router, nodes: list[str]) -> list[str]:
        """SQLite (alone): the nodes of `nodes` whose lease is still this router's, by a read: a
        router alone needs no renewal (its lock file keeps every other router out), so an idle
        one writes nothing; a lease someone took all the same is seen lost."""
        rows = await self.read(leases.held_sql(len(nodes)), (router.id, *nodes))
        return [r["node"] for r in rows]

    async def routers(self, lease_s: float) -> dict[str, Any]:
        """The routers alive (seen within `lease_s`; on SQLite, not stopped), the nodes each
        holds, each node's holder."""
        now = await self._lease_clock()
        seen = leases.SEEN_EVER if self.alone else now - lease_s
        return leases.alive(
            await self.read(leases.ROUTERS_SQL, (seen,)), await self.read(leases.LEASES_SQL), now, self.alone
        )

    async def take_service(self, router: leases.Router, service: str, lease_s: float) -> bool:
        """Does this router run the maintenance `service` (its lease taken or renewed)?"""
        return await self._write(
            partial(leases.take_service, router=router, service=service, lease_s=lease_s, now=self._lease_now())
        )
