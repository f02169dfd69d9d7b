-- 022_asked_unloads: the last unload a client asked of each node (`ollama stop`, Open WebUI's
-- unload: keep_alive 0 with no prompt), kept on the node's own row beside its health, so the
-- page and `gpuq nodes` still show it after a restart. Not the `event` table: an unload of a
-- model held warm on an idle node has no job (one asked while a job ran is in that job's events
-- too). JSON: model, by, at, took_s, verified (whether /api/ps confirmed it gone).

ALTER TABLE node ADD COLUMN asked_unload TEXT; -- NULL: no unload asked yet
