-- 024_retention_sweeps: the retention sweep on the record (issue 35), as the backups are (019), so
-- /health, `gpuq storage` and the page say when the last sweep ran, what it did and why it
-- failed, on every router: with several routers on one PostgreSQL only one sweeps, and a router
-- that restarts still knows. Two changes:
-- * retention_sweep: one row per sweep that ran (not one skipped because another router holds the
--   lease), done or failed; `swept` is what it did (JSON: rows deleted, jobs pruned, bytes
--   archived and freed, its longest hold of the writer), so far as it got when it failed. The
--   router keeps the newest 1000 rows (and always the newest success).
-- * alert: two more kinds (the last sweep failed; none has succeeded for 3 x [retention] every).
--   A CHECK changes only by rebuilding its table, as 019 did: rows copied as they are, its indexes
--   made again.

CREATE TABLE retention_sweep (
    id          INTEGER PRIMARY KEY,
    router      TEXT,                             -- the router that swept (its id), NULL: not known
    asked       INTEGER NOT NULL CONSTRAINT retention_sweep_asked_flag CHECK (asked IN (0, 1)),  -- 1: `gpuq prune`
    started_at  TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    ok          INTEGER NOT NULL CONSTRAINT retention_sweep_ok_flag CHECK (ok IN (0, 1)),
    swept       TEXT NOT NULL,                    -- JSON: what it did (Swept.json in gpuq/ops/retention.py)
    error       TEXT,                             -- not ok: why it stopped
    CONSTRAINT retention_sweep_says_why CHECK ((ok = 0) = (error IS NOT NULL))
);
CREATE INDEX retention_sweep_kind ON retention_sweep (ok, id);

CREATE TABLE alert_rebuilt (
    id               INTEGER PRIMARY KEY,
    alert            TEXT NOT NULL CHECK (alert IN ('stale_head', 'node_down', 'vram_stuck',
                         'backup_failed', 'backup_overdue', 'disk_filling', 'database_filling',
                         'retention_failed', 'retention_overdue')),
    node             TEXT NOT NULL,               -- '' for the router's own (a backup, the storage, the sweep)
    job_id           TEXT,                        -- the stale head, or the job after which VRAM stuck
    model            TEXT,                        -- vram_stuck: the model that would not leave
    since            TEXT NOT NULL,               -- when the condition began
    message          TEXT NOT NULL,
    fix              TEXT NOT NULL,               -- the command that frees it
    fired_at         TEXT NOT NULL,               -- when the router saw it
    resolved_at      TEXT,                        -- when it ended; NULL while it fires
    resolution       TEXT,                        -- what ended it, for the resolved notice
    deliver          INTEGER NOT NULL CHECK (deliver IN (0, 1)),  -- 1: notices owed to alert_url
    fired_sent_at    TEXT,                        -- the firing notice was delivered
    resolved_sent_at TEXT,                        -- the resolved notice was delivered
    CHECK (resolved_sent_at IS NULL OR (resolved_at IS NOT NULL AND fired_sent_at IS NOT NULL))
);
INSERT INTO alert_rebuilt SELECT id, alert, node, job_id, model, since, message, fix, fired_at, resolved_at,
    resolution, deliver, fired_sent_at, resolved_sent_at FROM alert;
DROP TABLE alert;
ALTER TABLE alert_rebuilt RENAME TO alert;
-- One open firing per condition.
CREATE UNIQUE INDEX alert_open ON alert (alert, node, COALESCE(job_id, '')) WHERE resolved_at IS NULL;
-- Notices still owed: the sender's query.
CREATE INDEX alert_owed ON alert (id) WHERE deliver = 1 AND (fired_sent_at IS NULL
    OR (resolved_at IS NOT NULL AND resolved_sent_at IS NULL));
