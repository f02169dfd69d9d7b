-- 006_front_door: calls through the Ollama/OpenAI front door (gpuq/front.py) are jobs. Each
-- keeps the route it came in on and the client's whole request, for forensics and to run it;
-- an embedding is a job of its own kind, 'embed'. A CHECK changes only by rebuilding the table,
-- as 005 did (SQLite's procedure: the router runs migrations with foreign keys off and checks
-- them before committing): the rows are copied as they are, then every index, trigger and view
-- of the old table is made again as 001-005 made them. `endpoint` is read by listings, so it
-- comes before the prompt; `request` (as large as the prompt, images included) comes last.
-- A later migration that adds an index, trigger or view on `job` must come after this one.

CREATE TABLE job_rebuilt (
    id          TEXT PRIMARY KEY,                 -- '<unix seconds>-<8 hex>'
    kind        TEXT NOT NULL CHECK (kind IN ('task', 'critique', 'embed')),
    state       TEXT NOT NULL DEFAULT 'queued'
                CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
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
    subject_from_parent INTEGER NOT NULL DEFAULT 0    -- 003: a held critique's prompt comes at its claim
                CHECK (subject_from_parent IN (0, 1)),
    think       TEXT,                             -- 004: Ollama's `think` as JSON; NULL: the node's
    options     TEXT,                             -- 004: the job's own Ollama options, JSON object
    endpoint    TEXT,                             -- 006: the front-door route it came in on
                                                  -- ('/api/chat', '/v1/chat/completions', ...)
    prompt_excerpt TEXT GENERATED ALWAYS AS (substr(prompt, 1, 300)) STORED,  -- characters, not bytes
    prompt_bytes   INTEGER GENERATED ALWAYS AS (length(CAST(prompt AS BLOB))) STORED,
    prompt      TEXT NOT NULL,                    -- a front-door call's: its last user message
    request     TEXT,                             -- 006: that call as received, JSON {path, user_agent, body}
    CHECK ((finished_at IS NULL) = (state IN ('queued', 'running'))),
    CHECK ((endpoint IS NULL) = (request IS NULL)),
    CHECK (kind <> 'embed' OR endpoint IS NOT NULL)
);

INSERT INTO job_rebuilt (id, kind, state, node, model, model_pinned, parent_id, group_id, position,
                         placement, run_id, error, findings, timeout_s, created_at, finished_at,
                         subject_from_parent, think, options, prompt)
SELECT id, kind, state, node, model, model_pinned, parent_id, group_id, position,
       placement, run_id, error, findings, timeout_s, created_at, finished_at,
       subject_from_parent, think, options, prompt
FROM job;

-- A view that names a dropped table would make the rename below fail: they go, and come back
-- after it (003's as 003 made them; the router recreates stale_heads at every start).
DROP VIEW IF EXISTS stale_heads;
DROP VIEW ready_job;
DROP VIEW held_job;
DROP TABLE job;
ALTER TABLE job_rebuilt RENAME TO job;

CREATE INDEX job_queue ON job (node, state, position, id);
CREATE UNIQUE INDEX job_one_running_per_node ON job (node) WHERE state = 'running';
CREATE INDEX job_parent ON job (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX job_created ON job (created_at);
CREATE INDEX job_state_node ON job (state, node);

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

CREATE VIEW ready_job AS
SELECT j.* FROM job j
WHERE j.state = 'queued'
  AND (j.subject_from_parent = 0
       OR (SELECT p.state FROM job p WHERE p.id = j.parent_id) = 'done');

CREATE VIEW held_job AS
SELECT j.id, j.node, j.parent_id, p.state AS parent_state FROM job j JOIN job p ON p.id = j.parent_id
WHERE j.state = 'queued' AND j.subject_from_parent = 1 AND p.state <> 'done';
