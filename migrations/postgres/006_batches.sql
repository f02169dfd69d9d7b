-- 006_batches: SQLite's 020 (issue 37): the OpenAI Batch API's files and batches and Anthropic's
-- Message Batches on the durable queue; each line an ordinary job in the batch lane, tied to its
-- batch by batch_line. A file's content is kept in the database (bytea), so a dump holds it.

CREATE TABLE batch_file (
    id          TEXT PRIMARY KEY,
    purpose     TEXT NOT NULL,
    filename    TEXT NOT NULL,
    bytes       BIGINT NOT NULL,
    created_at  TEXT NOT NULL,
    owner       TEXT,
    content     BYTEA NOT NULL
);

CREATE INDEX batch_file_created ON batch_file (created_at, id);

CREATE TABLE batch (
    id                TEXT PRIMARY KEY,
    api               TEXT NOT NULL,
    endpoint          TEXT NOT NULL,
    status            TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    owner             TEXT,
    name              TEXT,
    total             BIGINT NOT NULL,
    input_file_id     TEXT,
    output_file_id    TEXT,
    error_file_id     TEXT,
    metadata          TEXT,
    errors            TEXT,
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
    line       BIGINT NOT NULL,
    custom_id  TEXT NOT NULL,
    job_id     TEXT REFERENCES job(id),
    refused    TEXT,
    response   TEXT,
    PRIMARY KEY (batch_id, line)
);

CREATE UNIQUE INDEX batch_line_job ON batch_line (job_id) WHERE job_id IS NOT NULL;
