-- 026_batches_in_pieces: a large batch is created in bounded transactions (issue 43, item 4), so
-- no create holds the one writer for seconds (a 100,000-line batch held it 16 s on a loaded
-- machine, and /health turned 503). Its lines stay hidden until the batch is whole:
-- * batch.status gains 'validating': the batch and its lines so far are stored, piece by piece;
--   one short commit (one row) then makes it 'in_progress'. A CHECK changes only by rebuilding
--   its table, as 024 did: rows copied as they are, its indexes made again.
-- * batch.creator: the router creating it (its id, as in `router`), NULL once it is whole. A
--   'validating' batch whose creator is gone (killed mid-create) is deleted with its lines by the
--   next router that looks (gpuq/store/batches.py drop_unfinished): it was never answered.
-- * ready_job: a line of a 'validating' batch is not ready, so no worker claims it before its
--   batch is whole (one index probe per candidate: batch_line_job, then batch's key).

CREATE TABLE batch_rebuilt (
    id                TEXT PRIMARY KEY,           -- 'batch_<24 hex>' (OpenAI), 'msgbatch_<24 hex>' (Anthropic)
    api               TEXT NOT NULL,              -- 'openai' or 'anthropic': the shapes it is answered in
    endpoint          TEXT NOT NULL,              -- the front-door route every line calls
    status            TEXT NOT NULL,              -- validating, in_progress, cancelling, failed, completed, cancelled, expired
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
    pruned_at         TEXT,                       -- 021: retention shed its files and replies
    creator           TEXT,                       -- 026: the router creating it ('validating'); NULL once whole
    CONSTRAINT batch_api_valid CHECK (api IN ('openai', 'anthropic')),
    CONSTRAINT batch_status_valid CHECK (status IN ('validating', 'in_progress', 'cancelling', 'failed', 'completed', 'cancelled', 'expired')),
    CONSTRAINT batch_creator_while_validating CHECK ((creator IS NOT NULL) = (status = 'validating'))
);
INSERT INTO batch_rebuilt SELECT id, api, endpoint, status, completion_window, owner, name, total, input_file_id,
    output_file_id, error_file_id, metadata, errors, created_at, in_progress_at, finalizing_at, completed_at,
    failed_at, cancelling_at, cancelled_at, expires_at, pruned_at, NULL FROM batch;
DROP TABLE batch;
ALTER TABLE batch_rebuilt RENAME TO batch;
CREATE INDEX batch_created ON batch (created_at, id);
CREATE INDEX batch_status ON batch (status);

DROP VIEW ready_job;
CREATE VIEW ready_job AS
SELECT j.* FROM job j
WHERE j.state = 'queued' AND NOT EXISTS (SELECT 1 FROM held_job h WHERE h.id = j.id)
    AND NOT EXISTS (SELECT 1 FROM batch_line l JOIN batch b ON b.id = l.batch_id
                    WHERE l.job_id = j.id AND b.status = 'validating');
