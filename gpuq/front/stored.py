"""A front-door job's request as the store keeps it (the job's `request` column): the route the
call came to, its client's body and program, and for a batch's line its batch and custom_id.
Written once when the job is made (front/call.py, batches/parse.py) and read once when it runs
(front/relay.py), so that what a job is (a client's call, a batch's line) is a typed field, never
a guess from its text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .shapes import dumps


@dataclass(frozen=True)
class StoredCall:
    path: str  # the front-door route, "/v1/chat/completions"
    body: dict[str, Any]  # the client's request body, as it sent it
    user_agent: str | None = None
    batch: str | None = None  # the batch this job is a line of
    custom_id: str | None = None  # that line's custom_id

    def dumps(self) -> str:
        out: dict[str, Any] = {"path": self.path, "user_agent": self.user_agent, "body": self.body}
        if self.batch is not None:
            out |= {"batch": self.batch, "custom_id": self.custom_id}
        return dumps(out)

    @classmethod
    def parse(cls, text: str) -> StoredCall:
        data = json.loads(text)
        return cls(data["path"], data["body"], data.get("user_agent"), data.get("batch"), data.get("custom_id"))
