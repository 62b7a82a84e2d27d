"""Backends: the HTTP protocol of SGLang workers."""

from agent_cache.backends.protocol import ChatChunk, ChatResult, GenerateResult, ToolCall, ToolCallDelta
from agent_cache.backends.sglang import AsyncSGLangClient, SGLangClient, normalize_worker_url
from agent_cache.values import Usage

__all__ = [
    "AsyncSGLangClient",
    "ChatChunk",
    "ChatResult",
    "GenerateResult",
    "SGLangClient",
    "ToolCall",
    "ToolCallDelta",
    "Usage",
    "normalize_worker_url",
]
