"""A small lab's day as a trace, seeded: `generate(seed, day_s)` returns the same list of events
for the same arguments, so the day replays alike after every change (bench/replay.py plays it).

The day is ten working hours (09:00-19:00) compressed to `day_s` seconds of replay, and what
runs inside it a twentieth of a real lab's durations (`SCALE`): a 30B model's cold load of about
10 s is 0.5 s here, a token 3 ms. So the day is denser than a real one: queues form as at the
lab's busiest hours, every hour.

What happens in it:

- three people's batch sweeps (alice and carol on the coding model, bob on the small one), each
  a burst of tasks submitted at once through the API, some of whose tasks fan a critique out to
  the critique nodes once they finish;
- an editor's bursts of short interactive calls (Continue's autocompletes: the front door's
  /api/chat with `keep_alive`, one after another with a typing pause between);
- a chat UI's conversations (the front door, longer replies, a person reading between);
- one node down for an hour (its simulator stopped, then started again on the same port).

Each event's reply length is in its prompt (`(N tokens)`), which the replay's simulator reads."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

SCALE = 20.0  # real durations / replay durations
HOURS = 10  # the working day the replay compresses
CODER = "qwen3-coder:30b"
SMALL = "llama3.2:latest"
LOAD_S = {CODER: 0.5, SMALL: 0.15}  # cold loads, scaled (about 10 s and 3 s on a real GPU)
TOKEN_S = 0.003  # between streamed tokens, scaled
UNLOAD_S = 0.05  # how long a model stays listed after keep_alive: 0, scaled (about 1 s)
NODES = {"n1": (CODER, (CODER, SMALL)), "n2": (CODER, (CODER, SMALL)), "n3": (SMALL, (CODER, SMALL))}
DOWN_NODE = "n2"
PEOPLE = {"alice": CODER, "bob": SMALL, "carol": CODER}  # whose sweeps, on which model
EDITOR = "alice"  # whose editor calls the front door
CHAT = "bob"  # whose chat UI


@dataclass(frozen=True)
class Call:
    """One front-door call of a burst: sent `pause_s` after the previous one's reply ended."""

    pause_s: float
    tokens: int


@dataclass(frozen=True)
class Event:
    at: float  # replay seconds from the day's start
    kind: str  # sweep | editor | chat | down | up
    who: str = ""
    model: str = ""
    tokens: tuple[int, ...] = ()  # a sweep's tasks' reply lengths
    critiqued: tuple[bool, ...] = ()  # which of a sweep's tasks fan a critique out when done
    calls: tuple[Call, ...] = ()  # an editor's or a chat's calls, one after another
    node: str = ""  # down / up


@dataclass
class Trace:
    seed: int
    day_s: float
    events: list[Event] = field(default_factory=list)

    @property
    def hour_s(self) -> float:
        return self.day_s / HOURS

    def count(self, kind: str) -> int:
        """Jobs of a kind in the day: tasks, critiques (each fans out to the critique nodes but
        its parent's: counted once here), editor calls, chat calls."""
        if kind == "task":
            return sum(len(e.tokens) for e in self.events if e.kind == "sweep")
        if kind == "critique":
            return sum(sum(e.critiqued) for e in self.events if e.kind == "sweep")
        return sum(len(e.calls) for e in self.events if e.kind == kind)


def generate(seed: int, day_s: float = 12.0) -> Trace:
    rng = random.Random(seed)
    hour = day_s / HOURS
    trace = Trace(seed, day_s)
    events = trace.events
    # Batch sweeps: each person two a day (morning, afternoon), at a random moment of a window.
    for who, model in PEOPLE.items():
        for start, end in ((0.3, 3.5), (4.5, 8.0)):
            size = rng.randint(3, 5)
            events.append(
                Event(
                    at=round(rng.uniform(start, end) * hour, 3),
                    kind="sweep",
                    who=who,
                    model=model,
                    tokens=tuple(rng.randint(50, 120) for _ in range(size)),
                    critiqued=tuple(rng.random() < 0.3 for _ in range(size)),
                )
            )
    # The editor: a burst of autocompletes about every hour, 2-5 calls, typing pauses of 0.5-3 s
    # (real), short replies.
    t = rng.uniform(0.1, 0.6) * hour
    while t < HOURS * hour * 0.95:
        calls = tuple(
            Call(pause_s=round(rng.uniform(0.5, 3.0) / SCALE, 4), tokens=rng.randint(6, 20))
            for _ in range(rng.randint(2, 5))
        )
        events.append(Event(at=round(t, 3), kind="editor", who=EDITOR, model=CODER, calls=calls))
        t += rng.uniform(0.7, 1.3) * hour
    # The chat UI: a conversation about every 2.5 hours, 2-4 messages, a person reading and
    # typing 10-40 s (real) between, longer replies.
    t = rng.uniform(0.5, 1.5) * hour
    while t < HOURS * hour * 0.95:
        calls = tuple(
            Call(pause_s=round(rng.uniform(10, 40) / SCALE, 4), tokens=rng.randint(40, 140))
            for _ in range(rng.randint(2, 4))
        )
        events.append(Event(at=round(t, 3), kind="chat", who=CHAT, model=SMALL, calls=calls))
        t += rng.uniform(2.0, 3.0) * hour
    # One node down for an hour in the early afternoon.
    down = round(rng.uniform(4.0, 5.0) * hour, 3)
    events.append(Event(at=down, kind="down", node=DOWN_NODE))
    events.append(Event(at=round(down + hour, 3), kind="up", node=DOWN_NODE))
    events.sort(key=lambda e: (e.at, e.kind))
    return trace
