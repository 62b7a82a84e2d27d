"""A simulated worker whose generation calls a test may answer itself (a refusal, a stream that hangs)."""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from agent_cache.sim import WorkerOptions, create_app
from agent_cache.sim.fleet import ThreadedServer

Intercept = Callable[[dict[str, Any], Any, Any], Awaitable[None]]  # an ASGI app for one call


class InterceptedWorker:
    """While ``intercept`` is set, every ``/v1/chat/...`` and ``/generate`` call goes to it (counted in
    ``intercepted``); everything else, ``/health`` included, is the simulated worker's."""

    def __init__(self, intercept: Intercept | None = None) -> None:
        self.intercept = intercept
        self.intercepted = 0
        self.server = ThreadedServer(self._app)

    @property
    def url(self) -> str:
        return self.server.url

    def _app(self) -> Callable[..., Any]:
        inner = create_app(WorkerOptions(time_scale=0.0))

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            path = scope.get("path", "")
            handler = self.intercept
            if scope["type"] == "http" and handler is not None and (path.startswith("/v1/chat")
                                                                     or path == "/generate"):
                self.intercepted += 1
                await handler(scope, receive, send)
                return
            await inner(scope, receive, send)

        return app


def refusal(status: int) -> Intercept:
    """Answer every call with ``status`` (a worker whose API key or path differs from the fleet's)."""

    async def answer(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"error": "refused"}'})

    return answer
