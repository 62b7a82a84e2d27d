"""ASGI pieces of the gateway's proxied calls: an event stream written message by message, a
JSON answer in two messages, the client's departure watched."""

from __future__ import annotations

import asyncio
import sys
from typing import AsyncIterator, Awaitable, Callable, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class Once:
    """Runs ``fn`` on the first call only; True for that call."""

    def __init__(self, fn: Callable[[], None]) -> None:
        self._fn: Callable[[], None] | None = fn

    def __call__(self) -> bool:
        fn, self._fn = self._fn, None
        if fn is None:
            return False
        fn()
        return True


class EventStream(Response):
    """A server-sent event stream passed on item by item, as ASGI messages written here (a starlette
    StreamingResponse runs a task group per stream under uvicorn). A client that leaves stops it;
    ``cleanup`` runs however it ends, even when its body never starts (the server refusing a
    header, the client gone before the first byte)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]],
                 headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._content = content
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await unless_client_leaves(receive, self._send_all(send))
        finally:
            await self._cleanup()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for chunk in self._content:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def within(seconds: float, work: Awaitable[T]) -> T:
    """``await work``, raising asyncio.TimeoutError after ``seconds`` (without a task of its own where
    the Python has ``asyncio.timeout``)."""
    async with asyncio.timeout(seconds):
        return await work


async def unless_client_leaves(receive: Receive, work: Awaitable[T],
                                answered: Callable[[], bool] | None = None) -> T | None:
    """``await work``, or cancel it and return None if the client disconnects first (its call is
    settled as cancelled: the slot and the in-flight count are released at once).

    The work runs in the handler's own task; a watcher cancels that task when the client goes,
    unless ``answered()`` says the whole answer went out (the rest of the work then runs to its end).
    """
    handler = asyncio.current_task()
    assert handler is not None
    left = False

    async def watch() -> None:
        nonlocal left
        await _disconnect(receive)
        if answered is not None and answered():
            return
        left = True
        handler.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not left:
            raise  # this handler is being cancelled for another reason
        if sys.version_info >= (3, 11) and handler.uncancel() > 0:
            raise  # the watcher's cancel is consumed here; another one is not
        return None
    finally:
        watcher.cancel()


async def send_json(send: Send, body: bytes, headers: dict[str, str]) -> None:
    """A 200 answer with a JSON body, as two ASGI messages (what a starlette Response sends, without
    building one)."""
    raw = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json")]
    raw += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": 200, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def _disconnect(receive: Receive) -> None:
    """Returns when the client closes the connection, or once the answer is complete (the body has
    been read: receive waits for either)."""
    while (await receive())["type"] != "http.disconnect":
        pass
