-- 010_guard_in_the_schema: the critique guard lives here and only here. A critique never runs
-- on its parent task's node: every write that could put one there is refused with one message,
-- which the router maps to HTTP 409 (gpuq/errors.py from_sqlite, GUARD_MESSAGE). That is an
-- insert, a move (node), and a state change that makes the job active again (retry's requeue),
-- of the critique or of its parent. A write that leaves an active job where it is (a claim, a
-- finish, a reorder) is not judged again. Placement only chooses nodes; it refuses nothing.

DROP TRIGGER critique_not_on_parent_node_insert;
DROP TRIGGER critique_not_on_parent_node_update;
DROP TRIGGER parent_not_onto_its_critiques_node;

CREATE TRIGGER critique_guard_insert
BEFORE INSERT ON job
WHEN NEW.kind = 'critique' AND NEW.state IN ('queued', 'running')
     AND NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id)
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

CREATE TRIGGER critique_guard_update
BEFORE UPDATE OF node, state ON job
WHEN NEW.kind = 'critique' AND NEW.state IN ('queued', 'running')
     AND (NEW.node IS NOT OLD.node OR OLD.state NOT IN ('queued', 'running'))
     AND NEW.node = (SELECT node FROM job WHERE id = NEW.parent_id)
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;

CREATE TRIGGER critique_guard_parent_update
BEFORE UPDATE OF node, state ON job
WHEN NEW.kind <> 'critique' AND NEW.state IN ('queued', 'running')
     AND (NEW.node IS NOT OLD.node OR OLD.state NOT IN ('queued', 'running'))
     AND EXISTS (SELECT 1 FROM job c WHERE c.parent_id = NEW.id AND c.node = NEW.node
                 AND c.state IN ('queued', 'running'))
BEGIN
    SELECT RAISE(ABORT, 'a critique never runs on its parent task''s node');
END;
