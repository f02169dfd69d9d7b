"""The API's shapes: JSON answers, a job and a node as the API shows them, and what a job's
row gains from memory (its live output, its start estimate, a quota holding it)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .. import eta
from ..jobs import (
    ACTIVE,
    PROMPT_KEPT_CHARS,
    JobState,
    api_of,
    compact_json,
    iso,
    preview_url,
    prompt_pruned_words,
    pruned_words,
)
from ..node.dispatcher import Dispatcher
from ..node.runtime import NodeRuntime
from ..store import Row
from .state import STORE


def json_response(body: Any, status: int = 200, **kwargs: Any) -> web.Response:
    return web.json_response(body, status=status, dumps=compact_json, **kwargs)


def error_response(status: int, message: str) -> web.Response:
    return json_response({"error": {"status": status, "message": message}}, status=status)


def job_json(row: Row, public_url: str) -> Row:
    """The API's shape of a job row: `prompt` (and `output`) only when the row is a job's detail."""
    out = {
        "id": row["id"],
        "kind": row["kind"],
        "state": row["state"],
        "node": row["node"],
        "model": row["model"],
        "prompt_excerpt": row["prompt_excerpt"],
        "prompt_bytes": row["prompt_bytes"],
        "parent": row.get("parent_id"),
        "group": row.get("group_id"),
        "placement": row.get("placement"),
        "error": row.get("error"),
        "created_at": row.get("created_at"),
        "started_at": row.get("started_at"),
        "finished_at": row.get("finished_at"),
        "progress_at": row.get("progress_at"),
        "work_done_at": row.get("work_done_at"),
        "eval_count": row.get("eval_count"),
        "eval_duration_ns": row.get("eval_duration_ns"),
        "done_reason": row.get("done_reason"),
        "preempted_runs": row.get("preempted_runs", 0),
        "timeout_s": row.get("timeout_s"),
        "run_id": row.get("run_id"),
        "preview_url": preview_url(public_url, row["id"]),
        "waiting_for": row.get("waiting_for"),  # a held critique: the parent it waits for
        # who sent it (None: the router knows no one), with what program, and its lane
        "owner": row.get("owner"),
        "client": row.get("client"),
        "lane": row.get("lane"),
    }
    if row.get("endpoint"):  # a front-door call: its route, and the API it came through
        out["endpoint"] = row["endpoint"]
        out["api"] = api_of(row["endpoint"])
    for key in ("owner", "client"):  # who sent it (null: the router knew no one), and with what
        out[key] = row.get(key)
    for key in ("findings", "think", "options", "request"):  # JSON columns
        if row.get(key) is not None:
            out[key] = json.loads(row[key])
    for key in ("prompt", "output", "thinking", "runs", "events", "children", "queue_position"):
        if key in row:
            out[key] = row[key]
    pruned(out, row.get("pruned_at"))
    return out


# What a job another user sent shows a member when the router is private (gpuq/access/privacy.py):
# where and when it waits or runs, whose it is and how far it got, never what it says. Its error
# goes too: a node's or a parse's error can quote the prompt or the reply.
PLACEHOLDER_KEEPS = frozenset(
    {
        "id", "kind", "state", "node", "model", "prompt_bytes", "parent", "group", "placement",
        "created_at", "started_at", "finished_at", "progress_at", "work_done_at", "eval_count",
        "eval_duration_ns", "done_reason", "preempted_runs", "timeout_s", "run_id", "preview_url",
        "waiting_for", "owner", "client", "lane", "endpoint", "queue_position", "eta_start", "eta_finish",
        "eta_reason", "held_by_quota", "tokens_so_far", "thinking_tokens_so_far", "pruned_at",
    }
)  # fmt: skip
# Kept as keys (null) where the job's shape has them, so a client reads a placeholder as it reads a job.
PLACEHOLDER_NULLS = ("prompt_excerpt", "prompt", "output", "thinking", "error")


def placeholder(job: Row) -> Row:
    """A job as a member sees another user's on a private router: the fields above, its text null,
    and `private: true` (the pages and the CLI say "private: <owner>'s job"). Applied last, to the
    job's whole shape (after with_live, with_eta, with_quota)."""
    out = {k: v for k, v in job.items() if k in PLACEHOLDER_KEEPS}
    out.update({k: None for k in PLACEHOLDER_NULLS if k in job})
    out["private"] = True
    return out


def pruned(out: Row, pruned_at: str | None) -> None:
    """A job whose bulk retention shed says so: `pruned_at`, and `output_pruned` in words; its
    output (and request, reasoning) are null, never "" that would look like a job that gave none;
    a prompt retention kept to its first characters says so too (`prompt_pruned`)."""
    out["pruned_at"] = pruned_at
    if pruned_at is None:
        return
    out["output_pruned"] = pruned_words(pruned_at)
    if len(out.get("prompt") or "") >= PROMPT_KEPT_CHARS:  # a longer one was cut to this
        out["prompt_pruned"] = prompt_pruned_words(pruned_at)
    for key in ("output", "thinking"):
        if key in out:
            out[key] = None
    if out.get("endpoint"):
        out["request"] = None
    for run in out.get("runs") or []:
        run["output"] = run["thinking"] = None


def node_json(rt: NodeRuntime) -> Row:
    """The API's shape of a node: its config, its health, a crashed loop of its own."""
    return {
        "name": rt.name,
        "rank": rt.config.rank,
        "roles": list(rt.config.roles),
        "model": rt.config.model,
        "url": rt.config.url,
        "up": rt.up,
        "checked": rt.checked,
        "since": iso(rt.since),
        "last_error": rt.last_error,
        "model_installed": rt.model_installed,
        "vram_stuck": rt.vram_stuck,
        "health_recorded": not rt.health_unrecorded,
        "loop_error": "; ".join(loop.problem() for loop in rt.loops if not loop.alive) or None,
        # The model kept loaded between jobs, and until when (null: until the node goes idle).
        "warm": None
        if rt.warm_model is None
        else {"model": rt.warm_model, "until": None if rt.warm_until is None else iso(rt.warm_until)},
        # The last kept model a client asked to unload (`ollama stop`): which, who, when, verified.
        "asked_unload": rt.asked_unload,
    }


def with_live(job: Row, dispatcher: Dispatcher) -> Row:
    """A running job's output and token count so far, from memory (the database lags by ~1 s)."""
    cur = dispatcher.live(job["id"])
    if cur is not None:
        job["tokens_so_far"] = cur.tokens  # Ollama streams one token per chunk
        job["thinking_tokens_so_far"] = cur.thinking_tokens
        if "output" in job:
            job["output"] = "".join(cur.output)
            job["thinking"] = "".join(cur.thinking) or None
    return job


def with_eta(job: Row, found: dict[str, eta.Estimate]) -> Row:
    """eta_start, eta_finish (ISO, or null with eta_reason) on a waiting or running job."""
    if job["state"] not in ACTIVE:
        return job
    e = found.get(job["id"]) or eta.Estimate(
        None, None, f"more than {eta.DEPTH} jobs wait ahead of it, or its node is not in the config"
    )
    job["eta_start"] = None if e.start_s is None else iso(e.start_s)
    job["eta_finish"] = None if e.finish_s is None else iso(e.finish_s)
    job["eta_reason"] = e.reason
    return job


async def with_quota(app: web.Application, jobs: list[Row]) -> None:
    """A waiting job whose owner runs their max_running already waits for that, even on a free
    node: say so (held_by_quota), and its start estimate says it too."""
    waiting = [j for j in jobs if j["state"] == JobState.QUEUED]
    held = await app[STORE].at_max_running(j.get("owner") for j in waiting)  # the store's rule, its claim's
    for job in waiting:
        owner = job.get("owner")
        if owner in held:
            n = held[owner]
            why = (
                f"user '{owner}' runs {n} job{'s' if n != 1 else ''} already, their max_running: it starts "
                "once one ends; other users' jobs run meanwhile"
            )
            job["held_by_quota"] = why
            job["eta_start"] = job["eta_finish"] = None
            job["eta_reason"] = why
