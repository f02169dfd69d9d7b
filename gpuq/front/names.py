"""Model names as Ollama reads them (internal/modelref/modelref.go ParseRef, types/model/name.go
ParseName and IsValid): a `:local` suffix asks for the local model and is dropped, a `:cloud` or
`-cloud` one asks for ollama.com (which a lab does not have), a name that cannot parse is 400
"invalid model name"; and [front] model_aliases, which give a client's own default names (Claude
Code's `claude-*`) a model of the lab. Pure."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable

from ..errors import BadRequest, FrontError

MISSING = "!MISSING!"  # name.go MissingPart: a part a separator promised but that is empty
_HOST, _NAMESPACE, _MODEL, _TAG = range(4)
DEFAULTS = ("registry.ollama.ai", "library", "", "latest")  # name.go DefaultName

# routes.go: cloud models answer this way where cloud is disabled (internal/cloud DisabledError)
CLOUD_DISABLED = "ollama cloud is disabled: remote model is unavailable"


def _source(raw: str) -> tuple[str, str | None]:
    """(the name without its source suffix, "local", "cloud" or None): parseSourceSuffix."""
    idx = raw.rfind(":")
    if idx >= 0:
        suffix_raw = raw[idx + 1 :].strip()
        suffix = suffix_raw.lower()
        if suffix in ("cloud", "local"):
            return raw[:idx], suffix
        if "/" not in suffix_raw and suffix.endswith("-cloud"):
            return raw[: idx + 1] + suffix_raw[: -len("-cloud")], "cloud"
    return raw, None


def _cut_promised(s: str, sep: str) -> tuple[str, str, bool]:
    i = s.rfind(sep)
    if i < 0:
        return s, "", False
    return s[:i] or MISSING, s[i + 1 :] or MISSING, True


def _parts(name: str) -> list[str]:
    """ParseNameBare, then merged with DefaultName: [host, namespace, model, tag]."""
    parts = ["", "", "", ""]
    s = name
    if s.rfind(":") > s.rfind("/"):
        s, parts[_TAG], _ = _cut_promised(s, ":")
    s, parts[_MODEL], promised = _cut_promised(s, "/")
    if not promised:
        parts[_MODEL] = s
    else:
        s, parts[_NAMESPACE], promised = _cut_promised(s, "/")
        if not promised:
            parts[_NAMESPACE] = s
        else:
            parts[_HOST] = s.split("://", 1)[1] if "://" in s else s
    return [part or default for part, default in zip(parts, DEFAULTS, strict=True)]


def _alnum_(c: str) -> bool:
    return c == "_" or ("a" <= c <= "z") or ("A" <= c <= "Z") or ("0" <= c <= "9")


def _valid_part(kind: int, s: str) -> bool:
    """name.go isValidPart (ASCII only: Go checks bytes)."""
    if not 1 <= len(s.encode()) <= (350 if kind == _HOST else 80):
        return False
    if not _alnum_(s[0]):
        return False
    for c in s[1:]:
        if c in "_-" or _alnum_(c):
            continue
        if c == "." and kind != _NAMESPACE:
            continue
        if c == ":" and kind == _HOST:
            continue
        return False
    return True


def valid_name(name: str) -> bool:
    """Name.IsValid: every part present and valid."""
    return all(_valid_part(kind, part) for kind, part in enumerate(_parts(name)))


def local_name(raw: str) -> str:
    """The model a call asks for, as Ollama's handlers read it (parseAndValidateModelRef): the
    name trimmed and its `:local` suffix dropped. A `:cloud` or `-cloud` name is refused (403, in
    the words of an Ollama whose cloud is disabled, and why), an unparsable one is 400."""
    raw = raw.strip()
    base, source = _source(raw)
    if source is not None and _source(base)[1] is not None:
        raise BadRequest(f'use either :local or :cloud, not both: "{raw}"')
    if source == "cloud":
        raise FrontError(
            403,
            f"{CLOUD_DISABLED}: '{raw}' is an ollama.com cloud model, and this gpuq lab runs only "
            "its own nodes' models (see /api/tags)",
        )
    if not valid_name(base):
        raise BadRequest("invalid model name")
    return base


def aliased(model: str, aliases: Iterable[tuple[str, str]], present: Callable[[str], bool]) -> str:
    """A name no node has, given a model of the lab by the first [front] model_aliases pattern
    it matches (shell-style, case-insensitive: `claude-*`); a name some node has is its own."""
    if present(model):
        return model
    for pattern, target in aliases:
        if fnmatch.fnmatchcase(model.lower(), pattern.lower()):
            return target
    return model
