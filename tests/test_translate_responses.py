"""gpuq/front/responses.py against shapes from Ollama's own tests (openai/responses_test.go, cited by
test name): a Responses request -> the /api/chat body, the chat chunks -> the event stream and
the one response."""

from __future__ import annotations

import json

import pytest

from gpuq.errors import BadRequest
from gpuq.front.responses import ResponsesStream, responses_request, whole_response


def events(data: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in data.decode().split("\n\n"):
        if block:
            kind, payload = block.split("\n")
            assert kind.startswith("event: ") and payload.startswith("data: ")
            out.append((kind[len("event: ") :], json.loads(payload[len("data: ") :])))
    return out


def chunk(content: str = "", thinking: str = "", calls: list | None = None, done: bool = False, **extra) -> dict:
    message = {"role": "assistant", "content": content, **({"thinking": thinking} if thinking else {})}
    if calls:
        message["tool_calls"] = calls
    return {"model": "gpt-oss:20b", "created_at": "2026-01-01T00:00:00Z", "message": message, "done": done, **extra}


def test_instructions_input_options_and_format():
    # TestFromResponsesRequest_Instructions, _MaxOutputTokens, _TextFormatJsonSchema, _ReasoningEffort
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    out = responses_request(
        {
            "model": "m",
            "instructions": "be brief",
            "input": "hi",
            "max_output_tokens": 7,
            "top_p": 0.5,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
            "reasoning": {"effort": "minimal"},
        }
    )
    assert out == {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "options": {"temperature": 1.0, "top_p": 0.5, "num_predict": 7},
        "stream": False,
        "format": schema,
        "think": "low",
    }
    assert "format" not in responses_request({"model": "m", "input": "x", "text": {"format": {"type": "text"}}})


def test_a_message_replayed_between_a_call_and_its_output_joins_the_call():
    # TestFromResponsesRequestMergesMessageAfterFunctionCall
    out = responses_request(
        {
            "model": "kimi-k3:cloud",
            "input": [
                {"role": "user", "content": "Find Ollama and inspect the current directory."},
                {
                    "type": "web_search_call",
                    "id": "ws_test",
                    "status": "completed",
                    "action": {"type": "search", "query": "Ollama"},
                },
                {"type": "function_call", "call_id": "call_test", "name": "exec_command", "arguments": '{"cmd":"pwd"}'},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "I found Ollama and will inspect the directory."}],
                },
                {"type": "function_call_output", "call_id": "call_test", "output": "/tmp"},
            ],
        }
    )
    assert out["messages"][1:] == [
        {
            "role": "assistant",
            "content": "I found Ollama and will inspect the directory.",
            "tool_calls": [{"id": "call_test", "function": {"name": "exec_command", "arguments": {"cmd": "pwd"}}}],
        },
        {"role": "tool", "content": "/tmp", "tool_call_id": "call_test"},
    ]


def test_reasoning_joins_the_next_assistant_message_and_outputs_may_be_parts():
    # TestFromResponsesRequest_ReasoningMerge, _FunctionCallOutputContentArray
    out = responses_request(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "q"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "mulling"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": ""},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": [
                        {"type": "input_text", "text": "part one, "},
                        {"type": "input_text", "text": "part two"},
                    ],
                },
            ],
        }
    )
    assert out["messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {}}}],
            "thinking": "mulling",
        },
        {"role": "tool", "content": "part one, part two", "tool_call_id": "c1"},
    ]


def test_tools_flat_and_namespaced():
    # TestFromResponsesRequest_Tools, _NamespaceTools
    params = {"type": "object", "properties": {"city": {"type": "string"}}}
    out = responses_request(
        {
            "model": "m",
            "input": "x",
            "tools": [
                {"type": "function", "name": "get_weather", "description": "w", "parameters": params},
                {
                    "type": "namespace",
                    "name": "fs",
                    "tools": [{"type": "function", "name": "read", "parameters": params}],
                },
            ],
        }
    )
    assert out["tools"] == [
        {"type": "function", "function": {"name": "get_weather", "description": "w", "parameters": params}},
        {"type": "function", "function": {"name": "fs.read", "description": "", "parameters": params}},
    ]


@pytest.mark.parametrize(
    "body, message",
    [
        ({"input": "x"}, "model is required"),
        ({"model": "m", "input": [{"content": "no type"}]}, "input item missing required 'type' field"),
        ({"model": "m", "input": [{"type": "nope"}]}, 'input[0]: unknown input item type: "nope"'),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "file inputs are not currently supported",
        ),
        (
            {
                "model": "m",
                "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}],
            },
            "image URLs are not currently supported, please use base64 encoded data instead",
        ),
        (
            {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
            "failed to parse function call arguments: Expecting property name enclosed in double quotes: line 1 column 2 "
            "(char 1)",
        ),
        (
            {
                "model": "m",
                "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[" * 100_000}],
            },
            "malformed JSON: nested too deeply",
        ),  # (a 400, not the 500 of an escaped RecursionError)
        (
            {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]},
            "expected a JSON object, got array",
        ),
        ({"model": "m", "input": "x", "reasoning": {"effort": "huge"}}, "invalid reasoning value"),
    ],
)
def test_bad_requests_name_what_is_wrong(body, message):
    with pytest.raises(BadRequest) as exc:
        responses_request(body)
    assert message in exc.value.message


def test_text_stream_events_in_order():
    # TestResponsesStreamConverter_TextOnly, _SequenceNumbers
    stream = ResponsesStream("resp_123", "msg_456", {"model": "gpt-oss:20b"})
    first = events(stream.feed(chunk("Hello")))
    assert [k for k, _ in first] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert [k for k, _ in events(stream.feed(chunk(" World")))] == ["response.output_text.delta"]
    last = events(stream.feed(chunk(done=True, done_reason="stop", prompt_eval_count=3, eval_count=2)))
    assert [k for k, _ in last] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert last[0][1]["text"] == "Hello World"
    assert [d["sequence_number"] for _, d in first + last] == [0, 1, 2, 3, 4, 6, 7, 8, 9]
    completed = last[-1][1]["response"]
    assert completed["status"] == "completed" and completed["output"][0]["content"][0]["text"] == "Hello World"
    assert completed["usage"]["total_tokens"] == 5 and completed["id"] == "resp_123"


def test_tool_call_stream_events():
    # TestResponsesStreamConverter_ToolCalls, _FunctionCallStatus
    stream = ResponsesStream("resp_123", "msg_456", {"model": "m"})
    call = {"id": "call_abc", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    got = events(stream.feed(chunk(calls=[call])))
    assert [k for k, _ in got] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert got[2][1]["item"]["status"] == "in_progress" and got[5][1]["item"]["status"] == "completed"
    assert got[5][1]["item"]["arguments"] == '{"city":"Paris"}' and got[5][1]["item"]["call_id"] == "call_abc"
    assert events(stream.feed(chunk("ignored after a call"))) == []
    final = events(stream.feed(chunk(done=True)))
    assert [k for k, _ in final] == ["response.completed"]
    assert [i["type"] for i in final[0][1]["response"]["output"]] == ["function_call"]


def test_reasoning_closes_before_the_message():
    # TestResponsesStreamConverter_Reasoning
    stream = ResponsesStream("resp_123", "msg_456", {"model": "m"})
    got = events(stream.feed(chunk(thinking="Let me think...")))
    assert [k for k, _ in got][2:] == ["response.output_item.added", "response.reasoning_summary_text.delta"]
    assert got[2][1]["item"]["type"] == "reasoning"
    got = events(stream.feed(chunk("The answer is 42")))
    assert [k for k, _ in got] == [
        "response.reasoning_summary_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ]
    assert got[1][1]["item"]["encrypted_content"] == "Let me think..."
    assert got[2][1]["output_index"] == 1


def test_whole_response_with_reasoning():
    # TestToResponse_WithReasoning
    reply = chunk(
        "The answer is 42",
        thinking="Let me think...",
        done=True,
        done_reason="stop",
        prompt_eval_count=10,
        eval_count=5,
    )
    out = whole_response("resp_123", "msg_456", reply, {"model": "gpt-oss:20b", "instructions": "x"})
    assert [i["type"] for i in out["output"]] == ["reasoning", "message"]
    assert out["output"][0] == {
        "id": "rs_resp_123",
        "type": "reasoning",
        "encrypted_content": "Let me think...",
        "summary": [{"type": "summary_text", "text": "Let me think..."}],
    }
    assert out["output"][1]["content"][0]["text"] == "The answer is 42" and out["output"][1]["id"] == "msg_456"
    assert out["usage"]["input_tokens"] == 10 and out["instructions"] == "x" and out["completed_at"]
    assert out["created_at"] == 1767225600 and out["temperature"] == 1.0 and out["tools"] == []


def test_a_failed_stream_ends_with_response_failed():
    stream = ResponsesStream("resp_1", "msg_1", {"model": "m"})
    got = events(stream.error(410, "gpuq job 1 was deleted", "job_cancelled"))
    assert [k for k, _ in got] == ["response.created", "response.in_progress", "response.failed"]
    failed = got[-1][1]
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "job_cancelled", "message": "gpuq job 1 was deleted"}
    assert failed["error"]["message"] == "gpuq job 1 was deleted"  # what the OpenAI SDK raises
