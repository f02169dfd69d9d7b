-- 002_job_state_index: the queries that ask "what waits or runs, per node" across all nodes
-- (/health's totals, the waiting counts, placement's per-node counts, the orphan check at
-- start-up) read only the active rows through this index instead of scanning the whole
-- history, so their cost follows the queue's depth, not the number of jobs ever run.
CREATE INDEX job_state_node ON job (state, node);
