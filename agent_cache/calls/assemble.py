"""A whole answer built from a streamed one (the worker is asked for a stream even when the caller
wants the whole answer, so a hung worker is left after its first-byte deadline).

``/v1/chat/completions`` chunks become one ``chat.completion``; ``/v1/completions`` chunks one
``text_completion``: texts, reasoning and logprobs are joined, tool calls merged by their index,
each choice by its own index, the usage and finish reason taken from where the stream gave them.
"""

from __future__ import annotations

from typing import Any

from agent_cache.calls.jsonio import dumps

CHAT = "/v1/chat/completions"


def _join(into: dict[str, Any], key: str, piece: Any) -> None:
    if isinstance(piece, str):
        into[key] = (into.get(key) or "") + piece


def _join_logprobs(choice: dict[str, Any], logprobs: Any) -> None:
    """Chat logprobs are ``{"content": [...]}``, completions' ``{"tokens": [...], ...}``: lists, joined."""
    if not isinstance(logprobs, dict):
        return
    into = choice.get("logprobs") or {}
    for key, value in logprobs.items():
        if isinstance(value, list):
            into[key] = (into.get(key) or []) + value
        else:
            into.setdefault(key, value)
    choice["logprobs"] = into


def _merge_tool_calls(message: dict[str, Any], deltas: list[Any]) -> None:
    calls: list[dict[str, Any]] = message.setdefault("tool_calls", None) or []
    for delta in deltas:
        if not isinstance(delta, dict):
            continue
        index = _index(delta, len(calls))
        while len(calls) <= index:
            calls.append({"id": None, "index": len(calls), "type": "function",
                          "function": {"name": None, "arguments": ""}})
        call, fn = calls[index], delta.get("function") or {}
        for key in ("id", "type"):
            if delta.get(key):
                call[key] = delta[key]
        if fn.get("name"):
            call["function"]["name"] = fn["name"]
        if isinstance(fn.get("arguments"), str):
            call["function"]["arguments"] += fn["arguments"]
    message["tool_calls"] = calls


def _index(item: dict[str, Any], otherwise: int) -> int:
    index = item.get("index")
    return index if isinstance(index, int) and 0 <= index < 1024 else otherwise


class Whole:
    """Collects a stream's events (their JSON) into the answer a non-streamed request gets."""

    def __init__(self, path: str) -> None:
        self.chat = path == CHAT
        self.top: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: Any = None

    def add(self, data: dict[str, Any]) -> None:
        if not self.top:
            self.top = {k: v for k, v in data.items() if k not in ("choices", "usage")}
            self.top["object"] = "chat.completion" if self.chat else "text_completion"
        if data.get("usage") is not None:
            self.usage = data["usage"]
        for piece in data.get("choices") or ():
            if isinstance(piece, dict):
                self._add_choice(piece)

    def _add_choice(self, piece: dict[str, Any]) -> None:
        index = _index(piece, 0)
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = {"index": index}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": None, "reasoning_content": None,
                                     "tool_calls": None}
            else:
                choice["text"] = ""
            choice.update(logprobs=None, finish_reason=None, matched_stop=None)
        if self.chat:
            delta, message = piece.get("delta") or {}, choice["message"]
            _join(message, "content", delta.get("content"))
            _join(message, "reasoning_content", delta.get("reasoning_content"))
            if delta.get("tool_calls"):
                _merge_tool_calls(message, delta["tool_calls"])
        else:
            _join(choice, "text", piece.get("text"))
        _join_logprobs(choice, piece.get("logprobs"))
        for key, value in piece.items():
            if key not in ("index", "delta", "text", "logprobs") and value is not None:
                choice[key] = value

    def body(self) -> bytes:
        if self.chat:  # a tool call's answer has no text (as SGLang answers it whole)
            for choice in self.choices.values():
                message = choice["message"]
                if message["tool_calls"] and message["content"] == "":
                    message["content"] = None
        choices = [self.choices[i] for i in sorted(self.choices)]
        return dumps({**self.top, "choices": choices, "usage": self.usage})
