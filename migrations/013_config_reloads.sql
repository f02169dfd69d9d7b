-- 013_config_reloads: each time the router read its gpuq.toml again (SIGHUP, `gpuq reload`), one
-- row: who asked, the file, whether it took effect, what changed (JSON: added, removed, nodes,
-- router, needs_restart) or why nothing did. Not the `event` table: a reload has no job. The jobs
-- a forced reload failed (their node removed) have their own events, as every state change does.

CREATE TABLE config_reload (
    id       INTEGER PRIMARY KEY,
    at       TEXT NOT NULL,
    actor    TEXT NOT NULL,                       -- 'signal SIGHUP', or cli/page/api + client address
    path     TEXT NOT NULL,                       -- the gpuq.toml read
    ok       INTEGER NOT NULL CONSTRAINT config_reload_ok_flag CHECK (ok IN (0, 1)),
    changes  TEXT,                                -- ok: what changed, as the answer said it (JSON)
    error    TEXT,                                -- not ok: why nothing changed
    CONSTRAINT config_reload_says_what CHECK ((ok = 1) = (changes IS NOT NULL) AND (ok = 0) = (error IS NOT NULL))
);
