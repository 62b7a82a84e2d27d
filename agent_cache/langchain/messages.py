"""LangChain messages <-> OpenAI-style chat dicts as SGLang takes and gives them."""

from __future__ import annotations

import json
from typing import Any, Sequence

from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UsageMetadata,
)
from langchain_core.messages.tool import tool_call_chunk

from agent_cache.backends.protocol import ChatChunk
from agent_cache.errors import InvalidRequestError


def _parts(content: Any) -> str | list[dict[str, Any]]:
    """String content stays a string; a list of parts keeps text and image URLs."""
    if isinstance(content, str):
        return content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content or []):
        if isinstance(part, str):
            parts.append({"type": "text", "text": part})
        elif isinstance(part, dict) and part.get("type") == "text":
            parts.append({"type": "text", "text": str(part.get("text", ""))})
        elif isinstance(part, dict) and part.get("type") == "image_url":
            if not part.get("image_url"):
                raise InvalidRequestError(f"content[{j}].image_url", "an image_url part needs its image_url")
            parts.append({"type": "image_url", "image_url": part["image_url"]})
        # other blocks (tool_use, reasoning, ...) carry nothing the worker renders
    return parts


def _text(content: Any) -> str:
    value = _parts(content)
    if isinstance(value, str):
        return value
    return "".join(p["text"] for p in value if p["type"] == "text")


def _tool_call_dict(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.get("id") or "",
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(call.get("args") or {}, ensure_ascii=False)},
    }


def to_openai_message(message: BaseMessage) -> dict[str, Any]:
    """One LangChain message as an OpenAI chat message dict."""
    if isinstance(message, SystemMessage):
        return {"role": "system", "content": _parts(message.content)}
    if isinstance(message, HumanMessage):
        return {"role": "user", "content": _parts(message.content)}
    if isinstance(message, AIMessage):
        out: dict[str, Any] = {"role": "assistant", "content": _text(message.content)}
        calls = [_tool_call_dict(c) for c in message.tool_calls]
        # invalid calls were produced by the model too; send them back verbatim
        calls += [
            {"id": c.get("id") or "", "type": "function", "function": {"name": c.get("name") or "", "arguments": c.get("args") or ""}}
            for c in message.invalid_tool_calls
        ]
        if calls:
            out["tool_calls"] = calls
        return out
    if isinstance(message, ToolMessage):
        return {"role": "tool", "content": _text(message.content), "tool_call_id": message.tool_call_id}
    if isinstance(message, FunctionMessage):
        return {"role": "tool", "content": _text(message.content), "name": message.name}
    if isinstance(message, ChatMessage):
        return {"role": message.role, "content": _parts(message.content)}
    raise InvalidRequestError("type", f"unsupported message type {type(message).__name__}")


def to_openai_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        try:
            out.append(to_openai_message(m))
        except InvalidRequestError as exc:  # name the message: messages[2].content[0].image_url
            field = exc.field if exc.field.startswith("messages") else f"messages[{i}].{exc.field}"
            raise InvalidRequestError(field, str(exc).split(": ", 1)[-1]) from None
    return out


def usage_metadata(prompt: int, completion: int, cached: int) -> UsageMetadata:
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": prompt + completion,
        "input_token_details": {"cache_read": cached},
    }


def to_ai_chunk(chunk: ChatChunk) -> AIMessageChunk:
    """One streamed delta (without usage, which goes on the final chunk)."""
    extra = {"reasoning_content": chunk.reasoning_content} if chunk.reasoning_content else {}
    return AIMessageChunk(
        content=chunk.content or "",
        tool_call_chunks=[
            tool_call_chunk(name=d.name, args=d.arguments, id=d.id, index=d.index) for d in chunk.tool_calls
        ],
        additional_kwargs=extra,
        id=chunk.id or None,
    )
