-- 001_schema: the whole queue for PostgreSQL, one baseline: the same tables, columns, named rules,
-- indexes, views and triggers as SQLite's schema after its migrations 001-014 (tests/schema.sql),
-- so the same verbs keep the same rules and the router maps the same constraint names to the same
-- answers. A new engine has no history to migrate; the reasons behind each rule are told in
-- migrations/NNN_*.sql where SQLite's schema grew them, and tests/test_pg_schema.py holds both
-- engines to the same answers for the same rows.
--
-- Types, chosen so a row reads the same through either engine:
-- * Times stay ISO-8601 text in UTC ('2026-11-29T08:10:00.123456Z', gpuq/jobs.py iso), not
--   timestamptz: the verbs write and the API answers exactly these strings, they sort as text (the
--   indexes on created_at and finished_at, keyset paging), and a timestamptz would come back as a
--   datetime the verbs would have to format again at every read, in every listing. The few sums of
--   time (staleness) go through julianday() below, as SQLite's do.
-- * SQLite's INTEGER is 64 bits: BIGINT here (token counts, durations in ns, positions). An
--   INTEGER PRIMARY KEY is an identity column; the verbs read a new id with RETURNING.
-- * Flags stay INTEGER 0/1 under the same CHECKs (the API answers 0/1 today); REAL is double.

-- SQLite's julianday() for ISO-8601 text: days since noon UTC, 24 November 4714 BC. Views and the
-- router's staleness check compare times with it as SQLite's do. Text that is no time gives NULL,
-- as in SQLite, rather than an error; 'now' is the transaction's start, as PostgreSQL's now().
CREATE FUNCTION julianday(t TEXT) RETURNS DOUBLE PRECISION
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXTRACT(EPOCH FROM t::timestamptz) / 86400.0 + 2440587.5;
EXCEPTION WHEN invalid_datetime_format OR datetime_field_overflow OR invalid_parameter_value THEN
    RETURN NULL;
END $$;

-- -- tables -------------------------------------------------------------------------------------

CREATE TABLE node (
    name          TEXT PRIMARY KEY,
    url           TEXT NOT NULL,
    rank          BIGINT NOT NULL,
    roles         TEXT NOT NULL,                  -- 'task,critique'
    model         TEXT NOT NULL,
    max_runtime_s DOUBLE PRECISION,               -- NULL: the router's max_runtime
    up            BIGINT NOT NULL DEFAULT 0 CHECK (up IN (0, 1)),
    last_error    TEXT,
    since         TEXT                            -- when `up` last changed
);

CREATE TABLE job (
    id          TEXT PRIMARY KEY,                 -- '<unix seconds>-<8 hex>'
    kind        TEXT NOT NULL,                    -- task, critique, embed (a front-door embedding)
    state       TEXT NOT NULL DEFAULT 'queued',   -- see gpuq/jobs.py JobState
    node        TEXT NOT NULL,                    -- the node whose queue holds the job
    model       TEXT NOT NULL,
    model_pinned BIGINT NOT NULL DEFAULT 0,       -- 1: asked for; 0: the node's model, follows moves
    parent_id   TEXT REFERENCES job(id),          -- a critique's task under review
    group_id    TEXT,                             -- the critiques of one fan-out share it
    position    BIGINT NOT NULL,                  -- order in the node's queue, gaps of 1024
    placement   TEXT NOT NULL,                    -- why it went to that node
    run_id      BIGINT,                           -- the current (latest) run
    error       TEXT,                             -- why it failed or was cancelled
    findings    TEXT,                             -- a done critique's findings, JSON
    timeout_s   DOUBLE PRECISION,                 -- per-job wall-clock limit, NULL = node default
    created_at  TEXT NOT NULL,
    finished_at TEXT,
    subject_from_parent BIGINT NOT NULL DEFAULT 0,    -- a held critique's prompt comes at its claim
    think       TEXT,                             -- Ollama's `think` as JSON; NULL: the node's
    options     TEXT,                             -- the job's own Ollama options, JSON object
    endpoint    TEXT,                             -- the front-door route it came in on
    prompt_excerpt TEXT GENERATED ALWAYS AS (substr(prompt, 1, 300)) STORED,  -- characters, not bytes
    prompt_bytes   BIGINT GENERATED ALWAYS AS (octet_length(prompt)) STORED,  -- UTF-8 bytes
    prompt      TEXT NOT NULL,                    -- a front-door call's: its last user message
    request     TEXT,                             -- that call as received, JSON {path, user_agent, body}
    owner       TEXT,                             -- the user who sent it; NULL: no identity
    client      TEXT,                             -- the sending program (User-Agent), cut to 200 characters
    lane        TEXT NOT NULL DEFAULT 'batch',    -- 'interactive' or 'batch'
    CONSTRAINT job_lane_valid CHECK (lane IN ('interactive', 'batch')),
    CONSTRAINT job_kind_valid CHECK (kind IN ('task', 'critique', 'embed')),
    CONSTRAINT job_state_valid CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
    CONSTRAINT job_subject_from_parent_flag CHECK (subject_from_parent IN (0, 1)),
    CONSTRAINT job_finished_when_ended CHECK ((finished_at IS NULL) = (state IN ('queued', 'running'))),
    CONSTRAINT job_request_with_endpoint CHECK ((endpoint IS NULL) = (request IS NULL)),
    CONSTRAINT job_embed_from_front_door CHECK (kind <> 'embed' OR endpoint IS NOT NULL)
);

-- One row per attempt: a preempted or retried job runs more than once.
CREATE TABLE run (
    id                 BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    job_id             TEXT NOT NULL REFERENCES job(id),
    node               TEXT NOT NULL,
    model              TEXT NOT NULL,
    state              TEXT NOT NULL DEFAULT 'running',  -- running, done, failed, cancelled, preempted
    started_at         TEXT NOT NULL,
    progress_at        TEXT NOT NULL,             -- last time tokens arrived (heartbeat)
    work_done_at       TEXT,                      -- Ollama's stream ended
    finished_at        TEXT,
    output             TEXT NOT NULL DEFAULT '',  -- SQLite's runs before its 011 only; text is in run_chunk
    error              TEXT,
    done_reason        TEXT,                      -- Ollama's: stop, length
    eval_count         BIGINT,
    prompt_eval_count  BIGINT,
    total_duration_ns  BIGINT,
    load_duration_ns   BIGINT,
    eval_duration_ns   BIGINT,
    stale_reason       TEXT,                      -- set once when the run is first seen stale
    thinking           TEXT,                      -- as output
    CONSTRAINT run_state_valid CHECK (state IN ('running', 'done', 'failed', 'cancelled', 'preempted')),
    CONSTRAINT run_finished_when_ended CHECK ((finished_at IS NULL) = (state = 'running'))
);

-- A run's text, written once: each heartbeat appends the text that came since (SQLite's 011).
CREATE TABLE run_chunk (
    run_id   BIGINT NOT NULL REFERENCES run(id),
    seq      BIGINT NOT NULL,                     -- 1, 2, 3... in the order written
    at       TEXT NOT NULL,                       -- when it was written
    output   TEXT,                                -- the answer's text since the run's last chunk; NULL: none
    thinking TEXT,                                -- the reasoning's text since; NULL: none
    PRIMARY KEY (run_id, seq)
);

-- Every state change of every job.
CREATE TABLE event (
    id         BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    job_id     TEXT NOT NULL REFERENCES job(id),
    at         TEXT NOT NULL,
    from_state TEXT,                              -- NULL when the job was created
    to_state   TEXT NOT NULL,
    actor      TEXT NOT NULL,                     -- router, cli, page, api (+ client address)
    reason     TEXT,
    run_id     BIGINT REFERENCES run(id)          -- the run the event is about; NULL: none
);

-- How many jobs wait and run on each node, kept by the triggers below (placement reads it).
CREATE TABLE node_load (
    node    TEXT PRIMARY KEY,
    queued  BIGINT NOT NULL DEFAULT 0,
    running BIGINT NOT NULL DEFAULT 0,
    CONSTRAINT node_load_queued_counted CHECK (queued >= 0),
    CONSTRAINT node_load_running_counted CHECK (running >= 0)
);

-- The thresholds the router recorded at its start (stale_after_s, stale_grace_s, max_runtime_s).
CREATE TABLE router_setting (
    key   TEXT PRIMARY KEY,
    value DOUBLE PRECISION NOT NULL
);

CREATE TABLE alert (
    id               BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    alert            TEXT NOT NULL CHECK (alert IN ('stale_head', 'node_down', 'vram_stuck')),
    node             TEXT NOT NULL,
    job_id           TEXT,                        -- the stale head, or the job after which VRAM stuck
    model            TEXT,                        -- vram_stuck: the model that would not leave
    since            TEXT NOT NULL,               -- when the condition began
    message          TEXT NOT NULL,
    fix              TEXT NOT NULL,               -- the command that frees it
    fired_at         TEXT NOT NULL,               -- when the router saw it
    resolved_at      TEXT,                        -- when it ended; NULL while it fires
    resolution       TEXT,                        -- what ended it, for the resolved notice
    deliver          BIGINT NOT NULL CHECK (deliver IN (0, 1)),  -- 1: notices owed to alert_url
    fired_sent_at    TEXT,                        -- the firing notice was delivered
    resolved_sent_at TEXT,                        -- the resolved notice was delivered
    CHECK (resolved_sent_at IS NULL OR (resolved_at IS NOT NULL AND fired_sent_at IS NOT NULL))
);

CREATE TABLE alert_delivery (
    id          BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    alert_id    BIGINT NOT NULL REFERENCES alert(id),
    status      TEXT NOT NULL CHECK (status IN ('firing', 'resolved')),
    at          TEXT NOT NULL,
    attempt     BIGINT NOT NULL,                  -- 1 for the first try of this notice
    ok          BIGINT NOT NULL CHECK (ok IN (0, 1)),
    http_status BIGINT,                           -- the receiver's answer, NULL when none came
    error       TEXT                              -- why it failed
);

CREATE TABLE config_reload (
    id       BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    at       TEXT NOT NULL,
    actor    TEXT NOT NULL,                       -- 'signal SIGHUP', or cli/page/api + client address
    path     TEXT NOT NULL,                       -- the gpuq.toml read
    ok       BIGINT NOT NULL CONSTRAINT config_reload_ok_flag CHECK (ok IN (0, 1)),
    changes  TEXT,                                -- ok: what changed, as the answer said it (JSON)
    error    TEXT,                                -- not ok: why nothing changed
    CONSTRAINT config_reload_says_what CHECK ((ok = 1) = (changes IS NOT NULL) AND (ok = 0) = (error IS NOT NULL))
);

-- -- indexes ------------------------------------------------------------------------------------

CREATE INDEX job_queue ON job (node, state, position, id);        -- the claim: one node's head
CREATE UNIQUE INDEX job_one_running_per_node ON job (node) WHERE state = 'running';
CREATE INDEX job_parent ON job (parent_id) WHERE parent_id IS NOT NULL;
CREATE INDEX job_created ON job (created_at);
CREATE INDEX job_state_node ON job (state, node);
CREATE INDEX job_finished ON job (finished_at, id) WHERE finished_at IS NOT NULL;
CREATE INDEX job_owner_state ON job (owner, state) WHERE owner IS NOT NULL;

CREATE INDEX run_job ON run (job_id);
CREATE INDEX run_running ON run (state) WHERE state = 'running';
CREATE INDEX run_done_node ON run (node, id) WHERE state = 'done';
CREATE INDEX run_done_node_model ON run (node, model, id) WHERE state = 'done';
CREATE INDEX run_finished ON run (finished_at) WHERE finished_at IS NOT NULL;

CREATE INDEX event_job ON event (job_id, id);
CREATE INDEX event_run ON event (run_id) WHERE run_id IS NOT NULL;

CREATE UNIQUE INDEX alert_open ON alert (alert, node, COALESCE(job_id, '')) WHERE resolved_at IS NULL;
CREATE INDEX alert_owed ON alert (id) WHERE deliver = 1 AND (fired_sent_at IS NULL
    OR (resolved_at IS NOT NULL AND resolved_sent_at IS NULL));
CREATE INDEX alert_delivery_alert ON alert_delivery (alert_id, id);

-- -- the critique guard (SQLite's 010) ------------------------------------------------------------
-- A critique never runs on its parent task's node: an insert, a move (node) and a state change
-- that makes a job active again, of the critique or of its parent, are refused with the one
-- message the router maps to 409 (gpuq/errors.py GUARD_MESSAGE), as SQLSTATE 23000 naming the rule
-- critique_guard. A write that leaves an active job where it is (a claim, a finish) is not judged.

CREATE FUNCTION critique_guard_refuse() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING MESSAGE = 'a critique never runs on its parent task''s node',
        ERRCODE = 'integrity_constraint_violation', CONSTRAINT = 'critique_guard', TABLE = 'job';
END $$;

CREATE FUNCTION critique_guard_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id) THEN
        PERFORM critique_guard_refuse();
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER critique_guard_insert
BEFORE INSERT ON job FOR EACH ROW
WHEN (NEW.kind = 'critique' AND NEW.state IN ('queued', 'running'))
EXECUTE FUNCTION critique_guard_insert();

CREATE FUNCTION critique_guard_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id) THEN
        PERFORM critique_guard_refuse();
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER critique_guard_update
BEFORE UPDATE OF node, state ON job FOR EACH ROW
WHEN (NEW.kind = 'critique' AND NEW.state IN ('queued', 'running')
      AND (NEW.node IS DISTINCT FROM OLD.node OR OLD.state NOT IN ('queued', 'running')))
EXECUTE FUNCTION critique_guard_update();

CREATE FUNCTION critique_guard_parent_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM job c WHERE c.parent_id = NEW.id AND c.node = NEW.node
               AND c.state IN ('queued', 'running')) THEN
        PERFORM critique_guard_refuse();
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER critique_guard_parent_update
BEFORE UPDATE OF node, state ON job FOR EACH ROW
WHEN (NEW.kind <> 'critique' AND NEW.state IN ('queued', 'running')
      AND (NEW.node IS DISTINCT FROM OLD.node OR OLD.state NOT IN ('queued', 'running')))
EXECUTE FUNCTION critique_guard_parent_update();

-- -- node counts (SQLite's 009) -----------------------------------------------------------------
-- Every write to a job's state or node goes through these; a rolled-back savepoint takes its
-- counts back with it. A count that would fall below zero breaks node_load_*_counted.

CREATE FUNCTION node_load_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO node_load AS l (node, queued, running)
    VALUES (NEW.node, (NEW.state = 'queued')::int, (NEW.state = 'running')::int)
    ON CONFLICT (node) DO UPDATE SET queued = l.queued + excluded.queued, running = l.running + excluded.running;
    RETURN NULL;
END $$;

CREATE TRIGGER node_load_insert
AFTER INSERT ON job FOR EACH ROW
WHEN (NEW.state IN ('queued', 'running'))
EXECUTE FUNCTION node_load_insert();

CREATE FUNCTION node_load_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE node_load SET queued = queued - (OLD.state = 'queued')::int, running = running - (OLD.state = 'running')::int
    WHERE node = OLD.node;
    IF NEW.state IN ('queued', 'running') THEN
        INSERT INTO node_load AS l (node, queued, running)
        VALUES (NEW.node, (NEW.state = 'queued')::int, (NEW.state = 'running')::int)
        ON CONFLICT (node) DO UPDATE SET queued = l.queued + excluded.queued, running = l.running + excluded.running;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER node_load_update
AFTER UPDATE OF state, node ON job FOR EACH ROW
WHEN ((OLD.state IS DISTINCT FROM NEW.state OR OLD.node IS DISTINCT FROM NEW.node)
      AND (OLD.state IN ('queued', 'running') OR NEW.state IN ('queued', 'running')))
EXECUTE FUNCTION node_load_update();

CREATE FUNCTION node_load_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE node_load SET queued = queued - (OLD.state = 'queued')::int, running = running - (OLD.state = 'running')::int
    WHERE node = OLD.node;
    RETURN NULL;
END $$;

CREATE TRIGGER node_load_delete
AFTER DELETE ON job FOR EACH ROW
WHEN (OLD.state IN ('queued', 'running'))
EXECUTE FUNCTION node_load_delete();

-- -- a run deleted by hand (SQLite's 011, 012) --------------------------------------------------
-- Nothing in the router deletes a run; one deleted in psql takes its chunks with it and leaves its
-- events about no run. BEFORE the delete, so the foreign keys find nothing left to refer to it.

CREATE FUNCTION run_chunk_deleted_with_run() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM run_chunk WHERE run_id = OLD.id;
    RETURN OLD;
END $$;

CREATE TRIGGER run_chunk_deleted_with_run
BEFORE DELETE ON run FOR EACH ROW
EXECUTE FUNCTION run_chunk_deleted_with_run();

CREATE FUNCTION run_deleted_from_its_events() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE event SET run_id = NULL WHERE run_id = OLD.id;
    RETURN OLD;
END $$;

CREATE TRIGGER run_deleted_from_its_events
BEFORE DELETE ON run FOR EACH ROW
EXECUTE FUNCTION run_deleted_from_its_events();

-- -- the wake-up across routers -------------------------------------------------------------------
-- Each job created, deleted, or changed in state, node or place, NOTIFYs channel gpuq_job with
-- ids only (a payload is limited to 8000 bytes; a listener reads the rows it needs):
-- {"id": ..., "node": ..., "state": ...}, the row as it is now (as it was, for a delete).
-- Delivered at commit, never for a write rolled back. Another router LISTENs and wakes its
-- dispatcher and its pages' event streams; it polls as well, because LISTEN does not pass a
-- transaction-pooling PgBouncer.

CREATE FUNCTION job_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    j job;
BEGIN
    IF TG_OP = 'DELETE' THEN j := OLD; ELSE j := NEW; END IF;
    PERFORM pg_notify('gpuq_job', json_build_object('id', j.id, 'node', j.node, 'state', j.state)::text);
    RETURN NULL;
END $$;

CREATE TRIGGER job_notify
AFTER INSERT OR DELETE OR UPDATE OF state, node, position ON job FOR EACH ROW
EXECUTE FUNCTION job_notify();

-- -- views --------------------------------------------------------------------------------------

-- What each held critique waits for (SQLite's 003): queued, its subject its parent's result,
-- and that parent not done. ready_job is its complement: the claim takes the first of its node's.
CREATE VIEW held_job AS
SELECT j.id, j.node, j.parent_id, p.state AS parent_state FROM job j JOIN job p ON p.id = j.parent_id
WHERE j.state = 'queued' AND j.subject_from_parent = 1 AND p.state <> 'done';

CREATE VIEW ready_job AS
SELECT j.* FROM job j
WHERE j.state = 'queued' AND NOT EXISTS (SELECT 1 FROM held_job h WHERE h.id = j.id);

-- A run's text piece by piece: seq 0 what the run row holds (only when it holds some), then each
-- chunk. Read it ORDER BY run_id, seq: that order is the text's.
CREATE VIEW run_text AS
    SELECT id AS run_id, 0::bigint AS seq, NULL::text AS at, output, thinking FROM run
    WHERE output <> '' OR thinking IS NOT NULL
    UNION ALL
    SELECT run_id, seq, at, output, thinking FROM run_chunk;

-- Each run's whole text, one row a run ('' and NULL when it gave none).
CREATE VIEW run_output AS
SELECT r.id AS run_id, r.job_id, r.state,
    COALESCE((SELECT string_agg(COALESCE(t.output, ''), '' ORDER BY t.seq)
              FROM run_text t WHERE t.run_id = r.id), '') AS output,
    (SELECT string_agg(t.thinking, '' ORDER BY t.seq) FROM run_text t WHERE t.run_id = r.id) AS thinking
FROM run r;

-- The staleness thresholds in force, in seconds (NULL before the router recorded them).
CREATE VIEW stale_setting AS
SELECT (SELECT value FROM router_setting WHERE key = 'stale_after_s') AS stale_after_s,
       (SELECT value FROM router_setting WHERE key = 'stale_grace_s') AS grace_s,
       (SELECT value FROM router_setting WHERE key = 'max_runtime_s') AS max_runtime_s;

-- Each running head's ways of turning stale, in the order they are told (rank), each with the
-- moment its clock started (since) and the moment it turns stale (stale_at, a julianday).
CREATE VIEW head_staleness AS
SELECT j.id, j.node, j.state, j.run_id, 1 AS rank, 'ollama finished but the job was not closed' AS reason,
       r.work_done_at AS since, julianday(r.work_done_at) + s.grace_s / 86400.0 AS stale_at
FROM job j JOIN run r ON r.id = j.run_id CROSS JOIN stale_setting s
WHERE j.state = 'running' AND r.work_done_at IS NOT NULL
UNION ALL
SELECT j.id, j.node, j.state, j.run_id, 2, 'ran past max_runtime', r.started_at,
       julianday(r.started_at) + COALESCE(n.max_runtime_s, s.max_runtime_s) / 86400.0
FROM job j JOIN run r ON r.id = j.run_id CROSS JOIN stale_setting s LEFT JOIN node n ON n.name = j.node
WHERE j.state = 'running'
UNION ALL
SELECT j.id, j.node, j.state, j.run_id, 3, 'no progress', r.progress_at,
       julianday(r.progress_at) + s.stale_after_s / 86400.0
FROM job j JOIN run r ON r.id = j.run_id CROSS JOIN stale_setting s
WHERE j.state = 'running';

-- The heads stale now, each with the first reason that holds (SQLite's takes the row of MIN(rank)
-- in its GROUP BY; here DISTINCT ON). A router asks the same with its own clock for 'now'.
CREATE VIEW stale_heads AS
SELECT DISTINCT ON (id) id, node, state, since, reason, run_id FROM head_staleness
WHERE stale_at < julianday('now') ORDER BY id, rank;
