"""Which lane a job waits in, for both doors: the one rule of lanes (see jobs.Lane)."""

from __future__ import annotations

from enum import StrEnum

from ..config import UserConfig
from ..errors import BadRequest, Forbidden
from ..jobs import Lane


class Door(StrEnum):
    API = "api"  #: the router's API (the CLI, the page, scripts): a job may ask for a lane ('priority')
    FRONT = "front"  #: the front door: no client of Ollama's, OpenAI's or Anthropic's API can ask for one


# Where a job waits when it asks for no lane: a person waits on a front-door call (a chat, an
# editor); gpuq's own jobs are long work.
DEFAULT_LANE = {Door.API: Lane.BATCH, Door.FRONT: Lane.INTERACTIVE}


def lane_for(user: UserConfig | None, asked: str | None, door: Door) -> Lane:
    """The lane a job of `user` waits in. A lane the user may not use (their [[user]] `lanes`) is
    refused at the API, naming the rule (403); a front-door call, which could not ask, waits in
    the lane the user may use instead of being refused."""
    if asked is not None and asked not in tuple(Lane):
        raise BadRequest(f"field 'priority' must be 'interactive' or 'batch', got {str(asked)[:40]!r}")
    lane = Lane(asked) if asked is not None else DEFAULT_LANE[door]
    if user is None or lane in user.lanes:
        return lane
    if door is Door.FRONT:
        return Lane(user.lanes[0])
    raise Forbidden(
        f"user '{user.name}' may submit only to the {' and '.join(user.lanes)} lane "
        f"(their [[user]] lanes in gpuq.toml); ask with priority "
        f"'{user.lanes[0]}', or ask an admin to add '{lane}'"
    )
