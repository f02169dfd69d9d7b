-- 025_batch_file_chunks: SQLite's 025 (issue 43), numbered as SQLite's: a batch file's content
-- kept as chunks of at most 1 MiB, so an upload is stored piece by piece as it arrives and a
-- download read back piece by piece; batch_file loses `content` (every file's bytes move into
-- its chunks here). While an upload is under way its row has bytes = -1 and no read shows it.

CREATE TABLE batch_file_chunk (
    file_id  TEXT NOT NULL REFERENCES batch_file(id) ON DELETE CASCADE,
    seq      BIGINT NOT NULL,
    bytes    BYTEA NOT NULL,
    PRIMARY KEY (file_id, seq)
);

INSERT INTO batch_file_chunk (file_id, seq, bytes)
SELECT f.id, s.seq, substring(f.content FROM (s.seq * 1048576 + 1)::int FOR 1048576)
FROM batch_file f, generate_series(0, (length(f.content) - 1) / 1048576) AS s(seq)
WHERE length(f.content) > 0;

ALTER TABLE batch_file DROP COLUMN content;
