"""The gateway's optional fast transport (``agent-cache serve --transport fast``): an HTTP/1.1
client on asyncio and httptools (the parser uvicorn runs on).

The reference transport is httpx (:mod:`agent_cache.calls.httpx_transport`);
this one implements the same :class:`~agent_cache.calls.transport.WorkerTransport`
for less CPU per call (docs/benchmarks.md), and the same tests run against
both (tests/calls/test_transports.py). It speaks what the gateway needs from
SGLang: a request with a body of known length; an answer with a
``Content-Length`` or chunked; a stream's lines as they arrive; a request
written early on an idle keep-alive connection. Errors are the transports'
typed errors (:func:`~agent_cache.backends.protocol.transport_error`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncGenerator
from urllib.parse import urlsplit

import httptools

from agent_cache.backends.protocol import decode_json, http_error
from agent_cache.backends.protocol import transport_error as _error
from agent_cache.calls.transport import CONNECT_TIMEOUT as _CONNECT_TIMEOUT
from agent_cache.errors import BackendError, StreamError
from agent_cache.telemetry import trace_context

# SGLang's HTTP server (uvicorn) closes a connection idle for 5 s; closing ours first means a
# pooled connection is rarely reused just as the worker drops it (and one that was is retried)
_IDLE_CLOSE = 4.0
_PAUSE_AT = 1 << 20  # stream bytes held for a slow client before the worker's socket is paused
# a reused connection that fails this soon after the request, before any answer, was closed by the
# worker while idle (it never ran the request): sent again on a new one; later failures are errors
_STALE_WITHIN = 0.1
# what can end an exchange with a worker: the connection, a silence past the timeout, a malformed answer
_FAILURES = (OSError, asyncio.TimeoutError, httptools.HttpParserError)


@dataclass(frozen=True)
class _Origin:
    host: str
    port: int
    tls: bool
    base: str  # a path the worker URL carries, put before every request's path

    @classmethod
    def of(cls, url: str) -> "_Origin":
        parts = urlsplit(url)
        tls = parts.scheme == "https"
        return cls(parts.hostname or "127.0.0.1", parts.port or (443 if tls else 80), tls, parts.path.rstrip("/"))


class _Connection(asyncio.Protocol):
    """One keep-alive connection; the parser's callbacks fill in the current answer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self.sent_at = 0.0
        # one timer per connection, moved on lazily: a stream's every event would otherwise schedule one
        self._loop = asyncio.get_running_loop()
        self._expires: float | None = None  # when the current wait times out (the loop's clock)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._begin(streaming=False)

    def _begin(self, streaming: bool) -> None:
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.received = False  # any byte of this answer
        self.failed_at = 0.0  # when the connection failed (time.monotonic()), 0 while it has not
        self.delimited = False  # its end is known from a length or chunking, not the connection closing
        self.error: BaseException | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._streaming = streaming
        self._paused = False

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's is no subclass)

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            return
        if self._streaming and self._buffered > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.delimited and not self.complete:
            self.complete = True  # an answer that ends with its connection
            self._wake()
        elif not self.complete:
            self._fail(exc or ConnectionResetError("the worker closed the connection"))

    # --- httptools callbacks ----------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.delimited = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # --- the gateway's side -----------------------------------------------------------------

    def send(self, request: bytes, streaming: bool) -> None:
        assert self.transport is not None
        self._begin(streaming)
        self.sent_at = time.monotonic()
        self.transport.write(request)

    def stop_streaming(self) -> None:
        """The answer is read whole after all (an error status): never pause for a consumer."""
        self._streaming = False
        self._resume()

    def has_body(self) -> bool:
        return bool(self._body)

    def take(self) -> bytes:
        """The body bytes received since the last take (a paused socket reads again)."""
        out = b"".join(self._body)
        self._body, self._buffered = [], 0
        self._resume()
        return out

    def _resume(self) -> None:
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()

    async def progress(self, timeout: float | None) -> None:
        """Until the answer moves on (headers, body bytes, its end); raises on a failure or after
        ``timeout`` seconds without a byte."""
        if self.error is not None:
            raise self.error
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        if timeout is None:
            self._expires = None
        else:
            self._expires = expires = loop.time() + timeout
            if self._timer is None or self._timer_at > expires:  # else it fires first, and moves on to this
                if self._timer is not None:
                    self._timer.cancel()
                self._arm(expires)
        try:
            await waiter
        finally:
            self._waiter = None
        if self.error is not None:
            raise self.error

    def _arm(self, at: float) -> None:
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._timed)

    def _timed(self) -> None:
        self._timer = None
        waiter, expires = self._waiter, self._expires
        if waiter is None or waiter.done() or expires is None:
            return  # nothing waits now: the next wait arms it again
        if self._loop.time() < expires:
            self._arm(expires)  # the wait began after this timer was set
        else:
            waiter.set_exception(asyncio.TimeoutError())

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
            self.failed_at = time.monotonic()
        self._wake()
        self.close()

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.abort()


@dataclass(frozen=True)
class SentEarly:
    """A request written on a pooled connection, its answer not read yet (:meth:`Upstream.send_early`)."""

    worker: str
    origin: _Origin
    conn: _Connection
    request: bytes


class Upstream:
    """Keep-alive connections to every worker (opened in the event loop that uses them)."""

    def __init__(self, *, timeout: float, max_connections: int, api_key: str | None = None,
                 stall: float | None = None) -> None:
        self._timeout = timeout  # the longest silence within a whole answer
        self._stall = timeout if stall is None else stall  # ... and between a stream's lines once one came
        self._max_idle = max_connections  # kept per worker
        self._auth = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        self._origins: dict[str, _Origin] = {}
        self._idle: dict[_Origin, deque[_Connection]] = {}

    # --- connections --------------------------------------------------------------------------

    def _origin(self, worker: str) -> _Origin:
        origin = self._origins.get(worker)
        if origin is None:
            origin = self._origins[worker] = _Origin.of(worker)
        return origin

    async def _connect(self, origin: _Origin, deadline: float | None) -> _Connection:
        loop = asyncio.get_running_loop()
        opening = loop.create_connection(_Connection, origin.host, origin.port, ssl=origin.tls or None)
        _, conn = await asyncio.wait_for(opening, min(_CONNECT_TIMEOUT, _left(deadline, _CONNECT_TIMEOUT)))
        return conn

    def _reusable(self, origin: _Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have been dropped
            if not conn.closed and now - conn.idle_since < _IDLE_CLOSE:
                return conn
            conn.close()
        return None

    def _release(self, origin: _Origin, conn: _Connection) -> None:
        if conn.closed or not conn.complete or not conn.keep_alive:
            conn.close()
            return
        idle = self._idle.setdefault(origin, deque())
        if len(idle) >= self._max_idle:
            idle.popleft().close()
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _request(self, method: bytes, origin: _Origin, path: str, body: bytes) -> bytes:
        host = f"[{origin.host}]" if ":" in origin.host else origin.host  # an IPv6 address
        head = b"%s %s HTTP/1.1\r\nHost: %s:%d\r\n%s%s" % (method, (origin.base + path).encode(), host.encode(),
                                                           origin.port, self._auth, trace_context.header_lines())
        if method == b"GET":
            return head + b"\r\n"
        return head + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def _open(self, method: bytes, worker: str, path: str, body: bytes, *, streaming: bool,
                    deadline: float | None) -> tuple[_Origin, _Connection]:
        """Send the request and wait for the answer's status line and headers (by ``deadline``, a
        ``time.monotonic()``, if given; else each wait is the timeout)."""
        origin, request, conn = self._write_pooled(method, worker, path, body, streaming)
        return origin, await self._headers(worker, origin, conn, request, streaming, deadline)

    def _write_pooled(self, method: bytes, worker: str, path: str, body: bytes,
                      streaming: bool) -> tuple[_Origin, bytes, _Connection | None]:
        """The request, written at once on an idle keep-alive connection to ``worker`` if there is one
        (returned with it; None: no connection is idle, nothing was written)."""
        origin = self._origin(worker)
        request = self._request(method, origin, path, body)
        conn = self._reusable(origin)
        if conn is not None:
            conn.send(request, streaming)
        return origin, request, conn

    async def _headers(self, worker: str, origin: _Origin, conn: _Connection | None, request: bytes,
                       streaming: bool, deadline: float | None) -> _Connection:
        """The connection once the answer's headers arrived: ``request`` was written on ``conn``, a
        pooled connection, or (without one) is sent on a new connection."""
        try:
            if conn is not None:
                try:
                    return await self._wait_headers(conn, deadline)
                except ConnectionError:
                    # judged by when it failed, not when this wait began: an early send's answer is
                    # awaited only once the route is back
                    if conn.received or (conn.failed_at or time.monotonic()) - conn.sent_at > _STALE_WITHIN:
                        raise
                    conn = None  # the worker closed the idle connection as it was reused
            conn = await self._connect(origin, deadline)
            conn.send(request, streaming)
            return await self._wait_headers(conn, deadline)
        except _FAILURES as exc:
            if conn is not None:
                conn.close()
            raise _error(exc, worker) from exc
        except BaseException:
            if conn is not None:
                conn.close()
            raise

    async def _wait_headers(self, conn: _Connection, deadline: float | None) -> _Connection:
        while not conn.headers_done:
            await conn.progress(_left(deadline, self._timeout))
        return conn

    async def _answer(self, origin: _Origin, conn: _Connection, worker: str) -> bytes:
        """The whole body of the answer, the connection given back; an error status raises its typed error."""
        try:
            while not conn.complete:
                await conn.progress(self._timeout)
        except _FAILURES as exc:
            conn.close()
            raise _error(exc, worker) from exc
        except BaseException:
            conn.close()
            raise
        content = conn.take()
        self._release(origin, conn)
        if conn.status >= 400:
            raise http_error(conn.status, content, worker)
        return content

    # --- the calls ----------------------------------------------------------------------------

    async def post(self, worker: str, path: str, body: bytes, *, early: Any = None) -> bytes:
        """``POST`` an encoded JSON body; the response body (an error status raises its typed error).
        ``early``: the same request, already written by :meth:`send_early`."""
        sent: SentEarly | None = early
        if sent is not None:
            origin = sent.origin
            conn = await self._headers(worker, origin, sent.conn, sent.request, False, None)
            conn.stop_streaming()  # read whole: never paused for a consumer
        else:
            origin, conn = await self._open(b"POST", worker, path, body, streaming=False, deadline=None)
        return await self._answer(origin, conn, worker)

    async def alive(self, worker: str, timeout: float) -> bool:
        """Whether ``worker`` answers ``GET /health`` with 200 within ``timeout`` seconds."""
        try:
            origin, conn = await self._open(b"GET", worker, "/health", b"", streaming=False,
                                            deadline=time.monotonic() + timeout)
            async with asyncio.timeout(timeout):
                await self._answer(origin, conn, worker)
        except (BackendError, TimeoutError):
            return False
        return conn.status == 200

    async def stream(self, worker: str, path: str, body: bytes, *, first_byte_timeout: float | None = None,
                     early: Any = None) -> AsyncGenerator[bytes, None]:
        """Streamed :meth:`post`: the response's lines as they arrive, each with its line ending.

        ``first_byte_timeout``: seconds for the worker to be reached, answer and send its first line
        (a hung worker accepts the connection and sends nothing); later lines wait ``stall`` at most.
        ``early``: the same request, already written by :meth:`send_early`.
        """
        deadline = None if first_byte_timeout is None else time.monotonic() + first_byte_timeout
        sent: SentEarly | None = early
        if sent is not None:
            origin = sent.origin
            conn = await self._headers(worker, origin, sent.conn, sent.request, True, deadline)
        else:
            origin, conn = await self._open(b"POST", worker, path, body, streaming=True, deadline=deadline)
        if conn.status >= 400:
            conn.stop_streaming()
            await self._answer(origin, conn, worker)  # raises the status's error
        try:
            pending = b""
            lines_seen = False
            while True:
                done = conn.complete  # read before taking: bytes may land while the lines are yielded
                data = conn.take()
                if data:
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        lines_seen = True
                        yield line + b"\n"
                if done:
                    break
                if conn.complete or conn.has_body():
                    continue  # it came while the lines were yielded
                try:
                    await conn.progress(self._stall if lines_seen else _left(deadline, self._timeout))
                except _FAILURES as exc:
                    if not lines_seen:
                        raise _error(exc, worker) from exc
                    raise StreamError(f"stream broke: {type(exc).__name__}: {exc!s}", url=worker) from exc
            if pending:
                yield pending
        except BaseException:
            conn.close()
            raise
        self._release(origin, conn)

    def send_early(self, worker: str, path: str, body: bytes) -> "SentEarly | None":
        """Write a :meth:`post` on an idle keep-alive connection to ``worker`` at once, without waiting
        for anything; None when no connection is idle. Read the answer with :meth:`stream` (or, for a
        request that asks for a whole answer, :meth:`post`) given ``early``, or :meth:`drop` it."""
        origin, request, conn = self._write_pooled(b"POST", worker, path, body, True)
        return SentEarly(worker, origin, conn, request) if conn is not None else None

    @staticmethod
    def drop(sent: Any) -> None:
        """Abandon a :meth:`send_early`: its connection is closed (SGLang aborts a request whose client left)."""
        assert isinstance(sent, SentEarly)
        sent.conn.close()

    async def get_json(self, worker: str, path: str) -> Any:
        origin, conn = await self._open(b"GET", worker, path, b"", streaming=False, deadline=None)
        return decode_json(await self._answer(origin, conn, worker), worker, path)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()


def _left(deadline: float | None, otherwise: float) -> float:
    """Seconds to ``deadline`` (a ``time.monotonic()``), or ``otherwise`` without one."""
    return otherwise if deadline is None else max(0.0, deadline - time.monotonic())
