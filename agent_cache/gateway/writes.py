"""A response's head written with its first body bytes: one write, and one wake-up of the client.

uvicorn writes the status line and headers as the app starts its response,
then each body message; for a whole answer that is two writes to the
socket, and the client wakes for the head only to wait for the body (smg
writes both at once). :class:`HeadWithBody` wraps the connection's
transport: a head is held until the next write, which carries it, or until
the event loop's next turn (a response whose body comes later, or never).
"""

from __future__ import annotations

import asyncio
from typing import Any


class HeadWithBody:
    """``transport``, with a response head held until the next write (at most until the loop's next turn)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held = b""
        self._flush_handle: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held:
            data, self._held = self._held + bytes(data), b""
            self._cancel_flush()
        elif data[:9] == b"HTTP/1.1 " and data[-4:] == b"\r\n\r\n":  # a head (any write so shaped: held a turn)
            self._held = bytes(data)
            self._flush_handle = self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Write what is held now."""
        self._cancel_flush()
        if self._held:
            held, self._held = self._held, b""
            self._transport.write(held)

    def _cancel_flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None

    def writelines(self, lines: Any) -> None:
        self.write(b"".join(lines))

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = b""
        self._cancel_flush()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # the rest is the transport's own
        return getattr(self._transport, name)
