-- 009_node_models: SQLite's 023: the models each node's Ollama listed at its last health check,
-- on the node's row, so a router placing a batch's lines on the nodes other routers drive sends
-- each line only where its model is. JSON: the sorted list of normalized model names.

ALTER TABLE node ADD COLUMN models TEXT;
