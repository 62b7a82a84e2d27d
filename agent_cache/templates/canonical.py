"""Canonical form of chat messages and tool schemas.

Two prompts that mean the same thing should be byte-identical, so that a
prefix cache can share them. Every change made here is one a model would not
reasonably notice: Unicode NFC, one newline convention, no trailing
whitespace, one representation for text-only content, tool schemas as JSON
with sorted keys (and, by default, tools sorted by name).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping  # not typing's: isinstance against it is several times slower
from typing import Any, Sequence

from agent_cache.errors import TemplateError

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
STABLE_ROLES = frozenset({"system", "developer"})
# Fixed key order for rendered messages; unknown keys follow, sorted.
_KEY_ORDER = ("role", "name", "content", "tool_calls", "tool_call_id")
# Text parts of a text-only content list are joined with this separator.
PART_SEPARATOR = "\n"
# Whitespace other than newline, at the end of a line or of the text.
_TRAILING_WS = re.compile(r"[^\S\n]+(?=\n|\Z)")


# Long texts (a system prompt, a retrieved document) come back on every call of a session: their
# canonical form is kept, keyed by the text (its hash is computed once per string object), within
# a budget of characters (keys and the values that differ from them); a memo that fills is cleared.
_LONG_TEXT = 2048
_LONG_TEXTS_BUDGET = 4 << 20
_LONG_TEXTS: dict[str, str] = {}
_long_texts_size = 0


def canonical_text(text: str) -> str:
    """NFC, ``\\r\\n``/``\\r`` -> ``\\n``, trailing whitespace stripped per line."""
    global _long_texts_size
    if not _LONG_TEXT <= len(text) <= _LONG_TEXTS_BUDGET // 16:
        return _canonical_text(text)
    done = _LONG_TEXTS.get(text)
    if done is None:
        done = _canonical_text(text)
        size = len(text) + (len(done) if done is not text else 0)
        if _long_texts_size + size > _LONG_TEXTS_BUDGET:
            _LONG_TEXTS.clear()
            _long_texts_size = 0
        _LONG_TEXTS[text] = done
        _long_texts_size += size
    return done


def _canonical_text(text: str) -> str:
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    # is_normalized is a fast C check; ASCII is always NFC.
    if not text.isascii() and not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    if type(text) is str and text.isascii():
        # Fast exact check: a match of _TRAILING_WS ends right before a newline or
        # at the end, so ASCII text without "<space-ish>\n" and not ending in one
        # has nothing to strip (substring search is much faster than the regex).
        if text[-1:] not in _ASCII_WS and (
                "\n" not in text
                or not (_blank_ends_a_line(text) or any(c in text for c in _RARE_ASCII_WS))):
            return text
    return _TRAILING_WS.sub("", text)


_NEWLINES_SCANNED = 64


def _blank_ends_a_line(text: str) -> bool:
    """``" \\n" in text or "\\t\\n" in text``: newline to newline by ``find`` (a memchr), where a
    two-character search compares at every character (twenty times slower on prose); a text of
    many short lines takes the two searches."""
    i = text.find("\n")
    for _ in range(_NEWLINES_SCANNED):
        if i < 0:
            return False
        if i and text[i - 1] in " \t":
            return True
        i = text.find("\n", i + 1)
    return " \n" in text or "\t\n" in text


# ASCII characters that str.isspace() (and so the regex's \s) accepts, newline excluded.
_ASCII_WS = frozenset(c for c in map(chr, range(128)) if c.isspace() and c != "\n")
# Single-character searches are much faster than two-character ones: only space and
# tab are looked up before a newline, the rest anywhere (the regex decides then).
_RARE_ASCII_WS = tuple(sorted(_ASCII_WS - {" ", "\t"}))


def _canon_content(content: Any, field: str, *, rewrite_text: bool) -> Any:
    fix = canonical_text if rewrite_text else (lambda s: s)
    if content is None or isinstance(content, str):
        return None if content is None else fix(content)
    if not isinstance(content, (list, tuple)):
        raise TemplateError(field, f"must be a string, a list of parts or null, not {type(content).__name__}")
    parts: list[Any] = []
    text_only = True
    for i, part in enumerate(content):
        pf = f"{field}[{i}]"
        if isinstance(part, str):  # LangChain allows bare strings as text parts
            part = {"type": "text", "text": part}
        if type(part) is not dict and not isinstance(part, Mapping):
            raise TemplateError(pf, f"a content part must be an object, not {type(part).__name__}")
        ptype = part.get("type")
        if not isinstance(ptype, str):
            raise TemplateError(f"{pf}.type", "missing or not a string")
        if ptype == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise TemplateError(f"{pf}.text", "a text part needs a string 'text'")
            parts.append({**part, "text": fix(text)})
        else:
            text_only = False
            parts.append(dict(part))  # images and other parts are kept as they are
    if text_only:
        return PART_SEPARATOR.join(p["text"] for p in parts)
    return parts


def _canon_tool_calls(calls: Any, field: str) -> list[dict[str, Any]]:
    if not isinstance(calls, (list, tuple)):
        raise TemplateError(field, "must be a list")
    out = []
    for i, call in enumerate(calls):
        cf = f"{field}[{i}]"
        if type(call) is not dict and not isinstance(call, Mapping):
            raise TemplateError(cf, "must be an object")
        fn = call.get("function")
        if type(fn) is not dict and not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn.get("name"):
            raise TemplateError(f"{cf}.function.name", "missing or not a non-empty string")
        args = fn.get("arguments", "")
        if not isinstance(args, str):
            raise TemplateError(f"{cf}.function.arguments", "must be a JSON string")
        # Arguments are model output the cache already holds verbatim: keep them byte-exact.
        out.append(_ordered({**call, "function": dict(fn)}, ("id", "type", "function")))
    return out


def _ordered(d: Mapping[str, Any], order: Sequence[str]) -> dict[str, Any]:
    out = {k: d[k] for k in order if k in d}
    for k in sorted(k for k in d if k not in out):
        out[k] = d[k]
    return out


# Roles whose message may be just a role and a text (a tool message also needs its tool_call_id).
_PLAIN_ROLES = frozenset({"system", "developer", "user", "assistant"})


def canonical_message(msg: Any, index: int) -> dict[str, Any]:
    """One message in canonical form; raises TemplateError naming the field."""
    if type(msg) is dict and len(msg) == 2:  # the commonest message, {"role", "content": text}: as below
        role, content = msg.get("role"), msg.get("content")
        if type(content) is str and role in _PLAIN_ROLES:
            return {"role": role, "content": content if role == "assistant" else canonical_text(content)}
    field = f"messages[{index}]"
    if type(msg) is not dict and not isinstance(msg, Mapping):
        raise TemplateError(field, f"a message must be an object, not {type(msg).__name__}")
    role = msg.get("role")
    if role not in ROLES:
        raise TemplateError(f"{field}.role", f"unknown role {role!r}")
    out = dict(msg)
    if "content" not in msg and role != "assistant":
        raise TemplateError(f"{field}.content", "missing")
    # Assistant text is model output that the cache holds as generated; rewriting
    # it would break the session's own prompt+output prefix.
    content = _canon_content(msg.get("content"), f"{field}.content", rewrite_text=role != "assistant")
    if content is None and role != "assistant":
        raise TemplateError(f"{field}.content", "must not be null for this role")
    out["content"] = content
    if "name" in msg and msg["name"] is not None and not isinstance(msg["name"], str):
        raise TemplateError(f"{field}.name", "must be a string")
    if msg.get("tool_calls") is not None:
        out["tool_calls"] = _canon_tool_calls(msg["tool_calls"], f"{field}.tool_calls")
    if "tool_call_id" in msg and not isinstance(msg["tool_call_id"], str):
        raise TemplateError(f"{field}.tool_call_id", "must be a string")
    if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
        raise TemplateError(f"{field}.tool_call_id", "a tool message needs a string tool_call_id")
    return _ordered(out, _KEY_ORDER)


def _sorted_json(value: Any, field: str, _reuse: tuple[Any, Any, Any, Any] | None = None) -> Any:
    """Rebuild ``value`` with keys sorted at every level; text canonicalised.

    ``_reuse=(tool, fn, params, cparams)``: ``tool["function"]["parameters"]``
    (``fn`` and ``params``) is already rebuilt as ``cparams``.
    """
    # Hot path (tool schemas on every call): exact-type checks first, and child
    # field names are only formatted when an error needs them.
    kind = type(value)
    if kind is str:
        return canonical_text(value)
    if kind is dict or (kind is not list and isinstance(value, Mapping)):
        out = {}
        at_tool = _reuse is not None and value is _reuse[0]
        at_fn = _reuse is not None and value is _reuse[1]
        for k in sorted(value, key=str):
            if type(k) is not str:
                raise TemplateError(field, f"JSON object keys must be strings, got {k!r}")
            child = value[k]
            tc = type(child)
            if tc is str:  # the commonest leaf: what the recursive call would return
                out[k] = canonical_text(child)
            elif at_fn and k == "parameters" and _reuse is not None and child is _reuse[2]:
                out[k] = _reuse[3]
            elif tc in _JSON_SCALARS:
                out[k] = child
            else:
                out[k] = _sorted_json(child, f"{field}.{k}", _reuse if at_tool and k == "function" else None)
        return out
    if kind is list or kind is tuple:
        # List order is meaningful in JSON schema (enum, prefixItems): keep it.
        return [canonical_text(v) if type(v) is str else v if type(v) in _JSON_SCALARS else _sorted_json(v, f"{field}[{i}]")
                for i, v in enumerate(value)]
    if isinstance(value, str):
        return canonical_text(value)
    if value is None or isinstance(value, (bool, int)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise TemplateError(field, "NaN and infinity are not JSON")
        return value
    raise TemplateError(field, f"not JSON-serialisable: {type(value).__name__}")


# isinstance() against typing.Mapping/Sequence is slow; the exact-type checks in front of
# it (dict, list) are the common case and give the same answer.
# leaves returned as they are (str needs canonical text; floats need the NaN check)
_JSON_SCALARS = frozenset({bool, int, type(None)})


def canonical_tool(tool: Any, index: int) -> dict[str, Any]:
    field = f"tools[{index}]"
    if type(tool) is not dict and not isinstance(tool, Mapping):
        raise TemplateError(field, "a tool must be an object")
    fn = tool.get("function")
    if type(fn) is not dict and not isinstance(fn, Mapping):
        raise TemplateError(f"{field}.function", "missing or not an object")
    name = fn.get("name")
    if not isinstance(name, str) or not name.strip():
        raise TemplateError(f"{field}.function.name", "missing or not a non-empty string")
    # a tool is a mapping, so _sorted_json rebuilds it as a dict
    out: dict[str, Any]
    if "parameters" not in fn:
        out = _sorted_json(tool, field)
        return out
    # Parameters first, so their errors win (as before); then the rest of the tool,
    # reusing the rebuilt parameters instead of walking them a second time.
    params = fn["parameters"]
    cparams = params if type(params) in _JSON_SCALARS else _sorted_json(params, f"{field}.function.parameters")
    out = _sorted_json(tool, field, (tool, fn, params, cparams))
    return out


def tools_json(tools: Sequence[Mapping[str, Any]] | None) -> str:
    """Compact JSON of tools, keeping the key order the dicts carry."""
    if not tools:
        return ""
    try:
        return json.dumps(list(tools), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:
        raise TemplateError("tools", f"not JSON-serialisable: {e}") from None


def canonicalize(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None, *, sort_tools: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """Canonical copies of ``messages`` and ``tools`` (inputs are not modified)."""
    if type(messages) is not list and (isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence)):
        raise TemplateError("messages", "must be a list of message objects")
    out = [canonical_message(m, i) for i, m in enumerate(messages)]
    ctools: list[dict[str, Any]] | None = None
    if tools is not None:
        if type(tools) is not list and (isinstance(tools, (str, bytes)) or not isinstance(tools, Sequence)):
            raise TemplateError("tools", "must be a list of tool objects")
        ctools = [canonical_tool(t, i) for i, t in enumerate(tools)]
        if sort_tools:
            # Name first; the full JSON breaks ties so the order is total.
            # The JSON is only needed (and computed) when two tools share a name.
            names = [t["function"]["name"] for t in ctools]
            if len(set(names)) == len(names):
                ctools.sort(key=lambda t: t["function"]["name"])
            else:
                ctools.sort(key=lambda t: (t["function"]["name"], tools_json([t])))
    return out, ctools


def content_text(content: Any) -> str:
    """The text of a content value (non-text parts contribute nothing)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return PART_SEPARATOR.join(
        p.get("text", "") for p in content if (type(p) is dict or isinstance(p, Mapping)) and p.get("type") == "text"
    )
