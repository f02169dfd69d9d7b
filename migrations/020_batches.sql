-- 020_batches: sweeps as first-class work (issue 37): the OpenAI Batch API's files and batches and
-- Anthropic's Message Batches, on the durable queue. A batch is a set of front-door calls sent at
-- once: each of its lines is one ordinary job in the batch lane (placed, run, retried as any), and
-- batch_line ties it to its batch, its line number and the caller's custom_id. A file's content is
-- kept in the database (last in its row: see 016), so a backup holds the inputs and the outputs.

CREATE TABLE batch_file (
    id          TEXT PRIMARY KEY,                 -- 'file-<24 hex>'
    purpose     TEXT NOT NULL,                    -- 'batch' (an input), 'batch_output' (written at finalize)
    filename    TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    created_at  TEXT NOT NULL,
    owner       TEXT,                             -- the user who uploaded it (or whose batch wrote it); NULL: no identity
    content     BLOB NOT NULL                     -- last: the file as uploaded or written
);

CREATE INDEX batch_file_created ON batch_file (created_at, id);

CREATE TABLE batch (
    id                TEXT PRIMARY KEY,           -- 'batch_<24 hex>' (OpenAI), 'msgbatch_<24 hex>' (Anthropic)
    api               TEXT NOT NULL,              -- 'openai' or 'anthropic': the shapes it is answered in
    endpoint          TEXT NOT NULL,              -- the front-door route every line calls
    status            TEXT NOT NULL,              -- in_progress, cancelling, failed, completed, cancelled, expired
    completion_window TEXT NOT NULL,
    owner             TEXT,
    name              TEXT,                       -- what the page calls it (metadata's name, else its file's)
    total             INTEGER NOT NULL,           -- its lines
    input_file_id     TEXT,                       -- files by id, no reference: a file may be deleted, its batch keeps naming it (as OpenAI's does)
    output_file_id    TEXT,
    error_file_id     TEXT,
    metadata          TEXT,                       -- JSON object, as the caller sent it
    errors            TEXT,                       -- JSON: a batch failed in validation, its lines' errors
    created_at        TEXT NOT NULL,
    in_progress_at    TEXT,
    finalizing_at     TEXT,
    completed_at      TEXT,
    failed_at         TEXT,
    cancelling_at     TEXT,
    cancelled_at      TEXT,
    expires_at        TEXT NOT NULL,
    CONSTRAINT batch_api_valid CHECK (api IN ('openai', 'anthropic')),
    CONSTRAINT batch_status_valid CHECK (status IN ('in_progress', 'cancelling', 'failed', 'completed', 'cancelled', 'expired'))
);

CREATE INDEX batch_created ON batch (created_at, id);
CREATE INDEX batch_status ON batch (status);

CREATE TABLE batch_line (
    batch_id   TEXT NOT NULL REFERENCES batch(id),
    line       INTEGER NOT NULL,                  -- its line in the input, from 1 (Anthropic: its request's place)
    custom_id  TEXT NOT NULL,
    job_id     TEXT REFERENCES job(id),           -- NULL: refused before it became a job (`refused` says why)
    refused    TEXT,                              -- JSON {status, code, message}: the API's error for this line
    response   TEXT,                              -- JSON: the endpoint's reply, kept when its job's run ended
    PRIMARY KEY (batch_id, line)
);

CREATE UNIQUE INDEX batch_line_job ON batch_line (job_id) WHERE job_id IS NOT NULL;
