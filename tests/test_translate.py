"""The front door's translations, Ollama <-> job <-> OpenAI, each against what Ollama's own
server and its OpenAI layer (openai/openai.go, middleware/openai.go) give for the same input."""

import base64
import json
import struct

import pytest

from gpuq.errors import BadRequest, NotFound
from gpuq.front import endpoints, ollama_api, openai_api, shapes
from gpuq.front.endpoints import ENDPOINTS
from gpuq.jobs import normalize_model

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()


def sse_events(data: bytes) -> list:
    events = []
    for block in data.decode().split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            payload = block[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# -- request -> job ---------------------------------------------------------------------------


def test_the_jobs_prompt_is_the_last_user_message_of_a_chat():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second", "images": [PNG]},
            {"role": "tool", "content": "42"},
        ],
    }
    assert ENDPOINTS["/api/chat"].prompt(body) == "second [1 image]"
    parts = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}},
                ],
            }
        ],
    }
    assert ENDPOINTS["/v1/chat/completions"].prompt(parts) == "what is this? [1 image]"
    assert ENDPOINTS["/api/generate"].prompt({"model": "m", "prompt": "why"}) == "why"
    assert ENDPOINTS["/api/embed"].prompt({"model": "m", "input": ["a", "b"]}) == "a\nb"
    assert ENDPOINTS["/api/embeddings"].prompt({"model": "m", "prompt": "c"}) == "c"
    assert ENDPOINTS["/v1/embeddings"].prompt({"model": "m", "input": "d"}) == "d"


def test_kinds():
    assert [ENDPOINTS[e].kind for e in ("/api/chat", "/v1/completions", "/api/embed", "/v1/embeddings")] == [
        "task",
        "task",
        "embed",
        "embed",
    ]


def test_the_node_gets_the_clients_request_under_the_nodes_policy():
    body = {
        "model": "qwen3",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "keep_alive": "1h",
        "options": {"temperature": 0.2},
        "format": "json",
        "tools": [{"type": "function", "function": {"name": "f"}}],
    }
    route, sent = endpoints.node_request(
        "/api/chat", body, node_think=False, node_options={"num_ctx": 8192, "temperature": 1}
    )
    assert route == "/api/chat"
    assert sent == {
        "model": "qwen3",
        "messages": body["messages"],
        "stream": True,
        "keep_alive": 0,
        "options": {"num_ctx": 8192, "temperature": 0.2},
        "format": "json",
        "tools": body["tools"],
        "think": False,
    }
    assert body["keep_alive"] == "1h" and body["stream"] is False  # the stored request is untouched
    _, sent = endpoints.node_request(
        "/api/generate", {"model": "m", "prompt": "p", "think": "high", "raw": True}, node_think=False, keep_alive="10m"
    )
    assert sent == {"model": "m", "prompt": "p", "think": "high", "raw": True, "stream": True, "keep_alive": "10m"}
    route, sent = endpoints.node_request("/v1/embeddings", {"model": "e", "input": "x", "encoding_format": "base64"})
    assert (route, sent) == ("/api/embed", {"model": "e", "input": "x", "keep_alive": 0})


# -- OpenAI requests -> Ollama requests --------------------------------------------------------


def test_an_openai_chat_request_becomes_ollamas_chat_as_ollamas_layer_makes_it():
    body = {
        "model": "qwen3",
        "stream": True,
        "stop": "END",
        "max_tokens": 64,
        "seed": 7,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        "reasoning_effort": "minimal",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "-3C"},
        ],
    }
    out = openai_api.openai_chat_request(body)
    assert out["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "look"},  # each part a message of its own, as Ollama does
        {"role": "user", "content": "", "images": [PNG]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Oslo"}}, "id": "call_1"}],
        },
        {"role": "tool", "content": "-3C", "tool_name": "weather", "tool_call_id": "call_1"},
    ]
    assert out["options"] == {"stop": ["END"], "num_predict": 64, "temperature": 1.0, "seed": 7, "top_p": 1.0}
    assert out["format"] == {"type": "object"}
    assert out["think"] == "low" and out["stream"] is True


@pytest.mark.parametrize(
    "body, message",
    [
        ({"model": "m", "messages": []}, "[] is too short - 'messages'"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model is required"),
        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "invalid message content type: number"),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
                ],
            },
            "image URLs are not currently supported, please use base64 encoded data instead",
        ),
        (
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": "data:image/gif;base64,AA=="}]}
                ],
            },
            "invalid image input",
        ),
        (
            {
                "model": "m",
                "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}],
            },
            "invalid tool call arguments",
        ),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "reasoning_effort": "extreme"},
            'invalid reasoning value: "extreme"',
        ),
    ],
)
def test_openai_chat_requests_ollama_refuses_are_refused_with_its_message(body, message):
    with pytest.raises(BadRequest) as exc:
        openai_api.openai_chat_request(body)
    assert exc.value.message.startswith(message)


def test_reasoning_effort_as_think():
    assert [shapes.think_from_effort(e) for e in (None, "none", "minimal", "low", "high", "xhigh", "max")] == [
        None,
        False,
        "low",
        "low",
        "high",
        "max",
        "max",
    ]


def test_json_object_is_ollamas_json_format_and_temperature_is_kept():
    out = openai_api.openai_chat_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "temperature": 0,
            "top_p": 0.5,
            "response_format": {"type": "json_object"},
            "max_completion_tokens": 9,
        }
    )
    assert out["format"] == "json" and out["options"]["temperature"] == 0 and out["options"]["top_p"] == 0.5
    assert out["options"]["num_predict"] == 9


def test_an_openai_completion_and_embedding_request():
    out = openai_api.openai_completion_request(
        {"model": "m", "prompt": "def f(", "suffix": "return x", "stop": ["\n\n"], "stream": True}
    )
    assert out == {
        "model": "m",
        "prompt": "def f(",
        "suffix": "return x",
        "stream": True,
        "options": {"stop": ["\n\n"], "temperature": 1.0, "top_p": 1.0, "frequency_penalty": 0, "presence_penalty": 0},
    }
    with pytest.raises(BadRequest, match="invalid type for 'stop' field"):
        openai_api.openai_completion_request({"model": "m", "prompt": "x", "stop": [1]})
    assert openai_api.openai_embed_request({"model": "e", "input": "", "dimensions": 8}) == {
        "model": "e",
        "input": [""],
        "dimensions": 8,
    }
    for bad in ({"model": "e"}, {"model": "e", "input": []}, {"model": "e", "input": [1]}):
        with pytest.raises(BadRequest, match="invalid input"):
            openai_api.openai_embed_request(bad)
    with pytest.raises(BadRequest, match="Invalid value for 'encoding_format' = hex"):
        openai_api.openai_embed_request({"model": "e", "input": "x", "encoding_format": "hex"})


# -- checking Ollama requests ------------------------------------------------------------------


@pytest.mark.parametrize(
    "check, body, error, message",
    [
        (ollama_api.check_chat, {}, BadRequest, "model is required"),
        (ollama_api.check_chat, {"model": "m", "messages": "hi"}, BadRequest, "field 'messages' must be an array"),
        (
            ollama_api.check_chat,
            {"model": "m", "messages": [{"role": "user", "content": "x", "images": ["***"]}]},
            BadRequest,
            "messages[0].images: illegal base64 data",
        ),
        (
            ollama_api.check_chat,
            {"model": "m", "keep_alive": "300"},
            BadRequest,
            'time: missing unit in duration "300"',
        ),
        (ollama_api.check_chat, {"model": "m", "keep_alive": True}, BadRequest, "Unsupported type"),
        (ollama_api.check_chat, {"model": "m", "think": "very"}, BadRequest, "invalid think value"),
        (
            ollama_api.check_chat,
            {"model": "m", "options": {"num_ctx": "big"}},
            BadRequest,
            "field 'options': option 'num_ctx'",
        ),
        (ollama_api.check_generate, {}, NotFound, "model '' not found"),
        (
            ollama_api.check_generate,
            {"model": "m", "prompt": "x", "raw": True, "system": "s"},
            BadRequest,
            "raw mode does not support template, system, or context",
        ),
        (
            lambda b: ollama_api.check_embed(b, legacy=False),
            {"model": "m", "input": [1]},
            BadRequest,
            "invalid input type",
        ),
        (lambda b: ollama_api.check_embed(b, legacy=True), {}, BadRequest, "model is required"),
        # `wrong` is shapes.wrong here, not a name the options check binds (a 500 before: UnboundLocalError)
        (
            lambda b: ollama_api.check_embed(b, legacy=True),
            {"model": "m", "prompt": 3},
            BadRequest,
            "field 'prompt' must be a string",
        ),
        (
            lambda b: ollama_api.check_embed(b, legacy=False),
            {"model": "m", "options": {}, "dimensions": "8"},
            BadRequest,
            "field 'dimensions' must be a whole number",
        ),
    ],
)
def test_ollama_requests_are_checked_before_they_queue(check, body, error, message):
    with pytest.raises(error) as exc:
        check(body)
    assert exc.value.message.startswith(message)


def test_a_wrong_type_is_named_as_json_names_it_at_the_front_door_and_from_a_node():
    """One namer: a client's bool in the wrong place is a "boolean", as a node's is."""
    with pytest.raises(BadRequest) as exc:
        ollama_api.check_generate({"model": "m", "prompt": True})
    assert exc.value.message == "field 'prompt' must be a string, got boolean true"


def test_good_keep_alives_pass():
    for value in (None, 0, -1, 3.5, "5m", "1h30m", "-1m", "0", "250ms", ".5s"):
        ollama_api.check_keep_alive(value)


def test_an_empty_call_is_a_load_or_an_unload_answered_as_ollama_does():
    assert ollama_api.is_load_or_unload("/api/generate", {"model": "m", "prompt": ""})
    assert ollama_api.is_load_or_unload("/api/chat", {"model": "m", "messages": []})
    assert not ollama_api.is_load_or_unload("/api/chat", {"model": "m", "messages": [{"role": "user", "content": ""}]})
    assert ollama_api.is_load_or_unload("/api/embed", {"model": "m"})
    unload = ollama_api.load_or_unload_reply("/api/generate", {"model": "m", "prompt": "", "keep_alive": 0})
    assert {k: v for k, v in unload.items() if k != "created_at"} == {
        "model": "m",
        "response": "",
        "done": True,
        "done_reason": "unload",
    }
    load = ollama_api.load_or_unload_reply("/api/chat", {"model": "m", "messages": []})
    assert load["message"] == {"role": "assistant", "content": ""} and load["done_reason"] == "load"
    assert ollama_api.load_or_unload_reply("/api/embed", {"model": "m"}) == {"model": "m", "embeddings": []}


# -- Ollama replies ------------------------------------------------------------------------------

CHAT = [
    {
        "model": "q",
        "created_at": "2026-11-30T10:00:00.123456789Z",
        "message": {"role": "assistant", "content": "", "thinking": "Let me"},
        "done": False,
    },
    {
        "model": "q",
        "created_at": "2026-11-30T10:00:01Z",
        "message": {"role": "assistant", "content": "", "thinking": " think."},
        "done": False,
    },
    {
        "model": "q",
        "created_at": "2026-11-30T10:00:02Z",
        "message": {"role": "assistant", "content": "Hello"},
        "done": False,
    },
    {
        "model": "q",
        "created_at": "2026-11-30T10:00:03Z",
        "message": {"role": "assistant", "content": " there"},
        "done": False,
    },
    {
        "model": "q",
        "created_at": "2026-11-30T10:00:04Z",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "stop",
        "total_duration": 5,
        "prompt_eval_count": 10,
        "eval_count": 4,
    },
]


def test_stream_false_is_the_last_chunk_with_the_whole_text():
    reply = ollama_api.collected("/api/chat", CHAT, {})
    assert reply == {
        "model": "q",
        "created_at": "2026-11-30T10:00:04Z",
        "message": {"role": "assistant", "content": "Hello there", "thinking": "Let me think."},
        "done": True,
        "done_reason": "stop",
        "total_duration": 5,
        "prompt_eval_count": 10,
        "eval_count": 4,
    }
    gen = [
        {"model": "g", "response": "a", "done": False},
        {"model": "g", "response": "b", "thinking": "t", "done": False},
        {"model": "g", "response": "", "done": True, "done_reason": "length", "context": [1, 2]},
    ]
    assert ollama_api.collected("/api/generate", gen, {}) == {
        "model": "g",
        "response": "ab",
        "done": True,
        "done_reason": "length",
        "context": [1, 2],
        "thinking": "t",
    }


def test_tool_calls_are_gathered_when_the_request_had_tools():
    call = {"id": "call_a", "function": {"index": 0, "name": "weather", "arguments": {"city": "Oslo"}}}
    chunks = [
        {"model": "q", "message": {"role": "assistant", "content": "", "tool_calls": [call]}, "done": False},
        {"model": "q", "message": {"role": "assistant", "content": ""}, "done": True, "done_reason": "stop"},
    ]
    reply = ollama_api.collected("/api/chat", chunks, {"tools": [{"type": "function"}]})
    assert reply["message"]["tool_calls"] == [call]
    completion = openai_api.chat_completion("chatcmpl-1", reply)
    assert completion["choices"][0]["finish_reason"] == "tool_calls"
    assert completion["choices"][0]["message"]["tool_calls"] == [
        {
            "id": "call_a",
            "index": 0,
            "type": "function",
            "function": {"name": "weather", "arguments": '{"city":"Oslo"}'},
        }
    ]


def test_a_chat_completion_as_ollamas_layer_gives_it():
    completion = openai_api.chat_completion("chatcmpl-7", ollama_api.collected("/api/chat", CHAT, {}))
    assert completion == {
        "id": "chatcmpl-7",
        "object": "chat.completion",
        "created": 1796032804,
        "model": "q",
        "system_fingerprint": "fp_ollama",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello there", "reasoning": "Let me think."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
    }


def test_a_chat_stream_as_ollamas_layer_gives_it():
    stream = openai_api.ChatStream("chatcmpl-9", include_usage=True)
    events = sse_events(b"".join(stream.feed(c) for c in CHAT))
    created = 1796032800  # the first chunk's time, on every event
    assert all(e == "[DONE]" or e["created"] == created for e in events)
    deltas = [e["choices"][0]["delta"] for e in events if e != "[DONE]" and e["choices"]]
    assert deltas == [
        {"role": "assistant", "content": "", "reasoning": "Let me"},
        {"content": "", "reasoning": " think."},
        {"content": "Hello"},
        {"content": " there"},
        {},
    ]  # no empty chunk for the trailer
    finish = [e["choices"][0]["finish_reason"] for e in events if e != "[DONE]" and e["choices"]]
    assert finish == [None, None, None, None, "stop"]
    assert events[-2] == {
        "id": "chatcmpl-9",
        "object": "chat.completion.chunk",
        "created": created,
        "model": "q",
        "system_fingerprint": "fp_ollama",
        "choices": [],
        "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
    }
    assert events[-1] == "[DONE]"


def test_a_chunk_with_reasoning_and_content_is_split_in_two():
    stream = openai_api.ChatStream("c")
    events = sse_events(
        stream.feed(
            {
                "model": "q",
                "message": {"role": "assistant", "content": "A", "thinking": "T"},
                "done": True,
                "done_reason": "length",
            }
        )
    )
    assert [e["choices"][0]["delta"] for e in events[:-1]] == [
        {"role": "assistant", "reasoning": "T"},
        {"content": "A"},
        {},
    ]
    assert events[2]["choices"][0]["finish_reason"] == "length" and events[-1] == "[DONE]"


def test_completions_and_their_stream():
    gen = [
        {"model": "g", "created_at": "2026-11-30T10:00:00Z", "response": "x", "done": False},
        {
            "model": "g",
            "created_at": "2026-11-30T10:00:01Z",
            "response": "",
            "done": True,
            "done_reason": "stop",
            "prompt_eval_count": 3,
            "eval_count": 1,
        },
    ]
    reply = openai_api.text_completion("cmpl-1", ollama_api.collected("/api/generate", gen, {}))
    assert reply["choices"] == [{"text": "x", "index": 0, "finish_reason": "stop"}]
    assert reply["object"] == "text_completion" and reply["usage"]["total_tokens"] == 4
    events = sse_events(b"".join(openai_api.CompletionStream("cmpl-1").feed(c) for c in gen))
    assert [e["choices"][0]["text"] for e in events[:-1]] == ["x", ""] and events[-1] == "[DONE]"
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]] == [None, "stop"]


def test_embeddings_as_floats_and_as_base64():
    reply = {"model": "e", "embeddings": [[0.5, -0.25], [1.0, 0.0]], "prompt_eval_count": 6}
    floats = openai_api.embedding_list("e", reply)
    assert floats == {
        "object": "list",
        "model": "e",
        "usage": {"prompt_tokens": 6, "total_tokens": 6},
        "data": [
            {"object": "embedding", "embedding": [0.5, -0.25], "index": 0},
            {"object": "embedding", "embedding": [1.0, 0.0], "index": 1},
        ],
    }
    packed = openai_api.embedding_list("e", reply, "base64")["data"][0]["embedding"]
    assert list(struct.unpack("<2f", base64.b64decode(packed))) == [0.5, -0.25]


def test_models_as_openai_lists_them():
    tags = [
        {"name": "qwen3:latest", "model": "qwen3:latest", "modified_at": "2026-11-30T10:00:00Z"},
        {"name": "me/tuned:q4", "model": "me/tuned:q4", "modified_at": "2026-11-29T10:00:00+01:00"},
        {"name": "hf.co/org/repo:Q8", "model": "hf.co/org/repo:Q8"},
    ]
    listed = openai_api.model_list(tags)
    assert [(m["id"], m["owned_by"]) for m in listed["data"]] == [
        ("qwen3:latest", "library"),
        ("me/tuned:q4", "me"),
        ("hf.co/org/repo:Q8", "org"),
    ]
    assert listed["object"] == "list" and listed["data"][1]["created"] == 1796032800 - 86400 - 3600
    assert openai_api.model_card("qwen3", {"modified_at": "2026-11-30T10:00:00Z"}) == {
        "id": "qwen3",
        "object": "model",
        "created": 1796032800,
        "owned_by": "library",
    }


def test_the_nodes_models_each_once_newest_first():
    node1 = [{"name": "qwen3:latest", "model": "qwen3:latest", "modified_at": "2026-11-01T00:00:00Z", "size": 1}]
    node2 = [
        {"name": "Qwen3", "model": "Qwen3", "modified_at": "2026-11-20T00:00:00Z", "size": 2},
        {"name": "llama3.2:latest", "model": "llama3.2:latest", "modified_at": "2026-11-10T00:00:00Z"},
    ]
    merged = ollama_api.merged_tags([node1, node2], normalize_model)
    assert [(m["name"], m.get("size")) for m in merged] == [("llama3.2:latest", None), ("qwen3:latest", 1)]
    ps = ollama_api.merged_ps(
        [[{"name": "a", "expires_at": "2026-11-30T10:00:00Z"}], [{"name": "b", "expires_at": "2026-11-30T11:00:00Z"}]]
    )
    assert [m["name"] for m in ps] == ["b", "a"]


def test_errors_in_each_apis_shape():
    assert ollama_api.ollama_error("model 'x' not found") == {"error": "model 'x' not found"}
    assert openai_api.openai_error(404, "model 'x' not found") == {
        "error": {"message": "model 'x' not found", "type": "not_found_error", "param": None, "code": None}
    }
    assert openai_api.openai_error(400, "bad")["error"]["type"] == "invalid_request_error"
    assert openai_api.openai_error(499, "deleted", "job_cancelled")["error"] == {
        "message": "deleted",
        "type": "api_error",
        "param": None,
        "code": "job_cancelled",
    }


@pytest.mark.parametrize(
    "think, message",
    [
        ("max", None),  # Ollama's fourth level (api/types.go ThinkValue), taken at the door as in the API
        ("lots", 'invalid think value: "lots" (must be "high", "medium", "low", "max", true, or false)'),
        (3, 'think must be a boolean or string ("high", "medium", "low", "max", true, or false)'),
    ],
)
def test_the_front_door_checks_think_with_the_routers_one_check(think, message):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "think": think}
    if message is None:
        ollama_api.check_chat(body)
        return
    with pytest.raises(BadRequest) as exc:
        ollama_api.check_chat(body)
    assert exc.value.message == message


# -- what a front-door job is titled (gpuq/front/titles.py) ---------------------------------------


def test_a_jobs_title_is_the_persons_last_words_in_each_apis_shape():
    from gpuq.front.titles import chat_prompt, messages_prompt, responses_prompt

    reminder = "<system-reminder>\nthe date is today\n</system-reminder>\n"
    # Anthropic: reminders and tool results are not the person's; the last words are
    anthropic_body = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": reminder}, {"type": "text", "text": "say hi"}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
        ]
    }
    assert messages_prompt(anthropic_body) == "say hi"
    assert messages_prompt({"messages": [{"role": "user", "content": reminder + "fix the bug"}]}) == "fix the bug"
    # An agent's side call says so: a title asked with no tools (by its system prompt or by a
    # `title` schema), a quota probe; a turn with tools whose system mentions titles is a turn
    asks = {"system": "Generate a concise title for this conversation.", "messages": [{"role": "user", "content": "x"}]}
    assert messages_prompt(asks) == "side call (title): x"
    schema = {"format": {"type": "json_schema", "schema": {"properties": {"title": {"type": "string"}}}}}
    session = {"role": "user", "content": "<session>\nfix it\n</session>\n\nWrite the title."}
    assert messages_prompt({"output_config": schema, "messages": [session], "tools": []}) == "side call (title): fix it"
    assert messages_prompt({**asks, "tools": [{"name": "Read"}]}) == "x"
    assert messages_prompt({"max_tokens": 1, "messages": [{"role": "user", "content": "quota"}]}) == (
        "side call (quota probe)"
    )
    assert messages_prompt({"max_tokens": 100, "messages": [{"role": "user", "content": "quota"}]}) == "quota"
    # Responses: Codex's environment and AGENTS.md messages, and tool outputs, are skipped
    codex = {
        "input": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_text",
                        "text": "# AGENTS.md instructions for /w\n\n<INSTRUCTIONS>\nbe nice\n</INSTRUCTIONS>",
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "<environment_context>\n<cwd>/w</cwd>\n</environment_context>"}
                ],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "run the tests"}]},
            {"type": "function_call", "call_id": "c", "name": "exec_command", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ]
    }
    assert responses_prompt(codex) == "run the tests"
    assert responses_prompt({"input": "plain"}) == "plain"
    # chat (Ollama's and OpenAI's): tool messages are not the user's; images are counted
    chat = {
        "messages": [
            {"role": "user", "content": "look", "images": ["aGk="]},
            {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]},
            {"role": "tool", "content": "result"},
            {"role": "user", "content": reminder},
        ]
    }
    assert chat_prompt(chat) == "look [1 image]"
    parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    assert chat_prompt(parts) == "a\nb"
    # nothing of the person's at all: the last user text as it is
    assert chat_prompt({"messages": [{"role": "user", "content": reminder}]}).startswith("<system-reminder>")


def test_model_names_parse_as_ollamas():
    from gpuq.errors import BadRequest, FrontError
    from gpuq.front.names import aliased, local_name

    assert local_name(" qwen3:8b:local ") == "qwen3:8b" and local_name("hf.co/org/m:Q4_K_M") == "hf.co/org/m:Q4_K_M"
    assert local_name("registry.example.com:5000/ns/m:tag") == "registry.example.com:5000/ns/m:tag"
    for bad in ("bad name", "a:b:c", "x/y/z/w", "ns.dot/m", "m:", "-m", "m:tag!"):
        with pytest.raises(BadRequest, match="^invalid model name$"):
            local_name(bad)
    with pytest.raises(FrontError) as cloud:
        local_name("gpt-oss:120b-cloud")
    assert cloud.value.status == 403
    aliases = (("claude-*", "qwen3:8b"), ("*", "llama3.2"))
    present = {"qwen3-coder:30b"}.__contains__
    assert aliased("Claude-Opus-4-8", aliases, present) == "qwen3:8b"  # without case
    assert aliased("mistral", aliases, present) == "llama3.2"  # the first pattern that matches
    assert aliased("qwen3-coder:30b", aliases, present) == "qwen3-coder:30b"  # a node has it
