"""Did Ollama cut a job's prompt to fit its context window? Ollama says so only in its own log;
the prompt tokens it evaluated show it. The node's worker asks after each run and notes a
warning on the job (gpuq/node/worker.py)."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import OllamaError
from ..store import Row
from .ollama import prompt_was_cut
from .runtime import NodeRuntime

log = logging.getLogger("gpuq")

OLLAMA_DEFAULT_CONTEXT = 4096  # num_ctx when neither the job, the node nor the model sets one


class ContextCheck:
    """One node's check, with each model's num_ctx from /api/show read once."""

    def __init__(self, rt: NodeRuntime) -> None:
        self.rt = rt  # its client read at each check: a reload may give the node a new one
        self.context_lengths: dict[str, int | None] = {}  # /api/show's num_ctx per model

    async def warning(self, job: Row, stats: dict[str, Any], options: dict[str, Any] | None) -> str | None:
        """The warning for a prompt the run's stats show was cut (num_ctx from the options, else
        from the model's /api/show parameters; unknown: none)."""
        used = stats.get("prompt_eval_count")
        if not isinstance(used, int):
            return None
        num_ctx = (options or {}).get("num_ctx")
        if num_ctx is None:
            if job["model"] not in self.context_lengths:
                try:
                    self.context_lengths[job["model"]] = await self.rt.client.context_length(job["model"])
                except OllamaError as exc:
                    log.warning(
                        "job=%s node=%s cannot read num_ctx from /api/show: %s", job["id"], self.rt.name, exc.message
                    )
                    return None
            # No num_ctx in the model's parameters: the server's default context applies, 4096
            # unless its OLLAMA_CONTEXT_LENGTH says otherwise (which no API tells).
            num_ctx = self.context_lengths[job["model"]] or OLLAMA_DEFAULT_CONTEXT
        if num_ctx and prompt_was_cut(used, num_ctx, (options or {}).get("num_keep", 4)):
            return (
                f"prompt may have been truncated: {used} tokens, num_ctx {num_ctx} "
                "(set a larger num_ctx in the node's or the job's options)"
            )
        return None
