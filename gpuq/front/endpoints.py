"""The front door's endpoint registry: one record per route whose calls are jobs, saying all the
front door knows of it: its API, the Ollama route it runs as on its node, how its body is
checked and translated to Ollama's, what the job shows as its prompt, the whole reply of
stream:false, the writer of its server-sent events, its reply id and its job kind. The
listener (gpuq/front/listener.py) and the relay (gpuq/front/relay.py) read it; nothing else
names a route. Pure, no I/O, but for the refusal of what a model cannot do, which may ask a
node's /api/show once per model (early_refusal)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import BadRequest
from ..jobs import Kind, api_of, normalize_model
from ..node.runtime import NodeRuntime
from ..params import THINK_LEVELS, merged_options
from . import anthropic, ollama_api, openai_api, responses
from .ollama_api import go_quote
from .titles import chat_prompt, embed_prompt, generate_prompt, messages_prompt, responses_prompt

STREAMED_ROUTES = ("/api/chat", "/api/generate")  # on the node: the others answer one object


class StreamWriter(Protocol):
    """A /v1 stream: the node's chunks as the API's server-sent events, and its error event."""

    def feed(self, chunk: dict[str, Any]) -> bytes: ...

    def error(self, status: int, message: str, code: str | None = None) -> bytes: ...


@dataclass(frozen=True)
class Endpoint:
    path: str  #: the front door's route (POST)
    node_route: str  #: the Ollama route its job runs as on its node
    kind: Kind  #: the job kind its calls become
    #: the client's body in Ollama's terms; raises BadRequest (the /v1 translations check as they go)
    to_ollama: Callable[[dict[str, Any]], dict[str, Any]]
    #: what the job shows as its prompt, read from the client's body (gpuq/front/titles.py)
    prompt: Callable[[dict[str, Any]], str]
    check: Callable[[dict[str, Any]], None] | None = None  #: Ollama's own checks of an /api body, before all else
    #: stream:false (or an embedding): (reply id, job id, client body, the node's reply) -> the API's reply
    whole: Callable[[str, str, dict[str, Any], dict[str, Any]], Any] | None = None
    #: a /v1 stream's writer: (reply id, job id, client body) -> StreamWriter; None: Ollama's lines as sent
    stream: Callable[[str, str, dict[str, Any]], StreamWriter] | None = None
    id_prefix: str = ""  #: the API's id of a reply: this and the job's id, so a client's log leads to the job

    @property
    def api(self) -> str:
        """Its API, by its path (jobs.api_of): its error shape, its token rule, how it streams."""
        return api_of(self.path)

    @property
    def node_streams(self) -> bool:
        return self.node_route in STREAMED_ROUTES

    def streams(self, body: dict[str, Any]) -> bool:
        """Whether the client gets a stream: an Ollama call unless it says stream:false, a /v1
        call when it asks; an embedding never."""
        if self.kind == Kind.EMBED:
            return False
        return body.get("stream") is not False if self.api == "ollama" else bool(body.get("stream"))

    def reply_id(self, job_id: str) -> str:
        return self.id_prefix + job_id


def _same(body: dict[str, Any]) -> dict[str, Any]:
    return body


def _usage_asked(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _item_id(job_id: str) -> str:
    return f"msg_{job_id}"


ENDPOINTS: dict[str, Endpoint] = {
    ep.path: ep
    for ep in (
        Endpoint("/api/chat", "/api/chat", Kind.TASK, _same, chat_prompt, check=ollama_api.check_chat),
        Endpoint("/api/generate", "/api/generate", Kind.TASK, _same, generate_prompt, check=ollama_api.check_generate),
        Endpoint(
            "/api/embed",
            "/api/embed",
            Kind.EMBED,
            _same,
            lambda body: embed_prompt(body.get("input")),
            check=lambda body: ollama_api.check_embed(body, legacy=False),
        ),
        Endpoint(
            "/api/embeddings",
            "/api/embeddings",
            Kind.EMBED,
            _same,
            lambda body: embed_prompt(body.get("prompt")),
            check=lambda body: ollama_api.check_embed(body, legacy=True),
        ),
        Endpoint(
            "/v1/chat/completions",
            "/api/chat",
            Kind.TASK,
            openai_api.openai_chat_request,
            chat_prompt,
            whole=lambda rid, job_id, body, reply: openai_api.chat_completion(rid, reply),
            stream=lambda rid, job_id, body: openai_api.ChatStream(rid, _usage_asked(body)),
            id_prefix="chatcmpl-",
        ),
        Endpoint(
            "/v1/completions",
            "/api/generate",
            Kind.TASK,
            openai_api.openai_completion_request,
            generate_prompt,
            whole=lambda rid, job_id, body, reply: openai_api.text_completion(rid, reply),
            stream=lambda rid, job_id, body: openai_api.CompletionStream(rid, _usage_asked(body)),
            id_prefix="cmpl-",
        ),
        Endpoint(
            "/v1/embeddings",
            "/api/embed",
            Kind.EMBED,
            openai_api.openai_embed_request,
            lambda body: embed_prompt(body.get("input")),
            whole=lambda rid, job_id, body, reply: openai_api.embedding_list(
                body["model"], reply, body.get("encoding_format")
            ),
        ),
        # OpenAI's Responses API and Anthropic's Messages API: their own shapes of a chat.
        Endpoint(
            "/v1/responses",
            "/api/chat",
            Kind.TASK,
            responses.responses_request,
            responses_prompt,
            whole=lambda rid, job_id, body, reply: responses.whole_response(rid, _item_id(job_id), reply, body),
            stream=lambda rid, job_id, body: responses.ResponsesStream(rid, _item_id(job_id), body),
            id_prefix="resp_",
        ),
        Endpoint(
            "/v1/messages",
            "/api/chat",
            Kind.TASK,
            anthropic.messages_request,
            messages_prompt,
            whole=lambda rid, job_id, body, reply: anthropic.whole_message(rid, reply),
            stream=lambda rid, job_id, body: anthropic.MessagesStream(
                rid, body["model"], anthropic.estimate_input_tokens(body)
            ),
            id_prefix="msg_",
        ),
    )
}


def node_request(
    path: str,
    body: dict[str, Any],
    node_think: bool | str | None = None,
    node_options: dict[str, Any] | None = None,
    keep_alive: int | float | str = 0,
    model: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The Ollama route and body a front-door job sends its node: the client's own request, with
    the node's policy over it: the job's model (the name asked may be an alias, or end in
    `:local`: gpuq/front/names.py), the keep_alive the relay decided (the client's, capped, or the
    node's unload policy's: gpuq/node/vram.py), chat and generate streamed (gpuq relays each chunk
    as it comes), the node's options under the client's, and the node's `think` when the client
    set none."""
    ep = ENDPOINTS[path]
    out = dict(ep.to_ollama(body))
    if model is not None:
        out["model"] = model
    out["keep_alive"] = keep_alive
    if ep.node_streams:
        out["stream"] = True
        if out.get("think") is None and node_think is not None:
            out["think"] = node_think
    else:
        out.pop("stream", None)
    options = merged_options(node_options, out.get("options") if isinstance(out.get("options"), dict) else None)
    if options:
        out["options"] = options
    return ep.node_route, out


# -- what the nodes can run ----------------------------------------------------------------------
# Every front-door call is a task (or an embedding, which runs where tasks run: placement.role_of),
# so only the task nodes' models are the front door's to list, pull or check.


def runs_front_calls(node: NodeRuntime) -> bool:
    """A node (gpuq/node/runtime.py NodeRuntime) that front-door calls can be placed on."""
    return "task" in node.config.roles


def front_nodes(nodes: Iterable[NodeRuntime]) -> list[NodeRuntime]:
    return [rt for rt in nodes if runs_front_calls(rt)]


def entries_of(nodes: Iterable[NodeRuntime], model: str) -> list[dict[str, Any]]:
    """The /api/tags entries of `model` on the nodes that run front-door calls, as their last
    health checks read them (one per node that has it)."""
    wanted = normalize_model(model)
    out = []
    for rt in front_nodes(nodes):
        for entry in rt.tags or ():
            name = entry.get("model") or entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and normalize_model(name) == wanted:
                out.append(entry)
                break
    return out


def _entry_name(entry: dict[str, Any]) -> str:
    """The name an /api/tags entry goes by: its `model`, else its `name`."""
    name = entry.get("model") or entry.get("name")
    assert isinstance(name, str)  # entries_of keeps the entries it finds so named
    return name


def _full_name(name: str) -> str:
    """Ollama's Model.Name in its messages: host/namespace/model:tag (types/model/name.go)."""
    if ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    parts = name.split("/")
    if len(parts) == 1:
        parts = ["library", *parts]
    if len(parts) == 2:
        parts = ["registry.ollama.ai", *parts]
    return "/".join(parts)


async def capabilities_of(nodes: Iterable[NodeRuntime], model: str) -> list[list[str]] | None:
    """The capabilities of `model` on each task node that has it: as its /api/tags listed them
    (Ollama sends them there too), else as its /api/show lists them, asked once per model and
    digest (gpuq/node/ollama.py OllamaClient.capabilities). None when some node with it does
    not say (then the node answers for itself) or none has it."""
    known = []
    for rt in front_nodes(nodes):
        entries = entries_of([rt], model)
        if not entries:
            continue
        caps = entries[0].get("capabilities")
        if not isinstance(caps, list):
            if not rt.up:
                return None
            digest = entries[0].get("digest")
            caps = await rt.client.capabilities(_entry_name(entries[0]), digest if isinstance(digest, str) else "")
        if caps is None:
            return None
        known.append(caps)
    return known or None


async def early_refusal(ep: Endpoint, ollama: dict[str, Any], nodes: Iterable[NodeRuntime]) -> None:
    """Refuse now, before the call is stored and waits its turn, what Ollama would refuse when
    it came to run: with Ollama's status and words, in the order server/routes.go checks them.
    A call is refused for a capability only when every task node with the model lacks it, so
    the chosen one would too."""
    if ep.node_route not in STREAMED_ROUTES:
        return
    ollama_api.check_top_logprobs(ollama)  # ChatHandler, GenerateHandler: before the model
    model = ollama.get("model")
    nodes = list(nodes)
    known = await capabilities_of(nodes, model) if isinstance(model, str) else None
    if known and isinstance(model, str):  # known: model is a str
        chat = ep.node_route == "/api/chat"

        def lacks(cap: str) -> bool:
            return all(cap not in caps for caps in known)

        # think on a model without the capability (ChatHandler, GenerateHandler). Anthropic's
        # API is the exception: Ollama relaxes it there ("relax_thinking"), and so does gpuq.
        think = ollama.get("think")
        thinks = think is True or isinstance(think, str) and think in THINK_LEVELS
        if ep.api != "anthropic" and thinks and lacks("thinking"):
            raise BadRequest(f"{go_quote(model)} does not support thinking")
        # scheduleRunner -> Model.CheckCapabilities (server/images.go): completion first, then
        # what the request needs, the missing ones joined by errors.Join's newline.
        if lacks("completion"):
            raise BadRequest(f"{go_quote(model)} does not support {'chat' if chat else 'generate'}")
        needed = ["tools"] if chat and ollama.get("tools") else []
        if not chat and ollama.get("suffix"):
            needed.append("insert")
        missing = [cap for cap in needed if lacks(cap)]
        if missing:
            name = _entry_name(entries_of(nodes, model)[0])
            raise BadRequest(f"{_full_name(name)} does not support " + "\n".join(missing))
    ollama_api.check_format(ollama.get("format"))  # llm/llama_server.go, once loaded: last
