-- 021_batch_retention: retention applies to batches (issue 37): an ended batch past [retention]
-- prune_after loses its files (input, output, error) and its lines' kept replies, and says when,
-- as a pruned job's pruned_at does; past delete_after its row and lines go (archived first).
ALTER TABLE batch ADD COLUMN pruned_at TEXT;
