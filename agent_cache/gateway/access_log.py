"""The gateway's access log: one line per proxied call (``--log-format json``: one JSON object).

A line names the call (``request_id``: the client's ``x-request-id`` when it sent a usable one, else
a new one; every response of the gateway echoes it, logged or not: :func:`with_request_id`), who made it (``tenant``), its session (``session_hash``,
never the id itself), where it went (``worker``, ``placement``, ``attempts``), how it ended
(``status``: the HTTP status, or ``stream_error`` for a stream broken after it started;
``latency_ms`` until the last byte) and what the cache did (``cached_tokens`` of ``prompt_tokens``).
It follows the call's lifecycle as its spans do (a :class:`~agent_cache.telemetry.tracing.CallTrace`).
"""

from __future__ import annotations

import logging
import time
import uuid
from contextvars import ContextVar
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from agent_cache.telemetry.log_format import ACCESS_LOGGER, FIELDS
from agent_cache.telemetry.trace_context import session_hash
from agent_cache.values import Placement, Usage

logger = logging.getLogger(ACCESS_LOGGER)
REQUEST_ID_HEADER = "x-request-id"
_MAX_ID = 128
_current: ContextVar["Entry | None"] = ContextVar("agent_cache_access_entry", default=None)
_SCOPE_KEY = "agent_cache.request_id"  # the id a response echoes, kept in its scope for the access line


def _request_id(scope: Scope) -> str:
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            text: str = value.decode("latin-1")
            if 0 < len(text) <= _MAX_ID and text.isprintable() and '"' not in text:
                return text
    return uuid.uuid4().hex


def with_request_id(scope: Scope, send: Send) -> Send:
    """``send`` with ``x-request-id`` added to the response: the client's usable id, else a new one."""
    request_id = scope[_SCOPE_KEY] = _request_id(scope)
    echoed = (REQUEST_ID_HEADER.encode(), request_id.encode("latin-1"))

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), echoed]}
        await send(message)

    return sending


class Entry:
    """One call's access log line, filled in as the call goes."""

    def __init__(self, scope: Scope) -> None:
        self.started = time.monotonic()
        self.request_id: str = scope.get(_SCOPE_KEY) or _request_id(scope)
        self.path = str(scope["path"])
        self.status: int | str | None = None
        self.placement: Placement | None = None
        self.tenant: str | None = None
        self.session_hash: str | None = None
        self.attempts = 0
        self.usage: Usage | None = None

    # the lifecycle's observer (CallTrace)

    def attempt(self, placement: Placement) -> None:
        self.attempts += 1
        self.placement = placement

    def settled(self, placement: Placement, error: BaseException | None, usage: Usage | None) -> None:
        if error is None:
            self.usage = usage

    def end(self, placement: Placement | None, error: BaseException | None) -> None:
        if placement is not None:
            self.placement = placement

    def call(self, tenant: str, session_id: str) -> "Entry":
        self.tenant, self.session_hash = tenant, session_hash(session_id)
        return self

    def fields(self) -> dict[str, Any]:
        usage, placement = self.usage, self.placement
        return {
            "request_id": self.request_id, "path": self.path, "status": self.status,
            "latency_ms": round((time.monotonic() - self.started) * 1000, 1),
            "tenant": self.tenant, "session_hash": self.session_hash,
            "worker": placement.worker if placement else None, "placement": placement.outcome if placement else None,
            "attempts": self.attempts,
            "prompt_tokens": usage.prompt_tokens if usage else None,
            "completion_tokens": usage.completion_tokens if usage else None,
            "cached_tokens": usage.cached_tokens if usage else None,
        }


def current() -> Entry | None:
    """The access log entry of the call this task serves (None when the access log is off)."""
    return _current.get()


def stream_broke() -> None:
    """The call's stream broke after its status line was sent."""
    entry = _current.get()
    if entry is not None:
        entry.status = "stream_error"


def enabled() -> bool:
    return logger.isEnabledFor(logging.INFO)


async def logged(app: Any, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one proxied call with ``app``, then write its access line."""
    entry = Entry(scope)
    _current.set(entry)

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            entry.status = message["status"]
        await send(message)

    try:
        await app(scope, receive, sending)
    finally:
        if entry.status is None:
            entry.status = "cancelled"
        logger.info("call", extra={FIELDS: entry.fields()})
