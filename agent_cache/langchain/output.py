"""What ``ChatSGLang`` makes of one attempt's events: LangChain chunks, and the last chunk of a served call."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import LC_ID_PREFIX, AIMessageChunk
from langchain_core.outputs import ChatGenerationChunk

from agent_cache.backends.protocol import parse_chat_chunk
from agent_cache.calls.reader import Event
from agent_cache.langchain.messages import to_ai_chunk, usage_metadata
from agent_cache.routing.lifecycle import Attempt
from agent_cache.values import Placement, Usage


@dataclass
class AttemptOutput:
    """One attempt's output so far. ``live``: chunks go to the caller as they come; else they are kept
    (``chunks``) for the whole message, which is built from the attempt that succeeds."""

    attempt: Attempt
    live: bool
    run_id: Any = None  # the LangChain run, whose id a kept chunk's message takes
    model: str = ""
    finish: str | None = None
    usage: Usage | None = None
    text: str = ""
    id: str | None = None  # the message's id, as its first chunk carries it (the last chunk carries it too)
    chunks: list[ChatGenerationChunk] = field(default_factory=list)

    def chunk(self, event: Event) -> ChatGenerationChunk | None:
        """The chunk an event carries for the caller, if any (its model, finish and usage are noted)."""
        if event.payload is None:
            return None
        chunk = parse_chat_chunk(event.data(), self.attempt.placement.worker)
        self.model = chunk.model or self.model
        if chunk.finish_reason:
            self.finish = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage
        if chunk.content:
            self.text += chunk.content
        if not (chunk.content or chunk.tool_calls or chunk.reasoning_content):
            return None
        out = ChatGenerationChunk(message=to_ai_chunk(chunk))
        if self.id is None:
            self.id = out.message.id
        if self.live:
            self.attempt.delivered = True  # from here on, a retry would duplicate output
        else:
            self.chunks.append(out)
            if self.run_id is not None and out.message.id is None:
                out.message.id = f"{LC_ID_PREFIX}-{self.run_id}"
        return out

    def last(self, placement: Placement, metadata: dict[str, Any], include_usage: bool) -> ChatGenerationChunk:
        """The last chunk of the call (its usage, if the caller wants it, and ``metadata``), with the id the
        message's other chunks carry (a whole message's: its run's, when it has no other chunk)."""
        usage = self.usage if include_usage else None
        message_id = self.id
        if not self.live:
            message_id = self.chunks[0].message.id if self.chunks else message_id
            if message_id is None and self.run_id is not None:
                message_id = f"{LC_ID_PREFIX}-{self.run_id}"
        cached = (usage.cached_tokens or 0) if usage else None
        meta = {"model_name": self.model or metadata["model_name"], "model_provider": "sglang",
                "finish_reason": self.finish, "worker": placement.worker, "session_id": metadata["session_id"],
                "cached_tokens": cached, "template_id": metadata["template_id"], "routing": placement.outcome}
        chunk = AIMessageChunk(
            content="",
            id=message_id,
            response_metadata=meta,
            usage_metadata=usage_metadata(usage.prompt_tokens, usage.completion_tokens, cached or 0) if usage else None,
            chunk_position="last",
        )
        return ChatGenerationChunk(message=chunk)
