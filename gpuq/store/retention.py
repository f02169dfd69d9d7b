"""Retention: an ended job keeps its record and sheds its bulk. Two steps, each in
small batches, each batch one short transaction of the writer:

- prune: a job done longer ago than `prune_after` (a failed one: `prune_failed_after`; a cancelled
  one, mostly an editor's abandoned completions: `prune_cancelled_after`)
  loses its front-door request (its images too), its output and its reasoning (run_chunk rows, and
  run.output / run.thinking of runs before 011), and its prompt past the first 300 characters (a
  critique's holds its parent's output); its row, runs and events stay, and `pruned_at` says when
  (the API, the page and the CLI say "output pruned on <date> (retention)").
- delete: a job ended longer ago than `delete_after` goes with its runs, chunks and events.

Waiting, running and held jobs are never touched (only ended ones qualify); a critique's parent
is not pruned while one of its critiques has not ended (a held critique reads its parent's output
at its claim), and not deleted while any critique of it is still stored (the critiques, which end
later, go first). Each verb takes the ids a read found due and checks again, inside its
transaction, that each still is (a retry between the read and the write makes a job active
again): what it changed is what it returns. The archive of what leaves (gpuq/upkeep/archive.py) is
written between that read and the write. Portable SQL, `?` placeholders; times are ISO text,
which compares as the times do."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..jobs import PROMPT_KEPT_CHARS, iso
from . import usage
from .engine import Connection, Engine, dialect
from .steps import Row

# No ISO time is before this: a step that is off has it as its cutoff, and finds nothing.
NEVER = ""


@dataclass(frozen=True)
class Cutoffs:
    """What is due, as of one moment: jobs that ended before each time (ISO text)."""

    prune: str  # done jobs whose bulk goes
    prune_failed: str  # failed jobs whose bulk goes
    delete: str  # jobs whose rows go
    prune_cancelled: str  # cancelled jobs whose bulk goes (an editor's abandoned calls, mostly)

    @classmethod
    def at(
        cls,
        now: float,
        prune_s: float | None,
        prune_failed_s: float | None,
        delete_s: float | None,
        prune_cancelled_s: float | None,
    ) -> Cutoffs:
        def before(period: float | None) -> str:
            return NEVER if period is None else iso(now - period)

        return cls(before(prune_s), before(prune_failed_s), before(delete_s), before(prune_cancelled_s))

    def params(self) -> dict[str, str]:
        return {
            "prune": self.prune,
            "prune_failed": self.prune_failed,
            "delete": self.delete,
            "prune_cancelled": self.prune_cancelled,
        }


# The one statement of each rule, on a job `j`, with the cutoffs bound by name. A job has ended
# exactly when its finished_at is set (the schema's job_finished_when_ended): that is the test,
# not `state IN (...)`, which would lead SQLite's planner to walk every ended job by its state
# index (a batch of 100 took 100 ms that way, against 1 ms by the ids).
PRUNE_DUE = """j.finished_at IS NOT NULL AND j.pruned_at IS NULL
    AND j.finished_at < CASE j.state WHEN 'failed' THEN :prune_failed WHEN 'cancelled' THEN :prune_cancelled
        ELSE :prune END
    AND NOT EXISTS (SELECT 1 FROM job c WHERE c.parent_id = j.id AND c.state IN ('queued', 'running'))"""
DELETE_DUE = """j.finished_at IS NOT NULL AND j.finished_at < :delete
    AND NOT EXISTS (SELECT 1 FROM job c WHERE c.parent_id = j.id)"""
# A batch's lines' jobs wait for their batch (batch_line refers to them): they go after it.
DELETE_DUE += "\n    AND NOT EXISTS (SELECT 1 FROM batch_line l WHERE l.job_id = j.id)"
DUE = {"prune": PRUNE_DUE, "delete": DELETE_DUE}
STEPS = ("delete", "prune")  # the order a sweep runs them: a job deleted needs no prune first


def due_sql(step: str) -> str:
    """The ids of up to :limit jobs due for `step`, oldest first (the index job_unpruned or
    job_finished is walked from its start)."""
    return f"SELECT j.id FROM job j WHERE {DUE[step]} ORDER BY j.finished_at, j.id LIMIT :limit"


def _in(ids: list[str]) -> str:
    return ",".join("?" * len(ids))


def _named(ids: list[str], cutoffs: Cutoffs) -> tuple[str, dict[str, Any]]:
    """`IN (:id0, :id1...)` and its parameters with the cutoffs' (one statement binds by name)."""
    marks = ",".join(f":id{i}" for i in range(len(ids)))
    return marks, {f"id{i}": job_id for i, job_id in enumerate(ids)} | cutoffs.params()


def prune(db: Connection, now: float, ids: list[str], cutoffs: Cutoffs) -> dict[str, Any]:
    """Shed the bulk of the jobs of `ids` still due; counts of what went, and `held_ms`: how long
    its statements held the writer (the transaction's commit is shared with other writes)."""
    began = time.perf_counter()
    if not ids:
        return {"jobs": 0, "chunks": 0, "held_ms": 0.0}
    marks, params = _named(ids, cutoffs)
    pruned = [
        r[0]
        for r in db.execute(
            # By the ids (the primary key), then the rule.
            f"UPDATE job AS j SET request = NULL, prompt = substr(j.prompt, 1, :kept), pruned_at = :now"
            f" WHERE j.id IN ({marks}) AND {PRUNE_DUE} RETURNING id",
            params | {"now": iso(now), "kept": PROMPT_KEPT_CHARS},
        ).fetchall()
    ]
    chunks = 0
    if pruned:
        runs = f"SELECT id FROM run WHERE job_id IN ({_in(pruned)})"
        chunks = db.execute(f"DELETE FROM run_chunk WHERE run_id IN ({runs})", tuple(pruned)).rowcount
        db.execute(
            f"UPDATE run SET output = '', thinking = NULL WHERE job_id IN ({_in(pruned)})"
            " AND (output <> '' OR thinking IS NOT NULL)",
            tuple(pruned),
        )
    return {"jobs": len(pruned), "chunks": chunks, "held_ms": (time.perf_counter() - began) * 1000}


def delete(db: Connection, ids: list[str], cutoffs: Cutoffs) -> dict[str, Any]:
    """Delete the jobs of `ids` still due, with their events, runs and chunks (each run's
    figures kept in usage_run first: past usage never changes); counts of what went, and
    `held_ms` (see prune)."""
    began = time.perf_counter()
    if not ids:
        return {"jobs": 0, "runs": 0, "events": 0, "held_ms": 0.0}
    marks, params = _named(ids, cutoffs)
    gone = [r[0] for r in db.execute(f"SELECT j.id FROM job j WHERE j.id IN ({marks}) AND {DELETE_DUE}", params)]
    runs = events = 0
    if gone:
        these = tuple(gone)
        usage.keep(db, dialect(db), gone, _in(gone))
        events = db.execute(f"DELETE FROM event WHERE job_id IN ({_in(gone)})", these).rowcount
        runs = db.execute(f"DELETE FROM run WHERE job_id IN ({_in(gone)})", these).rowcount  # chunks: trigger
        db.execute(f"DELETE FROM job WHERE id IN ({_in(gone)})", these)
    return {"jobs": len(gone), "runs": runs, "events": events, "held_ms": (time.perf_counter() - began) * 1000}


# The tables whose rows a deletion takes (a job's runs, their chunks, its events): the dry run
# counts their rows' stored values, every column.
ROW_TABLES = {"job": "j", "run": "r", "run_chunk": "c", "event": "e"}  # each with its alias in plan_sql


def row_bytes(engine: Engine, alias: str, columns: list[str]) -> str:
    """SQL for the bytes of a row's stored values: each column's as text (a number's digits),
    NULL none. What a deleted row frees, less SQLite's few bytes of header a row and its indexes'
    entries (`gpuq prune --dry-run` says so)."""
    return " + ".join(engine.byte_length(f'CAST({alias}."{c}" AS TEXT)') for c in columns) or "0"


def plan_sql(engine: Engine, columns: dict[str, list[str]]) -> dict[str, str]:
    """The dry run's reads: what each step would drop now (jobs, rows) and its bytes: a prune's,
    the bulk it sheds; a deletion's, its rows' stored values (`columns`: each of ROW_TABLES')."""
    size = engine.byte_length
    pruned_only = f"{PRUNE_DUE} AND NOT ({DELETE_DUE})"  # a job due for both is deleted, not pruned
    chunk_bytes = f"SUM({size('c.output')} + {size('c.thinking')})"
    run_bytes = f"SUM({size('r.output')} + {size('r.thinking')})"
    whole = {table: f"SUM({row_bytes(engine, alias, columns[table])})" for table, alias in ROW_TABLES.items()}
    return {
        "prune_jobs": f"SELECT COUNT(*) AS jobs, SUM({size('j.request')} + j.prompt_bytes - {size('j.prompt_excerpt')})"
        f" AS bytes FROM job j WHERE {pruned_only}",
        "prune_chunks": f"SELECT COUNT(*) AS chunks, {chunk_bytes} AS bytes FROM run_chunk c"
        f" JOIN run r ON r.id = c.run_id JOIN job j ON j.id = r.job_id WHERE {pruned_only}",
        "prune_runs": f"SELECT {run_bytes} AS bytes FROM run r JOIN job j ON j.id = r.job_id WHERE {pruned_only}",
        "delete_jobs": f"SELECT COUNT(*) AS jobs, {whole['job']} AS bytes FROM job j WHERE {DELETE_DUE}",
        "delete_runs": f"SELECT COUNT(*) AS runs, {whole['run']} AS bytes FROM run r JOIN job j ON j.id = r.job_id"
        f" WHERE {DELETE_DUE}",
        "delete_chunks": f"SELECT {whole['run_chunk']} AS bytes FROM run_chunk c JOIN run r ON r.id = c.run_id"
        f" JOIN job j ON j.id = r.job_id WHERE {DELETE_DUE}",
        "delete_events": f"SELECT COUNT(*) AS events, {whole['event']} AS bytes FROM event e"
        f" JOIN job j ON j.id = e.job_id WHERE {DELETE_DUE}",
        # ended batches (a batch due for both is deleted, not pruned)
        "batch_prune": f"SELECT COUNT(*) AS batches FROM batch b WHERE {BATCH_PRUNE_ONLY}",
        "batch_prune_files": "SELECT COUNT(*) AS files, SUM(f.bytes) AS bytes FROM batch_file f"
        f" JOIN batch b ON f.id IN (b.input_file_id, b.output_file_id, b.error_file_id) WHERE {BATCH_PRUNE_ONLY}",
        "batch_delete": f"SELECT COUNT(*) AS batches FROM batch b WHERE {BATCH_DUE['delete']}",
        "batch_delete_lines": "SELECT COUNT(*) AS lines FROM batch_line l JOIN batch b ON b.id = l.batch_id"
        f" WHERE {BATCH_DUE['delete']}",
    }


def plan(found: dict[str, Row]) -> dict[str, Any]:
    """The dry run's answer from plan_sql's rows: per step, what it would drop and its bytes.
    (Deletion is counted first: a job due for both is deleted, not pruned, by the sweep.)"""

    def n(key: str, col: str) -> int:
        return int(found[key][col] or 0)

    return {
        "delete": {
            "jobs": n("delete_jobs", "jobs"),
            "runs": n("delete_runs", "runs"),
            "events": n("delete_events", "events"),
            "bytes": sum(n(key, "bytes") for key in ("delete_jobs", "delete_runs", "delete_chunks", "delete_events")),
        },
        "prune": {
            "jobs": n("prune_jobs", "jobs"),
            "chunks": n("prune_chunks", "chunks"),
            "bytes": n("prune_jobs", "bytes") + n("prune_chunks", "bytes") + n("prune_runs", "bytes"),
        },
        "sweeps": {
            "prune": {
                "batches": n("batch_prune", "batches"),
                "files": n("batch_prune_files", "files"),
                "bytes": n("batch_prune_files", "bytes"),
            },
            "delete": {"batches": n("batch_delete", "batches"), "lines": n("batch_delete_lines", "lines")},
        },
    }


# What an archive line holds of a job: every column but the two generated from the prompt.
WHOLE_JOB_COLUMNS = (
    "id, kind, state, node, model, model_pinned, parent_id, group_id, position, placement, run_id,"
    " error, findings, timeout_s, created_at, finished_at, subject_from_parent, think, options,"
    " endpoint, owner, client, lane, pruned_at, request, prompt"
)


def whole_jobs_sql(ids: list[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The reads of whole jobs (the archive's lines): the jobs, their runs, their events."""
    these = tuple(ids)
    return {
        "jobs": (f"SELECT {WHOLE_JOB_COLUMNS} FROM job WHERE id IN ({_in(ids)}) ORDER BY id", these),
        "runs": (f"SELECT * FROM run WHERE job_id IN ({_in(ids)}) ORDER BY id", these),
        "events": (
            f"SELECT job_id, run_id, at, from_state, to_state, actor, reason FROM event"
            f" WHERE job_id IN ({_in(ids)}) ORDER BY id",
            these,
        ),
    }


# -- batches: an ended batch is due by when it ended, with the jobs' cutoffs --------

BATCH_END = "COALESCE(b.finalizing_at, b.failed_at, b.created_at)"
BATCH_ENDED = "b.status IN ('completed', 'cancelled', 'failed', 'expired')"
BATCH_DUE = {
    "prune": f"{BATCH_ENDED} AND b.pruned_at IS NULL AND {BATCH_END} < :prune",
    "delete": f"{BATCH_ENDED} AND {BATCH_END} < :delete",
}
BATCH_PRUNE_ONLY = f"{BATCH_DUE['prune']} AND NOT ({BATCH_END} < :delete)"


def batches_due_sql(step: str) -> str:
    """The ids of up to :limit ended batches due for `step`, oldest first."""
    return f"SELECT b.id FROM batch b WHERE {BATCH_DUE[step]} ORDER BY {BATCH_END}, b.id LIMIT :limit"


def _named_batches(ids: list[str], cutoffs: Cutoffs) -> tuple[str, dict[str, Any]]:
    marks = ",".join(f":id{i}" for i in range(len(ids)))
    return marks, {f"id{i}": batch_id for i, batch_id in enumerate(ids)} | cutoffs.params()


def _drop_files(db: Connection, found: list[Row]) -> int:
    files = [f for b in found for f in (b["input_file_id"], b["output_file_id"], b["error_file_id"]) if f]
    if not files:
        return 0
    return db.execute(f"DELETE FROM batch_file WHERE id IN ({_in(files)})", tuple(files)).rowcount


def prune_batches(db: Connection, now: float, ids: list[str], cutoffs: Cutoffs) -> dict[str, Any]:
    """The batches of `ids` still due lose their input, output and error files and their lines'
    kept replies; their rows and lines stay, `pruned_at` set. Counts of what went."""
    began = time.perf_counter()
    if not ids:
        return {"batches": 0, "files": 0, "held_ms": 0.0}
    marks, params = _named_batches(ids, cutoffs)
    found = [
        dict(r)
        for r in db.execute(
            f"UPDATE batch AS b SET pruned_at = :now WHERE b.id IN ({marks}) AND {BATCH_DUE['prune']}"
            " RETURNING id, input_file_id, output_file_id, error_file_id",
            params | {"now": iso(now)},
        ).fetchall()
    ]
    files = _drop_files(db, found)
    if found:
        gone = tuple(b["id"] for b in found)
        db.execute(f"UPDATE batch_line SET response = NULL WHERE batch_id IN ({_in(list(gone))})", gone)
    return {"batches": len(found), "files": files, "held_ms": (time.perf_counter() - began) * 1000}


def delete_batches(db: Connection, ids: list[str], cutoffs: Cutoffs) -> dict[str, Any]:
    """The batches of `ids` still due go, with their lines and files (their jobs then go by the
    jobs' own rule: DELETE_DUE). Counts of what went."""
    began = time.perf_counter()
    if not ids:
        return {"batches": 0, "lines": 0, "files": 0, "held_ms": 0.0}
    marks, params = _named_batches(ids, cutoffs)
    found = [
        dict(r)
        for r in db.execute(
            f"SELECT b.id, b.input_file_id, b.output_file_id, b.error_file_id FROM batch b"
            f" WHERE b.id IN ({marks}) AND {BATCH_DUE['delete']}",
            params,
        ).fetchall()
    ]
    files = _drop_files(db, found)
    lines = 0
    if found:
        gone = tuple(b["id"] for b in found)
        lines = db.execute(f"DELETE FROM batch_line WHERE batch_id IN ({_in(list(gone))})", gone).rowcount
        db.execute(f"DELETE FROM batch WHERE id IN ({_in(list(gone))})", gone)
    return {"batches": len(found), "lines": lines, "files": files, "held_ms": (time.perf_counter() - began) * 1000}


def whole_batches_sql(ids: list[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """The reads of whole batches (the archive's lines): the batches, their lines, their files."""
    these = tuple(ids)
    marks = _in(ids)
    return {
        "batches": (f"SELECT * FROM batch WHERE id IN ({marks}) ORDER BY id", these),
        "lines": (
            f"SELECT batch_id, line, custom_id, job_id, refused, response FROM batch_line WHERE batch_id IN ({marks})"
            " ORDER BY batch_id, line",
            these,
        ),
        "files": (
            "SELECT f.* FROM batch_file f JOIN batch b ON f.id IN (b.input_file_id, b.output_file_id, b.error_file_id)"
            f" WHERE b.id IN ({marks}) ORDER BY f.id",
            these,
        ),
    }


# The batch that names a file (a pruned one's files are gone: their reads say so, 410).
BATCH_OF_FILE_SQL = (
    "SELECT id, pruned_at FROM batch WHERE input_file_id = ? OR output_file_id = ? OR error_file_id = ?"
    " ORDER BY pruned_at IS NULL, pruned_at DESC LIMIT 1"
)
