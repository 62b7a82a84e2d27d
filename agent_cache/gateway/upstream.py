"""The gateway's HTTP client to the workers: request bodies passed through as encoded bytes.

aiohttp rather than httpx (which the library clients use): with httpx the
gateway added 4.1 ms per call at the median, with aiohttp 2.5 ms, in the same
overhead benchmark (``docs/benchmarks.md``). Errors map to the same typed
errors as :mod:`agent_cache.backends.sglang`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncGenerator, AsyncIterator

import aiohttp

from agent_cache.backends.protocol import decode_json, http_error
from agent_cache.errors import BackendError, StreamError, WorkerConnectionError, WorkerTimeoutError

_JSON = {"Content-Type": "application/json"}
# a stream event is one line; /generate repeats the whole text so far in each, so lines can be long
_MAX_LINE = 16 * 1024 * 1024
# SGLang's HTTP server (uvicorn) closes a connection idle for 5 s; closing ours first means a
# pooled connection is never reused just as the worker drops it (a false connection error)
_IDLE_CLOSE = 4.0


class Upstream:
    """One pooled aiohttp session for every worker (created in the event loop that first uses it)."""

    def __init__(self, *, timeout: float, max_connections: int, api_key: str | None = None) -> None:
        # sock_read bounds a whole answer and each gap between stream events alike
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout)
        self._max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=self._max_connections,
                                             keepalive_timeout=_IDLE_CLOSE)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, headers=self._headers,
                                                  read_bufsize=_MAX_LINE, auto_decompress=True)
        return self._session

    @staticmethod
    def _error(exc: BaseException, worker: str) -> BackendError:
        if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            return WorkerTimeoutError(f"timed out: {type(exc).__name__}", url=worker)
        return WorkerConnectionError(f"cannot reach worker: {exc!s}", url=worker)

    async def post(self, worker: str, path: str, body: bytes) -> bytes:
        """``POST`` an encoded JSON body; the response body (an error status raises its typed error)."""
        try:
            async with self._http().post(worker + path, data=body, headers=_JSON) as response:
                content = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._error(exc, worker) from exc
        if response.status >= 400:
            raise http_error(response.status, content, worker)
        return content

    async def stream(self, worker: str, path: str, body: bytes,
                     first_byte_timeout: float | None = None) -> AsyncGenerator[bytes, None]:
        """Streamed :meth:`post`: the response's lines as they arrive, each with its line ending.

        ``first_byte_timeout``: seconds for the worker to answer and send its first line (a hung
        worker accepts the connection and sends nothing); later lines wait the session's timeout.
        """
        try:
            async with contextlib.AsyncExitStack() as stack:

                async def first_line() -> tuple[AsyncIterator[bytes], bytes | None]:
                    response = await stack.enter_async_context(self._http().post(worker + path, data=body,
                                                                                 headers=_JSON))
                    if response.status >= 400:
                        raise http_error(response.status, await response.read(), worker)
                    lines = response.content.__aiter__()
                    try:
                        return lines, await lines.__anext__()
                    except StopAsyncIteration:
                        return lines, None

                lines, first = await asyncio.wait_for(first_line(), first_byte_timeout)
                if first is None:
                    return
                yield first
                try:
                    async for line in lines:
                        yield line
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                    raise StreamError(f"stream broke: {exc!s}", url=worker) from exc
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._error(exc, worker) from exc

    async def get_json(self, worker: str, path: str) -> Any:
        try:
            async with self._http().get(worker + path) as response:
                content = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise self._error(exc, worker) from exc
        if response.status >= 400:
            raise http_error(response.status, content, worker)
        return decode_json(content, worker, path)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
