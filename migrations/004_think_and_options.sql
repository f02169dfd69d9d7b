-- 004_think_and_options: what a job asks of Ollama beyond its prompt, and the reasoning a
-- thinking model streams apart from its answer (Ollama's message.thinking, since 0.12.4).

-- Ollama's `think` as JSON (true, false, "low", "medium", "high"); NULL: the node's default.
ALTER TABLE job ADD COLUMN think TEXT;
-- The job's own Ollama model options as a JSON object (merged over the node's at each run).
ALTER TABLE job ADD COLUMN options TEXT;
-- The model's reasoning in this run, apart from its answer (`output`); NULL when it gave none.
ALTER TABLE run ADD COLUMN thinking TEXT;
