-- 004_request_parts: SQLite's 018. A front-door request's large parts are stored once per content
-- (issue 35): every string of a request of 64 KiB or more (a base64 image, a data: URL, a long
-- pasted file) is kept once in request_part, keyed by the sha256 of its UTF-8 bytes; the job's
-- request holds {"$gpuq_part": "<sha256>"} in its place, and job_part says which jobs refer to
-- which part, so that a part is dropped only when none does (Store.drop_unreferenced_parts).
-- Requests stored before this migration stay whole in job.request, as they were.

CREATE TABLE request_part (
    sha256     TEXT PRIMARY KEY,                  -- of the string's UTF-8 bytes, in hex
    data       TEXT NOT NULL,                     -- the string as JSON text, as it stood in the request (quoted)
    bytes      BIGINT NOT NULL,                   -- the size of that text in UTF-8 bytes
    created_at TEXT NOT NULL                      -- when a request first brought it
);

CREATE TABLE job_part (
    job_id TEXT NOT NULL REFERENCES job(id),
    sha256 TEXT NOT NULL REFERENCES request_part(sha256),
    PRIMARY KEY (job_id, sha256)
);

CREATE INDEX job_part_by_part ON job_part (sha256);

-- A job deleted takes its references with it (BEFORE the delete, so the foreign key finds nothing
-- left to refer to it); so does a request emptied (retention sheds an old job's request).
CREATE FUNCTION job_part_deleted_with_job() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_part WHERE job_id = OLD.id;
    RETURN OLD;
END $$;

CREATE TRIGGER job_part_deleted_with_job
BEFORE DELETE ON job
FOR EACH ROW EXECUTE FUNCTION job_part_deleted_with_job();

CREATE FUNCTION job_part_dropped_with_request() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_part WHERE job_id = OLD.id;
    RETURN NEW;
END $$;

CREATE TRIGGER job_part_dropped_with_request
AFTER UPDATE OF request ON job
FOR EACH ROW WHEN (NEW.request IS NULL) EXECUTE FUNCTION job_part_dropped_with_request();
