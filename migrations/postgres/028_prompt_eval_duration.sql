-- 028_prompt_eval_duration: SQLite's 028: Ollama's prompt_eval_duration of each run (ns), beside the other
-- durations 001 keeps, so a node's prompt tokens per second is measured from its own runs
-- (issue 45, item 4: gpuq/speed.py). NULL for runs before it: they count for output only.

ALTER TABLE run ADD COLUMN prompt_eval_duration_ns INTEGER;
