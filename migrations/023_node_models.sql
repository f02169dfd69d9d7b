-- 023_node_models: the models each node's Ollama listed at its last health check, on the node's
-- own row. Several routers on one PostgreSQL database place a batch's lines on every node a live
-- router drives, not only their own: a router knows by its own health checks only what its own
-- nodes have, so it reads the others' from here, and a line goes only where its model is.
-- JSON: the list of model names, normalized (`name:tag`), sorted.

ALTER TABLE node ADD COLUMN models TEXT; -- NULL: the node not heard from yet
