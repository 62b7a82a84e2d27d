"""Which session a model call belongs to.

Order: an explicit ``session_id`` (bind/invoke kwarg, or set by the agent
middleware), the callback metadata ``thread_id``, the ambient runnable config
(``configurable.session_id``, ``configurable.thread_id``, ``metadata.thread_id``),
and otherwise the conversation's own (:mod:`agent_cache.routing.conversation`):
a call before the first assistant turn is placed as a new session, and from
the first assistant turn on every step of the conversation repeats one
``conv-<hash>``, so a run without a thread id still sticks to one worker
(``ChatSGLang(infer_sessions=False)``: a fresh id per call instead).
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import ensure_config

from agent_cache.errors import InvalidRequestError
from agent_cache.routing.conversation import conversation_session

__all__ = ["conversation_session", "resolve_session_id", "session_from_config"]


def _from_run_manager(run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None) -> Any:
    metadata = getattr(run_manager, "metadata", None) or {}
    return metadata.get("thread_id")


def session_from_config(config: RunnableConfig | None = None) -> str | None:
    """The session named by a runnable config (merged with the ambient one)."""
    config = ensure_config(config)
    configurable = config.get("configurable") or {}
    metadata = config.get("metadata") or {}
    for value in (configurable.get("session_id"), configurable.get("thread_id"), metadata.get("thread_id")):
        if value is not None:
            return str(value)
    return None


def resolve_session_id(
    explicit: Any = None,
    run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None = None,
    config_session: str | None = None,
    infer: Callable[[], str] | None = None,
) -> str:
    """The session id of one call (see the module docstring for the order).

    ``config_session`` is what the caller's config named (``session_from_config``
    at the public entry point, since a config passed to ``invoke`` is not
    visible as the ambient config inside ``_generate``).
    """
    ambient = config_session if config_session is not None else session_from_config()
    for value in (explicit, _from_run_manager(run_manager), ambient):
        if value is None:
            continue
        if not isinstance(value, (str, int, uuid.UUID)) or str(value) == "":
            raise InvalidRequestError("session_id", f"expected a non-empty string, got {value!r}")
        return str(value)
    return infer() if infer is not None else f"anon-{uuid.uuid4().hex}"
