-- 009_node_load: how many jobs wait and run on each node, kept by the database itself.
-- Placement reads these counts on every submit. Counted from the job table, they cost a scan
-- of every active row (0.6 ms at 1,600 queued, which capped a burst of submits at ~1,400/s);
-- kept here by triggers, a read costs one row per node, and a savepoint rolled back takes its
-- counts back with it. Every write to a job's state or node goes through these triggers.

CREATE TABLE node_load (
    node    TEXT PRIMARY KEY,
    queued  INTEGER NOT NULL DEFAULT 0 CHECK (queued >= 0),
    running INTEGER NOT NULL DEFAULT 0 CHECK (running >= 0)
) WITHOUT ROWID;

INSERT INTO node_load (node, queued, running)
SELECT node, SUM(state = 'queued'), SUM(state = 'running') FROM job
WHERE state IN ('queued', 'running') GROUP BY node;

CREATE TRIGGER node_load_insert AFTER INSERT ON job
WHEN NEW.state IN ('queued', 'running')
BEGIN
    INSERT INTO node_load (node, queued, running) VALUES (NEW.node, NEW.state = 'queued', NEW.state = 'running')
    ON CONFLICT (node) DO UPDATE SET queued = queued + excluded.queued, running = running + excluded.running;
END;

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

CREATE TRIGGER node_load_delete AFTER DELETE ON job
WHEN OLD.state IN ('queued', 'running')
BEGIN
    UPDATE node_load SET queued = queued - (OLD.state = 'queued'), running = running - (OLD.state = 'running')
    WHERE node = OLD.node;
END;
