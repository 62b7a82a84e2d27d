"""The reference :class:`~agent_cache.calls.transport.WorkerTransport`: httpx, async and sync.

One pooled httpx client per transport serves every worker (absolute URLs).
Lines are split from the raw body bytes, each kept with its line ending, so
the gateway can pass events on byte for byte, as the fast path does.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterator

import httpx

from agent_cache.backends.protocol import decode_json, http_error
from agent_cache.calls.transport import CONNECT_TIMEOUT, transport_error
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
        self._pool = httpx.AsyncHTTPTransport(limits=_limits(max_connections))
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
                    for line in lines:
                        seen = True
                        # from the first line on, the deadline is the stall bound from the latest one
                        first_byte.reschedule(None if self.stall is None else loop.time() + self.stall)
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


