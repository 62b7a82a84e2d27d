"""The gateway's own error: a request it refuses before routing it. Only the gateway raises it, so it
lives here, on the base of the one tree (:mod:`agent_cache.errors`)."""

from __future__ import annotations

from agent_cache.errors import AgentCacheError


class RequestRejectedError(AgentCacheError):
    """The gateway refuses a request before routing it (no key, too large, overloaded).

    ``status`` is the HTTP status, ``code`` the OpenAI error code, ``retry_after``
    the seconds a client should wait before trying again (a saturated gateway),
    ``param`` the request field or header at fault, ``headers`` more response headers.
    """

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 retry_after: float | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.code = code
        self.retry_after = retry_after
        self.param = param
        self.headers = headers or {}
        super().__init__(message)
