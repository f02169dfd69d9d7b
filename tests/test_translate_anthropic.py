"""gpuq/front/anthropic.py against shapes from Ollama's own tests (anthropic/anthropic_test.go,
cited by test name): a Messages request -> the /api/chat body, the chat chunks -> the event
stream and the one message, errors and stop reasons."""

from __future__ import annotations

import json

import pytest
from test_translate_responses import events  # (the one reader of named SSE events)

from gpuq.errors import BadRequest
from gpuq.front.anthropic import (
    MessagesStream,
    anthropic_error,
    estimate_input_tokens,
    messages_request,
    relaxes_thinking,
    stop_reason,
    whole_message,
)


def labels(data: bytes) -> list[str]:
    """As TestStreamConverter_TextBeforeThinking writes them: event:block type:index."""
    out = []
    for kind, d in events(data):
        if kind == "content_block_start":
            out.append(f"{kind}:{d['content_block']['type']}:{d['index']}")
        elif kind == "content_block_delta":
            out.append(f"{kind}:{d['delta']['type']}:{d['index']}")
        elif kind == "content_block_stop":
            out.append(f"{kind}:{d['index']}")
        else:
            out.append(kind)
    return out


def chunk(content: str = "", thinking: str = "", calls: list | None = None, done: bool = False, **extra) -> dict:
    message = {"role": "assistant", "content": content, **({"thinking": thinking} if thinking else {})}
    if calls:
        message["tool_calls"] = calls
    return {"model": "test-model", "message": message, "done": done, **extra}


def test_basic_system_and_options():
    # TestFromMessagesRequest_Basic, _WithSystemPromptArray, _WithOptions
    out = messages_request(
        {
            "model": "test-model",
            "max_tokens": 1024,
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["\n", "END"],
            "system": [{"type": "text", "text": "You are helpful. "}, {"type": "text", "text": "Be concise."}],
            "messages": [{"role": "user", "content": "Hello"}],
        }
    )
    assert out == {
        "model": "test-model",
        "stream": False,
        "messages": [
            {"role": "system", "content": "You are helpful. Be concise."},
            {"role": "user", "content": "Hello"},
        ],
        "options": {"num_predict": 1024, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "stop": ["\n", "END"]},
    }


def test_a_tool_result_before_the_users_text():
    # TestFromMessagesRequest_WithToolResultFollowedByUserText
    out = messages_request(
        {
            "model": "test-model",
            "max_tokens": 1024,
            "messages": [
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "call_read",
                            "name": "Read",
                            "input": {"file_path": "/Users/hoyyeva/Desktop/aaa.png"},
                        }
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "call_read", "content": "Read image (311.5KB)"},
                        {"type": "text", "text": "Please describe it."},
                    ],
                },
            ],
        }
    )
    assert out["messages"] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_read",
                    "function": {"name": "Read", "arguments": {"file_path": "/Users/hoyyeva/Desktop/aaa.png"}},
                }
            ],
        },
        {"role": "tool", "content": "Read image (311.5KB)", "tool_call_id": "call_read"},
        {"role": "user", "content": "Please describe it."},
    ]


def test_images_tools_and_thinking():
    # TestFromMessagesRequest_WithImage, _WithTools, _WithThinking, _ThinkingOnlyBlock
    out = messages_request(
        {
            "model": "m",
            "max_tokens": 10,
            "thinking": {"type": "enabled", "budget_tokens": 1000},
            "tools": [{"name": "get_weather", "description": "Get weather", "input_schema": {"type": "object"}}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What's this?"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "aGVsbG8="}},
                    ],
                },
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}]},
            ],
        }
    )
    assert out["messages"] == [
        {"role": "user", "content": "What's this?", "images": ["aGVsbG8="]},
        {"role": "assistant", "content": "", "thinking": "hmm"},
    ]
    assert out["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "Get weather", "parameters": {"type": "object"}},
        }
    ]
    assert out["think"] is True


@pytest.mark.parametrize(
    "body, think",
    [
        ({"output_config": {"effort": "medium"}}, "medium"),  # _WithOutputConfigEffort
        ({"output_config": {"effort": "xhigh"}}, "high"),  # _WithOutputConfigEffortXHighMapsToHigh
        (
            {"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}},
            False,
        ),  # _ThinkingDisabledOverrides...
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "low"}}, "low"),  # _ThinkingAdaptiveUses...
        ({}, None),
    ],
)
def test_thinking_and_effort(body, think):
    out = messages_request({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], **body})
    assert out.get("think") == think


@pytest.mark.parametrize(
    "body, message",
    [
        ({"max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}, "model is required"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens is required and must be positive"),
        ({"model": "m", "max_tokens": 10, "messages": []}, "messages is required"),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}],
            },
            "tool_use block missing required 'id' field",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "input": {}}]}],
            },
            "tool_use block missing required 'name' field",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x"}}]}
                ],
            },
            "invalid image source type: url. Only base64 images are supported.",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "t", "input_schema": "nope"}],
            },
            'invalid input_schema for tool "t"',
        ),
    ],
)
def test_bad_requests_name_what_is_wrong(body, message):
    with pytest.raises(BadRequest) as exc:
        messages_request(body)
    assert message in exc.value.message


def test_server_tools_are_left_out_and_the_turn_goes_on():
    """Claude Code's WebSearch (web_search_20250305) and Anthropic's other server tools run on
    Anthropic's servers; no server here runs them, so the model is offered only the client's
    own tools, and a request with nothing else has no tools at all."""
    from gpuq.front.responses import responses_request

    body = {
        "model": "m",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "x"}],
        "tools": [
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
            {"type": "web_fetch_20250910", "name": "web_fetch"},
            {"type": "code_execution_20250825", "name": "code_execution"},
            {"name": "Read", "description": "read a file", "input_schema": {"type": "object"}},
        ],
    }
    assert [t["function"]["name"] for t in messages_request(body)["tools"]] == ["Read"]
    assert "tools" not in messages_request(dict(body, tools=body["tools"][:1]))
    assert "tools" not in responses_request({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})


def test_text_before_thinking_stream():
    # TestStreamConverter_TextBeforeThinking
    stream = MessagesStream("msg_123", "test-model", 0)
    got = []
    for c in (
        chunk("---\n"),
        chunk(thinking="Let me think."),
        chunk("The answer.", done=True, done_reason="stop", prompt_eval_count=10, eval_count=5),
    ):
        got += labels(stream.feed(c))
    assert got == [
        "message_start",
        "content_block_start:text:0",
        "content_block_delta:text_delta:0",
        "content_block_stop:0",
        "content_block_start:thinking:1",
        "content_block_delta:thinking_delta:1",
        "content_block_stop:1",
        "content_block_start:text:2",
        "content_block_delta:text_delta:2",
        "content_block_stop:2",
        "message_delta",
        "message_stop",
    ]


def test_thinking_directly_followed_by_a_tool_call_stream():
    # TestStreamConverter_ThinkingDirectlyFollowedByToolCall
    stream = MessagesStream("msg_123", "test-model", 0)
    first = stream.feed(chunk(thinking="I should call the tool."))
    assert labels(first) == ["message_start", "content_block_start:thinking:0", "content_block_delta:thinking_delta:0"]
    call = {"id": "call_abc", "function": {"name": "ask_user", "arguments": {"question": "cats or dogs?"}}}
    second = stream.feed(chunk(calls=[call], done=True, done_reason="stop", prompt_eval_count=10, eval_count=5))
    assert labels(second) == [
        "content_block_stop:0",
        "content_block_start:tool_use:1",
        "content_block_delta:input_json_delta:1",
        "content_block_stop:1",
        "message_delta",
        "message_stop",
    ]
    got = events(second)
    assert got[1][1]["content_block"] == {"type": "tool_use", "id": "call_abc", "name": "ask_user", "input": {}}
    assert json.loads(got[2][1]["delta"]["partial_json"]) == {"question": "cats or dogs?"}
    assert got[4][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use"},
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def test_message_start_uses_the_estimate_until_the_node_counts():
    # TestStreamConverter_Basic; EstimateCountTokens: "user" + "Hello, world!" = 17 chars / 4 = 4
    body = {"messages": [{"role": "user", "content": "Hello, world!"}]}
    assert estimate_input_tokens(body) == 4
    start = events(MessagesStream("msg_1", "test-model", estimate_input_tokens(body)).feed(chunk("hi")))[0][1]
    assert start["message"] == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": [],
        "usage": {"input_tokens": 4, "output_tokens": 0},
    }


def test_whole_message():
    # TestToMessagesResponse_Basic, _WithToolCalls, _WithThinking
    call = {"id": "call_123", "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}
    out = whole_message(
        "msg_1",
        chunk(
            "Hello", thinking="mull", calls=[call], done=True, done_reason="stop", prompt_eval_count=10, eval_count=5
        ),
    )
    assert out == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "test-model",
        "content": [
            {"type": "thinking", "thinking": "mull"},
            {"type": "text", "text": "Hello"},
            {"type": "tool_use", "id": "call_123", "name": "get_weather", "input": {"location": "Paris"}},
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


@pytest.mark.parametrize(
    "reason, calls, want",
    [  # TestMapStopReason
        ("stop", False, "end_turn"),
        ("length", False, "max_tokens"),
        ("stop", True, "tool_use"),
        ("other", False, "stop_sequence"),
        ("", False, None),
    ],
)
def test_stop_reasons(reason, calls, want):
    assert stop_reason(reason, calls) == want


@pytest.mark.parametrize(
    "status, kind",
    [  # TestNewError
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (503, "overloaded_error"),
        (529, "overloaded_error"),
        (410, "api_error"),
    ],
)
def test_errors(status, kind):
    out = anthropic_error(status, "test message")
    assert out["type"] == "error" and out["error"] == {"type": kind, "message": "test message"}
    assert out["request_id"].startswith("req_")


def test_a_failed_stream_ends_with_an_error_event():
    got = events(MessagesStream("msg_1", "m", 1).error(410, "gpuq job 1 was deleted"))
    assert got == [("error", {"type": "error", "error": {"type": "api_error", "message": "gpuq job 1 was deleted"}})]


def test_only_anthropic_calls_relax_thinking():
    refusal = '"qwen3-coder:30b" does not support thinking'
    assert relaxes_thinking("/v1/messages", True, 400, refusal)
    assert relaxes_thinking("/v1/messages", "high", 400, refusal)
    assert not relaxes_thinking("/v1/chat/completions", True, 400, refusal)
    assert not relaxes_thinking("/v1/messages", None, 400, refusal)
    assert not relaxes_thinking("/v1/messages", True, 500, "out of memory")
