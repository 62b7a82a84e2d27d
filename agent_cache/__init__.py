"""agent-cache: prefix-cache-aware middleware for LLM agents on SGLang fleets."""

from agent_cache.backends import AsyncSGLangClient, SGLangClient
from agent_cache.errors import AgentCacheError, BackendError, ConfigError
from agent_cache.langchain import ChatSGLang, SessionMiddleware
from agent_cache.templates import TemplateMode, Templater

__version__ = "0.1.0"

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
