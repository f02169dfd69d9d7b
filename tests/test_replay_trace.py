"""The replayed day's trace (bench/trace.py): the same seed gives the same day, and the day has
the lab's parts in the proportions bench/README describes."""

from __future__ import annotations

import pytest

from bench import trace as tr


def test_the_same_seed_replays_the_same_day_and_another_seed_another():
    assert tr.generate(7, 12.0).events == tr.generate(7, 12.0).events
    assert tr.generate(7, 12.0).events != tr.generate(8, 12.0).events


def test_a_longer_replay_is_the_same_day_at_a_slower_clock():
    short, long = tr.generate(3, 12.0), tr.generate(3, 24.0)
    assert [(e.kind, e.who, e.tokens, e.calls, e.node) for e in short.events] == [
        (e.kind, e.who, e.tokens, e.calls, e.node) for e in long.events
    ]
    for a, b in zip(short.events, long.events):
        assert b.at == pytest.approx(2 * a.at, abs=0.002)


@pytest.mark.parametrize("seed", range(1, 21))
def test_the_day_has_its_parts_in_proportion(seed):
    day = tr.generate(seed, 12.0)
    events = day.events
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert all(0 <= e.at < day.day_s for e in events)
    # Three people's sweeps, a morning's and an afternoon's each, on their own model.
    sweeps = [e for e in events if e.kind == "sweep"]
    assert sorted(e.who for e in sweeps) == sorted(list(tr.PEOPLE) * 2)
    assert all(e.model == tr.PEOPLE[e.who] and len(e.tokens) == len(e.critiqued) >= 3 for e in sweeps)
    # Some finished tasks fan critiques out (about 3 in 10), never nearly all of them.
    tasks, critiques = day.count("task"), day.count("critique")
    assert 1 <= critiques <= 0.6 * tasks
    # The editor's short calls are the day's most frequent; the chat's replies are longer.
    editor, chat = day.count("editor"), day.count("chat")
    calls = tasks + critiques + editor + chat
    assert editor >= tasks > chat > 0
    assert 0.25 <= editor / calls <= 0.6 and 0.2 <= tasks / calls <= 0.5 and 0.05 <= chat / calls <= 0.25
    bursts = {kind: [c for e in events if e.kind == kind for c in e.calls] for kind in ("editor", "chat")}
    assert max(c.tokens for c in bursts["editor"]) < min(c.tokens for c in bursts["chat"])
    assert all(e.who == tr.EDITOR and e.model == tr.CODER for e in events if e.kind == "editor")
    # A person types between an editor's calls (seconds) and reads between a chat's (longer).
    assert max(c.pause_s for c in bursts["editor"]) < min(c.pause_s for c in bursts["chat"])
    # One node down for one hour, then back.
    down = [e for e in events if e.kind in ("down", "up")]
    assert [(e.kind, e.node) for e in down] == [("down", tr.DOWN_NODE), ("up", tr.DOWN_NODE)]
    assert down[1].at - down[0].at == pytest.approx(day.hour_s, abs=0.002)
