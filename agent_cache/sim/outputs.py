"""Deterministic completions for the simulated worker.

The same request always gets the same answer. What it produces:

* **scripted**: the request carries ``sim_output`` (an extra body field; SGLang
  itself would ignore it) and the worker emits exactly that text, so a
  replayed trace fills the cache with what the real model produced;
* **tool calls**: when tools are offered and ``tool_choice`` is ``required``
  or names a function, or is ``auto`` (the default) and the last user
  message mentions a tool by name (or by the last word of a snake_case name,
  e.g. "weather" for ``get_weather``); after a tool result the next mentioned
  tool not yet called in this turn is called, then a final text answer;
  arguments satisfy the tool's JSON schema (quoted strings and numbers of the
  user message fill string and number fields in order);
* **JSON** satisfying ``response_format`` (``json_schema``, or ``json_object``
  with the keys the user quotes when asking for "... 'a' and 'b' keys");
* otherwise plain text made of words chosen by a hash of the prompt.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agent_cache.sim.chat_template import content_text

_WORDS = (
    "the agent considers the question and looks at the context before it answers with care "
    "observation shows a result that supports the next step so the plan continues toward "
    "a final answer based on the evidence gathered from the tools and the prior thoughts"
).split()

_QUOTED = re.compile(r"[\"'`]([^\"'`]{1,200})[\"'`]")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True)
class PlannedOutput:
    text: str
    tool_calls: list[dict[str, Any]]  # OpenAI shape: {"id", "type": "function", "function": {"name", "arguments"}}


def _digest(*parts: Any) -> bytes:
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode())
    return h.digest()


def plain_text(seed: bytes, n_words: int) -> str:
    words = [_WORDS[seed[i % len(seed)] % len(_WORDS)] for i in range(n_words)]
    text = " ".join(words)
    return text[:1].upper() + text[1:] + "."


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def _calls_since_last_user(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    names: list[str] = []
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        for call in message.get("tool_calls") or []:
            names.append((call.get("function") or {}).get("name", ""))
    return names


def _resolve(schema: Any, root: Mapping[str, Any]) -> Any:
    while isinstance(schema, Mapping) and "$ref" in schema:
        ref = str(schema["$ref"])
        node: Any = root
        for part in ref.lstrip("#/").split("/"):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        schema = node
    return schema


class _Filler:
    """Values for a JSON schema, drawing strings and numbers from the user's words."""

    def __init__(self, user_text: str, seed: bytes) -> None:
        self.strings = _QUOTED.findall(user_text)
        self.numbers = [float(n) for n in _NUMBER.findall(user_text)]
        self.seed = seed
        self.count = 0

    def value(self, schema: Any, root: Mapping[str, Any], name: str = "value") -> Any:
        schema = _resolve(schema, root)
        if not isinstance(schema, Mapping):
            return None
        self.count += 1
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        for key in ("anyOf", "oneOf", "allOf"):
            if schema.get(key):
                options = [o for o in schema[key] if _resolve(o, root).get("type") != "null"] or schema[key]
                return self.value(options[0], root, name)
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind is None:
            kind = "object" if "properties" in schema else "string"
        if kind == "object":
            props = schema.get("properties") or {}
            return {key: self.value(sub, root, key) for key, sub in props.items()}
        if kind == "array":
            return [self.value(schema.get("items") or {"type": "string"}, root, name)]
        if kind == "integer":
            return int(self.numbers.pop(0)) if self.numbers else 1 + self.seed[self.count % 32] % 9
        if kind == "number":
            return self.numbers.pop(0) if self.numbers else 1.5
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        if self.strings:
            return self.strings.pop(0)
        return plain_text(self.seed[self.count % 32 :] + self.seed, 3).rstrip(".")


def _tool_name(tool: Mapping[str, Any]) -> str:
    return str((tool.get("function") or {}).get("name") or tool.get("name") or "")


def _tool_schema(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    fn = tool.get("function") or tool
    return fn.get("parameters") or {"type": "object", "properties": {}}


def _mentioned(tools: Sequence[Mapping[str, Any]], text: str) -> list[Mapping[str, Any]]:
    lowered = text.lower()
    hits = []
    for tool in tools:
        name = _tool_name(tool).lower()
        # the name, spaced out, or its last word ("weather" for get_weather)
        last = name.rsplit("_", 1)[-1] if "_" in name and len(name.rsplit("_", 1)[-1]) >= 4 else ""
        for form in (name, name.replace("_", " ")):
            pos = lowered.find(form) if form else -1
            if pos < 0 and last:
                match = re.search(rf"\b{re.escape(last)}\b", lowered)
                pos = match.start() if match else -1
            if pos >= 0:
                hits.append((pos, tool))
                break
    return [tool for _, tool in sorted(hits, key=lambda x: x[0])]


def _tools_to_call(body: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    tools = body.get("tools") or []
    choice = body.get("tool_choice", "auto")
    if not tools or choice == "none":
        return []
    if isinstance(choice, Mapping):
        wanted = (choice.get("function") or {}).get("name")
        return [t for t in tools if _tool_name(t) == wanted][:1]
    user_text = _last_user_text(messages)
    already = _calls_since_last_user(messages)
    candidates = [t for t in _mentioned(tools, user_text) if _tool_name(t) not in already]
    if choice == "required":
        return (candidates or list(tools))[:1]
    return candidates[:1]


def plan_output(body: Mapping[str, Any], prompt_ids: Sequence[int]) -> PlannedOutput:
    """What the simulated model says to this request."""
    messages = body.get("messages") or []
    seed = _digest(list(prompt_ids[-64:]), len(prompt_ids))
    if isinstance(body.get("sim_output"), str):
        return PlannedOutput(text=body["sim_output"], tool_calls=[])

    to_call = _tools_to_call(body, messages)
    if to_call:
        filler = _Filler(_last_user_text(messages), seed)
        calls = []
        for i, tool in enumerate(to_call):
            schema = _tool_schema(tool)
            args = filler.value(schema, schema, _tool_name(tool))
            calls.append(
                {
                    "id": "call_" + hashlib.sha256(seed + bytes([i])).hexdigest()[:24],
                    "type": "function",
                    "function": {"name": _tool_name(tool), "arguments": json.dumps(args, ensure_ascii=False)},
                }
            )
        return PlannedOutput(text="", tool_calls=calls)

    fmt = body.get("response_format") or {}
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema") or spec.get("schema_") or {"type": "object"}
        value = _Filler(_last_user_text(messages), seed).value(schema, schema)
        return PlannedOutput(text=json.dumps(value, ensure_ascii=False), tool_calls=[])
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_object":
        # keys the user asks for by quoting them ("... with 'a' and 'b' keys"), else "answer"
        keys = _QUOTED.findall(_last_user_text(messages)) if re.search(r"\bkeys?\b", _last_user_text(messages)) else []
        return PlannedOutput(text=json.dumps({k: plain_text(seed, 6) for k in keys or ["answer"]}), tool_calls=[])

    n_words = 8 + seed[0] % 24
    return PlannedOutput(text=plain_text(seed, n_words), tool_calls=[])
