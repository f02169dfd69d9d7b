-- 012_event_runs_and_named_rules: the schema tells the truth on its own, in the sqlite3 shell too.
--
-- * event.run_id: the run an event is about (its claim, its end, a stale note). /metrics joined a
--   job's end to the job's latest run, so once a router restarted and summed the history again,
--   a failed run of 100 tokens followed by a retried run of 7 counted 7 tokens twice. Events
--   written before this migration get their run where the history tells it: the job's run that
--   was on the node at the event's moment.
-- * run_output: each run's whole text in one row (the text is stored in pieces since 011).
-- * stale_heads is made here, once, not by the router at every start: it reads the thresholds
--   the router records in router_setting at its start (through the view stale_setting), and the
--   rule itself (three ways to turn stale, in the order they are told) is the view head_staleness,
--   which the router's own check (gpuq/store/sqlite.py STALE_SQL) reads with its clock.
-- * Every CHECK of job, run and node_load has a name, so a refused write names the rule it broke
--   (the router answers 500 naming it: a bug, not a busy store). A CHECK changes only by
--   rebuilding its table, as 005 and 006 did (foreign keys are off while migrating and checked
--   before the commit): rows are copied as they are, then every index, trigger and view that went
--   with the old tables is made again as 001-011 made them (tests/test_schema.py holds the result).
-- * ready_job is the complement of held_job: the held-critique rule is written once, in held_job.

-- -- event.run_id ------------------------------------------------------------------------------

ALTER TABLE event ADD COLUMN run_id INTEGER REFERENCES run(id);  -- NULL: the event is about no run

UPDATE event SET run_id = (
    SELECT r.id FROM run r
    WHERE r.job_id = event.job_id AND r.started_at <= event.at
      AND (r.finished_at IS NULL OR r.finished_at >= event.at)
    ORDER BY r.id DESC LIMIT 1)
WHERE from_state = 'running' OR to_state = 'running';

-- -- job, rebuilt with named rules -------------------------------------------------------------

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
    prompt_excerpt TEXT GENERATED ALWAYS AS (substr(prompt, 1, 300)) STORED,  -- characters, not bytes
    prompt_bytes   INTEGER GENERATED ALWAYS AS (length(CAST(prompt AS BLOB))) STORED,
    prompt      TEXT NOT NULL,                    -- a front-door call's: its last user message
    request     TEXT,                             -- 006: that call as received, JSON {path, user_agent, body}
    CONSTRAINT job_kind_valid CHECK (kind IN ('task', 'critique', 'embed')),
    CONSTRAINT job_state_valid CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    CONSTRAINT job_subject_from_parent_flag CHECK (subject_from_parent IN (0, 1)),
    CONSTRAINT job_finished_when_ended CHECK ((finished_at IS NULL) = (state IN ('queued', 'running'))),
    CONSTRAINT job_request_with_endpoint CHECK ((endpoint IS NULL) = (request IS NULL)),
    CONSTRAINT job_embed_from_front_door CHECK (kind <> 'embed' OR endpoint IS NOT NULL)
);

INSERT INTO job_rebuilt (id, kind, state, node, model, model_pinned, parent_id, group_id, position,
                         placement, run_id, error, findings, timeout_s, created_at, finished_at,
                         subject_from_parent, think, options, endpoint, prompt, request)
SELECT id, kind, state, node, model, model_pinned, parent_id, group_id, position,
       placement, run_id, error, findings, timeout_s, created_at, finished_at,
       subject_from_parent, think, options, endpoint, prompt, request
FROM job;

-- Views that name a dropped table would make the renames below fail: they go, and come back
-- below (stale_heads as this migration makes it, no longer as the router made it).
DROP VIEW IF EXISTS stale_heads;
DROP VIEW ready_job;
DROP VIEW held_job;
DROP VIEW run_text;
DROP TABLE job;                                   -- its indexes and triggers go with it
ALTER TABLE job_rebuilt RENAME TO job;

-- -- run, rebuilt with named rules -------------------------------------------------------------

CREATE TABLE run_rebuilt (
    id                 INTEGER PRIMARY KEY,
    job_id             TEXT NOT NULL REFERENCES job(id),
    node               TEXT NOT NULL,
    model              TEXT NOT NULL,
    state              TEXT NOT NULL DEFAULT 'running',  -- running, done, failed, cancelled, preempted
    started_at         TEXT NOT NULL,
    progress_at        TEXT NOT NULL,             -- last time tokens arrived (heartbeat)
    work_done_at       TEXT,                      -- Ollama's stream ended
    finished_at        TEXT,
    output             TEXT NOT NULL DEFAULT '',  -- runs before 011 only; later text is in run_chunk
    error              TEXT,
    done_reason        TEXT,                      -- Ollama's: stop, length
    eval_count         INTEGER,
    prompt_eval_count  INTEGER,
    total_duration_ns  INTEGER,
    load_duration_ns   INTEGER,
    eval_duration_ns   INTEGER,
    stale_reason       TEXT,                      -- set once when the run is first seen stale
    thinking           TEXT,                      -- 004 (runs before 011 only, as output)
    CONSTRAINT run_state_valid CHECK (state IN ('running', 'done', 'failed', 'cancelled', 'preempted')),
    CONSTRAINT run_finished_when_ended CHECK ((finished_at IS NULL) = (state = 'running'))
);

INSERT INTO run_rebuilt (id, job_id, node, model, state, started_at, progress_at, work_done_at, finished_at,
                         output, error, done_reason, eval_count, prompt_eval_count, total_duration_ns,
                         load_duration_ns, eval_duration_ns, stale_reason, thinking)
SELECT id, job_id, node, model, state, started_at, progress_at, work_done_at, finished_at,
       output, error, done_reason, eval_count, prompt_eval_count, total_duration_ns,
       load_duration_ns, eval_duration_ns, stale_reason, thinking
FROM run;

DROP TABLE run;
ALTER TABLE run_rebuilt RENAME TO run;

-- -- node_load, rebuilt with named rules -------------------------------------------------------

CREATE TABLE node_load_rebuilt (
    node    TEXT PRIMARY KEY,
    queued  INTEGER NOT NULL DEFAULT 0,
    running INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT node_load_queued_counted CHECK (queued >= 0),
    CONSTRAINT node_load_running_counted CHECK (running >= 0)
) WITHOUT ROWID;
INSERT INTO node_load_rebuilt (node, queued, running) SELECT node, queued, running FROM node_load;
DROP TABLE node_load;
ALTER TABLE node_load_rebuilt RENAME TO node_load;

-- -- everything that went with the old tables, as 001-011 made it ------------------------------

CREATE INDEX job_queue ON job (node, state, position, id);                       -- 001
CREATE UNIQUE INDEX job_one_running_per_node ON job (node) WHERE state = 'running';
CREATE INDEX job_parent ON job (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX job_created ON job (created_at);
CREATE INDEX job_state_node ON job (state, node);                                -- 002
CREATE INDEX job_finished ON job (finished_at, id) WHERE finished_at IS NOT NULL; -- 008

CREATE INDEX run_job ON run (job_id);                                            -- 001
CREATE INDEX run_running ON run (state) WHERE state = 'running';
CREATE INDEX run_done_node ON run (node, id) WHERE state = 'done';               -- 008
CREATE INDEX run_done_node_model ON run (node, model, id) WHERE state = 'done';
CREATE INDEX run_finished ON run (finished_at) WHERE finished_at IS NOT NULL;

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

CREATE TRIGGER run_chunk_deleted_with_run                                        -- 011
AFTER DELETE ON run
BEGIN
    DELETE FROM run_chunk WHERE run_id = OLD.id;
END;

-- A run deleted by hand in the sqlite3 shell (the router never deletes one) leaves its events
-- about no run, foreign keys on or off; the index is what that delete (and the foreign key's own
-- check) finds them by.
CREATE INDEX event_run ON event (run_id) WHERE run_id IS NOT NULL;
CREATE TRIGGER run_deleted_from_its_events
AFTER DELETE ON run
BEGIN
    UPDATE event SET run_id = NULL WHERE run_id = OLD.id;
END;

-- What each held critique waits for (003): queued, its subject its parent's result, and that
-- parent not done. The one statement of the rule: the router's listings, start estimates and
-- the ending of a parent without a result read it, and ready_job is its complement.
CREATE VIEW held_job AS
SELECT j.id, j.node, j.parent_id, p.state AS parent_state FROM job j JOIN job p ON p.id = j.parent_id
WHERE j.state = 'queued' AND j.subject_from_parent = 1 AND p.state <> 'done';

-- Which queued jobs may run now (003): the claim takes the first of its node's.
CREATE VIEW ready_job AS
SELECT j.* FROM job j
WHERE j.state = 'queued' AND NOT EXISTS (SELECT 1 FROM held_job h WHERE h.id = j.id);

CREATE VIEW run_text AS                                                          -- 011
    SELECT id AS run_id, 0 AS seq, NULL AS at, output, thinking FROM run
    WHERE output <> '' OR thinking IS NOT NULL
    UNION ALL
    SELECT run_id, seq, at, output, thinking FROM run_chunk;

-- Each run's whole text, one row a run ('' and NULL when it gave none). In the sqlite3 shell:
--   SELECT output FROM run_output WHERE run_id = 7;
-- The pieces are joined in seq order (the ordered subquery; SQLite 3.40 has no ORDER BY inside
-- group_concat). The router reads the pieces themselves (gpuq/store/verbs.py run_text_query).
CREATE VIEW run_output AS
SELECT r.id AS run_id, r.job_id, r.state,
    COALESCE((SELECT group_concat(COALESCE(t.output, ''), '')
              FROM (SELECT output FROM run_text WHERE run_id = r.id ORDER BY seq) t), '') AS output,
    (SELECT group_concat(t.thinking, '')
     FROM (SELECT thinking FROM run_text WHERE run_id = r.id ORDER BY seq) t) AS thinking
FROM run r;

-- -- staleness ----------------------------------------------------------------------------------

-- The thresholds in force, in seconds, as the router recorded them at its start (NULL before).
CREATE VIEW stale_setting AS
SELECT (SELECT value FROM router_setting WHERE key = 'stale_after_s') AS stale_after_s,
       (SELECT value FROM router_setting WHERE key = 'stale_grace_s') AS grace_s,
       (SELECT value FROM router_setting WHERE key = 'max_runtime_s') AS max_runtime_s;

-- Each running head's ways of turning stale, in the order they are told (rank), each with the
-- moment its clock started (since) and the moment it turns stale (stale_at, a julianday): Ollama
-- finished but the job did not within the grace (the 49-minute case), it ran past max_runtime
-- (the node's own, else the router's), or no tokens came for stale_after. Only running rows are
-- read (the partial index job_one_running_per_node), so the cost stays flat as history grows.
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

-- The heads stale now, each with the first reason that holds (SQLite gives the bare columns of
-- the row with MIN(rank)). The router asks the same with its own clock for 'now'.
CREATE VIEW stale_heads AS
SELECT id, node, state, since, reason, run_id FROM (
    SELECT id, node, state, since, reason, run_id, MIN(rank) FROM head_staleness
    WHERE stale_at < julianday('now') GROUP BY id);
