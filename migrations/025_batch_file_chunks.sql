-- 025_batch_file_chunks: a batch file's content kept as chunks (issue 43), so an upload goes to
-- the store piece by piece as it arrives and a download is read back piece by piece: neither
-- holds the file whole in the router's memory (a 51 MB upload once grew it by 440 MB).
-- * batch_file_chunk: the file's bytes in order, each row at most 1 MiB (FILE_CHUNK_BYTES in
--   gpuq/store/batches.py); a file's chunks go with it (ON DELETE CASCADE: its delete, a batch's
--   delete or retry, retention's prune and delete all delete the file's row).
-- * batch_file loses `content`: every file's bytes move into its chunks here. While an upload is
--   under way its row has bytes = -1 and no read shows it; its end sets its size.

CREATE TABLE batch_file_chunk (
    file_id  TEXT NOT NULL REFERENCES batch_file(id) ON DELETE CASCADE,
    seq      INTEGER NOT NULL,                    -- from 0, in the file's order
    bytes    BLOB NOT NULL,
    PRIMARY KEY (file_id, seq)
);

WITH RECURSIVE piece(id, seq) AS (
    SELECT id, 0 FROM batch_file WHERE length(content) > 0
    UNION ALL
    SELECT p.id, p.seq + 1 FROM piece p JOIN batch_file f ON f.id = p.id
    WHERE (p.seq + 1) * 1048576 < length(f.content)
)
INSERT INTO batch_file_chunk (file_id, seq, bytes)
SELECT p.id, p.seq, substr(f.content, p.seq * 1048576 + 1, 1048576) FROM piece p JOIN batch_file f ON f.id = p.id;

ALTER TABLE batch_file DROP COLUMN content;
