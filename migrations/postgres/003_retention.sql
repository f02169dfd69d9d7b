-- 003_retention: SQLite's 017. Retention sheds an ended job's bulk (its front-door request, its
-- output and reasoning) after a while and deletes its rows after a longer one (issue 35,
-- gpuq/store/retention.py); `pruned_at` says when its bulk was shed, so the job says "output
-- pruned on <date> (retention)" rather than look like one that produced nothing. A front-door
-- call keeps its request until it is pruned. PostgreSQL keeps long values out of the row (TOAST),
-- so the column is simply added. `maintenance_lease`: with several routers on one database,
-- only the router holding the lease of a service (the retention sweep) runs it.

ALTER TABLE job ADD COLUMN pruned_at TEXT;        -- when retention shed its bulk; NULL: whole
ALTER TABLE job DROP CONSTRAINT job_request_with_endpoint;
ALTER TABLE job ADD CONSTRAINT job_request_with_endpoint CHECK (endpoint IS NOT NULL OR request IS NULL);
ALTER TABLE job ADD CONSTRAINT job_request_kept_until_pruned
    CHECK (endpoint IS NULL OR request IS NOT NULL OR pruned_at IS NOT NULL);
ALTER TABLE job ADD CONSTRAINT job_pruned_when_ended
    CHECK (pruned_at IS NULL OR state IN ('done', 'failed', 'cancelled'));

CREATE TABLE maintenance_lease (
    service     TEXT PRIMARY KEY,                 -- 'retention'
    router      TEXT NOT NULL REFERENCES router(id),
    expires_at  DOUBLE PRECISION NOT NULL,        -- epoch seconds: another router may take it after it
    taken_at    DOUBLE PRECISION NOT NULL
);

-- The sweep's scan: ended jobs whose bulk is still whole, oldest first.
CREATE INDEX job_unpruned ON job (finished_at, id) WHERE finished_at IS NOT NULL AND pruned_at IS NULL;
