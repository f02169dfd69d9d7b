-- 008_history_indexes: start estimates, the history view and the busy strips read recent
-- history by these indexes, so their cost follows what they show, not the jobs ever run.

-- The last 20 done runs of a node (and of a node's model): the basis of eta_start/eta_finish.
CREATE INDEX run_done_node ON run (node, id) WHERE state = 'done';
CREATE INDEX run_done_node_model ON run (node, model, id) WHERE state = 'done';
-- Runs that ended in the last hour: each node's busy strip and jobs per hour.
CREATE INDEX run_finished ON run (finished_at) WHERE finished_at IS NOT NULL;
-- Every finished job, newest first: the history view and today's counts.
CREATE INDEX job_finished ON job (finished_at, id) WHERE finished_at IS NOT NULL;
