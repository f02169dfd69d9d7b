"""LangChain, as people use it with a local lab: `ChatOllama`/`OllamaEmbeddings` pointed at the
front door as their `base_url`, and `ChatOpenAI` at its `/v1`. Each call is a gpuq job."""

from __future__ import annotations

import ollama
import pytest
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_ollama import ChatOllama, OllamaEmbeddings
from langchain_openai import ChatOpenAI
from test_front import CHAT_MODEL, EMBED_MODEL, start_front_lab


@pytest.fixture
async def front(fakes, daemon_factory):
    lab = await start_front_lab(fakes, daemon_factory)
    yield lab
    await lab.close()


@pytest.fixture
async def made():
    """The LangChain models a test makes: they never close their HTTP clients themselves (their
    open sockets would fail the test as ResourceWarnings), so they are closed here."""
    models: list = []
    yield models.append
    for model in models:
        if isinstance(model, ChatOpenAI):
            await model.root_async_client.close()
            model.root_client.close()
        else:  # ChatOllama, OllamaEmbeddings: an ollama Client and AsyncClient each
            model._client._client.close()
            await model._async_client._client.aclose()


async def test_chat_ollama_invokes_and_streams_each_call_a_job(front, made):
    # validate_model_on_init reads /api/tags' "model" field, as LangChain does before any call.
    chat = ChatOllama(model=CHAT_MODEL, base_url=front.url, validate_model_on_init=True)
    made(chat)
    reply = await chat.ainvoke([SystemMessage("be brief"), HumanMessage("langchain says hello")])
    assert reply.content.strip() and reply.response_metadata["done_reason"] == "stop"
    job = await front.job_with("langchain says hello", "done")
    assert job["node"] == "node-1" and (await front.daemon.job(job["id"]))["output"] == reply.content

    streamed = [chunk.content async for chunk in chat.astream("langchain streams")]
    assert len(streamed) > 2
    job = await front.job_with("langchain streams", "done")
    assert (await front.daemon.job(job["id"]))["output"] == "".join(streamed)


async def test_a_model_no_node_has_is_ollamas_404_and_no_job(front, made):
    chat = ChatOllama(model="no-such-model:7b", base_url=front.url)
    made(chat)
    with pytest.raises(ollama.ResponseError) as exc:
        await chat.ainvoke("who has this model?")
    assert (exc.value.status_code, exc.value.error) == (404, "model 'no-such-model:7b' not found")
    assert await front.jobs() == []


async def test_ollama_embeddings_are_embed_jobs(front, made):
    embeddings = OllamaEmbeddings(model=EMBED_MODEL, base_url=front.url)
    made(embeddings)
    vector = await embeddings.aembed_query("embed me via langchain")
    assert len(vector) > 8 and all(isinstance(x, float) for x in vector)
    job = await front.job_with("embed me via langchain", "done")
    assert job["kind"] == "embed" and job["node"] == "node-3"


async def test_chat_openai_invokes_and_streams_through_v1(front, made):
    chat = ChatOpenAI(model=CHAT_MODEL, base_url=front.url + "/v1", api_key="unused", max_retries=0)
    made(chat)
    reply = await chat.ainvoke("openai via langchain")
    assert reply.content.strip() and reply.response_metadata["finish_reason"] == "stop"
    job = await front.job_with("openai via langchain", "done")
    assert (await front.daemon.job(job["id"]))["output"] == reply.content
    assert reply.response_metadata["id"] == f"chatcmpl-{job['id']}"  # the completion's id leads to the job

    streamed = [chunk.content async for chunk in chat.astream("openai streams via langchain")]
    job = await front.job_with("openai streams via langchain", "done")
    assert (await front.daemon.job(job["id"]))["output"] == "".join(streamed)
