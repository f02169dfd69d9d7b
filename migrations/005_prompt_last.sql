-- 005_prompt_last: listings (/api/queue, /api/jobs) read each prompt's excerpt and size, never
-- the prompt. SQLite stores a row's columns in order and a long value's tail in overflow pages,
-- so a column declared after `prompt` is reached only by walking the prompt's whole overflow
-- chain: listing 300 waiting jobs with 1 MB prompts read 300 MB (~130 ms on one reader
-- connection, which /health waits behind) even when no prompt was selected. The job table is
-- rebuilt with `prompt` last and, before it, its first 300 characters and its size in UTF-8
-- bytes, which SQLite computes whenever the prompt is written (STORED generated columns).
-- The router runs migrations with foreign keys off (the rebuild drops the table that run,
-- event and job itself refer to) and checks them before committing.

CREATE TABLE job_rebuilt (
    id          TEXT PRIMARY KEY,                 -- '<unix seconds>-<8 hex>'
    kind        TEXT NOT NULL CHECK (kind IN ('task', 'critique')),
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
    prompt_excerpt TEXT GENERATED ALWAYS AS (substr(prompt, 1, 300)) STORED,  -- characters, not bytes
    prompt_bytes   INTEGER GENERATED ALWAYS AS (length(CAST(prompt AS BLOB))) STORED,
    prompt      TEXT NOT NULL,                    -- last: nothing else is read through it
    CHECK ((finished_at IS NULL) = (state IN ('queued', 'running')))
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

-- Everything that went with the old table, as 001, 002 and 003 made it.
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
