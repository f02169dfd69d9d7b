"""OpenAI's Responses API (POST /v1/responses) through the front door with the real OpenAI SDK
(`client.responses.create`, as the Agents SDK and Codex CLI call it), against the real daemon and
simulated Ollama nodes on loopback. Each call is a job like a chat completion."""

from __future__ import annotations

import openai
import pytest
from test_front import CHAT_MODEL, front, start_front_lab_with_token, start_thinking_lab  # noqa: F401 (front: the fixture)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "the weather now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def test_a_response_whole_and_streamed_each_a_job(front):
    client = front.openai()
    response = await client.responses.create(model=CHAT_MODEL, instructions="be brief", input="hello responses")
    assert response.status == "completed" and response.output_text.strip()
    assert response.instructions == "be brief" and response.model == CHAT_MODEL
    assert response.usage.output_tokens == len(response.output_text.split()) and response.usage.input_tokens > 0
    job = await front.job_with("hello responses", "done")
    assert response.id == f"resp_{job['id']}"
    # The node got a chat: the instructions as its system message (FromResponsesRequest).
    sent = [b for b in front.fakes["node-1"].requests if b["messages"][-1]["content"] == "hello responses"][-1]
    assert sent["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello responses"},
    ]
    assert sent["stream"] is True and sent["keep_alive"] == 300 and sent["options"]["temperature"] == 1.0

    stream = await client.responses.create(
        model=CHAT_MODEL, stream=True, max_output_tokens=50, input=[{"role": "user", "content": "stream a response"}]
    )
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    completed = events[-1].response
    assert text.strip() and completed.output_text == text and completed.max_output_tokens == 50

    job = await front.job_with("stream a response", "done")
    detail = await front.daemon.job(job["id"])
    assert detail["output"] == text and detail["endpoint"] == "/v1/responses"
    assert detail["request"]["body"]["input"] == [{"role": "user", "content": "stream a response"}]
    assert detail["events"][0]["actor"] == "openai 127.0.0.1"
    sent = [b for b in front.fakes["node-1"].requests if b["messages"][-1]["content"] == "stream a response"][-1]
    assert sent["options"]["num_predict"] == 50


async def test_the_stream_helper_gives_the_final_response(front):
    async with front.openai().responses.stream(model=CHAT_MODEL, input="helper stream") as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_response()
    assert final.status == "completed" and final.output_text.strip()


async def test_a_tool_call_round_trip(front):
    fake = front.fakes["node-1"]
    fake.script.tool_call = ("get_weather", {"city": "Paris"})
    client = front.openai()
    first = await client.responses.create(model=CHAT_MODEL, input="weather in Paris?", tools=[WEATHER])
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].arguments == '{"city":"Paris"}'
    assert calls[0].call_id.startswith("call_") and first.tools[0].name == "get_weather"
    sent = fake.requests[-1]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": "the weather now", "parameters": WEATHER["parameters"]},
        }
    ]

    # The result goes back as function_call_output: the node sees the call and a tool message.
    second = await client.responses.create(
        model=CHAT_MODEL,
        tools=[WEATHER],
        input=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": "get_weather",
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "rain, 8C"},
        ],
    )
    assert second.output_text.strip()
    assert fake.requests[-1]["messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": calls[0].call_id, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": "rain, 8C", "tool_call_id": calls[0].call_id},
    ]

    stream = await client.responses.create(model=CHAT_MODEL, input="weather in Lyon?", tools=[WEATHER], stream=True)
    events = [e async for e in stream]
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == ["function_call"] and done[0].arguments == '{"city":"Paris"}'
    assert events[-1].type == "response.completed" and events[-1].response.output[0].name == "get_weather"


async def test_reasoning_from_a_thinking_model(fakes, daemon_factory):
    lab = await start_thinking_lab(fakes, daemon_factory)
    node, daemon = lab.fakes["node-1"], lab.daemon
    try:
        client = lab.openai()
        response = await client.responses.create(model="qwen3:8b", input="reason first", reasoning={"effort": "high"})
        reasoning = response.output[0]
        assert reasoning.type == "reasoning" and reasoning.summary[0].text.strip()
        assert response.output[1].type == "message" and response.output_text.strip()
        assert response.reasoning.effort == "high" and node.requests[-1]["think"] == "high"
        job = await daemon.job((await lab.job_with("reason first", "done"))["id"])
        assert job["thinking"] == reasoning.summary[0].text and job["output"] == response.output_text

        stream = await client.responses.create(model="qwen3:8b", input="reason in a stream", stream=True)
        events = [e async for e in stream]
        thought = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert thought.strip() and text.strip()
        assert [i.type for i in events[-1].response.output] == ["reasoning", "message"]
        kinds = [e.type for e in events]  # the reasoning item closes before the message opens
        assert kinds.index("response.reasoning_summary_text.done") < kinds.index("response.content_part.added")
        # Reasoning passed back joins the next assistant message (FromResponsesRequest).
        await client.responses.create(
            model="qwen3:8b",
            input=[
                {"role": "user", "content": "reason in a stream"},
                {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": thought},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]},
                {"role": "user", "content": "and then?"},
            ],
        )
        assert node.requests[-1]["messages"][1] == {"role": "assistant", "content": text, "thinking": thought}
    finally:
        await lab.close()


async def test_a_missing_model_is_404_as_the_sdk_raises_it_and_no_job(front):
    with pytest.raises(openai.NotFoundError) as exc:
        await front.openai().responses.create(model="nope:1b", input="to no model")
    assert exc.value.status_code == 404 and exc.value.body["message"] == "model 'nope:1b' not found"
    assert exc.value.body["type"] == "not_found_error"
    with pytest.raises(openai.BadRequestError) as exc:
        await front.openai().responses.create(
            model=CHAT_MODEL, input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f1"}]}]
        )
    assert exc.value.body["message"] == "file inputs are not currently supported"
    assert not [j for j in await front.jobs() if j["model"] == "nope:1b"]


async def test_the_token_is_required_and_accepted(fakes, daemon_factory):
    lab = await start_front_lab_with_token(fakes, daemon_factory, "s3cret")
    try:
        with pytest.raises(openai.AuthenticationError):
            await lab.openai(api_key="wrong").responses.create(model=CHAT_MODEL, input="no")
        response = await lab.openai(api_key="s3cret").responses.create(model=CHAT_MODEL, input="with the key")
        assert response.output_text.strip()
    finally:
        await lab.close()


async def test_a_delete_while_streaming_ends_the_stream_with_an_error_the_sdk_raises(front):
    async def read(got):
        stream = await front.openai().responses.create(model=CHAT_MODEL, input="doomed response", stream=True)
        async for item in stream:
            got.append(item)

    job, raised, _ = await front.delete_mid_stream(
        "doomed response", read, lambda got: sum(e.type == "response.output_text.delta" for e in got) >= 2
    )
    assert isinstance(raised, openai.APIError)
    assert raised.message == f"gpuq job {job['id']} was deleted by cli 127.0.0.1: request canceled"
    assert raised.body["code"] == "job_cancelled"
