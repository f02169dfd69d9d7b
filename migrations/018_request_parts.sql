-- 018_request_parts: a front-door request's large parts are stored once per content (issue 35).
-- job.request held the client's whole request, so a chat UI that resends the same 20 MB base64
-- photo with every turn stored it again each turn (about 27 MB per call). Now every string of a
-- request of 64 KiB or more (an image in Ollama's `images`, an OpenAI `image_url` data URL, an
-- Anthropic `source.data`, a long pasted file) is kept once here, keyed by the sha256 of its
-- UTF-8 bytes; the job's request holds {"$gpuq_part": "<sha256>"} in its place, and job_part says
-- which jobs refer to which part, so that a part is dropped only when none does
-- (Store.drop_unreferenced_parts). The router reads a request whole (gpuq/store/parts.py).
-- Requests stored before this migration stay whole in job.request, as they were.
-- In the sqlite3 shell, a job's parts:
--   SELECT p.sha256, p.bytes FROM job_part j JOIN request_part p USING (sha256) WHERE j.job_id = '...';

CREATE TABLE request_part (
    sha256     TEXT PRIMARY KEY,    -- of the string's UTF-8 bytes, in hex
    data       TEXT NOT NULL,       -- the string as JSON text, as it stood in the request (quoted)
    bytes      INTEGER NOT NULL,    -- the size of that text in UTF-8 bytes
    created_at TEXT NOT NULL        -- when a request first brought it
) WITHOUT ROWID;

CREATE TABLE job_part (
    job_id TEXT NOT NULL REFERENCES job(id),
    sha256 TEXT NOT NULL REFERENCES request_part(sha256),
    PRIMARY KEY (job_id, sha256)
) WITHOUT ROWID;

-- Which jobs refer to a part: what Store.drop_unreferenced_parts asks of each.
CREATE INDEX job_part_by_part ON job_part (sha256);

-- A job deleted (by hand, or by retention) takes its references with it; so does a request
-- emptied (retention sheds an old job's request); the parts no job refers to are then dropped.
CREATE TRIGGER job_part_deleted_with_job
AFTER DELETE ON job
BEGIN
    DELETE FROM job_part WHERE job_id = OLD.id;
END;

CREATE TRIGGER job_part_dropped_with_request
AFTER UPDATE OF request ON job WHEN NEW.request IS NULL
BEGIN
    DELETE FROM job_part WHERE job_id = OLD.id;
END;
