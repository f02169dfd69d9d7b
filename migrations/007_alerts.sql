-- 007_alerts: gpuq tells the person when the queue is stuck (a stale head, a node with waiting
-- jobs down, a model that will not leave VRAM) and again when it recovers. One `alert` row per
-- firing, open until the condition ends; one `alert_delivery` row per attempt to notify
-- router.alert_url, delivered or not. A firing's two notices (firing, resolved) are each sent
-- once: `fired_sent_at` / `resolved_sent_at` are written with the delivery that succeeded, so a
-- restart neither sends a notice again nor forgets one still owed. Not the `event` table: a
-- node's alert has no job.

CREATE TABLE alert (
    id               INTEGER PRIMARY KEY,
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
    deliver          INTEGER NOT NULL CHECK (deliver IN (0, 1)),  -- 1: notices owed to alert_url
    fired_sent_at    TEXT,                        -- the firing notice was delivered
    resolved_sent_at TEXT,                        -- the resolved notice was delivered
    CHECK (resolved_sent_at IS NULL OR (resolved_at IS NOT NULL AND fired_sent_at IS NOT NULL))
);
-- One open firing per condition.
CREATE UNIQUE INDEX alert_open ON alert (alert, node, COALESCE(job_id, '')) WHERE resolved_at IS NULL;
-- Notices still owed: the sender's query.
CREATE INDEX alert_owed ON alert (id) WHERE deliver = 1 AND (fired_sent_at IS NULL
    OR (resolved_at IS NOT NULL AND resolved_sent_at IS NULL));

CREATE TABLE alert_delivery (
    id          INTEGER PRIMARY KEY,
    alert_id    INTEGER NOT NULL REFERENCES alert(id),
    status      TEXT NOT NULL CHECK (status IN ('firing', 'resolved')),
    at          TEXT NOT NULL,
    attempt     INTEGER NOT NULL,                 -- 1 for the first try of this notice
    ok          INTEGER NOT NULL CHECK (ok IN (0, 1)),
    http_status INTEGER,                          -- the receiver's answer, NULL when none came
    error       TEXT                              -- why it failed
);
CREATE INDEX alert_delivery_alert ON alert_delivery (alert_id, id);
