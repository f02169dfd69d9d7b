-- index alert_delivery_alert on alert_delivery
CREATE INDEX alert_delivery_alert ON alert_delivery (alert_id, id);

-- index alert_open on alert
CREATE UNIQUE INDEX alert_open ON alert (alert, node, COALESCE(job_id, '')) WHERE resolved_at IS NULL;

-- index alert_owed on alert
CREATE INDEX alert_owed ON alert (id) WHERE deliver = 1 AND (fired_sent_at IS NULL
OR (resolved_at IS NOT NULL AND resolved_sent_at IS NULL));

-- index backup_kind on backup
CREATE INDEX backup_kind ON backup (scheduled, ok, id);

-- index batch_created on batch
CREATE INDEX batch_created ON batch (created_at, id);

-- index batch_file_created on batch_file
CREATE INDEX batch_file_created ON batch_file (created_at, id);

-- index batch_line_job on batch_line
CREATE UNIQUE INDEX batch_line_job ON batch_line (job_id) WHERE job_id IS NOT NULL;

-- index batch_status on batch
CREATE INDEX batch_status ON batch (status);

-- index event_job on event
CREATE INDEX event_job ON event (job_id, id);

-- index event_run on event
CREATE INDEX event_run ON event (run_id) WHERE run_id IS NOT NULL;

-- index job_created on job
CREATE INDEX job_created ON job (created_at);

-- index job_finished on job
CREATE INDEX job_finished ON job (finished_at, id) WHERE finished_at IS NOT NULL;

-- index job_one_running_per_node on job
CREATE UNIQUE INDEX job_one_running_per_node ON job (node) WHERE state = 'running';

-- index job_owner_state on job
CREATE INDEX job_owner_state ON job(owner, state) WHERE owner IS NOT NULL;

-- index job_parent on job
CREATE INDEX job_parent ON job (parent_id) WHERE parent_id IS NOT NULL;

-- index job_part_by_part on job_part
CREATE INDEX job_part_by_part ON job_part (sha256);

-- index job_queue on job
CREATE INDEX job_queue ON job (node, state, position, id);

-- index job_state_node on job
CREATE INDEX job_state_node ON job (state, node);

-- index job_unpruned on job
CREATE INDEX job_unpruned ON job (finished_at, id) WHERE finished_at IS NOT NULL AND pruned_at IS NULL;

-- index node_lease_router on node_lease
CREATE INDEX node_lease_router ON node_lease(router);

-- index retention_sweep_kind on retention_sweep
CREATE INDEX retention_sweep_kind ON retention_sweep (ok, id);

-- index run_done_node on run
CREATE INDEX run_done_node ON run (node, id) WHERE state = 'done';

-- index run_done_node_model on run
CREATE INDEX run_done_node_model ON run (node, model, id) WHERE state = 'done';

-- index run_finished on run
CREATE INDEX run_finished ON run (finished_at) WHERE finished_at IS NOT NULL;

-- index run_job on run
CREATE INDEX run_job ON run (job_id);

-- index run_running on run
CREATE INDEX run_running ON run (state) WHERE state = 'running';

-- index run_started on run
CREATE INDEX run_started ON run (started_at) WHERE finished_at IS NOT NULL;

-- index sqlite_autoindex_batch_1 on batch
(made by SQLite);

-- index sqlite_autoindex_batch_file_1 on batch_file
(made by SQLite);

-- index sqlite_autoindex_batch_file_chunk_1 on batch_file_chunk
(made by SQLite);

-- index sqlite_autoindex_batch_line_1 on batch_line
(made by SQLite);

-- index sqlite_autoindex_job_1 on job
(made by SQLite);

-- index sqlite_autoindex_maintenance_lease_1 on maintenance_lease
(made by SQLite);

-- index sqlite_autoindex_node_1 on node
(made by SQLite);

-- index sqlite_autoindex_node_lease_1 on node_lease
(made by SQLite);

-- index sqlite_autoindex_router_1 on router
(made by SQLite);

-- index sqlite_autoindex_router_setting_1 on router_setting
(made by SQLite);

-- index storage_sample_at on storage_sample
CREATE INDEX storage_sample_at ON storage_sample (at);

-- index usage_run_started on usage_run
CREATE INDEX usage_run_started ON usage_run (started_at);

-- table alert on alert
CREATE TABLE "alert" (
id INTEGER PRIMARY KEY,
alert TEXT NOT NULL CHECK (alert IN ('stale_head', 'node_down', 'vram_stuck',
'backup_failed', 'backup_overdue', 'disk_filling', 'database_filling',
'retention_failed', 'retention_overdue')),
node TEXT NOT NULL, -- '' for the router's own (a backup, the storage, the sweep)
job_id TEXT, -- the stale head, or the job after which VRAM stuck
model TEXT, -- vram_stuck: the model that would not leave
since TEXT NOT NULL, -- when the condition began
message TEXT NOT NULL,
fix TEXT NOT NULL, -- the command that frees it
fired_at TEXT NOT NULL, -- when the router saw it
resolved_at TEXT, -- when it ended; NULL while it fires
resolution TEXT, -- what ended it, for the resolved notice
deliver INTEGER NOT NULL CHECK (deliver IN (0, 1)), -- 1: notices owed to alert_url
fired_sent_at TEXT, -- the firing notice was delivered
resolved_sent_at TEXT, -- the resolved notice was delivered
CHECK (resolved_sent_at IS NULL OR (resolved_at IS NOT NULL AND fired_sent_at IS NOT NULL))
);

-- table alert_delivery on alert_delivery
CREATE TABLE alert_delivery (
id INTEGER PRIMARY KEY,
alert_id INTEGER NOT NULL REFERENCES alert(id),
status TEXT NOT NULL CHECK (status IN ('firing', 'resolved')),
at TEXT NOT NULL,
attempt INTEGER NOT NULL, -- 1 for the first try of this notice
ok INTEGER NOT NULL CHECK (ok IN (0, 1)),
http_status INTEGER, -- the receiver's answer, NULL when none came
error TEXT -- why it failed
);

-- table backup on backup
CREATE TABLE backup (
id INTEGER PRIMARY KEY,
path TEXT NOT NULL, -- the backup's file, on the router's machine
scheduled INTEGER NOT NULL CONSTRAINT backup_scheduled_flag CHECK (scheduled IN (0, 1)), -- 0: `gpuq backup`
started_at TEXT NOT NULL,
finished_at TEXT NOT NULL,
ok INTEGER NOT NULL CONSTRAINT backup_ok_flag CHECK (ok IN (0, 1)),
bytes INTEGER, -- ok: the copy's size
seconds REAL, -- how long it took
error TEXT, -- not ok: why
removed_at TEXT, -- rotation deleted the file
CONSTRAINT backup_says_what CHECK ((ok = 1) = (bytes IS NOT NULL) AND (ok = 0) = (error IS NOT NULL))
);

-- table batch on batch
CREATE TABLE "batch" (
id TEXT PRIMARY KEY, -- 'batch_<24 hex>' (OpenAI), 'msgbatch_<24 hex>' (Anthropic)
api TEXT NOT NULL, -- 'openai' or 'anthropic': the shapes it is answered in
endpoint TEXT NOT NULL, -- the front-door route every line calls
status TEXT NOT NULL, -- validating, in_progress, cancelling, failed, completed, cancelled, expired
completion_window TEXT NOT NULL,
owner TEXT,
name TEXT, -- what the page calls it (metadata's name, else its file's)
total INTEGER NOT NULL, -- its lines
input_file_id TEXT, -- files by id, no reference: a file may be deleted, its batch keeps naming it (as OpenAI's does)
output_file_id TEXT,
error_file_id TEXT,
metadata TEXT, -- JSON object, as the caller sent it
errors TEXT, -- JSON: a batch failed in validation, its lines' errors
created_at TEXT NOT NULL,
in_progress_at TEXT,
finalizing_at TEXT,
completed_at TEXT,
failed_at TEXT,
cancelling_at TEXT,
cancelled_at TEXT,
expires_at TEXT NOT NULL,
pruned_at TEXT, -- 021: retention shed its files and replies
creator TEXT, -- 026: the router creating it ('validating'); NULL once whole
CONSTRAINT batch_api_valid CHECK (api IN ('openai', 'anthropic')),
CONSTRAINT batch_status_valid CHECK (status IN ('validating', 'in_progress', 'cancelling', 'failed', 'completed', 'cancelled', 'expired')),
CONSTRAINT batch_creator_while_validating CHECK ((creator IS NOT NULL) = (status = 'validating'))
);

-- table batch_file on batch_file
CREATE TABLE batch_file (
id TEXT PRIMARY KEY, -- 'file-<24 hex>'
purpose TEXT NOT NULL, -- 'batch' (an input), 'batch_output' (written at finalize)
filename TEXT NOT NULL,
bytes INTEGER NOT NULL,
created_at TEXT NOT NULL,
owner TEXT);

-- table batch_file_chunk on batch_file_chunk
CREATE TABLE batch_file_chunk (
file_id TEXT NOT NULL REFERENCES batch_file(id) ON DELETE CASCADE,
seq INTEGER NOT NULL, -- from 0, in the file's order
bytes BLOB NOT NULL,
PRIMARY KEY (file_id, seq)
);

-- table batch_line on batch_line
CREATE TABLE batch_line (
batch_id TEXT NOT NULL REFERENCES batch(id),
line INTEGER NOT NULL, -- its line in the input, from 1 (Anthropic: its request's place)
custom_id TEXT NOT NULL,
job_id TEXT REFERENCES job(id), -- NULL: refused before it became a job (`refused` says why)
refused TEXT, -- JSON {status, code, message}: the API's error for this line
response TEXT, -- JSON: the endpoint's reply, kept when its job's run ended
PRIMARY KEY (batch_id, line)
);

-- table config_reload on config_reload
CREATE TABLE config_reload (
id INTEGER PRIMARY KEY,
at TEXT NOT NULL,
actor TEXT NOT NULL, -- 'signal SIGHUP', or cli/page/api + client address
path TEXT NOT NULL, -- the gpuq.toml read
ok INTEGER NOT NULL CONSTRAINT config_reload_ok_flag CHECK (ok IN (0, 1)),
changes TEXT, -- ok: what changed, as the answer said it (JSON)
error TEXT, -- not ok: why nothing changed
CONSTRAINT config_reload_says_what CHECK ((ok = 1) = (changes IS NOT NULL) AND (ok = 0) = (error IS NOT NULL))
);

-- table event on event
CREATE TABLE event (
id INTEGER PRIMARY KEY,
job_id TEXT NOT NULL REFERENCES job(id),
at TEXT NOT NULL,
from_state TEXT, -- NULL when the job was created
to_state TEXT NOT NULL,
actor TEXT NOT NULL, -- router, cli, page, api (+ client address)
reason TEXT
, run_id INTEGER REFERENCES run(id));

-- table job on job
CREATE TABLE "job" (
id TEXT PRIMARY KEY, -- '<unix seconds>-<8 hex>'
kind TEXT NOT NULL, -- task, critique, embed (a front-door embedding)
state TEXT NOT NULL DEFAULT 'queued', -- see gpuq/jobs.py JobState
node TEXT NOT NULL, -- the node whose queue holds the job
model TEXT NOT NULL,
model_pinned INTEGER NOT NULL DEFAULT 0, -- 1: asked for; 0: the node's model, follows moves
parent_id TEXT REFERENCES job(id), -- a critique's task under review
group_id TEXT, -- the critiques of one fan-out share it
position INTEGER NOT NULL, -- order in the node's queue, gaps of 1024
placement TEXT NOT NULL, -- why it went to that node
run_id INTEGER, -- the current (latest) run
error TEXT, -- why it failed or was cancelled
findings TEXT, -- a done critique's findings, JSON
timeout_s REAL, -- per-job wall-clock limit, NULL = node default
created_at TEXT NOT NULL,
finished_at TEXT,
subject_from_parent INTEGER NOT NULL DEFAULT 0, -- 003: a held critique's prompt comes at its claim
think TEXT, -- 004: Ollama's `think` as JSON; NULL: the node's
options TEXT, -- 004: the job's own Ollama options, JSON object
endpoint TEXT, -- 006: the front-door route it came in on
owner TEXT, -- 014: the user who sent it; NULL: no identity
client TEXT, -- 014: the sending program (User-Agent), cut to 200 characters
lane TEXT NOT NULL DEFAULT 'batch', -- 014: 'interactive' or 'batch'
prompt_excerpt TEXT GENERATED ALWAYS AS (substr(prompt, 1, 300)) STORED, -- characters, not bytes
prompt_bytes INTEGER GENERATED ALWAYS AS (length(CAST(prompt AS BLOB))) STORED,
pruned_at TEXT, -- 017: when retention shed its bulk (request, output, reasoning); NULL: whole
request TEXT, -- 006: a front-door call as received, JSON {path, user_agent, body}; NULL once pruned
prompt TEXT NOT NULL, -- last (005): a front-door call's: its last user message
CONSTRAINT job_lane_valid CHECK (lane IN ('interactive', 'batch')),
CONSTRAINT job_kind_valid CHECK (kind IN ('task', 'critique', 'embed')),
CONSTRAINT job_state_valid CHECK (state IN ('queued', 'running', 'done', 'failed', 'cancelled')),
CONSTRAINT job_subject_from_parent_flag CHECK (subject_from_parent IN (0, 1)),
CONSTRAINT job_finished_when_ended CHECK ((finished_at IS NULL) = (state IN ('queued', 'running'))),
CONSTRAINT job_request_with_endpoint CHECK (endpoint IS NOT NULL OR request IS NULL),
CONSTRAINT job_request_kept_until_pruned CHECK (endpoint IS NULL OR request IS NOT NULL OR pruned_at IS NOT NULL),
CONSTRAINT job_pruned_when_ended CHECK (pruned_at IS NULL OR state IN ('done', 'failed', 'cancelled')),
CONSTRAINT job_embed_from_front_door CHECK (kind <> 'embed' OR endpoint IS NOT NULL)
);

-- table job_part on job_part
CREATE TABLE job_part (
job_id TEXT NOT NULL REFERENCES job(id),
sha256 TEXT NOT NULL REFERENCES request_part(sha256),
PRIMARY KEY (job_id, sha256)
) WITHOUT ROWID;

-- table maintenance_lease on maintenance_lease
CREATE TABLE maintenance_lease (
service TEXT PRIMARY KEY, -- 'retention'
router TEXT NOT NULL REFERENCES router(id),
expires_at REAL NOT NULL, -- epoch seconds: another router may take it after it
taken_at REAL NOT NULL
);

-- table node on node
CREATE TABLE node (
name TEXT PRIMARY KEY,
url TEXT NOT NULL,
rank INTEGER NOT NULL,
roles TEXT NOT NULL, -- 'task,critique'
model TEXT NOT NULL,
max_runtime_s REAL, -- NULL: the router's max_runtime
up INTEGER NOT NULL DEFAULT 0 CHECK (up IN (0, 1)),
last_error TEXT,
since TEXT -- when `up` last changed
, asked_unload TEXT, models TEXT);

-- table node_lease on node_lease
CREATE TABLE node_lease (
node TEXT PRIMARY KEY, -- as gpuq.toml names it (no reference to `node`: a lease may come before configure writes the row)
router TEXT NOT NULL REFERENCES router(id),
expires_at REAL NOT NULL, -- epoch seconds: free for another router after it
taken_at REAL NOT NULL -- when this router took it (a renewal keeps it)
);

-- table node_load on node_load
CREATE TABLE "node_load" (
node TEXT PRIMARY KEY,
queued INTEGER NOT NULL DEFAULT 0,
running INTEGER NOT NULL DEFAULT 0,
CONSTRAINT node_load_queued_counted CHECK (queued >= 0),
CONSTRAINT node_load_running_counted CHECK (running >= 0)
) WITHOUT ROWID;

-- table request_part on request_part
CREATE TABLE request_part (
sha256 TEXT PRIMARY KEY, -- of the string's UTF-8 bytes, in hex
data TEXT NOT NULL, -- the string as JSON text, as it stood in the request (quoted)
bytes INTEGER NOT NULL, -- the size of that text in UTF-8 bytes
created_at TEXT NOT NULL -- when a request first brought it
) WITHOUT ROWID;

-- table retention_sweep on retention_sweep
CREATE TABLE retention_sweep (
id INTEGER PRIMARY KEY,
router TEXT, -- the router that swept (its id), NULL: not known
asked INTEGER NOT NULL CONSTRAINT retention_sweep_asked_flag CHECK (asked IN (0, 1)), -- 1: `gpuq prune`
started_at TEXT NOT NULL,
finished_at TEXT NOT NULL,
ok INTEGER NOT NULL CONSTRAINT retention_sweep_ok_flag CHECK (ok IN (0, 1)),
swept TEXT NOT NULL, -- JSON: what it did (Swept.json in gpuq/ops/retention.py)
error TEXT, -- not ok: why it stopped
CONSTRAINT retention_sweep_says_why CHECK ((ok = 0) = (error IS NOT NULL))
);

-- table router on router
CREATE TABLE router (
id TEXT PRIMARY KEY, -- host:pid:random, fresh at each start
listen TEXT NOT NULL, -- its [router] listen
public_url TEXT,
pid INTEGER NOT NULL,
host TEXT NOT NULL,
started_at TEXT NOT NULL,
seen_at REAL NOT NULL, -- its last heartbeat (epoch seconds)
stopped_at REAL -- its clean stop, or a router alone on the database found it dead; NULL: not known stopped
);

-- table router_setting on router_setting
CREATE TABLE router_setting (
key TEXT PRIMARY KEY,
value REAL NOT NULL
);

-- table run on run
CREATE TABLE "run" (
id INTEGER PRIMARY KEY,
job_id TEXT NOT NULL REFERENCES job(id),
node TEXT NOT NULL,
model TEXT NOT NULL,
state TEXT NOT NULL DEFAULT 'running', -- running, done, failed, cancelled, preempted
started_at TEXT NOT NULL,
progress_at TEXT NOT NULL, -- last time tokens arrived (heartbeat)
work_done_at TEXT, -- Ollama's stream ended
finished_at TEXT,
output TEXT NOT NULL DEFAULT '', -- runs before 011 only; later text is in run_chunk
error TEXT,
done_reason TEXT, -- Ollama's: stop, length
eval_count INTEGER,
prompt_eval_count INTEGER,
total_duration_ns INTEGER,
load_duration_ns INTEGER,
eval_duration_ns INTEGER,
stale_reason TEXT, -- set once when the run is first seen stale
thinking TEXT, router TEXT, prompt_eval_duration_ns INTEGER, -- 004 (runs before 011 only, as output)
CONSTRAINT run_state_valid CHECK (state IN ('running', 'done', 'failed', 'cancelled', 'preempted')),
CONSTRAINT run_finished_when_ended CHECK ((finished_at IS NULL) = (state = 'running'))
);

-- table run_chunk on run_chunk
CREATE TABLE run_chunk (
run_id INTEGER NOT NULL REFERENCES run(id),
seq INTEGER NOT NULL, -- 1, 2, 3... in the order written
at TEXT NOT NULL, -- when it was written (a heartbeat, the end of the stream, the finish)
output TEXT, -- the answer's text that came since the run's last chunk; NULL: none
thinking TEXT, -- the reasoning's text that came since; NULL: none
PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- table schema_migration on schema_migration
CREATE TABLE schema_migration ( version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL);

-- table storage_sample on storage_sample
CREATE TABLE storage_sample (
id INTEGER PRIMARY KEY,
at TEXT NOT NULL,
database_bytes INTEGER NOT NULL, -- the database's file and its WAL
free_bytes INTEGER -- free on the database's disk (NULL: not known)
);

-- table usage_run on usage_run
CREATE TABLE usage_run (
id INTEGER PRIMARY KEY, -- the run's id, as it was
job_id TEXT NOT NULL, -- no reference: the job is gone
owner TEXT, -- the job's
client TEXT,
lane TEXT NOT NULL,
node TEXT NOT NULL, -- the run's
model TEXT NOT NULL,
started_at TEXT NOT NULL,
finished_at TEXT NOT NULL,
busy_s REAL NOT NULL, -- started_at to finished_at
load_s REAL, -- Ollama's load_duration
tokens_in INTEGER, -- prompt_eval_count
tokens_out INTEGER, -- eval_count
wait_s REAL -- the job's first run only: created_at to started_at
);

-- trigger critique_guard_insert on job
CREATE TRIGGER critique_guard_insert -- 010
BEFORE INSERT ON job
WHEN NEW.kind = 'critique' AND NEW.state IN ('queued', 'running')
AND NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id)
BEGIN
SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

-- trigger critique_guard_parent_update on job
CREATE TRIGGER critique_guard_parent_update
BEFORE UPDATE OF node, state ON job
WHEN NEW.kind <> 'critique' AND NEW.state IN ('queued', 'running')
AND (NEW.node IS NOT OLD.node OR OLD.state NOT IN ('queued', 'running'))
AND EXISTS (SELECT 1 FROM job c WHERE c.parent_id = NEW.id AND c.node = NEW.node
AND c.state IN ('queued', 'running'))
BEGIN
SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

-- trigger critique_guard_update on job
CREATE TRIGGER critique_guard_update
BEFORE UPDATE OF node, state ON job
WHEN NEW.kind = 'critique' AND NEW.state IN ('queued', 'running')
AND (NEW.node IS NOT OLD.node OR OLD.state NOT IN ('queued', 'running'))
AND NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id)
BEGIN
SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

-- trigger job_part_deleted_with_job on job
CREATE TRIGGER job_part_deleted_with_job
AFTER DELETE ON job
BEGIN
DELETE FROM job_part WHERE job_id = OLD.id;
END;

-- trigger job_part_dropped_with_request on job
CREATE TRIGGER job_part_dropped_with_request
AFTER UPDATE OF request ON job WHEN NEW.request IS NULL
BEGIN
DELETE FROM job_part WHERE job_id = OLD.id;
END;

-- trigger node_load_delete on job
CREATE TRIGGER node_load_delete AFTER DELETE ON job
WHEN OLD.state IN ('queued', 'running')
BEGIN
UPDATE node_load SET queued = queued - (OLD.state = 'queued'), running = running - (OLD.state = 'running')
WHERE node = OLD.node;
END;

-- trigger node_load_insert on job
CREATE TRIGGER node_load_insert AFTER INSERT ON job -- 009
WHEN NEW.state IN ('queued', 'running')
BEGIN
INSERT INTO node_load (node, queued, running) VALUES (NEW.node, NEW.state = 'queued', NEW.state = 'running')
ON CONFLICT (node) DO UPDATE SET queued = queued + excluded.queued, running = running + excluded.running;
END;

-- trigger node_load_update on job
CREATE TRIGGER node_load_update AFTER UPDATE OF state, node ON job
WHEN (OLD.state IS NOT NEW.state OR OLD.node IS NOT NEW.node)
AND (OLD.state IN ('queued', 'running') OR NEW.state IN ('queued', 'running'))
BEGIN
UPDATE node_load SET queued = queued - (OLD.state = 'queued'), running = running - (OLD.state = 'running')
WHERE node = OLD.node;
INSERT INTO node_load (node, queued, running)
SELECT NEW.node, NEW.state = 'queued', NEW.state = 'running' WHERE NEW.state IN ('queued', 'running')
ON CONFLICT (node) DO UPDATE SET queued = queued + excluded.queued, running = running + excluded.running;
END;

-- trigger run_chunk_deleted_with_run on run
CREATE TRIGGER run_chunk_deleted_with_run -- 011
AFTER DELETE ON run
BEGIN
DELETE FROM run_chunk WHERE run_id = OLD.id;
END;

-- trigger run_deleted_from_its_events on run
CREATE TRIGGER run_deleted_from_its_events
AFTER DELETE ON run
BEGIN
UPDATE event SET run_id = NULL WHERE run_id = OLD.id;
END;

-- trigger run_router_stamp on run
CREATE TRIGGER run_router_stamp
AFTER INSERT ON run FOR EACH ROW WHEN NEW.router IS NULL
BEGIN
UPDATE run SET router = (SELECT l.router FROM node_lease l WHERE l.node = NEW.node) WHERE id = NEW.id;
END;

-- view head_staleness on head_staleness
CREATE VIEW head_staleness AS
SELECT j.id, j.node, j.state, j.run_id, 1 AS rank, 'ollama finished but the job was not closed' AS reason,
r.work_done_at AS since, julianday(r.work_done_at) + s.grace_s / 86400.0 AS stale_at
FROM job j JOIN run r ON r.id = j.run_id JOIN stale_setting s
WHERE j.state = 'running' AND r.work_done_at IS NOT NULL
UNION ALL
SELECT j.id, j.node, j.state, j.run_id, 2, 'ran past max_runtime', r.started_at,
julianday(r.started_at) + COALESCE(n.max_runtime_s, s.max_runtime_s) / 86400.0
FROM job j JOIN run r ON r.id = j.run_id JOIN stale_setting s LEFT JOIN node n ON n.name = j.node
WHERE j.state = 'running'
UNION ALL
SELECT j.id, j.node, j.state, j.run_id, 3, 'no progress', r.progress_at,
julianday(r.progress_at) + s.stale_after_s / 86400.0
FROM job j JOIN run r ON r.id = j.run_id JOIN stale_setting s
WHERE j.state = 'running';

-- view held_job on held_job
CREATE VIEW held_job AS
SELECT j.id, j.node, j.parent_id, p.state AS parent_state FROM job j JOIN job p ON p.id = j.parent_id
WHERE j.state = 'queued' AND j.subject_from_parent = 1 AND p.state <> 'done';

-- view ready_job on ready_job
CREATE VIEW ready_job AS
SELECT j.* FROM job j
WHERE j.state = 'queued' AND NOT EXISTS (SELECT 1 FROM held_job h WHERE h.id = j.id)
AND NOT EXISTS (SELECT 1 FROM batch_line l JOIN batch b ON b.id = l.batch_id
WHERE l.job_id = j.id AND b.status = 'validating');

-- view run_output on run_output
CREATE VIEW run_output AS
SELECT r.id AS run_id, r.job_id, r.state,
COALESCE((SELECT group_concat(COALESCE(t.output, ''), '')
FROM (SELECT output FROM run_text WHERE run_id = r.id ORDER BY seq) t), '') AS output,
(SELECT group_concat(t.thinking, '')
FROM (SELECT thinking FROM run_text WHERE run_id = r.id ORDER BY seq) t) AS thinking
FROM run r;

-- view run_text on run_text
CREATE VIEW run_text AS -- 011
SELECT id AS run_id, 0 AS seq, NULL AS at, output, thinking FROM run
WHERE output <> '' OR thinking IS NOT NULL
UNION ALL
SELECT run_id, seq, at, output, thinking FROM run_chunk;

-- view stale_heads on stale_heads
CREATE VIEW stale_heads AS
SELECT id, node, state, since, reason, run_id FROM (
SELECT id, node, state, since, reason, run_id, MIN(rank) FROM head_staleness
WHERE stale_at < julianday('now') GROUP BY id);

-- view stale_setting on stale_setting
CREATE VIEW stale_setting AS
SELECT (SELECT value FROM router_setting WHERE key = 'stale_after_s') AS stale_after_s,
(SELECT value FROM router_setting WHERE key = 'stale_grace_s') AS grace_s,
(SELECT value FROM router_setting WHERE key = 'max_runtime_s') AS max_runtime_s;

