-- 011_run_chunks: a run's text is written once. Until now each heartbeat (about once a second
-- while a job streams) appended to run.output with `output = output || ?`, and SQLite rewrites
-- the whole value, every overflow page of the text so far, so a long job wrote O(n^2) bytes.
-- Now each write inserts one run_chunk row holding only the text that came since the last one,
-- and nothing rewrites earlier text.
--
-- A run's text is its run.output/run.thinking (the text of runs written before this migration;
-- '' and NULL for later ones) followed by its chunks in seq order. The view run_text lists those
-- pieces; the router reads them through it, ordered by (run_id, seq), and joins them in Python.
-- In the sqlite3 shell:
--   SELECT seq, at, output, thinking FROM run_text WHERE run_id = 7 ORDER BY seq;

CREATE TABLE run_chunk (
    run_id   INTEGER NOT NULL REFERENCES run(id),
    seq      INTEGER NOT NULL,      -- 1, 2, 3... in the order written
    at       TEXT NOT NULL,         -- when it was written (a heartbeat, the end of the stream, the finish)
    output   TEXT,                  -- the answer's text that came since the run's last chunk; NULL: none
    thinking TEXT,                  -- the reasoning's text that came since; NULL: none
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;                    -- one b-tree, rows in (run_id, seq) order: an append writes one leaf

-- Nothing in the router deletes a run (a deleted job is cancelled, its rows stay); a run deleted by
-- hand takes its chunks with it, foreign keys on or off.
CREATE TRIGGER run_chunk_deleted_with_run
AFTER DELETE ON run
BEGIN
    DELETE FROM run_chunk WHERE run_id = OLD.id;
END;

-- A run's text piece by piece: seq 0 is what the run row holds (only when it holds some), then
-- each chunk. Read it ORDER BY run_id, seq: that order is the text's.
CREATE VIEW run_text AS
    SELECT id AS run_id, 0 AS seq, NULL AS at, output, thinking FROM run
    WHERE output <> '' OR thinking IS NOT NULL
    UNION ALL
    SELECT run_id, seq, at, output, thinking FROM run_chunk;
