-- 003_held_critiques: a critique of a task that has not finished yet is accepted at once and
-- held in its node's queue until the parent is done; then it reviews the parent's prompt and
-- result. `subject_from_parent` marks such a critique (its prompt is filled in at the claim).
-- The ready_job view is the one statement of "which queued jobs may run now": a held critique
-- never blocks the jobs behind it, because the claim takes the first ready job.

ALTER TABLE job ADD COLUMN subject_from_parent INTEGER NOT NULL DEFAULT 0
    CHECK (subject_from_parent IN (0, 1));

CREATE VIEW ready_job AS
SELECT j.* FROM job j
WHERE j.state = 'queued'
  AND (j.subject_from_parent = 0
       OR (SELECT p.state FROM job p WHERE p.id = j.parent_id) = 'done');

-- What each held critique waits for, for the sqlite3 shell.
CREATE VIEW held_job AS
SELECT j.id, j.node, j.parent_id, p.state AS parent_state FROM job j JOIN job p ON p.id = j.parent_id
WHERE j.state = 'queued' AND j.subject_from_parent = 1 AND p.state <> 'done';
