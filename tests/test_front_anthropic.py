"""Anthropic's Messages API (POST /v1/messages) through the front door with the real `anthropic`
SDK (as Claude Code pointed at Ollama calls it: ANTHROPIC_BASE_URL at the front door), against the
real daemon and simulated Ollama nodes on loopback. Each call is a job like a chat completion."""

from __future__ import annotations

import anthropic
import openai
import pytest
from test_front import CHAT_MODEL, FrontLab, front, start_front_lab_with_token, start_thinking_lab  # noqa: F401 (front: the fixture)

WEATHER = {
    "name": "get_weather",
    "description": "the weather now",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def client_for(lab: FrontLab, **kwargs) -> anthropic.AsyncAnthropic:
    kwargs.setdefault("api_key", "unused")
    lab.clients.append(anthropic.AsyncAnthropic(base_url=lab.url, max_retries=0, **kwargs))
    return lab.clients[-1]


async def test_a_message_whole_and_streamed_each_a_job(front):
    client = client_for(front)
    message = await client.messages.create(
        model=CHAT_MODEL, max_tokens=100, system="be brief", messages=[{"role": "user", "content": "hello claude"}]
    )
    assert message.type == "message" and message.role == "assistant" and message.stop_reason == "end_turn"
    assert [b.type for b in message.content] == ["text"] and message.content[0].text.strip()
    assert message.usage.output_tokens == len(message.content[0].text.split()) and message.usage.input_tokens > 0
    job = await front.job_with("hello claude", "done")
    assert message.id == f"msg_{job['id']}"
    sent = [b for b in front.fakes["node-1"].requests if b["messages"][-1]["content"] == "hello claude"][-1]
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello claude"}]
    assert sent["options"]["num_predict"] == 100 and sent["keep_alive"] == 300 and "think" not in sent

    async with client.messages.stream(
        model=CHAT_MODEL,
        max_tokens=200,
        stop_sequences=["zzz"],
        messages=[{"role": "user", "content": [{"type": "text", "text": "stream a message"}]}],
    ) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_start" in kinds
    assert final.stop_reason == "end_turn" and final.content[0].text.strip()
    job = await front.job_with("stream a message", "done")
    detail = await front.daemon.job(job["id"])
    assert detail["output"] == final.content[0].text and detail["endpoint"] == "/v1/messages"
    assert detail["events"][0]["actor"] == "anthropic 127.0.0.1"
    assert detail["request"]["body"]["stream"] is True
    sent = [b for b in front.fakes["node-1"].requests if b["messages"][-1]["content"] == "stream a message"][-1]
    assert sent["options"]["stop"] == ["zzz"]


async def test_max_tokens_reached_is_its_stop_reason(front):
    front.fakes["node-1"].script.tokens = 30
    message = await client_for(front).messages.create(
        model=CHAT_MODEL, max_tokens=5, messages=[{"role": "user", "content": "cut me"}]
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 5


async def test_a_tool_use_round_trip(front):
    fake = front.fakes["node-1"]
    fake.script.tool_call = ("get_weather", {"city": "Paris"})
    client = client_for(front)
    question = {"role": "user", "content": "weather in Paris?"}
    first = await client.messages.create(model=CHAT_MODEL, max_tokens=100, tools=[WEATHER], messages=[question])
    assert first.stop_reason == "tool_use"
    use = first.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
    assert use.id.startswith("call_")
    assert fake.requests[-1]["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "the weather now",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]

    # The result goes back as a tool_result block: the node sees the call and a tool message.
    second = await client.messages.create(
        model=CHAT_MODEL,
        max_tokens=100,
        tools=[WEATHER],
        messages=[
            question,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "rain, 8C"}]},
        ],
    )
    assert second.stop_reason == "end_turn" and second.content[0].text.strip()
    assert fake.requests[-1]["messages"][1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": use.id, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": "rain, 8C", "tool_call_id": use.id},
    ]

    async with client.messages.stream(
        model=CHAT_MODEL, max_tokens=100, tools=[WEATHER], messages=[{"role": "user", "content": "weather in Lyon?"}]
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"city": "Paris"}


async def test_thinking_from_a_thinking_model(fakes, daemon_factory):
    lab = await start_thinking_lab(fakes, daemon_factory)
    node, daemon = lab.fakes["node-1"], lab.daemon
    try:
        client = client_for(lab)
        message = await client.messages.create(
            model="qwen3:8b",
            max_tokens=500,
            thinking={"type": "enabled", "budget_tokens": 100},
            messages=[{"role": "user", "content": "think first"}],
        )
        assert [b.type for b in message.content] == ["thinking", "text"] and node.requests[-1]["think"] is True
        job = await daemon.job((await lab.job_with("think first", "done"))["id"])
        assert job["thinking"] == message.content[0].thinking and job["output"] == message.content[1].text

        async with client.messages.stream(
            model="qwen3:8b", max_tokens=500, messages=[{"role": "user", "content": "think in a stream"}]
        ) as stream:
            thought = "".join([e.thinking async for e in stream if e.type == "thinking"])
            final = await stream.get_final_message()
        assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking == thought

        off = await client.messages.create(
            model="qwen3:8b",
            max_tokens=500,
            thinking={"type": "disabled"},
            messages=[{"role": "user", "content": "no thinking"}],
        )
        assert [b.type for b in off.content] == ["text"] and node.requests[-1]["think"] is False
    finally:
        await lab.close()


async def test_a_missing_model_is_404_as_the_sdk_raises_it_and_no_job(front):
    with pytest.raises(anthropic.NotFoundError) as exc:
        await client_for(front).messages.create(
            model="nope:1b", max_tokens=10, messages=[{"role": "user", "content": "to no model"}]
        )
    assert exc.value.body["type"] == "error"
    assert exc.value.body["error"] == {"type": "not_found_error", "message": "model 'nope:1b' not found"}
    assert exc.value.response.headers["x-should-retry"] == "false"
    with pytest.raises(anthropic.BadRequestError) as exc:
        await client_for(front).messages.create(
            model=CHAT_MODEL, max_tokens=0, messages=[{"role": "user", "content": "x"}]
        )
    assert exc.value.body["error"]["message"] == "max_tokens is required and must be positive"
    assert not [j for j in await front.jobs() if j["model"] == "nope:1b"]


async def test_the_token_is_required_and_accepted_as_x_api_key_or_bearer(fakes, daemon_factory):
    lab = await start_front_lab_with_token(fakes, daemon_factory, "s3cret")
    try:
        ask = {"model": CHAT_MODEL, "max_tokens": 20, "messages": [{"role": "user", "content": "with a key"}]}
        with pytest.raises(anthropic.AuthenticationError) as exc:
            await client_for(lab, api_key="wrong").messages.create(**ask)
        assert exc.value.body["error"]["type"] == "authentication_error" and "x-api-key" in str(exc.value)
        assert (await client_for(lab, api_key="s3cret").messages.create(**ask)).content  # ANTHROPIC_API_KEY
        assert (await client_for(lab, api_key=None, auth_token="s3cret").messages.create(**ask)).content
    finally:
        await lab.close()


async def test_a_delete_while_streaming_ends_the_stream_with_an_error_the_sdk_raises(front):
    async def read(got):
        async with client_for(front).messages.stream(
            model=CHAT_MODEL, max_tokens=1000, messages=[{"role": "user", "content": "doomed"}]
        ) as stream:
            async for text in stream.text_stream:
                got.append(text)

    job, raised, _ = await front.delete_mid_stream("doomed", read, lambda got: len(got) >= 2)
    assert isinstance(raised, anthropic.APIStatusError)
    assert raised.body["error"]["message"] == f"gpuq job {job['id']} was deleted by cli 127.0.0.1: request canceled"


async def test_thinking_asked_of_a_model_that_cannot_think_is_relaxed_as_ollama_does(front):
    # Claude Code asks for thinking whatever the model: Ollama drops it for a model without the
    # capability instead of refusing (server/routes.go ChatHandler, "relax_thinking").
    message = await client_for(front).messages.create(
        model=CHAT_MODEL,
        max_tokens=100,
        thinking={"type": "enabled", "budget_tokens": 50},
        messages=[{"role": "user", "content": "think if you can"}],
    )
    assert [b.type for b in message.content] == ["text"] and message.content[0].text.strip()
    asked = [b for b in front.fakes["node-1"].requests if b["messages"][-1]["content"] == "think if you can"]
    assert [b.get("think") for b in asked] == [True, None]
    job = await front.daemon.job((await front.job_with("think if you can", "done"))["id"])
    assert f"warning: {CHAT_MODEL} does not support thinking: sent again without it, as Ollama relaxes it" in [
        e["reason"] for e in job["events"]
    ]  # the second request is on the record
    # The other APIs keep Ollama's refusal.
    with pytest.raises(openai.BadRequestError) as exc:
        await front.openai().chat.completions.create(
            model=CHAT_MODEL, reasoning_effort="high", messages=[{"role": "user", "content": "must think"}]
        )
    assert "does not support thinking" in str(exc.value)
