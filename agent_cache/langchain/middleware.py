"""Agent middleware: every model call of one LangGraph thread is one session."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse


def _thread_id(request: ModelRequest) -> str | None:
    info = getattr(request.runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    if thread is None:
        # no checkpointer: execution_info has no thread; the run config still may
        try:
            from langgraph.config import get_config

            thread = (get_config().get("configurable") or {}).get("thread_id")
        except RuntimeError:  # outside a graph run
            thread = None
    return None if thread is None else str(thread)


class SessionMiddleware(AgentMiddleware):
    """Pass the thread id of a ``create_agent`` run to the model as ``session_id``.

    An explicit ``session_id`` already in the model settings wins.
    """

    def _with_session(self, request: ModelRequest) -> ModelRequest:
        if "session_id" in request.model_settings:
            return request
        thread = _thread_id(request)
        if thread is None:
            return request
        return request.override(model_settings={**request.model_settings, "session_id": thread})

    def wrap_model_call(self, request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> Any:
        return handler(self._with_session(request))

    async def awrap_model_call(
        self, request: ModelRequest, handler: Callable[[ModelRequest], Awaitable[ModelResponse]]
    ) -> Any:
        return await handler(self._with_session(request))
