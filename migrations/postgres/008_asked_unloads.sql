-- 008_asked_unloads: SQLite's 022: the last unload a client asked of each node (`ollama stop`),
-- on the node's own row beside its health, so the page and `gpuq nodes` show it after a restart
-- (an idle node's unload has no job for an event). JSON: model, by, at, took_s, verified.

ALTER TABLE node ADD COLUMN asked_unload TEXT;
