"""The reference :class:`~agent_cache.calls.transport.WorkerTransport`: httpx, async and sync.

One pooled httpx client per transport serves every worker (absolute URLs).
Lines are split from the raw body bytes, each kept with its line ending, so
the gateway can pass events on byte for byte, as the fast path does. The
async transport's connections write a request's head and body in one write
(httpcore makes two, and the worker wakes for each).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator

import httpcore
import httpx

from agent_cache.backends.protocol import decode_json, http_error, transport_error
from agent_cache.calls.transport import CONNECT_TIMEOUT
from agent_cache.errors import BackendError, StreamError
from agent_cache.telemetry import trace_context


def _timeout(stall: float | None, first_byte: float | None = None) -> httpx.Timeout:
    read = first_byte if first_byte is not None else stall
    connect = CONNECT_TIMEOUT if read is None else min(CONNECT_TIMEOUT, read)
    return httpx.Timeout(stall, connect=connect, read=read)


# SGLang's HTTP server (uvicorn) closes a connection idle for 5 s, httpx's default expiry: closing
# ours first means a pooled connection is rarely reused just as the worker drops it
IDLE_CLOSE = 4.0


def _limits(max_connections: int) -> httpx.Limits:
    return httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections,
                        keepalive_expiry=IDLE_CLOSE)


def _headers(api_key: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def _lines(pending: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The whole lines in ``pending + data`` (each with its ``\\n``), and the rest."""
    *lines, rest = (pending + data).split(b"\n")
    return [line + b"\n" for line in lines], rest


async def _read(response: httpx.Response, worker: str) -> bytes:
    """The whole body of ``response``, which is then closed."""
    try:
        return await response.aread()
    except httpx.HTTPError as exc:
        raise transport_error(exc, worker) from exc
    finally:
        await response.aclose()


def _has_body(head: bytes) -> bool:
    """Whether ``head`` is an HTTP/1.1 request head whose body comes next (a length other than 0)."""
    if not head.endswith(b"\r\n\r\n"):
        return False
    lowered = head.lower()
    return b"\r\ncontent-length:" in lowered and b"\r\ncontent-length: 0\r\n" not in lowered


class _HeadWithBody(httpcore.AsyncNetworkStream):
    """A connection that holds a request's head until its body is written, and writes both at once."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream = stream
        self._head = b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if self._head:
            buffer, self._head = self._head + buffer, b""
        elif not buffer:  # the end of a message with a length: nothing to write
            return
        elif _has_body(buffer):
            self._head = buffer  # written with the body, next
            return
        await self._stream.write(buffer, timeout)

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._head:  # no body came after all
            head, self._head = self._head, b""
            await self._stream.write(head, timeout)
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._head = b""
        await self._stream.aclose()

    async def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        return _HeadWithBody(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


class _OneWriteBackend(httpcore.AsyncNetworkBackend):
    """httpcore's network backend, its connections :class:`_HeadWithBody`."""

    def __init__(self) -> None:
        self._backend = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        return _HeadWithBody(await self._backend.connect_tcp(host, port, timeout, local_address, socket_options))

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        return _HeadWithBody(await self._backend.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


class _Pool(httpx.AsyncHTTPTransport):
    """httpx's transport (its request and response mapping, its errors) over a connection pool whose
    connections write a request's head with its body."""

    def __init__(self, max_connections: int) -> None:
        limits = _limits(max_connections)
        super().__init__(limits=limits)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(), max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=_OneWriteBackend())


@dataclass
class _Early:
    worker: str
    opening: "asyncio.Task[httpx.Response]"


class HttpxTransport:
    """Async httpx transport; ``timeout``: the longest silence within a whole answer; ``stall``: between a
    stream's lines once one came (default: ``timeout``)."""

    def __init__(self, *, timeout: float | None, max_connections: int = 64, api_key: str | None = None,
                 stall: float | None = None) -> None:
        self.timeout = timeout
        self.stall = timeout if stall is None else stall
        # calls go straight to httpx's transport (its connection pool): the client's per-call layers
        # (auth, redirects, cookies, event hooks) have nothing to do for a worker
        self._pool = _Pool(max_connections)
        self._headers = list(httpx.Headers(_headers(api_key)).raw)
        self._urls: dict[str, httpx.URL] = {}
        self._extensions = {"timeout": _timeout(timeout).as_dict()}
        self._closing: set[asyncio.Future[None]] = set()

    def _request(self, worker: str, path: str, body: bytes) -> httpx.Request:
        url = self._urls.get(worker + path)
        if url is None:
            url = self._urls[worker + path] = httpx.URL(worker + path)
        request = httpx.Request("POST", url, headers=self._headers, content=body, extensions=self._extensions)
        trace_context.add_headers(request)  # a traced call's traceparent
        return request

    async def _open(self, worker: str, path: str, body: bytes) -> httpx.Response:
        request = self._request(worker, path, body)
        try:
            response = await self._pool.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise transport_error(exc, worker) from exc
        if response.status_code >= 400:
            raise http_error(response.status_code, await _read(response, worker), worker)
        return response

    def send_early(self, worker: str, path: str, body: bytes) -> _Early:
        """Start the request now, in a task of its own; :meth:`stream` reads it, or :meth:`drop` cancels it."""
        return _Early(worker, asyncio.ensure_future(self._open(worker, path, body)))

    def drop(self, sent: Any) -> None:
        assert isinstance(sent, _Early)
        if not sent.opening.done():
            sent.opening.cancel()  # httpx closes a connection whose exchange is cancelled
        elif sent.opening.exception() is None:
            closing = asyncio.ensure_future(sent.opening.result().aclose())
            self._closing.add(closing)  # held until done: the loop keeps only a weak reference
            closing.add_done_callback(self._closing.discard)

    async def stream(self, worker: str, path: str, body: bytes, *, first_byte_timeout: float | None = None,
                     early: Any = None) -> AsyncIterator[bytes]:
        response: httpx.Response | None = None
        seen = False
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(first_byte_timeout) as first_byte:
                if early is not None:
                    assert isinstance(early, _Early)
                    response = await early.opening
                else:
                    response = await self._open(worker, path, body)
                pending = b""
                async for data in response.stream:  # type: ignore[union-attr]  # the transport's byte stream
                    lines, pending = _lines(pending, data)
                    if lines:  # lines read together came together: one bound for them all
                        seen = True
                        # from the first line on, the deadline is the stall bound from the latest one
                        first_byte.reschedule(None if self.stall is None else loop.time() + self.stall)
                    for line in lines:
                        yield line
                if pending:
                    yield pending
        except BackendError:
            raise
        except (httpx.HTTPError, TimeoutError) as exc:
            if seen:
                raise StreamError(f"stream broke: {type(exc).__name__}: {exc!s}", url=worker) from exc
            raise transport_error(exc, worker) from exc
        finally:
            if response is not None:
                await response.aclose()

    async def post(self, worker: str, path: str, body: bytes, *, early: Any = None) -> bytes:
        if early is not None:
            assert isinstance(early, _Early)
            return await _read(await early.opening, worker)
        return await _read(await self._open(worker, path, body), worker)

    async def alive(self, worker: str, timeout: float) -> bool:
        request = httpx.Request("GET", worker + "/health", headers=self._headers,
                                extensions={"timeout": httpx.Timeout(timeout).as_dict()})
        try:
            async with asyncio.timeout(timeout):
                response = await self._pool.handle_async_request(request)
                await _read(response, worker)
        except (httpx.HTTPError, BackendError, TimeoutError):
            return False
        return response.status_code == 200

    async def get_json(self, worker: str, path: str) -> Any:
        request = httpx.Request("GET", worker + path, headers=self._headers, extensions=self._extensions)
        try:
            response = await self._pool.handle_async_request(request)
        except httpx.HTTPError as exc:
            raise transport_error(exc, worker) from exc
        content = await _read(response, worker)
        if response.status_code >= 400:
            raise http_error(response.status_code, content, worker)
        return decode_json(content, worker, path)

    async def aclose(self) -> None:
        await self._pool.aclose()


class SyncHttpxTransport:
    """Sync httpx transport. Without an event loop to time the first line apart, the first-byte
    deadline bounds every wait of a stream (connect, headers, each read)."""

    def __init__(self, *, timeout: float | None, max_connections: int = 64, api_key: str | None = None) -> None:
        self.timeout = timeout
        self._http = httpx.Client(timeout=_timeout(timeout), limits=_limits(max_connections),
                                  headers=_headers(api_key), event_hooks={"request": [trace_context.add_headers]})

    def stream(self, worker: str, path: str, body: bytes, *,
               first_byte_timeout: float | None = None) -> Iterator[bytes]:
        seen = False
        timeout = _timeout(self.timeout, first_byte_timeout)
        try:
            with self._http.stream("POST", worker + path, content=body, timeout=timeout) as response:
                if response.status_code >= 400:
                    raise http_error(response.status_code, response.read(), worker)
                pending = b""
                for data in response.iter_bytes():
                    lines, pending = _lines(pending, data)
                    for line in lines:
                        seen = True
                        yield line
                if pending:
                    yield pending
        except BackendError:
            raise
        except httpx.HTTPError as exc:
            if seen:
                raise StreamError(f"stream broke: {type(exc).__name__}: {exc!s}", url=worker) from exc
            raise transport_error(exc, worker) from exc

    def close(self) -> None:
        self._http.close()


