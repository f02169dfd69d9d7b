"""The neighbours bench's reading of what it measures (bench/neighbour_calls.py), without the
peers installed: a stream's tokens through the OpenAI and Ollama wire formats, and the most
generations a node served at once from its request log. The bench's probe rows rest on these."""

from __future__ import annotations

import pytest

from bench.neighbour_calls import most_at_once, token_of


def test_openai_stream_lines_give_tokens_and_the_end() -> None:
    assert token_of(b'data: {"choices": [{"delta": {"content": "Hi"}}]}\n', openai=True) == "Hi"
    assert token_of(b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n', openai=True) == ""
    assert token_of(b"\n", openai=True) == ""
    assert token_of(b": keep-alive\n", openai=True) == ""
    assert token_of(b"data: [DONE]\n", openai=True) is None


def test_ollama_stream_lines_give_tokens() -> None:
    assert token_of(b'{"message": {"role": "assistant", "content": "Hi"}, "done": false}\n', openai=False) == "Hi"
    assert token_of(b'{"message": {"content": ""}, "done": true}\n', openai=False) == ""


@pytest.mark.parametrize("openai", [True, False])
def test_an_error_line_is_a_failed_call_not_an_answer(openai: bool) -> None:
    line = b'data: {"error": {"message": "no node"}}\n' if openai else b'{"error": "no node"}\n'
    with pytest.raises(RuntimeError, match="no node"):
        token_of(line, openai=openai)


def test_calls_one_after_another_count_as_one_at_a_time() -> None:
    # Back to back: the next arrives the moment the last ended (a queue's hand-over).
    log = [("/api/chat", 1.0, 2.0, True), ("/api/chat", 2.0, 3.0, True), ("/api/chat", 3.0, 4.0, True)]
    assert most_at_once(log, since=0.0) == 1


def test_overlapping_calls_are_counted_together_and_others_ignored() -> None:
    log = [
        ("/api/chat", 1.0, 3.0, True),
        ("/api/chat", 1.1, 3.1, True),
        ("/api/chat", 1.2, 3.2, True),
        ("/api/ps", 1.5, 1.6, False),  # not a generation
        ("/api/chat", 0.1, 9.0, True),  # before the probe began
    ]
    assert most_at_once(log, since=1.0) == 3
