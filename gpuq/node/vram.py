"""What stays in a node's VRAM, and for how long: the model a job used leaves after it (Ollama's
`keep_alive: 0`), confirmed gone through /api/ps, or stays warm: for the next job of the same
model (unload = "when-idle"), or for a front-door call's keep_alive (capped by [front]
max_keep_alive) while nothing else waits for the node. A model that will not leave flags the
node (vram_stuck: nothing is claimed there until the monitor sees it gone).

The decisions are pure functions (below); `Vram` is one node's worker's side of them: the
unload, its check, the kept model and when it expires. The worker calls it around each job."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..config import Settings
from ..errors import GpuqError, OllamaError, described
from ..jobs import iso, normalize_model
from ..store import Store
from .calls import CLIENT_LEFT, Policy
from .monitor import NodeMonitor
from .runtime import NodeRuntime

log = logging.getLogger("gpuq")

# A real unload takes a few hundred ms after keep_alive: 0 returns, and the next job waits for
# /api/ps to show it gone: ask often (a backoff overshot a 200 ms unload by 114 ms), and less
# often only once an unload is slow.
UNLOAD_POLL_S = 0.025
UNLOAD_POLL_FAST_S = 2.0
UNLOAD_POLL_MAX_S = 0.5  # the longest wait between two checks of a slow unload
MIN_REQUEST_S = 0.05  # the shortest limit given to one request to a node
# With unload = "when-idle", the model a job leaves loaded for the next one of the same model.
# Bounded, so a router that dies does not pin it forever; an idle node unloads it at once.
KEEP_WARM = "10m"


# -- the decisions (pure) -----------------------------------------------------------------------


def same_model(a: str, b: str) -> bool:
    """Are these one model, however named ("m" and "m:latest" are)?"""
    return normalize_model(a) == normalize_model(b)


def request_keep_alive(unload: str) -> int | str:
    """The keep_alive a job's own request carries under the node's unload policy: 0 (the model
    leaves as the request ends) for "after-each", KEEP_WARM for "when-idle"."""
    return KEEP_WARM if unload == "when-idle" else 0


def call_keep_s(asked: float | None, policy: Policy) -> float:
    """How long a called job's model may stay loaded after it, in seconds: what its client asked
    (None: forever), never more than [front] max_keep_alive, never negative."""
    return policy.front_max_keep_s if asked is None else max(min(asked, policy.front_max_keep_s), 0.0)


def call_keep_alive(keep_s: float, policy: Policy) -> int | float | str:
    """The keep_alive a called job's node is asked with: the client's (capped, `call_keep_s`),
    so a router that dies leaves the model to Ollama's own timer; else the node's policy (0:
    unloaded after the job)."""
    return ollama_seconds(keep_s) if keep_s > 0 else policy.keep_alive


def ollama_seconds(keep_s: float) -> int | float:
    """Seconds as Ollama takes a number for keep_alive (api/types.go Duration: float64 seconds)."""
    return int(keep_s) if keep_s == int(keep_s) else keep_s


def may_keep(keep_s: float, when_idle: bool) -> bool:
    """May a job's model stay loaded after it at all: a call's keep_alive, or "when-idle"?"""
    return keep_s > 0 or when_idle


def keep_for_next(model: str, keep_s: float, next_model: str | None) -> bool:
    """Keep a job's model loaded, given the model of the job the node runs next (None: nothing
    waits)? With nothing waiting: only for a call's keep_alive ("when-idle" unloads an idle
    node's model at once); with a job waiting: only when it wants the same model."""
    if next_model is None:
        return keep_s > 0
    return same_model(next_model, model)


def warm_until(keep_s: float, now: float) -> float | None:
    """Until when a kept model stays (epoch): a call's keep_alive from now; None for
    "when-idle"'s, kept until the node goes idle."""
    return now + keep_s if keep_s > 0 else None


def to_evict(warm: str | None, model: str) -> str | None:
    """The kept model that must leave VRAM before a job of `model` loads it (None: nothing kept,
    or the job's own model: it runs on it without a load)."""
    return warm if warm is not None and not same_model(warm, model) else None


def unload_asked(warm: str | None, model: str, idle: bool) -> bool:
    """Does a client's unload (`ollama stop`: keep_alive 0 with no prompt) end this node's kept
    model now? Only where the model is held warm and the node is idle (see unload_after)."""
    return idle and warm is not None and same_model(warm, model)


def unload_after(running: str | None, model: str) -> bool:
    """Is a client's unload of `model` kept for the end of the job the node runs (`running`: its
    model)? As Ollama's scheduler does (sched.go expireRunner: a runner still referenced gets a
    session of 0 and leaves as its last request finishes): the job runs to its end, then its
    model leaves, whatever keep_alive it asked."""
    return running is not None and same_model(running, model)


def asked_unload_note(model: str, by: str, seconds: float, unloaded: bool) -> str:
    """The event the job gets whose model a client asked to unload while it ran."""
    how = "gone from /api/ps" if unloaded else "still listed by /api/ps: node flagged"
    return f"unloaded {model} after this job as {by} asked while it ran (ollama stop), {seconds:.1f} s, {how}"


def warm_expired(warm: str | None, until: float | None, now: float) -> bool:
    """On an idle node, does the kept model leave now? "When-idle"'s (no `until`) at once, a
    call's once its time has run out."""
    return warm is not None and (until is None or until <= now)


def idle_wait_s(until: float | None, now: float, poll_s: float) -> float:
    """How long an idle worker waits for work: its poll, or less when a kept model's time runs
    out sooner (it is unloaded then)."""
    return poll_s if until is None else min(poll_s, max(until - now, 0))


def next_poll_s(delay: float, elapsed: float) -> float:
    """The wait before the next /api/ps check of an unload: as short as UNLOAD_POLL_S until the
    unload has taken UNLOAD_POLL_FAST_S, then doubling up to UNLOAD_POLL_MAX_S."""
    return min(delay * 2, UNLOAD_POLL_MAX_S) if elapsed > UNLOAD_POLL_FAST_S else delay


def warm_unload_note(model: str, seconds: float) -> str:
    """The event a job gets when a model kept warm for another had to leave VRAM before it ran."""
    return f"unloaded warm {model} first, {seconds:.1f} s"


def unload_failure(
    model: str, node: str, elapsed: float, timeout_s: float, listed: bool, last_error: str | None
) -> str:
    """What a node flagged for a model that would not leave VRAM says: what /api/ps last showed
    (`listed`: the model still in it) and the last check's error, if it failed."""
    # What was seen stays in the message: a last check cut short by the deadline (or a node
    # that stops answering) must not hide that /api/ps still listed the model.
    seen = [f"{model} is still listed by /api/ps"] if listed else []
    if last_error:
        seen.append(f"the last check: {last_error}" if listed else last_error)
    return (
        f"unload failed: {model} did not leave VRAM within {elapsed:.1f}s "
        f"(unload_timeout {timeout_s:g}s; {'; '.join(seen)});"
        f" node {node} flagged"
    )


# -- one node's VRAM ----------------------------------------------------------------------------


class Vram:
    """One node's VRAM as its worker leaves it between jobs. `note` writes an event on a job
    (retried while the store refuses); `stopping` tells whether the router is stopping (nothing
    is kept warm for a next job then). `orphans`: a dead router's jobs' models, to unload first."""

    def __init__(
        self,
        rt: NodeRuntime,
        monitor: NodeMonitor,
        settings: Settings,
        store: Store,
        note: Callable[[str, str], Awaitable[Any]],
        stopping: Callable[[], bool],
    ):
        self.rt = rt
        self.monitor = monitor
        self.settings = settings
        self.store = store
        self.note = note
        self.stopping = stopping
        self.orphans: list[str] = []
        self.unload_by: str | None = None  # who asked the kept model to leave now (ask_unload)
        # An unload asked while a job of its model ran: (model, who asked), done as the job ends.
        self.unload_pending: tuple[str, str] | None = None

    # The model left loaded on purpose (the runtime holds it, for the pages and the metrics): for
    # the next job of the same model ("when-idle"), or for a front-door call's keep_alive.
    @property
    def warm_model(self) -> str | None:
        return self.rt.warm_model

    @warm_model.setter
    def warm_model(self, model: str | None) -> None:
        self.rt.warm_model = model
        if model is None:
            self.rt.warm_until = None

    def forget(self) -> None:
        """The node's models are another router's business now: nothing is kept here."""
        self.warm_model = None
        self.unload_pending = None

    def keep_alive(self) -> int | str:
        """The keep_alive of a job's own request (and a called job's policy), by the node's unload."""
        return request_keep_alive(self.settings.unload_for(self.rt.config))

    async def unload_orphans(self) -> None:
        """A job of a dead router may still hold VRAM: each of their models leaves, verified."""
        while self.orphans:
            await self.unload(self.orphans[0], job_id=None)
            self.orphans.pop(0)

    async def make_room(self, job: dict[str, Any]) -> bool:
        """Before a job: a kept model of another model must leave VRAM first (and /api/ps show
        it gone); False if it would not (the job must not start). A job of the same model runs
        on it, without a load (a gpuq job still unloads after, under after-each)."""
        self.unload_by = None  # a job came first: its own keep_alive decides now
        if self.warm_model is None:
            return True
        if to_evict(self.warm_model, job["model"]) is None:
            self.rt.warm_hits += 1
            return True
        return await self.unload_warm(job["id"])

    async def after_job(self, job: dict[str, Any], error: str | None, keep_s: float = 0.0) -> bool:
        """Unload the job's model and confirm it left VRAM, or keep it loaded: for the next job
        of the same model ("when-idle"), or for `keep_s` (a front-door call's keep_alive) while
        nothing else waits for the node; a client's unload asked while it ran ends it now. True:
        the node answered, it is reachable."""
        asked = await self.asked_while_running(job)
        if asked is not None:
            return asked
        if error is None and await self.keeps(job, keep_s):
            self.warm_model = job["model"]
            self.rt.warm_until = warm_until(keep_s, time.time())
            return True
        self.warm_model = None
        return await self.unload(job["model"], job["id"])

    async def after_abort(
        self, job: dict[str, Any], reason: str | None, keep_s: float = 0.0, sent: bool = True
    ) -> None:
        """After an aborted job: a kept model whose unload the abort cut short leaves VRAM too,
        verified, before the next job; the job's own model leaves, unless a job of the same
        model preempted it under "when-idle" (an interactive call on the sweep's model): the
        model stays for it, as after a finish; a reload would be the call's whole wait. A call
        whose client left (an editor's abandoned autocomplete) keeps its model for the
        keep_alive it asked (`keep_s`), as after a finish and as Ollama does for a cancelled
        request: the editor's next call must not pay a load. A job aborted before its request
        left (`sent` False) loaded nothing: a model kept warm for its own model stays, as it was."""
        warm, until = self.warm_model, self.rt.warm_until
        self.warm_model = None
        evict = to_evict(warm, job["model"])
        if evict is not None:
            await self.unload(evict, job["id"])
        if await self.asked_while_running(job) is not None:
            return
        if not sent:
            if evict is None:
                self.warm_model, self.rt.warm_until = warm, until
            return
        if (reason or "").startswith("preempted") and await self.keeps(job):
            self.warm_model, self.rt.warm_until = job["model"], None
            return
        if reason == CLIENT_LEFT and keep_s > 0 and await self.keeps(job, keep_s):
            self.warm_model, self.rt.warm_until = job["model"], warm_until(keep_s, time.time())
            return
        await self.unload(job["model"], job["id"])

    def ask_unload(self, model: str, by: str, idle: bool, running: str | None) -> bool:
        """A client asks the model to leave (`ollama stop`, Open WebUI's unload): if this node
        holds it warm and idle, its time runs out now; the worker, woken, unloads it (expire),
        verified through /api/ps, and records it. If a job of that model runs (`running`: its
        model), it leaves as that job ends (asked_while_running). False: not held here."""
        if unload_asked(self.warm_model, model, idle):
            self.unload_by = by
            self.rt.warm_until = time.time()
            return True
        if unload_after(running, model):
            self.unload_pending = (model, by)
            return True
        return False

    async def asked_while_running(self, job: dict[str, Any]) -> bool | None:
        """The job's end, where a client asked its model to leave while it ran: the model leaves
        VRAM now (nothing kept, whatever keep_alive the job asked), verified, recorded on the node
        and in the job's events. None: no such unload was asked; else whether it left."""
        pending, self.unload_pending = self.unload_pending, None
        if pending is None or not same_model(pending[0], job["model"]):
            return None
        self.warm_model = None
        started = time.monotonic()
        unloaded = await self.unload(job["model"], job["id"])
        took = time.monotonic() - started
        await self.note(job["id"], asked_unload_note(job["model"], pending[1], took, unloaded))
        await self.record_asked(job["model"], pending[1], took, unloaded)
        return unloaded

    async def restore_asked(self) -> None:
        """At start: the node's last asked unload, as the store kept it (a restart keeps it shown)."""
        try:
            self.rt.asked_unload = (await self.store.asked_unloads()).get(self.rt.name, self.rt.asked_unload)
        except GpuqError as exc:  # shown again at the next asked unload
            log.warning("node=%s cannot read its last asked unload: %s", self.rt.name, exc.message)

    async def record_asked(self, model: str, by: str, took: float, unloaded: bool) -> None:
        """The node's last unload a client asked, for the pages and `gpuq nodes`: in memory, and
        on the node's row (migration 022), so a restart keeps it."""
        self.rt.asked_unload = {
            "model": model,
            "by": by,
            "at": iso(time.time()),
            "took_s": round(took, 3),
            "verified": unloaded,
        }
        log.info(
            "node=%s unloaded %s as asked by %s (%.2fs, %s)",
            self.rt.name,
            model,
            by,
            took,
            "gone from /api/ps" if unloaded else "still listed: node flagged",
        )
        try:
            await self.store.record_asked_unload(self.rt.name, self.rt.asked_unload)
        except GpuqError as exc:  # the unload itself is done and shown; only its record is lost
            log.warning("node=%s cannot record the asked unload of %s: %s", self.rt.name, model, exc.message)

    async def expire(self) -> bool:
        """The node went idle: a model kept for the next job ("when-idle") leaves now; one a
        front-door call kept stays until its time runs out (or a client asks it to leave), then
        leaves, verified. True if one left."""
        if not warm_expired(self.warm_model, self.rt.warm_until, time.time()):
            return False
        model, by, self.unload_by = self.warm_model, self.unload_by, None
        started = time.monotonic()
        unloaded = await self.unload_warm(None)
        if by is not None and model is not None:
            await self.record_asked(model, by, time.monotonic() - started, unloaded)
        return True

    async def keeps(self, job: dict[str, Any], keep_s: float = 0.0) -> bool:
        """Keep the job's model loaded? With a front-door keep_alive: while no job of another
        model waits (one of the same model runs on it); with "when-idle": when the next job
        wants the same model."""
        when_idle = self.settings.unload_for(self.rt.config) == "when-idle"
        if not may_keep(keep_s, when_idle) or not self.rt.claimable or self.stopping():
            return False
        try:
            nxt = await self.store.next_ready_model(self.rt.name)
        except GpuqError as exc:  # unknown: unload, as after-each would (the ending must go on)
            log.warning("node=%s cannot read the next job's model, unloading: %s", self.rt.name, exc.message)
            return False
        return keep_for_next(job["model"], keep_s, nxt)

    async def unload_warm(self, job_id: str | None) -> bool:
        """The kept model leaves VRAM (its time ran out, or another model's job comes): verified
        through /api/ps as after any job (Ollama's own timer may have let it go already)."""
        model = self.warm_model
        if model is None:
            return True
        self.rt.warm_unloads += 1
        started = time.monotonic()
        unloaded = await self.unload(model, job_id)
        # Forgotten only now: a job aborted during the unload still sees it (after_abort).
        self.warm_model = None
        if unloaded and job_id is not None:  # the job's wait for it is in the job's events
            await self.note(job_id, warm_unload_note(model, time.monotonic() - started))
        return unloaded

    async def unload(self, model: str, job_id: str | None) -> bool:
        """Confirm through /api/ps that the model left VRAM; ask for an unload if it lingers.
        Every request is bounded by the time left: a real /api/ps can block for seconds. A model
        that stays flags the node (the monitor clears the flag once /api/ps shows it gone)."""
        client = self.rt.client
        wanted = normalize_model(model)
        started = time.monotonic()
        deadline = started + self.settings.unload_timeout_s
        delay, asked = UNLOAD_POLL_S, False
        listed = False  # /api/ps answered with the model still in it
        last_error = None  # the check that failed after that answer, if one did
        while True:
            try:
                if wanted not in await client.loaded(timeout_s=max(deadline - time.monotonic(), MIN_REQUEST_S)):
                    return True
                listed, last_error = True, None
                if not asked:
                    await client.unload(model, timeout_s=max(deadline - time.monotonic(), MIN_REQUEST_S))
                    asked = True
            except OllamaError as exc:
                last_error = exc.message
            except Exception as exc:  # a bug: the model may still hold VRAM, so the node is flagged
                log.exception("node=%s job=%s unexpected error while unloading %s", self.rt.name, job_id, model)
                last_error = f"unexpected error in the router: {described(exc)}"
                break
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = next_poll_s(delay, time.monotonic() - started)  # a slow unload: ask less often
        message = unload_failure(
            model, self.rt.name, time.monotonic() - started, self.settings.unload_timeout_s, listed, last_error
        )
        log.error("node=%s job=%s %s", self.rt.name, job_id, message)
        if job_id is not None:
            await self.note(job_id, message)
        self.monitor.flag_stuck(message, model, job_id)
        return False
