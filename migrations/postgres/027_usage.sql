-- 027_usage: SQLite's 027, numbered as it is (issue 45, item 3). `GET /api/usage` reads each ended run's figures:
-- the runs still stored, and `usage_run` for the runs of jobs retention deleted. Retention's
-- delete copies a job's runs here in the same transaction that deletes them
-- (gpuq/store/retention.py delete), so past usage never changes when jobs go.
-- * usage_run: one row per deleted run, the figures only (no text): who, where, when, how much.
-- * usage_run_started, run_started: the window's rows found by their start, not by a scan.

CREATE TABLE usage_run (
    id          BIGINT PRIMARY KEY,         -- the run's id, as it was
    job_id      TEXT NOT NULL,              -- no reference: the job is gone
    owner       TEXT,                       -- the job's
    client      TEXT,
    lane        TEXT NOT NULL,
    node        TEXT NOT NULL,              -- the run's
    model       TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    busy_s      DOUBLE PRECISION NOT NULL,             -- started_at to finished_at
    load_s      DOUBLE PRECISION,                    -- Ollama's load_duration
    tokens_in   BIGINT,                     -- prompt_eval_count
    tokens_out  BIGINT,                     -- eval_count
    wait_s      DOUBLE PRECISION                     -- the job's first run only: created_at to started_at
);
CREATE INDEX usage_run_started ON usage_run (started_at);
CREATE INDEX run_started ON run (started_at) WHERE finished_at IS NOT NULL;
