"""agent-cache: prefix-cache-aware middleware for LLM agents on SGLang fleets.

The names below are imported on first use, so ``import agent_cache`` (or a
light submodule such as :mod:`agent_cache.placement`) loads neither
LangChain, Redis nor an HTTP client until a name that needs them is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent_cache.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "AgentCacheError": "agent_cache.errors",
    "BackendError": "agent_cache.errors",
    "ConfigError": "agent_cache.errors",
    "AsyncSGLangClient": "agent_cache.backends",
    "SGLangClient": "agent_cache.backends",
    "ChatSGLang": "agent_cache.langchain",
    "SessionMiddleware": "agent_cache.langchain",
    "TemplateMode": "agent_cache.templates",
    "Templater": "agent_cache.templates",
}

if TYPE_CHECKING:
    from agent_cache.errors import AgentCacheError, BackendError, ConfigError
    from agent_cache.backends import AsyncSGLangClient, SGLangClient
    from agent_cache.langchain import ChatSGLang, SessionMiddleware
    from agent_cache.templates import TemplateMode, Templater


__getattr__ = lazy_exports(__name__, globals(), _LAZY)

__all__ = [
    "AgentCacheError",
    "AsyncSGLangClient",
    "BackendError",
    "ChatSGLang",
    "ConfigError",
    "SGLangClient",
    "SessionMiddleware",
    "TemplateMode",
    "Templater",
    "__version__",
]
