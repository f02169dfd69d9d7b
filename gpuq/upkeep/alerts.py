"""Alerts that reach a person. Every second the router looks at the facts /health reports (a
stale queue head, a node with waiting jobs that is down, a model that will not leave VRAM):
each condition that starts is a firing (an `alert` row), and each firing that ends is resolved.
With router.alert_url set, each firing gets two notices, POSTed once each: `firing`, then
`resolved`. A notice that fails is retried with backoff (1 s doubling to 60 s) until it is
delivered; every try is an `alert_delivery` row and a log line. A delivered notice is marked
sent in the same transaction as its record, so a restart neither sends it again nor forgets
a notice still owed (open firings live in the database, not in memory)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlparse

import aiohttp

from ..config import Settings
from ..errors import GpuqError, NotFound, described
from ..jobs import iso, parse_iso, span
from ..node.runtime import NodeRuntime
from ..store import Store
from .service import Periodic, Service

if TYPE_CHECKING:
    from ..node.dispatcher import Dispatcher

log = logging.getLogger("gpuq")

CHECK_S = 1.0  # how often the conditions are looked at
SEND_POLL_S = 1.0  # how often owed notices are looked at (a new firing wakes the sender at once)
RETRY_FIRST_S = 1.0  # the wait after a first failed delivery, doubled after each
RETRY_MAX_S = 60.0
SEND_TIMEOUT_S = 10.0  # a receiver that does not answer within this has failed the try

LABELS = {
    "stale_head": "stale head",
    "node_down": "node down",
    "vram_stuck": "VRAM stuck",
    "backup_failed": "backup failed",
    "backup_overdue": "backup overdue",
    "disk_filling": "disk filling",
    "database_filling": "database near its cap",
    "retention_failed": "retention sweep failed",
    "retention_overdue": "retention sweep overdue",
}


@dataclass(frozen=True)
class Condition:
    """Something that keeps a queue from moving, as the router sees it now."""

    alert: str  # stale_head | node_down | vram_stuck, or a source's (ConditionSource.alerts)
    node: str  # "" for the router's own (a backup, the storage, the retention sweep)
    job: str | None
    since: str
    message: str
    fix: str
    model: str | None = None  # vram_stuck: the model that would not leave

    @property
    def key(self) -> tuple[str, str, str]:
        return self.alert, self.node, self.job or ""


def conditions(stale_heads: list[dict[str, Any]], nodes: list[NodeRuntime], waiting: dict[str, int]) -> list[Condition]:
    """What fires now: each stale head, each checked node that is down with jobs waiting on
    it, each node with a model stuck in VRAM. `nodes` are the dispatcher's NodeRuntimes,
    `waiting` the queued jobs per node (held critiques included, as /health counts them)."""
    found = []
    for head in stale_heads:
        behind = waiting.get(head["node"], 0)
        found.append(
            Condition(
                "stale_head",
                head["node"],
                head["id"],
                head["since"],
                f"{head['node']} is blocked: job {head['id']} is a stale head ({head['reason']}) since "
                f"{head['since']}; {plural(behind, 'job waits', 'jobs wait')} behind it",
                f"gpuq delete {head['id']}",
            )
        )
    for rt in nodes:
        host = urlparse(rt.config.url).hostname
        count = waiting.get(rt.name, 0)
        if rt.checked and not rt.up and count:
            found.append(
                Condition(
                    "node_down",
                    rt.name,
                    None,
                    iso(rt.since),
                    f"node {rt.name} is down since {iso(rt.since)} ({rt.last_error or 'no answer'}); "
                    f"{plural(count, 'job waits', 'jobs wait')} on it",
                    f"restart Ollama on {host} (systemctl restart ollama); or cancel what waits: gpuq clear {rt.name}",
                )
            )
        if rt.vram_stuck:
            model = rt.stuck_model or rt.config.model
            found.append(
                Condition(
                    "vram_stuck",
                    rt.name,
                    rt.stuck_job,
                    iso(rt.stuck_since or time.time()),
                    rt.vram_stuck,
                    f"OLLAMA_HOST={rt.config.url} ollama stop {model}; if it stays, restart Ollama on {host}",
                    model,
                )
            )
    return found


class ConditionSource(Protocol):
    """Another part of the router whose trouble alerts (gpuq/upkeep/backups.py, storage.py,
    gpuq/upkeep/retention_report.py): what
    fires now, from its memory, and the words of a firing's end."""

    alerts: tuple[str, ...]  # the alert kinds it raises

    def conditions(self) -> list[Condition]: ...

    def resolution(self, alert: str) -> str: ...


def plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def notice(row: dict[str, Any], status: str) -> dict[str, Any]:
    """The JSON body of a notice (for ntfy it becomes a title and a text)."""
    firing = status == "firing"
    return {
        "status": status,
        "alert": row["alert"],
        "node": row["node"],
        "job": row["job_id"],
        "since": row["since"],
        "message": row["message"] if firing else row["resolution"],
        "fix": row["fix"] if firing else None,
    }


def request_for(body: dict[str, Any], settings: Settings, alert_id: int) -> dict[str, Any]:
    """aiohttp.post keyword arguments for a notice, in the configured format."""
    headers = {"Idempotency-Key": f"gpuq-alert-{alert_id}-{body['status']}"}  # a receiver may dedupe
    if settings.alert_token:
        headers["Authorization"] = f"Bearer {settings.alert_token}"
    if settings.alert_format == "json":
        return {"json": body, "headers": headers}
    # ntfy's publish API: the text is the body, the rest are headers (docs.ntfy.sh/publish).
    firing = body["status"] == "firing"
    job_url = f"{settings.public_url}/jobs/{body['job']}" if body["job"] else f"{settings.public_url}/"
    headers.update(
        {
            "Title": f"gpuq: {'' if firing else 'resolved: '}{LABELS[body['alert']]}"
            + (f" on {body['node']}" if body["node"] else ""),
            "Priority": "high" if firing else "default",
            "Tags": "rotating_light" if firing else "white_check_mark",
            "Click": job_url,
            "Content-Type": "text/plain; charset=utf-8",
        }
    )
    text = body["message"] + (f"\nfix: {body['fix']}" if body["fix"] else "")
    return {"data": text.encode("utf-8"), "headers": headers}


def retry_after_s(attempts: int) -> float:
    """The wait after `attempts` failed tries of one notice."""
    return min(RETRY_FIRST_S * 2.0 ** max(attempts - 1, 0), RETRY_MAX_S)


class Alerter(Periodic):
    """Turns conditions into firings and resolutions (its rounds: `check`, every CHECK_S), and
    delivers their notices (AlertDelivery's rounds: `send_owed`)."""

    name = "alert check"
    interval_s = CHECK_S

    def __init__(
        self, settings: Settings, store: Store, dispatcher: Dispatcher, sources: Sequence[ConditionSource] = ()
    ) -> None:
        super().__init__()
        self.settings = settings
        self.sources = {alert: source for source in sources for alert in source.alerts}
        self.store = store
        self.dispatcher = dispatcher
        self.session: aiohttp.ClientSession | None = None
        self.owed = asyncio.Event()  # a notice became owed: the sender goes at once
        self.next_try: dict[tuple[int, str], float] = {}  # (alert id, status) -> monotonic time
        # Delivered, but the database refused the record: never sent again, recorded later.
        self.unrecorded: dict[tuple[int, str], tuple[int, int]] = {}

    @property
    def delivering(self) -> bool:
        return self.settings.alert_url is not None

    async def start(self) -> None:
        """With alert_url, the delivery's session, and the open firings owed to it."""
        if self.delivering:
            await self.start_delivery()

    async def reconfigure(self, settings: Settings) -> None:
        """A reload of gpuq.toml: the alert settings follow it; an alert_url set now starts the
        delivery (open firings owed to it), one removed stops sending."""
        self.settings = settings
        if self.delivering and self.session is None:
            await self.start_delivery()

    async def start_delivery(self) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SEND_TIMEOUT_S))
        await self.store.owe_open_alerts()
        self.owed.set()

    async def stop(self) -> None:
        """After the loops have stopped: close the delivery session."""
        if self.session is not None:
            await self.session.close()

    async def run_once(self) -> tuple[int, int]:
        return await self.check()

    # -- firing and resolving -------------------------------------------------------------------

    async def check(self) -> tuple[int, int]:
        """Compare what fires now with the open firings: open the new, resolve the ended."""
        runtimes = self.dispatcher.nodes
        waiting = {node: counts.queued for node, counts in (await self.store.active_by_node()).items()}
        found = conditions(await self.store.stale_heads(), list(runtimes.values()), waiting)
        found += [c for source in set(self.sources.values()) for c in source.conditions()]
        now = {c.key: c for c in found}
        open_rows = {(r["alert"], r["node"], r["job_id"] or ""): r for r in await self.store.open_alerts()}
        fired = resolved = 0
        for key, cond in now.items():
            if key not in open_rows:
                await self.store.fire_alert(vars(cond), self.delivering)
                log.warning(
                    "alert=%s node=%s job=%s firing: %s fix=%r", cond.alert, cond.node, cond.job, cond.message, cond.fix
                )
                fired += 1
        for key, row in open_rows.items():
            rt = runtimes.get(row["node"])
            if key in now or (row["alert"] == "node_down" and rt is not None and not rt.checked):
                continue  # still firing, or not judged yet since a restart
            why = await self._resolution(row, rt)
            await self.store.resolve_alert(row["id"], why)
            log.info("alert=%s node=%s job=%s resolved: %s", row["alert"], row["node"], row["job_id"], why)
            resolved += 1
        if (fired or resolved) and self.delivering:
            self.owed.set()
        return fired, resolved

    async def _resolution(self, row: dict[str, Any], rt: NodeRuntime | None) -> str:
        took = f"after {span(time.time() - parse_iso(row['since']))}"
        if row["alert"] in self.sources:
            return f"{self.sources[row['alert']].resolution(row['alert'])} ({took})"
        if rt is None:
            return f"node {row['node']} is no longer in the config ({took})"
        if row["alert"] == "stale_head":
            try:
                state = (await self.store.job(row["job_id"]))["state"]
            except NotFound:
                state = "gone"
            return f"{row['node']} is no longer blocked: job {row['job_id']} is {state} now ({took})"
        if row["alert"] == "node_down":
            if rt.up:
                return f"node {row['node']} answers again ({took})"
            return f"no job waits on node {row['node']} any more; it is still down ({took})"
        return f"{row['model'] or 'the model'} left VRAM on {row['node']}; it takes jobs again ({took})"

    # -- delivering (AlertDelivery's rounds) ------------------------------------------------------

    async def send_owed(self) -> int:
        """Try each owed notice that is due, oldest firing first; returns how many were delivered."""
        if not self.delivering:  # alert_url removed by a reload
            return 0
        await self._record_unrecorded()
        delivered = 0
        for row in await self.store.alerts_owed():
            owed = (["firing"] if row["fired_sent_at"] is None else []) + (["resolved"] if row["resolved_at"] else [])
            attempts = row["attempts"]
            for status in owed:  # a resolution is sent only after its firing
                key = (row["id"], status)
                if key in self.unrecorded or time.monotonic() < self.next_try.get(key, 0.0):
                    break
                if not await self._deliver(row, status, attempts + 1):
                    break
                delivered += 1
                attempts = 0  # the resolved notice's tries start now
        return delivered

    async def _deliver(self, row: dict[str, Any], status: str, attempt: int) -> bool:
        body = notice(row, status)
        http_status, error = None, None
        assert self.session is not None and self.settings.alert_url is not None
        try:
            async with self.session.post(
                self.settings.alert_url, allow_redirects=False, **request_for(body, self.settings, row["id"])
            ) as resp:
                http_status = resp.status
                if not 200 <= resp.status < 300:
                    text = (await resp.text(errors="replace")).strip()[:200]
                    error = f"HTTP {resp.status} {resp.reason or ''}".strip() + (f": {text}" if text else "")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            error = described(exc)
        key = (row["id"], status)
        ok = error is None
        where = f"alert={row['alert']} node={row['node']} job={row['job_id']} notice={status} attempt={attempt}"
        if ok:
            log.info("%s delivered (HTTP %s)", where, http_status)
            self.next_try.pop(key, None)
        else:
            wait = retry_after_s(attempt)
            log.warning("%s not delivered: %s; trying again in %gs", where, error, wait)
            self.next_try[key] = time.monotonic() + wait
        try:
            await self.store.record_delivery(row["id"], status, attempt, ok, http_status, error)
        except GpuqError as exc:
            if ok:  # it reached the person: never send it again, record it when the database lets us
                self.unrecorded[key] = (attempt, http_status or 0)
            log.error("%s: delivery not recorded: %s", where, exc.message)
        return ok

    async def _record_unrecorded(self) -> None:
        for (alert_id, status), (attempt, http_status) in list(self.unrecorded.items()):
            await self.store.record_delivery(alert_id, status, attempt, True, http_status, None)
            del self.unrecorded[alert_id, status]


class AlertDelivery(Service):
    """The alerts' notices sent: at once when one becomes owed, else every SEND_POLL_S (retries
    wait their backoff); nothing while no alert_url is set."""

    name = "alert delivery"

    def __init__(self, alerter: Alerter) -> None:
        self.alerter = alerter

    async def run_once(self) -> int:
        if self.alerter.session is None:  # no alert_url (yet: a reload may set one)
            return 0
        return await self.alerter.send_owed()

    async def pause(self) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SEND_POLL_S):
                await self.alerter.owed.wait()
        self.alerter.owed.clear()
