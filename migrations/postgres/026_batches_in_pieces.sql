-- 026_batches_in_pieces: SQLite's 026, numbered as it is (issue 43, item 4). A large batch is
-- created in bounded transactions, its lines hidden until it is whole: batch.status gains
-- 'validating', batch.creator names the router creating it (NULL once whole), and ready_job leaves
-- out the lines of a 'validating' batch, so no router's worker claims one before its batch is whole.

ALTER TABLE batch ADD COLUMN creator TEXT;
ALTER TABLE batch DROP CONSTRAINT batch_status_valid;
ALTER TABLE batch ADD CONSTRAINT batch_status_valid
    CHECK (status IN ('validating', 'in_progress', 'cancelling', 'failed', 'completed', 'cancelled', 'expired'));
ALTER TABLE batch ADD CONSTRAINT batch_creator_while_validating CHECK ((creator IS NOT NULL) = (status = 'validating'));

CREATE OR REPLACE VIEW ready_job AS
SELECT j.* FROM job j
WHERE j.state = 'queued' AND NOT EXISTS (SELECT 1 FROM held_job h WHERE h.id = j.id)
    AND NOT EXISTS (SELECT 1 FROM batch_line l JOIN batch b ON b.id = l.batch_id
                    WHERE l.job_id = j.id AND b.status = 'validating');
