"""LangChain integration: the ``ChatSGLang`` chat model and the session middleware."""

from agent_cache.langchain.chat_model import ChatSGLang
from agent_cache.langchain.middleware import SessionMiddleware
from agent_cache.langchain.sessions import resolve_session_id

__all__ = ["ChatSGLang", "SessionMiddleware", "resolve_session_id"]
