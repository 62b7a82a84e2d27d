"""LangChain integration: the ``ChatSGLang`` chat model and the session middleware.

``SessionMiddleware`` (which loads ``langchain.agents`` and LangGraph) is
imported on first use.
"""

from typing import TYPE_CHECKING

from agent_cache.langchain.chat_model import ChatSGLang
from agent_cache.langchain.sessions import resolve_session_id
from agent_cache.lazy import lazy_exports

if TYPE_CHECKING:
    from agent_cache.langchain.middleware import SessionMiddleware

__getattr__ = lazy_exports(__name__, globals(), {"SessionMiddleware": "agent_cache.langchain.middleware"})

__all__ = ["ChatSGLang", "SessionMiddleware", "resolve_session_id"]
