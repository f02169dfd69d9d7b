"""What a front-door job shows as its prompt (its title in the queue, the history, the pages):
the person's last words, read from the client's own body in its API's shape. An agent's turn
ends with what the person did not write: Claude Code wraps context in `<system-reminder>`
blocks, Codex sends its environment and AGENTS.md as user messages, and a tool's result comes
back as a user turn (Anthropic's tool_result blocks, Responses' function_call_output items,
chat's tool messages). Those are skipped; the whole request is kept with the job.

An agent's side calls, made beside the person's turn, are titled as such: Claude Code's title for
the session (its `generate_session_title`: no tools, a system prompt asking for a title, the
session's words in `<session>` tags) and its quota probe (`quota_check`: "quota", max_tokens 1).
Their client (Claude Code's User-Agent) is kept with the job as every call's is. Pure."""

from __future__ import annotations

import re
from typing import Any

# Blocks an agent adds to a user turn that the person did not write: Claude Code's reminders,
# Codex's environment and instructions (codex-rs: EnvironmentContext, UserInstructions).
_WRAPPED = re.compile(r"<(system-reminder|environment_context|user_instructions|INSTRUCTIONS)>.*?</\1>\s*", re.DOTALL)
# Codex's AGENTS.md message: "# AGENTS.md instructions for <dir>" then its <INSTRUCTIONS> block.
_AGENTS_MD = re.compile(r"^# AGENTS\.md instructions for [^\n]*\s*$")


def own_words(text: str) -> str:
    """A user turn's text without what an agent wrapped into it; "" when nothing else is left."""
    rest = _WRAPPED.sub("", text).strip()
    return "" if _AGENTS_MD.match(rest) else rest


def with_images(text: str, images: Any) -> str:
    count = len(images) if isinstance(images, list) else 0
    if not count:
        return text
    note = f"[{count} image{'s' if count > 1 else ''}]"
    return f"{text} {note}" if text else note


def _last_words(turns: list[tuple[str, int]]) -> str:
    """The last turn with words of the person's (text, image count), else the last turn's as it is."""
    for text, images in reversed(turns):
        words = own_words(text)
        if words or images:
            return with_images(words, [None] * images)
    return with_images(turns[-1][0].strip(), [None] * turns[-1][1]) if turns else ""


def chat_prompt(body: dict[str, Any]) -> str:
    """Ollama's /api/chat and OpenAI's chat: the last user message with words of its own (an
    OpenAI message's text parts joined), its images counted; tool messages are not the user's."""
    turns = []
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, list):  # OpenAI's parts
            text = "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            media = sum(1 for p in content if isinstance(p, dict) and p.get("type") in ("image_url", "input_audio"))
            turns.append((text, media))
        else:
            images = msg.get("images")
            turns.append((content if isinstance(content, str) else "", len(images) if isinstance(images, list) else 0))
    return _last_words(turns)


# What a side call's title says before its words.
SIDE_TITLE = "side call (title): "
SIDE_QUOTA = "side call (quota probe)"
_SESSION = re.compile(r"^\s*<session>\s*(.*?)\s*</session>", re.DOTALL)


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    blocks = system if isinstance(system, list) else []
    return "\n".join(b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str))


def _asks_for_title(body: dict[str, Any]) -> bool:
    """A call made to name the conversation: it offers no tool, and its system prompt or its
    structured output asks for a title (Claude Code 2.1's `{"title": ...}` JSON schema)."""
    if body.get("tools"):
        return False
    output = body.get("output_config")
    form = output.get("format") if isinstance(output, dict) else None
    schema = form.get("schema") if isinstance(form, dict) else None
    props = schema.get("properties") if isinstance(schema, dict) else None
    if isinstance(props, dict) and "title" in props:
        return True
    return re.search(r"\btitle\b", _system_text(body.get("system")), re.IGNORECASE) is not None


def _is_quota_probe(body: dict[str, Any]) -> bool:
    """Claude Code's check of its rate limits: one user message "quota", max_tokens 1, no system."""
    messages = body.get("messages")
    return (
        body.get("max_tokens") == 1
        and isinstance(messages, list)
        and len(messages) == 1
        and isinstance(messages[0], dict)
        and messages[0].get("content") == "quota"
    )


def messages_prompt(body: dict[str, Any]) -> str:
    """Anthropic's Messages: the last user message's text blocks, its tool_result blocks left out;
    an agent's side call says so, with the words it is about."""
    if _is_quota_probe(body):
        return SIDE_QUOTA
    words = _person_words(body)
    if _asks_for_title(body):
        inside = _SESSION.match(words)
        return SIDE_TITLE + (inside.group(1) if inside else words)
    return words


def _person_words(body: dict[str, Any]) -> str:
    turns = []
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        content = msg.get("content")
        if isinstance(content, str):
            turns.append((content, 0))
            continue
        blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
        text = "\n".join(
            own_words(b["text"]) for b in blocks if b.get("type") == "text" and isinstance(b.get("text"), str)
        )
        images = sum(1 for b in blocks if b.get("type") == "image")
        if text.strip() or images:
            turns.append((text.strip(), images))
    return _last_words(turns)


def responses_prompt(body: dict[str, Any]) -> str:
    """OpenAI's Responses: a string input, else the last user message item's input_text parts
    (function_call_output items are tool results)."""
    given = body.get("input")
    if isinstance(given, str):
        return own_words(given) or given.strip()
    turns = []
    for item in given if isinstance(given, list) else []:
        if not isinstance(item, dict) or item.get("role") != "user" or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            turns.append((content, 0))
            continue
        parts = [p for p in content if isinstance(p, dict)] if isinstance(content, list) else []
        text = "\n".join(
            own_words(p["text"]) for p in parts if p.get("type") == "input_text" and isinstance(p.get("text"), str)
        )
        turns.append((text.strip(), sum(1 for p in parts if p.get("type") == "input_image")))
    return _last_words(turns)


def generate_prompt(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    return with_images(prompt if isinstance(prompt, str) else "", body.get("images"))


def embed_prompt(given: Any) -> str:
    """An embedding's input (or the legacy route's prompt), one line each."""
    if isinstance(given, list):
        return "\n".join(str(i) for i in given)
    return given if isinstance(given, str) else ""
