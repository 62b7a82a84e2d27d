"""The seam between a call and the worker it is sent to: :class:`WorkerTransport`.

A transport sends one encoded JSON body to one worker and hands back the
answer's lines as they arrive. Its contract, whichever library is under it:

- ``stream`` waits at most ``first_byte_timeout`` seconds for the worker to be
  reached, answer and send its first line (a hung worker accepts the
  connection and sends nothing), then at most the transport's stall timeout
  between lines;
- ``post`` waits for a whole answer, each silence bounded by the transport's
  timeout (the caller bounds the wait for a hung worker:
  :func:`~agent_cache.calls.attempt.awhole`, with ``alive``, whether the
  worker answers its ``/health``);
- failures are typed (:func:`~agent_cache.backends.protocol.transport_error`): :class:`WorkerConnectionError`
  (the worker could not be reached, or dropped the connection before
  answering), :class:`WorkerTimeoutError` (silence past a deadline),
  :class:`MalformedResponseError` (not HTTP), the status's error for an error
  status (:func:`~agent_cache.backends.protocol.http_error`), and
  :class:`StreamError` once the stream broke after its first line;
- ``send_early`` may write a request before the route answers (an optional
  fast path: a transport without it returns None); the route then either
  confirms the worker (the answer is read with ``stream(..., early=sent)``,
  or ``post(..., early=sent)`` for a whole one) or the early send is dropped.

Two implementations: :mod:`agent_cache.calls.httpx_transport` (the
reference, sync and async) and the gateway's optional fast path
:mod:`agent_cache.gateway.upstream` (asyncio and httptools).
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Iterator, Protocol

CONNECT_TIMEOUT = 10.0  # seconds to open a connection, however long the call may take


class SentEarly(Protocol):
    """A request written before its route was known; ``worker`` is where it went."""

    @property
    def worker(self) -> str: ...


class WorkerTransport(Protocol):
    """Async: how a call reaches a worker (the gateway's transports, and ``ChatSGLang``'s async calls)."""

    def send_early(self, worker: str, path: str, body: bytes) -> SentEarly | None:
        """Write the request now if it can be done without waiting; None otherwise."""
        ...

    def drop(self, sent: SentEarly) -> None:
        """Abandon an early send (the worker sees its client leave, and aborts the request)."""
        ...

    def stream(self, worker: str, path: str, body: bytes, *, first_byte_timeout: float | None = None,
               early: SentEarly | None = None) -> AsyncIterator[bytes]:
        """``POST`` ``body`` and yield the answer's lines, each with its line ending."""
        ...

    async def post(self, worker: str, path: str, body: bytes, *, early: SentEarly | None = None) -> bytes:
        """``POST`` ``body`` and return the whole answer (each silence bounded by the timeout)."""
        ...

    async def alive(self, worker: str, timeout: float) -> bool:
        """Whether ``worker`` answers ``GET /health`` with 200 within ``timeout`` seconds."""
        ...

    async def get_json(self, worker: str, path: str) -> Any:
        """``GET`` a JSON document."""
        ...

    async def aclose(self) -> None: ...


class SyncWorkerTransport(Protocol):
    """Sync :class:`WorkerTransport` (``ChatSGLang``'s sync calls); no early send."""

    def stream(self, worker: str, path: str, body: bytes, *,
               first_byte_timeout: float | None = None) -> Iterator[bytes]: ...

    def close(self) -> None: ...
