"""The simulator's model table: Ollama's model names [types/model/name.go], what each library
model is (capabilities, family, context and embedding lengths, size, Modelfile parameters), its
digest, chat template and an estimate of token counts."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

_MISSING = "!MISSING!"


@dataclass(frozen=True)
class ModelName:
    """host/namespace/model:tag, defaults registry.ollama.ai, library, latest [types/model/name.go]."""

    host: str
    namespace: str
    model: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> ModelName:
        host = namespace = tag = ""
        if text.rfind(":") > text.rfind("/"):
            text, tag = _cut(text, ":")
        if "/" not in text:
            model = text
        else:
            text, model = _cut(text, "/")
            if "/" not in text:
                namespace = text
            else:
                text, namespace = _cut(text, "/")
                host = text.split("://", 1)[-1]
        return cls(host or "registry.ollama.ai", namespace or "library", model, tag or "latest")

    @property
    def valid(self) -> bool:
        return all(
            _valid_part(kind, part)
            for kind, part in (
                ("host", self.host),
                ("namespace", self.namespace),
                ("model", self.model),
                ("tag", self.tag),
            )
        )

    def same(self, other: ModelName) -> bool:
        return all(
            a.lower() == b.lower()
            for a, b in zip(
                (self.host, self.namespace, self.model, self.tag), (other.host, other.namespace, other.model, other.tag)
            )
        )

    @property
    def short(self) -> str:
        """DisplayShortest: what /api/tags and /api/ps call it ('qwen3:latest')."""
        if self.host.lower() != "registry.ollama.ai":
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        prefix = "" if self.namespace.lower() == "library" else f"{self.namespace}/"
        return f"{prefix}{self.model}:{self.tag}"

    @property
    def full(self) -> str:
        return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"


def _cut(text: str, sep: str) -> tuple[str, str]:
    i = text.rfind(sep)
    return text[:i] or _MISSING, text[i + 1 :] or _MISSING


def _valid_part(kind: str, part: str) -> bool:
    if not 1 <= len(part) <= (350 if kind == "host" else 80):
        return False
    word = re.compile(r"[A-Za-z0-9_]")
    if not word.match(part[0]):
        return False
    allowed = "_-" + ("" if kind == "namespace" else ".") + (":" if kind == "host" else "")
    return all(word.match(c) or c in allowed for c in part[1:])


@dataclass(frozen=True)
class Profile:
    """What a model is, as /api/show and /api/tags describe it."""

    capabilities: tuple[str, ...]
    family: str  # general.architecture
    context_length: int  # trained context: model_info "<family>.context_length"
    embedding_length: int
    parameter_size: str  # when the tag does not say
    quantization: str = "Q4_K_M"
    parameters: tuple[tuple[str, Any], ...] = ()  # the Modelfile's PARAMETER lines


_CHATML = (("stop", "<|im_start|>"), ("stop", "<|im_end|>"))
_LLAMA3 = (("stop", "<|start_header_id|>"), ("stop", "<|end_header_id|>"), ("stop", "<|eot_id|>"))
_R1 = (
    ("stop", "<｜begin▁of▁sentence｜>"),
    ("stop", "<｜end▁of▁sentence｜>"),
    ("stop", "<｜User｜>"),
    ("stop", "<｜Assistant｜>"),
    ("temperature", 0.6),
    ("top_p", 0.95),
)
_SAMPLING_QWEN3 = (("repeat_penalty", 1), ("temperature", 0.6), ("top_k", 20), ("top_p", 0.95))
# Library models by name prefix, first match wins; capabilities in the order Ollama lists them
# [server/images.go Capabilities: completion/embedding, vision, then tools, insert, thinking].
PROFILES: tuple[tuple[tuple[str, ...], Profile], ...] = (
    (
        ("qwen3-coder",),
        Profile(
            ("completion", "tools"),
            "qwen3moe",
            262144,
            2048,
            "30.5B",
            parameters=(
                ("repeat_penalty", 1.05),
                *_CHATML,
                ("stop", "<|endoftext|>"),
                ("temperature", 0.7),
                ("top_k", 20),
                ("top_p", 0.8),
            ),
        ),
    ),
    (("qwen3-embedding",), Profile(("embedding",), "qwen3", 40960, 4096, "7.6B")),
    (("qwen3-vl",), Profile(("completion", "vision", "tools", "thinking"), "qwen3vl", 262144, 4096, "8.8B")),
    (
        ("qwen3",),
        Profile(
            ("completion", "tools", "thinking"), "qwen3", 40960, 4096, "8.2B", parameters=(*_CHATML, *_SAMPLING_QWEN3)
        ),
    ),
    (("deepseek-r1",), Profile(("completion", "tools", "thinking"), "qwen2", 131072, 5120, "32.8B", parameters=_R1)),
    (
        ("gpt-oss",),
        Profile(("completion", "tools", "thinking"), "gptoss", 131072, 2880, "20.9B", "MXFP4", (("temperature", 1),)),
    ),
    (("qwen2.5-coder",), Profile(("completion", "tools", "insert"), "qwen2", 32768, 3584, "7.6B", parameters=_CHATML)),
    (("qwen2.5",), Profile(("completion", "tools"), "qwen2", 32768, 3584, "7.6B", parameters=_CHATML)),
    (("llama3.2-vision",), Profile(("completion", "vision"), "mllama", 131072, 4096, "10.7B")),
    (
        ("llama3.1", "llama3.2", "llama3.3"),
        Profile(("completion", "tools"), "llama", 131072, 3072, "3.2B", parameters=_LLAMA3),
    ),
    (("mistral",), Profile(("completion", "tools"), "llama", 32768, 4096, "7.2B", "Q4_0")),
    (("gemma3",), Profile(("completion", "vision"), "gemma3", 131072, 2560, "4.3B")),
    # Ollama's docs show gemma4 reading images [docs/capabilities/vision.mdx]; its launcher offers it
    # to coding agents for "Reasoning and code generation locally" [cmd/launch/models.go]: tools, thinking.
    (("gemma4",), Profile(("completion", "vision", "tools", "thinking"), "gemma4", 131072, 2560, "8.0B")),
    (("llava",), Profile(("completion", "vision"), "llama", 32768, 4096, "7.2B", "Q4_0")),
    (("nomic-embed-text",), Profile(("embedding",), "nomic-bert", 2048, 768, "137M", "F16", (("num_ctx", 8192),))),
    (("all-minilm",), Profile(("embedding",), "bert", 512, 384, "23M", "F16")),
    (("mxbai-embed-large",), Profile(("embedding",), "bert", 512, 1024, "334M", "F16")),
    (("bge-m3",), Profile(("embedding",), "bert", 8192, 1024, "567M", "F16")),
    # [convert/convert_embeddinggemma.go KV: architecture gemma-embedding, context_length 2048]
    (("embeddinggemma",), Profile(("embedding",), "gemma-embedding", 2048, 768, "307M", "BF16")),
)
DEFAULT_PROFILE = Profile(("completion",), "llama", 131072, 4096, "8.0B")


def profile_for(name: str) -> Profile:
    model = ModelName.parse(name).model.lower()
    return next((p for prefixes, p in PROFILES if model.startswith(prefixes)), DEFAULT_PROFILE)


def _parameter_size(name: ModelName, profile: Profile) -> str:
    found = re.search(r"(?:^|[-_])(\d+(?:\.\d+)?)([bm])(?:$|[-_])", name.tag.lower())
    if not found:
        return profile.parameter_size
    size = f"{found.group(1)}{found.group(2).upper()}"
    # A tag rounds the count ("32b"); the library's own figure is more exact ("32.8B").
    same = profile.parameter_size.split(".")[0].rstrip("BM") == size[:-1] and profile.parameter_size[-1] == size[-1]
    return profile.parameter_size if same else size


def size_bytes(parameter_size: str, quantization: str) -> int:
    count = float(parameter_size[:-1]) * (1e9 if parameter_size.endswith("B") else 1e6)
    return int(count * {"F16": 2.0, "BF16": 2.0, "Q8_0": 1.07, "MXFP4": 0.62, "Q4_0": 0.57}.get(quantization, 0.6))


def count_tokens(text: str) -> int:
    """About four characters a token."""
    return (len(text) + 3) // 4


def chat_template(capabilities: tuple[str, ...]) -> str:
    """A chat template that implies the model's capabilities, as Ollama derives them from it
    [server/images.go goTemplateCapabilities: .Tools -> tools, .Suffix -> insert, think tags ->
    thinking]; clients read it too (Continue offers fill-in-the-middle when it has .Suffix)."""
    think = "{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}" if "thinking" in capabilities else ""
    tools = (
        ("{{- if .Tools }}<|im_start|>system\n# Tools\n{{ range .Tools }}{{ . }}\n{{ end }}<|im_end|>\n{{ end }}")
        if "tools" in capabilities
        else ""
    )
    chat = (
        f"{tools}{{{{- if .System }}}}<|im_start|>system\n{{{{ .System }}}}<|im_end|>\n{{{{ end }}}}"
        "{{- range .Messages }}<|im_start|>{{ .Role }}\n"
        f"{think}{{{{ .Content }}}}<|im_end|>\n{{{{ end }}}}<|im_start|>assistant\n"
    )
    if "insert" not in capabilities:
        return chat
    return (
        "{{- if .Suffix }}<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|>"
        f"{{{{- else }}}}{chat}{{{{- end }}}}"
    )


def details(model: str, with_lengths: bool = False) -> dict[str, Any]:
    """The `details` object of /api/tags, /api/show and /api/ps."""
    profile, name = profile_for(model), ModelName.parse(model)
    out: dict[str, Any] = {
        "parent_model": "",
        "format": "gguf",
        "family": profile.family,
        "families": [profile.family],
        "parameter_size": _parameter_size(name, profile),
        "quantization_level": profile.quantization,
    }
    if with_lengths:  # /api/tags reads them from the GGUF; /api/show and /api/ps leave them out
        out.update(context_length=profile.context_length, embedding_length=profile.embedding_length)
    return out


def model_size(model: str) -> int:
    """Bytes on disk (and in VRAM, as /api/ps shows a model fully offloaded)."""
    found = details(model)
    return size_bytes(found["parameter_size"], found["quantization_level"])


def digest(model: str) -> str:
    return hashlib.sha256(ModelName.parse(model).full.lower().encode()).hexdigest()
