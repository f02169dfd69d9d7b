"""The demo as a new user meets it: `gpuq serve --demo` (what `make run` starts) runs the examples
of Ollama's API docs and the clients' quick starts unchanged through its front door, and
`python -m gpuq.demo` runs one simulated node from the command line for a pretend lab."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import sys
import textwrap

import aiohttp
import ollama
import pytest
from conftest import eventually, free_port
from test_front import start_front_lab

# Ollama's docs, word for word but for the address: docs/api.md ("Chat request (No streaming)",
# "Generate Embeddings": all-minilm), the ollama-python README's chat and embed, and
# docs/api/openai-compatibility.mdx's OpenAI client (api_key='ollama', gpt-oss:20b).
DOCS_EXAMPLES = textwrap.dedent("""
    import json, os
    import ollama
    from openai import OpenAI

    out = {}
    response = ollama.chat(model='llama3.2', messages=[{'role': 'user', 'content': 'Why is the sky blue?'}])
    out['chat'] = response['message']['content']
    response = ollama.generate(model='llama3.2', prompt='Why is the sky blue?')
    out['generate'] = response['response']
    out['embed'] = ollama.embed(model='all-minilm', input=['Why is the sky blue?', 'Why is the grass green?'])['embeddings']
    out['embedding'] = ollama.embeddings(model='all-minilm', prompt='Here is an article about llamas...')['embedding']
    out['embeddinggemma'] = ollama.embed(model='embeddinggemma',
                                         input='The quick brown fox jumps over the lazy dog.')['embeddings']
    out['tags'] = [m.model for m in ollama.list().models]

    client = OpenAI(base_url=os.environ['FRONT'] + '/v1/', api_key='ollama')
    chat_completion = client.chat.completions.create(
        messages=[{'role': 'user', 'content': 'Say this is a test'}], model='gpt-oss:20b')
    out['openai_chat'] = chat_completion.choices[0].message.content
    embeddings = client.embeddings.create(model='all-minilm', input=['why is the sky blue?', 'why is the grass green?'])
    out['openai_embed'] = [e.embedding for e in embeddings.data]
    out['openai_nomic'] = client.embeddings.create(model='nomic-embed-text', input='hello').data[0].embedding
    print(json.dumps(out))
""")


def clean_env(**extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GPUQ_CONFIG", "GPUQ_ROUTER", "OLLAMA_HOST", "OLLAMA_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY")
    }
    return {**env, **extra}


@pytest.fixture
async def demo(tmp_path):
    """`gpuq serve --demo` on free ports with a database in tmp_path: (router URL, front door URL)."""
    port, front = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuq.cli",
        "serve",
        "--demo",
        "--listen",
        f"127.0.0.1:{port}",
        "--ollama-listen",
        f"127.0.0.1:{front}",
        "--database",
        str(tmp_path / "demo.db"),
        cwd=tmp_path,
        env=clean_env(),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    router, door = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{front}"
    try:
        async with aiohttp.ClientSession() as s:

            async def models_known():  # the front door has read both task nodes' /api/tags
                try:
                    async with s.get(door + "/api/tags") as r:
                        listed = {m["model"] for m in (await r.json())["models"]} if r.status == 200 else set()
                        return {"qwen3-coder:30b", "deepseek-r1:32b"} <= listed
                except aiohttp.ClientError:
                    return False

            await eventually(models_known, 30, 0.1, "the demo's front door to know its models")
        yield router, door
    finally:
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0


async def test_the_demo_runs_ollamas_docs_examples_unchanged(demo, tmp_path):
    router, door = demo
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        DOCS_EXAMPLES,
        cwd=tmp_path,
        env=clean_env(OLLAMA_HOST=door, FRONT=door),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-3000:]
    got = json.loads(out)
    assert got["chat"].strip() and got["generate"].strip() and got["openai_chat"].strip()
    # all-minilm's vectors are 384 long, nomic-embed-text's 768, embeddinggemma's 768, one per input
    assert [len(v) for v in got["embed"]] == [384, 384] and len(got["embedding"]) == 384
    assert [len(v) for v in got["openai_embed"]] == [384, 384] and len(got["openai_nomic"]) == 768
    assert [len(v) for v in got["embeddinggemma"]] == [768]
    assert {"llama3.2:latest", "all-minilm:latest", "nomic-embed-text:latest", "gpt-oss:20b"} <= set(got["tags"])

    async with aiohttp.ClientSession() as s:

        async def history(state: str) -> int:
            async with s.get(f"{router}/api/history", params={"state": state}) as r:
                return (await r.json())["total"]

        # each example was a job, none failed (the header's "failed today" stays 0)
        await eventually(lambda: history("done"), 15, 0.1, "the examples' jobs to be done")
        assert await history("failed") == 0
        assert await history("done") == 8
        # and a gpuq task still goes to the first free task node by rank, as the demo's story tells
        async with s.post(f"{router}/api/jobs", json={"kind": "task", "prompt": "hello demo"}) as r:
            assert r.status == 201
            [task] = (await r.json())["jobs"]
        assert task["node"] == "demo-1"


async def test_the_demo_refuses_chat_with_an_embedding_model_as_ollama_does(demo):
    _, door = demo
    client = ollama.AsyncClient(host=door)
    try:
        with pytest.raises(ollama.ResponseError) as refused:
            await client.chat(model="all-minilm", messages=[{"role": "user", "content": "hi"}])
        # Ollama's words [server/routes.go ChatHandler: "%q does not support chat"]
        assert (refused.value.status_code, refused.value.error) == (400, '"all-minilm" does not support chat')
        shown = await client.show("all-minilm")
        assert shown.capabilities == ["embedding"]
    finally:
        await client.close()


# -- python -m gpuq.demo ---------------------------------------------------------------------------


async def test_python_m_gpuq_demo_has_help():
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuq.demo",
        "--help",
        env=clean_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert text.startswith("Usage: python -m gpuq.demo [OPTIONS]")
    for option in ("--listen HOST:PORT", "--model NAME", "--token-delay", "--load-delay", "--unload-delay"):
        assert option in text
    assert "127.0.0.1:11500" in text and "11434" in text  # its default, and why not Ollama's


async def test_python_m_gpuq_demo_serves_the_models_it_is_given_and_stops_on_ctrl_c(tmp_path):
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuq.demo",
        "--listen",
        f"127.0.0.1:{port}",
        "--model",
        "llama3.2",
        "--model",
        "all-minilm",
        "--token-delay",
        "0",
        "--load-delay",
        "0",
        env=clean_env(),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        url = f"http://127.0.0.1:{port}"
        assert re.fullmatch(
            rf"simulated Ollama \S+ on {re.escape(url)} with all-minilm:latest, llama3\.2:latest\n", line
        ), line
        client = ollama.AsyncClient(host=url)
        try:
            listed = await client.list()
            assert sorted(m.model for m in listed.models) == ["all-minilm:latest", "llama3.2:latest"]
            reply = await client.chat(model="llama3.2", messages=[{"role": "user", "content": "hi"}])
            assert reply.message.content.strip()
            assert len((await client.embed(model="all-minilm", input="hi")).embeddings[0]) == 384
        finally:
            await client.close()
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert "Traceback" not in err.decode(), err.decode()
    assert out.decode().strip().endswith("stopped")


async def test_python_m_gpuq_demo_on_a_taken_port_says_so(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuq.demo",
            "--listen",
            f"127.0.0.1:{port}",
            env=clean_env(),
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert err.decode().strip() == (
        f"cannot listen on 127.0.0.1:{port}: address already in use (choose another port with --listen)"
    )


# -- the README's client table, the `ollama` Python library's row ----------------------------------

OLLAMA_ROW = textwrap.dedent("""
    import ollama
    from langchain_ollama import ChatOllama

    print(ollama.chat(model='llama3.2', messages=[{'role': 'user', 'content': 'hi'}]).message.content.strip() != '')
    print(ChatOllama(model='llama3.2').invoke('hi').content.strip() != '')
""")


async def test_the_ollama_python_row_works_as_written_with_a_token(fakes, daemon_factory, tmp_path):
    lab = await start_front_lab(fakes, daemon_factory, token="s3cret")
    try:

        async def run(**env: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                OLLAMA_ROW,
                cwd=tmp_path,
                env=clean_env(**env),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            return proc.returncode, out.decode(), err.decode()

        # export OLLAMA_HOST=...; export OLLAMA_API_KEY=<token>: both clients send it as Bearer
        code, out, err = await run(OLLAMA_HOST=lab.url, OLLAMA_API_KEY="s3cret")
        assert code == 0, err[-3000:]
        assert out.split() == ["True", "True"]
        code, out, err = await run(OLLAMA_HOST=lab.url)  # without the key: the front door's 401
        assert code != 0 and "(status code: 401)" in err, err[-3000:]
    finally:
        await lab.close()
