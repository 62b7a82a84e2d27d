"""agent-cache: prefix-cache-aware middleware for LLM agents on SGLang fleets."""

from agent_cache.backends import AsyncSGLangClient, SGLangClient
from agent_cache.errors import AgentCacheError, BackendError, ConfigError

__version__ = "0.1.0"

__all__ = [
    "AgentCacheError",
    "AsyncSGLangClient",
    "BackendError",
    "ConfigError",
    "SGLangClient",
    "__version__",
]
