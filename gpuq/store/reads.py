"""The store's reads: every question the router, its pages and its API ask of the queue, each
one or a few statements on the readers' connection (aiosqlite's thread, psycopg's pool; see
Core.read), which WAL (or PostgreSQL's MVCC) lets in alongside the writer. `Reads` is a base of
gpuq/store/facade.py's Store: its methods are Store's; the few statements written per engine
come from the engine's module (`self.engine`). The reads of batches and files: batch_reads.py."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import NotFound
from ..jobs import JobState, Lane, NodeCounts, iso
from . import retention
from .core import Core
from .parts import MARK_TEXT, join_request, marks_in, parts_sql
from .steps import QUEUE_POSITION_SQL, Row, RunText, joined_text, run_text_query

# The parent a held critique waits for (NULL for any other job): the view held_job is the one
# statement of the rule (migration 003, and ready_job its complement since 012).
WAITING_FOR = "(SELECT h.parent_id FROM held_job h WHERE h.id = j.id) AS waiting_for"

# A listing (/api/queue, /api/jobs) carries each prompt's first 300 characters and its size in
# UTF-8 bytes, which SQLite stores beside the prompt when it is written (migration 005): 300
# waiting 1 MB prompts are neither read from the file nor held in the router's memory. Only a
# single job's read (/api/jobs/{id}) adds the whole prompt.
LISTING_COLUMNS = (
    """j.id, j.kind, j.state, j.node, j.model, j.parent_id, j.group_id,
    j.position, j.placement, j.run_id, j.error, j.findings, j.timeout_s, j.created_at, j.finished_at,
    j.think, j.options, j.endpoint, j.prompt_excerpt, j.prompt_bytes, j.owner, j.client, j.lane, j.pruned_at,
    r.started_at, r.progress_at, r.work_done_at, r.eval_count, r.prompt_eval_count,
    r.eval_duration_ns, r.total_duration_ns, r.done_reason,
    (SELECT COUNT(*) FROM run p WHERE p.job_id = j.id AND p.state = 'preempted') AS preempted_runs,
    """
    + WAITING_FOR
)
DETAIL_COLUMNS = LISTING_COLUMNS + ", j.prompt"

JOB_FROM = "FROM job j LEFT JOIN run r ON r.id = j.run_id"


class Reads(Core):
    """The reads of the queue, answered through `read` (Core's: the readers' connection)."""

    # -- jobs and queues ----------------------------------------------------------------------

    async def lanes_in_play(self, job_id: str) -> list[Row]:
        """Each running job's node, lane and model, and the interactive jobs waiting (but
        `job_id`): what placement.preempt_elsewhere weighs."""
        return await self.read(
            "SELECT node, state, lane, model FROM job WHERE state = 'running'"
            " OR (state = 'queued' AND lane = ? AND id != ?)",
            (Lane.INTERACTIVE, job_id),
        )

    async def stale_heads(self, now: float | None = None) -> list[Row]:
        return await self.read(self.engine.STALE_SQL, {"now": iso(self.clock() if now is None else now)})

    async def job(self, job_id: str, columns: str = LISTING_COLUMNS) -> Row:
        """A job as listings show it (its prompt's excerpt and size, not the prompt)."""
        rows = await self.read(f"SELECT {columns} {JOB_FROM} WHERE j.id = ?", (job_id,))
        if not rows:
            raise NotFound(f"no job with id '{job_id}'")
        return rows[0]

    async def job_detail(self, job_id: str) -> Row:
        """The whole job: its full prompt, output, runs, events and critiques."""
        job = await self.job(job_id, DETAIL_COLUMNS)
        job["runs"] = await self.runs(job_id)
        job["events"] = await self.read(
            "SELECT at, from_state, to_state, actor, reason FROM event WHERE job_id = ? ORDER BY id", (job_id,)
        )
        job["children"] = await self.read(  # each critique's finding count and highest severity too
            f"SELECT id, kind, state, node, model, {self.engine.FINDING_COUNT} AS finding_count,"
            f" {self.engine.TOP_SEVERITY} AS top_severity FROM job WHERE parent_id = ? ORDER BY created_at, id",
            (job_id,),
        )
        if job.get("endpoint"):  # a front-door call: the request as received, for forensics
            job["request"] = await self.whole_request(job_id)
        job["output"] = job["runs"][-1]["output"] if job["runs"] else ""
        job["thinking"] = job["runs"][-1]["thinking"] if job["runs"] else None
        if job["state"] == JobState.QUEUED:
            job["queue_position"] = await self.queue_position(job)
        return job

    async def whole_request(self, job_id: str) -> str | None:
        """A front-door job's request as its client sent it (JSON {path, user_agent, body}), its
        large parts, stored once apart (gpuq/store/parts.py), back in place; None: no request."""
        rows = await self.read("SELECT request FROM job WHERE id = ?", (job_id,))
        if not rows:
            raise NotFound(f"no job with id '{job_id}'")
        request: str | None = rows[0]["request"]
        if request is None or not marks_in(request):
            return request
        found: dict[str, str] = {}
        digests = [r["sha256"] for r in await self.read("SELECT sha256 FROM job_part WHERE job_id = ?", (job_id,))]
        if digests:
            found = {r["sha256"]: r["data"] for r in await self.read(parts_sql(digests), digests)}
        return join_request(request, lambda _: found)

    async def runs(self, job_id: str) -> list[Row]:
        """A job's runs, oldest first, each with its whole text (output, thinking) from the view
        run_text (see run_text_query), not the run row's columns, which hold only the text
        of runs written before migration 011."""
        runs = await self.read("SELECT * FROM run WHERE job_id = ? ORDER BY id", (job_id,))
        texts = await self.run_texts([r["id"] for r in runs]) if runs else {}
        for r in runs:
            r.update(texts[r["id"]])
        return runs

    async def run_texts(self, run_ids: list[int]) -> dict[int, RunText]:
        """Runs' whole text, each {"output", "thinking"}: the one read of it (run_text_query)."""
        return joined_text(run_ids, await self.read(*run_text_query(run_ids)))

    async def queue_position(self, job: Row) -> int:
        rows = await self.read(QUEUE_POSITION_SQL, {k: job[k] for k in ("node", "position", "id")})
        n: int = rows[0]["n"]
        return n

    async def asked_unloads(self) -> dict[str, dict[str, Any]]:
        """Each node's last unload a client asked (migration 022), by node name."""
        rows = await self.read("SELECT name, asked_unload FROM node WHERE asked_unload IS NOT NULL")
        return {row["name"]: json.loads(row["asked_unload"]) for row in rows}

    async def jobs(self, node: str | None = None, state: str | None = None, limit: int = 100) -> list[Row]:
        where, params = [], []
        if node:
            where.append("j.node = ?")
            params.append(node)
        if state:
            where.append("j.state = ?")
            params.append(state)
        sql = f"SELECT {LISTING_COLUMNS} {JOB_FROM}"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return await self.read(sql + " ORDER BY j.created_at DESC, j.id DESC LIMIT ?", (*params, limit))

    async def queue(self, node: str, limit: int, offset: int = 0) -> tuple[Row | None, list[Row], int]:
        """The node's running job, `limit` of its queued jobs in order from the `offset`-th (0:
        the head), and how many wait."""
        running = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM} WHERE j.node = ? AND j.state = 'running'", (node,)
        )
        queued = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM} WHERE j.node = ? AND j.state = 'queued'"
            " ORDER BY j.position, j.id LIMIT ? OFFSET ?",
            (node, limit, offset),
        )
        count = await self.read("SELECT COUNT(*) AS n FROM job WHERE node = ? AND state = 'queued'", (node,))
        return (running[0] if running else None), queued, count[0]["n"]

    async def active_by_node(self) -> dict[str, NodeCounts]:
        """Running and queued jobs per node (one row per node: the table node_load)."""
        rows = await self.read("SELECT node, running, queued FROM node_load")
        return {r["node"]: NodeCounts(r["running"], r["queued"]) for r in rows}

    async def finished_totals(
        self, after_event: int, duration_bounds: Sequence[float], wait_bounds: Sequence[float]
    ) -> list[Row]:
        """Jobs that ended after event `after_event`, summed per (node, kind, state, model, owner) for
        /metrics: counts, tokens, and each histogram's count, sum and cumulative count per
        bound. A range of the event table's primary key, grouped in SQL: one query, however
        long the history. Each end is counted with its own run (event.run_id, migration 012), not
        the job's latest: a failed run's tokens are not the retried run's."""
        le = ", ".join(
            [f"SUM(CASE WHEN d <= {float(b)!r} THEN 1 ELSE 0 END) AS d_le_{i}" for i, b in enumerate(duration_bounds)]
            + [f"SUM(CASE WHEN w <= {float(b)!r} THEN 1 ELSE 0 END) AS w_le_{i}" for i, b in enumerate(wait_bounds)]
        )
        between = self.engine.seconds_between
        return await self.read(
            f"SELECT node, kind, state, model, owner, COUNT(*) AS n, SUM(tokens) AS tokens, MAX(event_id) AS last_event,"
            f" COUNT(d) AS d_n, COALESCE(SUM(d), 0.0) AS d_sum, COUNT(w) AS w_n, COALESCE(SUM(w), 0.0) AS w_sum,"
            f" {le} FROM ("
            " SELECT e.id AS event_id, e.to_state AS state, j.node, j.kind, COALESCE(r.model, j.model) AS model,"
            "  COALESCE(j.owner, '') AS owner,"
            "  COALESCE(r.eval_count, 0) AS tokens,"
            "  CASE WHEN e.to_state <> 'cancelled' AND r.finished_at IS NOT NULL"
            f"   THEN {between('r.started_at', 'r.finished_at')} END AS d,"
            f"  {between('j.created_at', '(SELECT MIN(f.started_at) FROM run f WHERE f.job_id = j.id)')}"
            "   AS w"
            " FROM event e JOIN job j ON j.id = e.job_id LEFT JOIN run r ON r.id = e.run_id"
            " WHERE e.id > ? AND e.to_state IN ('done', 'failed', 'cancelled') AND e.from_state <> e.to_state"
            ") AS ended GROUP BY node, kind, state, model, owner",
            (after_event,),
        )

    async def next_ready(self, node: str) -> Row | None:
        """The job the node would claim next (None: nothing is ready)."""
        rows = await self.read("SELECT id, model FROM ready_job WHERE node = ? ORDER BY position, id LIMIT 1", (node,))
        return rows[0] if rows else None

    async def next_ready_model(self, node: str) -> str | None:
        """The model of the job the node would claim next (None: nothing is ready)."""
        rows = await self.read("SELECT model FROM ready_job WHERE node = ? ORDER BY position, id LIMIT 1", (node,))
        return rows[0]["model"] if rows else None

    # -- start estimates (gpuq/eta.py) ---------------------------------------------------------

    async def queue_plans(self, nodes: list[str], depth: int) -> list[Row]:
        """Each node's running job and first `depth` waiting jobs (held critiques included), with
        the few columns a start estimate needs; one statement, each part on an index."""
        if not nodes:
            return []
        waiting = (
            "SELECT * FROM (SELECT j.id, j.node, j.state, j.model, j.position, NULL AS started_at,"
            f" {WAITING_FOR} FROM job j WHERE j.node = ? AND j.state = 'queued'"
            " ORDER BY j.position, j.id LIMIT ?) AS waiting"
        )
        running = (
            "SELECT j.id, j.node, j.state, j.model, 0 AS position, r.started_at, NULL AS waiting_for"
            " FROM job j JOIN run r ON r.id = j.run_id WHERE j.state = 'running'"
        )
        params: list[Any] = []
        for name in nodes:
            params += [name, depth]
        rows = await self.read(" UNION ALL ".join([running] + [waiting] * len(nodes)), params)
        rows.sort(key=lambda r: (r["node"], r["state"] != JobState.RUNNING, r["position"], r["id"]))
        return rows

    async def recent_durations(self, node_models: set[tuple[str, str]], nodes: set[str], last: int = 20) -> list[Row]:
        """How long the last `last` done runs took, per node and model and per node: rows of
        (node, model or NULL for the node's, seconds, load_s: the part of it Ollama spent
        loading the model, 0 where not reported). Each part reads its partial index."""
        seconds = (
            self.engine.seconds_between("started_at", "finished_at")
            + " AS seconds, COALESCE(load_duration_ns, 0) / 1e9 AS load_s"
        )
        by_node, by_model = self.engine.indexed_by("run_done_node"), self.engine.indexed_by("run_done_node_model")
        parts: list[tuple[str, tuple[Any, ...]]] = [
            (
                f"SELECT * FROM (SELECT node, NULL AS model, {seconds} FROM run{by_node}"
                " WHERE state = 'done' AND node = ? ORDER BY id DESC LIMIT ?) AS last",
                (node, last),
            )
            for node in sorted(nodes)
        ]
        parts += [
            (
                f"SELECT * FROM (SELECT node, model, {seconds} FROM run{by_model}"
                " WHERE state = 'done' AND node = ? AND model = ? ORDER BY id DESC LIMIT ?) AS last",
                (node, model, last),
            )
            for node, model in sorted(node_models)
        ]
        rows: list[Row] = []
        for at in range(0, len(parts), 400):  # SQLite compounds at most 500 SELECTs
            chunk = parts[at : at + 400]
            rows += await self.read(" UNION ALL ".join(sql for sql, _ in chunk), [p for _, ps in chunk for p in ps])
        return rows

    async def speeds(self, node_models: set[tuple[str, str]], last: int = 20) -> list[Row]:
        """Ollama's counters summed over the last `last` done runs of each (node, model), for its
        measured speed (gpuq/speed.py): runs, prompt_tokens and prompt_ns (runs with a prompt
        time), output_tokens and output_ns (runs that generated), load_ns (the longest load),
        last_used (the newest one's end). No row for a pair with no done run. Each part reads
        the partial index run_done_node_model."""
        by_model = self.engine.indexed_by("run_done_node_model")
        part = (
            "SELECT node, model, COUNT(*) AS runs,"
            " SUM(CASE WHEN prompt_eval_duration_ns > 0 THEN prompt_eval_count END) AS prompt_tokens,"
            " SUM(CASE WHEN prompt_eval_duration_ns > 0 THEN prompt_eval_duration_ns END) AS prompt_ns,"
            " SUM(CASE WHEN eval_duration_ns > 0 THEN eval_count END) AS output_tokens,"
            " SUM(CASE WHEN eval_duration_ns > 0 THEN eval_duration_ns END) AS output_ns,"
            " MAX(load_duration_ns) AS load_ns, MAX(finished_at) AS last_used FROM ("
            " SELECT node, model, prompt_eval_count, prompt_eval_duration_ns, eval_count, eval_duration_ns,"
            f" load_duration_ns, finished_at FROM run{by_model}"
            " WHERE state = 'done' AND node = ? AND model = ? ORDER BY id DESC LIMIT ?) AS last GROUP BY node, model"
        )
        pairs = sorted(node_models)
        rows: list[Row] = []
        for at in range(0, len(pairs), 400):  # SQLite compounds at most 500 SELECTs
            chunk = pairs[at : at + 400]
            rows += await self.read(
                " UNION ALL ".join([part] * len(chunk)), [p for n, m in chunk for p in (n, m, last)]
            )
        return rows

    async def model_use(self, since: float) -> list[Row]:
        """Per (node, model) as jobs asked for it: how many jobs had a run end since `since`
        (jobs), and when the last of those runs ended (last_used); `gpuq models`. One range of
        the index run_finished."""
        return await self.read(
            "SELECT node, model, COUNT(DISTINCT job_id) AS jobs, MAX(finished_at) AS last_used"
            " FROM run WHERE finished_at >= ? GROUP BY node, model",
            (iso(since),),
        )

    # -- history and utilisation (the history page, the busy strips) ---------------------------

    async def history(
        self,
        state: str | None,
        node: str | None,
        kind: str | None,
        text: str | None,
        limit: int,
        offset: int,
        owner: str | None = None,
        text_owner: str | None = None,
    ) -> tuple[list[Row], int]:
        """Finished jobs, newest first, filtered (by owner too); and how many match in all. `text`
        matches an id, a model, an error or a prompt; with `text_owner` (a member of a private
        router) the errors and prompts of that owner's jobs only."""
        where, params = ["j.finished_at IS NOT NULL"], []
        for column, value in (("j.state", state), ("j.node", node), ("j.kind", kind), ("j.owner", owner)):
            if value:
                where.append(f"{column} = ?")
                params.append(value)
        if text:
            like = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            match = [f"{c} {self.engine.LIKE} ? ESCAPE '\\'" for c in ("j.id", "j.model", "j.error", "j.prompt")]
            if text_owner is None:
                where.append("(" + " OR ".join(match) + ")")
                params += [like] * 4
            else:
                where.append(f"({match[0]} OR {match[1]} OR (j.owner = ? AND ({match[2]} OR {match[3]})))")
                params += [like, like, text_owner, like, like]
        cond = " AND ".join(where)
        rows = await self.read(
            f"SELECT {LISTING_COLUMNS} {JOB_FROM.replace('job j', 'job j' + self.engine.indexed_by('job_finished'))}"
            f" WHERE {cond}"
            " ORDER BY j.finished_at DESC, j.id DESC"
            " LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        total = await self.read(f"SELECT COUNT(*) AS n FROM job j WHERE {cond}", params)
        return rows, total[0]["n"]

    async def finished_since(self, since: float) -> dict[str, int]:
        """How many jobs ended in each final state since `since` (index job_finished)."""
        rows = await self.read(
            f"SELECT state, COUNT(*) AS n FROM job{self.engine.indexed_by('job_finished')}"
            " WHERE finished_at >= ?"
            " GROUP BY state",
            (iso(since),),
        )
        return {r["state"]: r["n"] for r in rows}

    async def runs_since(self, since: float) -> list[Row]:
        """Every run that was on a node at some time after `since`: the running ones and those
        that ended after it (index run_finished), oldest first."""
        return await self.read(
            "SELECT node, state, started_at, finished_at FROM run WHERE finished_at >= ?"
            " UNION ALL SELECT node, state, started_at, finished_at FROM run WHERE state = 'running'"
            " ORDER BY started_at",
            (iso(since),),
        )

    # -- alerts (gpuq/upkeep/alerts.py) -----------------------------------------------------------------

    async def open_alerts(self) -> list[Row]:
        """Firings not resolved yet (a restart picks them up where the last router left them)."""
        return await self.read("SELECT * FROM alert WHERE resolved_at IS NULL ORDER BY id")

    async def alerts_owed(self) -> list[Row]:
        """Notices not delivered yet, oldest firing first, with how many tries the next one has had."""
        return await self.read(
            "SELECT a.*, (SELECT COUNT(*) FROM alert_delivery d WHERE d.alert_id = a.id AND d.status ="
            " CASE WHEN a.fired_sent_at IS NULL THEN 'firing' ELSE 'resolved' END) AS attempts"
            f" FROM alert a{self.engine.indexed_by('alert_owed')} WHERE a.deliver = 1 AND (a.fired_sent_at IS NULL"
            " OR (a.resolved_at IS NOT NULL AND a.resolved_sent_at IS NULL)) ORDER BY a.id"
        )

    async def alerts(self, limit: int) -> list[Row]:
        """The latest firings, newest first, each with its delivery attempts."""
        rows = await self.read("SELECT * FROM alert ORDER BY id DESC LIMIT ?", (limit,))
        if rows:
            tries = await self.read(
                "SELECT * FROM alert_delivery WHERE alert_id BETWEEN ? AND ? ORDER BY id",
                (rows[-1]["id"], rows[0]["id"]),
            )
            for row in rows:
                row["deliveries"] = [t for t in tries if t["alert_id"] == row["id"]]
        return rows

    # -- retention (gpuq/store/retention.py): what is due, and what leaves whole -----------------

    async def retention_due(self, step: str, cutoffs: retention.Cutoffs, limit: int) -> list[str]:
        """Up to `limit` ids of ended jobs due for `step` ("prune" or "delete"), oldest first."""
        rows = await self.read(retention.due_sql(step), cutoffs.params() | {"limit": limit})
        return [r["id"] for r in rows]

    async def retention_plan(self, cutoffs: retention.Cutoffs) -> dict[str, Any]:
        """The dry run: what each step would drop now, and its bytes."""
        params = cutoffs.params()
        columns = {
            table: [r["name"] for r in await self.read(self.engine.COLUMNS_SQL, {"table": table})]
            for table in retention.ROW_TABLES
        }
        plans = retention.plan_sql(self.engine, columns)
        found = {key: (await self.read(sql, params))[0] for key, sql in plans.items()}
        return retention.plan(found)

    async def whole_jobs(self, ids: list[str]) -> list[Row]:
        """Jobs whole, as the archive keeps them: every column (JSON ones parsed), each run with
        its whole text, every event."""
        if not ids:
            return []
        reads = retention.whole_jobs_sql(ids)
        jobs = await self.read(*reads["jobs"])
        runs = await self.read(*reads["runs"])
        events = await self.read(*reads["events"])
        texts = await self.run_texts([r["id"] for r in runs]) if runs else {}
        for r in runs:
            r.update(texts[r["id"]])
        # Their requests' large parts, stored once apart (gpuq/store/parts.py), back in place:
        # one read of every part the batch's requests name.
        marked = [job for job in jobs if marks_in(job["request"])]
        digests = sorted({d for job in marked for d in MARK_TEXT.findall(job["request"])})
        found = {r["sha256"]: r["data"] for r in await self.read(parts_sql(digests), digests)} if digests else {}
        for job in marked:
            job["request"] = join_request(job["request"], lambda _: found)
        for job in jobs:
            for key in ("request", "findings", "think", "options"):
                if job[key] is not None:
                    job[key] = json.loads(job[key])
            job["runs"] = [r for r in runs if r["job_id"] == job["id"]]
            job["events"] = [e for e in events if e["job_id"] == job["id"]]
            job["output"] = job["runs"][-1]["output"] if job["runs"] else ""
        return jobs

    async def retention_batches_due(self, step: str, cutoffs: retention.Cutoffs, limit: int) -> list[str]:
        """Up to `limit` ids of ended batches due for `step` ("prune" or "delete"), oldest first."""
        rows = await self.read(retention.batches_due_sql(step), cutoffs.params() | {"limit": limit})
        return [r["id"] for r in rows]

    async def whole_batches(self, ids: list[str]) -> list[Row]:
        """Batches whole, as the archive keeps them: every column, every line (its kept reply),
        its files with their content as text (JSON Lines)."""
        if not ids:
            return []
        reads = retention.whole_batches_sql(ids)
        batches = await self.read(*reads["batches"])
        lines = await self.read(*reads["lines"])
        files = await self.read(*reads["files"])
        for f in files:  # (its chunks: migration 025)
            chunks = await self.read("SELECT bytes FROM batch_file_chunk WHERE file_id = ? ORDER BY seq", (f["id"],))
            f["content"] = b"".join(bytes(c["bytes"]) for c in chunks).decode("utf-8", "replace")
        for batch in batches:
            for key in ("metadata", "errors"):
                if batch[key] is not None:
                    batch[key] = json.loads(batch[key])
            named = (batch["input_file_id"], batch["output_file_id"], batch["error_file_id"])
            batch["lines"] = [line for line in lines if line["batch_id"] == batch["id"]]
            batch["files"] = [f for f in files if f["id"] in named]
        return batches

    async def batch_of_file(self, file_id: str) -> Row | None:
        """The batch that names a file ({id, pruned_at}), if any: a pruned batch's files are gone."""
        found = await self.read(retention.BATCH_OF_FILE_SQL, (file_id, file_id, file_id))
        return found[0] if found else None

    # -- backups and the storage budget (gpuq/upkeep/backups.py, gpuq/upkeep/storage.py) -----------------

    async def backups(self, scheduled: bool | None = None, limit: int = 20) -> list[Row]:
        """The latest backups recorded (both kinds, or only scheduled or asked-for ones), newest first."""
        where = "" if scheduled is None else " WHERE scheduled = ?"
        params: tuple[Any, ...] = () if scheduled is None else (int(scheduled),)
        return await self.read(f"SELECT * FROM backup{where} ORDER BY id DESC LIMIT ?", (*params, limit))

    async def last_backups(self) -> dict[str, Row | None]:
        """The newest successful backup of any kind, and the newest scheduled success and failure."""
        found: dict[str, Row | None] = {}
        for key, where in (
            ("last_success", "ok = 1"),
            ("scheduled_success", "scheduled = 1 AND ok = 1"),
            ("scheduled_failure", "scheduled = 1 AND ok = 0"),
        ):
            rows = await self.read(f"SELECT * FROM backup WHERE {where} ORDER BY id DESC LIMIT 1")
            found[key] = rows[0] if rows else None
        return found

    async def last_sweeps(self) -> dict[str, Row | None]:
        """The newest retention sweep recorded (done or failed) and the newest that succeeded,
        each with what it did (`swept`, JSON text)."""
        found: dict[str, Row | None] = {}
        for key, where in (("last", ""), ("last_success", " WHERE ok = 1")):
            rows = await self.read(f"SELECT * FROM retention_sweep{where} ORDER BY id DESC LIMIT 1")
            found[key] = rows[0] if rows else None
        return found

    async def rotatable_backups(self) -> list[Row]:
        """Scheduled backups the router made whose files it has not deleted yet."""
        return await self.read("SELECT * FROM backup WHERE scheduled = 1 AND ok = 1 AND removed_at IS NULL ORDER BY id")

    async def storage_samples(self, since: float) -> list[Row]:
        """The storage samples since `since`, oldest first."""
        return await self.read("SELECT * FROM storage_sample WHERE at >= ? ORDER BY at", (iso(since),))

    async def born(self) -> str:
        """When the database was made: its first migration's time (ISO text)."""
        return str((await self.read("SELECT MIN(applied_at) AS at FROM schema_migration"))[0]["at"])
