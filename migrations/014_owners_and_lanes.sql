-- 014_owners_and_lanes: who sent each job, with what, and in which lane it waits.
-- owner: the [[user]] whose token (or tailnet login) sent it; NULL when the router knows no one
-- (no token and no users: everyone is the same anonymous caller). client: the program that sent
-- it (its User-Agent), as a person reads it on the page. lane: an interactive job waits ahead of
-- every batch job on its node (the order itself stays `position`; the lane says why a job entered
-- where it did). The front door's calls so far were interactive by the new rule: say so.

ALTER TABLE job ADD COLUMN owner TEXT;   -- 014: the user who sent it; NULL: no identity
ALTER TABLE job ADD COLUMN client TEXT;  -- 014: the sending program (User-Agent), cut to 200 characters
ALTER TABLE job ADD COLUMN lane TEXT NOT NULL DEFAULT 'batch'  -- 014: 'interactive' or 'batch'
    CONSTRAINT job_lane_valid CHECK (lane IN ('interactive', 'batch'));

UPDATE job SET lane = 'interactive' WHERE endpoint IS NOT NULL;

-- A user's waiting and running jobs (quotas), and history filtered by owner.
CREATE INDEX job_owner_state ON job(owner, state) WHERE owner IS NOT NULL;
