-- 019_backups_and_storage: the router backs its database up on a schedule and watches the disk it
-- lives on (issue 35). Three changes:
-- * backup: one row per backup the router took (scheduled, or asked for with `gpuq backup`), made
--   or failed. The newest success is what /health and the page call the last backup, and a restart
--   keeps it (an overdue backup is judged from it). Rotation deletes only the files these rows name
--   as scheduled and made (never a file the router did not write), and marks each removed_at.
-- * storage_sample: the database's size (its file and WAL) and the free space on its disk, recorded
--   by the router about once an hour: its growth per day is read from them.
-- * alert: four more kinds (a backup failed or is overdue; at the current growth the disk, or
--   router.max_database_bytes, is reached within [storage] warn_days). A CHECK changes only by
--   rebuilding its table (foreign keys are off while migrating and checked before the commit):
--   rows are copied as they are, and its indexes made again as 007 made them.

CREATE TABLE backup (
    id          INTEGER PRIMARY KEY,
    path        TEXT NOT NULL,                    -- the backup's file, on the router's machine
    scheduled   INTEGER NOT NULL CONSTRAINT backup_scheduled_flag CHECK (scheduled IN (0, 1)),  -- 0: `gpuq backup`
    started_at  TEXT NOT NULL,
    finished_at TEXT NOT NULL,
    ok          INTEGER NOT NULL CONSTRAINT backup_ok_flag CHECK (ok IN (0, 1)),
    bytes       INTEGER,                          -- ok: the copy's size
    seconds     REAL,                             -- how long it took
    error       TEXT,                             -- not ok: why
    removed_at  TEXT,                             -- rotation deleted the file
    CONSTRAINT backup_says_what CHECK ((ok = 1) = (bytes IS NOT NULL) AND (ok = 0) = (error IS NOT NULL))
);
CREATE INDEX backup_kind ON backup (scheduled, ok, id);

CREATE TABLE storage_sample (
    id             INTEGER PRIMARY KEY,
    at             TEXT NOT NULL,
    database_bytes INTEGER NOT NULL,              -- the database's file and its WAL
    free_bytes     INTEGER                        -- free on the database's disk (NULL: not known)
);
CREATE INDEX storage_sample_at ON storage_sample (at);

CREATE TABLE alert_rebuilt (
    id               INTEGER PRIMARY KEY,
    alert            TEXT NOT NULL CHECK (alert IN ('stale_head', 'node_down', 'vram_stuck',
                         'backup_failed', 'backup_overdue', 'disk_filling', 'database_filling')),
    node             TEXT NOT NULL,               -- '' for the router's own (a backup, the storage)
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
