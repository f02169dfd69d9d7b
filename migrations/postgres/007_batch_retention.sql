-- 007_batch_retention: SQLite's 021 (issue 37): an ended batch pruned by retention (its files and
-- its lines' kept replies gone) says when, as a pruned job's pruned_at does.
ALTER TABLE batch ADD COLUMN pruned_at TEXT;
