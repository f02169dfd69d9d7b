-- 015_router_leases: exactly one router drives a node at a time (issue 27). Each router process
-- has a row of its own (a fresh id per start), seen again at each heartbeat; a node is driven by
-- the router whose lease on it has not expired (node_lease), renewed by that router's heartbeat.
-- A router takes a node only when its lease is free or expired; the jobs a dead router left
-- running there fail, naming it. Times of the leases are seconds since the epoch (REAL), compared
-- as plain numbers; started_at is ISO text as every other time here.
-- On SQLite one router holds the database (its lock file), so every other router is dead: the
-- rows say which router ran what, and /health names the router and the nodes it holds.

CREATE TABLE router (
    id          TEXT PRIMARY KEY,                 -- host:pid:random, fresh at each start
    listen      TEXT NOT NULL,                    -- its [router] listen
    public_url  TEXT,
    pid         INTEGER NOT NULL,
    host        TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    seen_at     REAL NOT NULL,                    -- its last heartbeat (epoch seconds)
    stopped_at  REAL                              -- its clean stop, or a router alone on the database found it dead; NULL: not known stopped
);

CREATE TABLE node_lease (
    node        TEXT PRIMARY KEY, -- as gpuq.toml names it (no reference to `node`: a lease may come before configure writes the row)
    router      TEXT NOT NULL REFERENCES router(id),
    expires_at  REAL NOT NULL,                    -- epoch seconds: free for another router after it
    taken_at    REAL NOT NULL                     -- when this router took it (a renewal keeps it)
);

CREATE INDEX node_lease_router ON node_lease(router);

-- Which router ran each run (NULL: a run of a router before this migration).
ALTER TABLE run ADD COLUMN router TEXT;  -- 015: the router that claimed it

-- A claim stamps its run with the router holding the node's lease, in the claim's transaction.
CREATE TRIGGER run_router_stamp
AFTER INSERT ON run FOR EACH ROW WHEN NEW.router IS NULL
BEGIN
    UPDATE run SET router = (SELECT l.router FROM node_lease l WHERE l.node = NEW.node) WHERE id = NEW.id;
END;
