-- 002_router_leases: SQLite's 015. Exactly one router drives a node at a time: each router process
-- has a row of its own (a fresh id per start), seen again at each heartbeat; a node is driven by
-- the router whose lease on it has not expired (node_lease), renewed by that router's heartbeat.
-- A router takes a node only when its lease is free or expired (one upsert whose WHERE is judged
-- on the row as it is once locked: two routers never both take it); the jobs a dead router left
-- running there fail, naming it. Lease times are seconds since the epoch, compared as numbers.

CREATE TABLE router (
    id          TEXT PRIMARY KEY,                 -- host:pid:random, fresh at each start
    listen      TEXT NOT NULL,                    -- its [router] listen
    public_url  TEXT,
    pid         BIGINT NOT NULL,
    host        TEXT NOT NULL,
    started_at  TEXT NOT NULL,
    seen_at     DOUBLE PRECISION NOT NULL,        -- its last heartbeat (epoch seconds)
    stopped_at  DOUBLE PRECISION                  -- its clean stop, or a router alone on the database found it dead; NULL: not known stopped
);

CREATE TABLE node_lease (
    node        TEXT PRIMARY KEY, -- as gpuq.toml names it (no reference to `node`: a lease may come before configure writes the row)
    router      TEXT NOT NULL REFERENCES router(id),
    expires_at  DOUBLE PRECISION NOT NULL,        -- epoch seconds: free for another router after it
    taken_at    DOUBLE PRECISION NOT NULL         -- when this router took it (a renewal keeps it)
);

CREATE INDEX node_lease_router ON node_lease (router);

-- Which router ran each run (NULL: a run of a router before this migration).
ALTER TABLE run ADD COLUMN router TEXT;

-- A claim stamps its run with the router holding the node's lease, in the claim's transaction.
CREATE FUNCTION run_router_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.router := (SELECT l.router FROM node_lease l WHERE l.node = NEW.node);
    RETURN NEW;
END $$;

CREATE TRIGGER run_router_stamp
BEFORE INSERT ON run FOR EACH ROW
WHEN (NEW.router IS NULL)
EXECUTE FUNCTION run_router_stamp();
