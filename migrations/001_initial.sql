-- 001_initial: the durable queue. Every job, every run of a job and every state change is a
-- row, so the queue survives restarts and a person can do forensics in the sqlite3 shell.
-- Times are UTC ISO-8601 text ('2026-11-29T08:10:00.123456Z'): readable, and they sort.

CREATE TABLE job (
    id          TEXT PRIMARY KEY,                 -- '<unix seconds>-<8 hex>'
    kind        TEXT NOT NULL CHECK (kind IN ('task', 'critique')),
    state       TEXT NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    node        TEXT NOT NULL,                    -- the node whose queue holds the job
    model       TEXT NOT NULL,
    model_pinned INTEGER NOT NULL DEFAULT 0,      -- 1: asked for; 0: the node's model, follows moves
    prompt      TEXT NOT NULL,
    parent_id   TEXT REFERENCES job(id),          -- a critique's task under review
    group_id    TEXT,                             -- the critiques of one fan-out share it
    position    INTEGER NOT NULL,                 -- order in the node's queue, gaps of 1024
    placement   TEXT NOT NULL,                    -- why it went to that node
    run_id      INTEGER,                          -- the current (latest) run
    error       TEXT,                             -- why it failed or was cancelled
    findings    TEXT,                             -- a done critique's findings, JSON
    timeout_s   REAL,                             -- per-job wall-clock limit, NULL = node default
    created_at  TEXT NOT NULL,
    finished_at TEXT,
    CHECK ((finished_at IS NULL) = (state IN ('queued', 'running')))
);

-- The claim path: the head of one node's queue.
CREATE INDEX job_queue ON job (node, state, position, id);
-- Two heads on one node are impossible.
CREATE UNIQUE INDEX job_one_running_per_node ON job (node) WHERE state = 'running';
CREATE INDEX job_parent ON job (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX job_created ON job (created_at);

-- One row per attempt: a preempted or retried job runs more than once.
CREATE TABLE run (
    id                 INTEGER PRIMARY KEY,
    job_id             TEXT NOT NULL REFERENCES job(id),
    node               TEXT NOT NULL,
    model              TEXT NOT NULL,
    state              TEXT NOT NULL DEFAULT 'running'
                       CHECK (state IN ('running', 'done', 'failed', 'cancelled', 'preempted')),
    started_at         TEXT NOT NULL,
    progress_at        TEXT NOT NULL,             -- last time tokens arrived (heartbeat)
    work_done_at       TEXT,                      -- Ollama's stream ended
    finished_at        TEXT,
    output             TEXT NOT NULL DEFAULT '',
    error              TEXT,
    done_reason        TEXT,                      -- Ollama's: stop, length
    eval_count         INTEGER,
    prompt_eval_count  INTEGER,
    total_duration_ns  INTEGER,
    load_duration_ns   INTEGER,
    eval_duration_ns   INTEGER,
    stale_reason       TEXT,                      -- set once when the run is first seen stale
    CHECK ((finished_at IS NULL) = (state = 'running'))
);
CREATE INDEX run_job ON run (job_id);
CREATE INDEX run_running ON run (state) WHERE state = 'running';

-- Every state change (and every move) of a job, who did it and why.
CREATE TABLE event (
    id          INTEGER PRIMARY KEY,
    job_id      TEXT NOT NULL REFERENCES job(id),
    at          TEXT NOT NULL,
    from_state  TEXT,                             -- NULL when the job was created
    to_state    TEXT NOT NULL,
    actor       TEXT NOT NULL,                    -- router, cli, page, api (+ client address)
    reason      TEXT
);
CREATE INDEX event_job ON event (job_id, id);

-- The guard lives in the database too, so no write path can break it.
CREATE TRIGGER critique_not_on_parent_node_insert
BEFORE INSERT ON job
WHEN NEW.kind = 'critique' AND NEW.parent_id IS NOT NULL
     AND NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id)
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

CREATE TRIGGER critique_not_on_parent_node_update
BEFORE UPDATE OF node ON job
WHEN NEW.kind = 'critique' AND NEW.parent_id IS NOT NULL
     AND NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id)
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

CREATE TRIGGER parent_not_onto_its_critiques_node
BEFORE UPDATE OF node ON job
WHEN NEW.kind = 'task' AND NEW.node <> OLD.node
     AND EXISTS (SELECT 1 FROM job c WHERE c.parent_id = NEW.id AND c.node = NEW.node
                 AND c.state IN ('queued', 'running'))
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

-- The nodes the router knows (from gpuq.toml) and their health, as last checked.
CREATE TABLE node (
    name            TEXT PRIMARY KEY,
    url             TEXT NOT NULL,
    rank            INTEGER NOT NULL,
    roles           TEXT NOT NULL,                -- 'task,critique'
    model           TEXT NOT NULL,
    max_runtime_s   REAL,                         -- NULL: the router's max_runtime
    up              INTEGER NOT NULL DEFAULT 0 CHECK (up IN (0, 1)),
    last_error      TEXT,
    since           TEXT                          -- when `up` last changed
);

-- The router's staleness thresholds, so the stale_heads view works in the sqlite3 shell.
CREATE TABLE router_setting (
    key    TEXT PRIMARY KEY,
    value  REAL NOT NULL
);
