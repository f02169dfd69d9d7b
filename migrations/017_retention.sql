-- 017_retention: retention sheds an ended job's bulk (its front-door request, its output and
-- reasoning) after a while, and deletes its rows after a longer one (gpuq/store/retention.py,
-- issue 35). A job whose bulk was shed must say so ("output pruned on <date> (retention)"), never
-- look like a job that produced nothing: `pruned_at` records when. The job table is rebuilt (a
-- column goes before `request` by a rebuild, never by ADD COLUMN: see 016), and the rule that a
-- front-door call keeps its request becomes "until it was pruned". Only an ended job is pruned.
-- `maintenance_lease`: with several routers on one PostgreSQL, one runs the sweep (the table is
-- here too so both engines have the same schema; on SQLite one router holds the database).
-- SQLite's auto_vacuum = INCREMENTAL (freed pages given back after a sweep) needs a full VACUUM
-- of an existing database, which cannot run in a transaction: the store does it once after its
-- migrations (gpuq/store/sqlite.py), with a log line saying how long it took.

CREATE TABLE maintenance_lease (
    service     TEXT PRIMARY KEY,                 -- 'retention'
    router      TEXT NOT NULL REFERENCES router(id),
    expires_at  REAL NOT NULL,                    -- epoch seconds: another router may take it after it
    taken_at    REAL NOT NULL
);

CREATE TABLE job_rebuilt (
    id          TEXT PRIMARY KEY,                 -- '<unix seconds>-<8 hex>'
    kind        TEXT NOT NULL,                    -- task, critique, embed (a front-door embedding)
    state       TEXT NOT NULL DEFAULT 'queued',   -- see gpuq/jobs.py JobState
    node        TEXT NOT NULL,                    -- the node whose queue holds the job
    model       TEXT NOT NULL,
    model_pinned INTEGER NOT NULL DEFAULT 0,      -- 1: asked for; 0: the node's model, follows moves
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
    subject_from_parent INTEGER NOT NULL DEFAULT 0,   -- 003: a held critique's prompt comes at its claim
    think       TEXT,                             -- 004: Ollama's `think` as JSON; NULL: the node's
    options     TEXT,                             -- 004: the job's own Ollama options, JSON object
    endpoint    TEXT,                             -- 006: the front-door route it came in on
    owner       TEXT,                             -- 014: the user who sent it; NULL: no identity
    client      TEXT,                             -- 014: the sending program (User-Agent), cut to 200 characters
    lane        TEXT NOT NULL DEFAULT 'batch',    -- 014: 'interactive' or 'batch'
    prompt_excerpt TEXT GENERATED ALWAYS AS (substr(prompt, 1, 300)) STORED,  -- characters, not bytes
    prompt_bytes   INTEGER GENERATED ALWAYS AS (length(CAST(prompt AS BLOB))) STORED,
    pruned_at   TEXT,                             -- 017: when retention shed its bulk (request, output, reasoning); NULL: whole
    request     TEXT,                             -- 006: a front-door call as received, JSON {path, user_agent, body}; NULL once pruned
    prompt      TEXT NOT NULL,                    -- last (005): a front-door call's: its last user message
    CONSTRAINT job_lane_valid CHECK (lane IN ('interactive', 'batch')),
    CONSTRAINT job_kind_valid CHECK (kind IN ('task', 'critique', 'embed')),
    CONSTRAINT job_state_valid CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    CONSTRAINT job_subject_from_parent_flag CHECK (subject_from_parent IN (0, 1)),
    CONSTRAINT job_finished_when_ended CHECK ((finished_at IS NULL) = (state IN ('queued', 'running'))),
    CONSTRAINT job_request_with_endpoint CHECK (endpoint IS NOT NULL OR request IS NULL),
    CONSTRAINT job_request_kept_until_pruned CHECK (endpoint IS NULL OR request IS NOT NULL OR pruned_at IS NOT NULL),
    CONSTRAINT job_pruned_when_ended CHECK (pruned_at IS NULL OR state IN ('done', 'failed', 'cancelled')),
    CONSTRAINT job_embed_from_front_door CHECK (kind <> 'embed' OR endpoint IS NOT NULL)
);

INSERT INTO job_rebuilt (id, kind, state, node, model, model_pinned, parent_id, group_id, position, placement, run_id, error, findings, timeout_s, created_at, finished_at, subject_from_parent, think, options, endpoint, owner, client, lane, pruned_at, request, prompt)
SELECT id, kind, state, node, model, model_pinned, parent_id, group_id, position, placement, run_id, error, findings, timeout_s, created_at, finished_at, subject_from_parent, think, options, endpoint, owner, client, lane, NULL, request, prompt
FROM job;

-- Views that name job would make the rename below fail: they go, and come back below.
DROP VIEW stale_heads;
DROP VIEW head_staleness;
DROP VIEW ready_job;
DROP VIEW held_job;
DROP TABLE job;                                   -- its indexes and triggers go with it
ALTER TABLE job_rebuilt RENAME TO job;

-- -- everything that went with the old table, as it was ----------------------------------------

CREATE INDEX job_queue ON job (node, state, position, id);
CREATE UNIQUE INDEX job_one_running_per_node ON job (node) WHERE state = 'running';
CREATE INDEX job_parent ON job (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX job_created ON job (created_at);
CREATE INDEX job_state_node ON job (state, node);
CREATE INDEX job_finished ON job (finished_at, id) WHERE finished_at IS NOT NULL;
CREATE TRIGGER node_load_insert AFTER INSERT ON job                              -- 009
WHEN NEW.state IN ('queued', 'running')
BEGIN
    INSERT INTO node_load (node, queued, running) VALUES (NEW.node, NEW.state = 'queued', NEW.state = 'running')
    ON CONFLICT (node) DO UPDATE SET queued = queued + excluded.queued, running = running + excluded.running;
END;

CREATE TRIGGER node_load_update AFTER UPDATE OF state, node ON job
WHEN (OLD.state IS NOT NEW.state OR OLD.node IS NOT NEW.node)
     AND (OLD.state IN ('queued', 'running') OR NEW.state IN ('queued', 'running'))
BEGIN
    UPDATE node_load SET queued = queued - (OLD.state = 'queued'), running = running - (OLD.state = 'running')
    WHERE node = OLD.node;
    INSERT INTO node_load (node, queued, running)
    SELECT NEW.node, NEW.state = 'queued', NEW.state = 'running' WHERE NEW.state IN ('queued', 'running')
    ON CONFLICT (node) DO UPDATE SET queued = queued + excluded.queued, running = running + excluded.running;
END;

CREATE TRIGGER node_load_delete AFTER DELETE ON job
WHEN OLD.state IN ('queued', 'running')
BEGIN
    UPDATE node_load SET queued = queued - (OLD.state = 'queued'), running = running - (OLD.state = 'running')
    WHERE node = OLD.node;
END;

CREATE TRIGGER critique_guard_insert                                             -- 010
BEFORE INSERT ON job
WHEN NEW.kind = 'critique' AND NEW.state IN ('queued', 'running')
     AND NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id)
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

CREATE TRIGGER critique_guard_update
BEFORE UPDATE OF node, state ON job
WHEN NEW.kind = 'critique' AND NEW.state IN ('queued', 'running')
     AND (NEW.node IS NOT OLD.node OR OLD.state NOT IN ('queued', 'running'))
     AND NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id)
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

CREATE TRIGGER critique_guard_parent_update
BEFORE UPDATE OF node, state ON job
WHEN NEW.kind <> 'critique' AND NEW.state IN ('queued', 'running')
     AND (NEW.node IS NOT OLD.node OR OLD.state NOT IN ('queued', 'running'))
     AND EXISTS (SELECT 1 FROM job c WHERE c.parent_id = NEW.id AND c.node = NEW.node
                 AND c.state IN ('queued', 'running'))
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

CREATE VIEW held_job AS
SELECT j.id, j.node, j.parent_id, p.state AS parent_state FROM job j JOIN job p ON p.id = j.parent_id
WHERE j.state = 'queued' AND j.subject_from_parent = 1 AND p.state <> 'done';

CREATE VIEW ready_job AS
SELECT j.* FROM job j
WHERE j.state = 'queued' AND NOT EXISTS (SELECT 1 FROM held_job h WHERE h.id = j.id);

CREATE VIEW head_staleness AS
SELECT j.id, j.node, j.state, j.run_id, 1 AS rank, 'ollama finished but the job was not closed' AS reason,
       r.work_done_at AS since, julianday(r.work_done_at) + s.grace_s / 86400.0 AS stale_at
FROM job j JOIN run r ON r.id = j.run_id JOIN stale_setting s
WHERE j.state = 'running' AND r.work_done_at IS NOT NULL
UNION ALL
SELECT j.id, j.node, j.state, j.run_id, 2, 'ran past max_runtime', r.started_at,
       julianday(r.started_at) + COALESCE(n.max_runtime_s, s.max_runtime_s) / 86400.0
FROM job j JOIN run r ON r.id = j.run_id JOIN stale_setting s LEFT JOIN node n ON n.name = j.node
WHERE j.state = 'running'
UNION ALL
SELECT j.id, j.node, j.state, j.run_id, 3, 'no progress', r.progress_at,
       julianday(r.progress_at) + s.stale_after_s / 86400.0
FROM job j JOIN run r ON r.id = j.run_id JOIN stale_setting s
WHERE j.state = 'running';

CREATE VIEW stale_heads AS
SELECT id, node, state, since, reason, run_id FROM (
    SELECT id, node, state, since, reason, run_id, MIN(rank) FROM head_staleness
    WHERE stale_at < julianday('now') GROUP BY id);

CREATE INDEX job_owner_state ON job(owner, state) WHERE owner IS NOT NULL;

-- The sweep's scan: ended jobs whose bulk is still whole, oldest first (the pruned ones are not
-- walked again at each batch).
CREATE INDEX job_unpruned ON job (finished_at, id) WHERE finished_at IS NOT NULL AND pruned_at IS NULL;
