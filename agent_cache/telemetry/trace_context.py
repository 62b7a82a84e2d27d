"""The trace context a call carries to its worker, per context (task or thread): stdlib only.

The tracer (:mod:`.otel`) sets the headers of the attempt in progress; the clients that talk to
workers add them to their requests (:func:`header_lines` for the gateway's hand-written HTTP/1.1,
:func:`add_headers` as an httpx event hook). With tracing off they stay empty.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

Headers = tuple[tuple[str, str], ...]

# the headers (traceparent, tracestate) the next request to a worker carries, in this context
_OUTGOING: ContextVar[Headers] = ContextVar("agent_cache_trace_outgoing", default=())
# the incoming request's trace context (an OpenTelemetry Context), the parent of the call's span
_PARENT: ContextVar[Any] = ContextVar("agent_cache_trace_parent", default=None)


def session_hash(session_id: str) -> str:
    """What a span or a log line shows of a session id: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def set_outgoing(headers: Headers) -> None:
    _OUTGOING.set(headers)


def set_parent(parent: Any) -> None:
    _PARENT.set(parent)


def parent() -> Any:
    return _PARENT.get()


def header_lines() -> bytes:
    """The trace headers for a request to a worker written by hand, as HTTP/1.1 header lines."""
    return b"".join(b"%s: %s\r\n" % (k.encode("latin-1"), v.encode("latin-1")) for k, v in _OUTGOING.get())


def add_headers(request: "httpx.Request") -> None:
    """An httpx ``request`` event hook: the trace headers on a request to a worker."""
    for name, value in _OUTGOING.get():
        request.headers[name] = value


async def aadd_headers(request: "httpx.Request") -> None:
    """Async :func:`add_headers`."""
    add_headers(request)
