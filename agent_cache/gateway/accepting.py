"""Accepting client connections within a budget of file descriptors, a few at a time.

An event loop's own server accepts every connection queued on the listening socket at once
(uvloop until the queue is empty, asyncio up to the backlog, 4,096 here), before any of them
is looked at. Under a slow-header attack with more connections than file descriptors, one such
burst took every descriptor: asyncio then failed the calls' connections to workers (503) and
uvloop (libuv) accepted and closed every connection still queued, legitimate ones included,
which their clients saw as a read error. This listener accepts at most ``BATCH`` connections a
turn of the loop, each only once the gateway's limits admit it
(:meth:`agent_cache.gateway.http_limits.Connections.admit`, which may close a slow-header or
long-idle connection to make room); until then new connections wait in the kernel's queue, as
nginx stops accepting when its ``worker_connections`` run out. Connections already open with a
request under way are never closed to let one in.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Callable

logger = logging.getLogger("agent_cache.gateway")

BATCH = 32  # connections accepted a turn of the loop: each is looked at before the next batch
RETRY_S = 0.02  # while full: how soon to look again (a closed connection frees its descriptor in a turn or two)
_AGAIN = (BlockingIOError, InterruptedError)


class BoundedListener:
    """Accepts connections on ``sock`` for ``protocol_factory`` while ``admit(open, arriving)`` lets
    one more in: ``open`` counts those open (``held()``, the protocol's, and those being set up),
    ``arriving`` those being set up. Quacks as the ``asyncio.Server`` uvicorn keeps."""

    def __init__(self, sock: socket.socket, protocol_factory: Callable[[], asyncio.Protocol],
                 held: Callable[[], int], admit: Callable[[int, int], bool]) -> None:
        self.sockets = [sock]
        self._sock, self._factory, self._held, self._admit = sock, protocol_factory, held, admit
        self._loop = asyncio.get_running_loop()
        self._handing = 0  # accepted, not yet handed to a protocol (not in held())
        self._reading = False
        self._retry: asyncio.TimerHandle | None = None
        self._closed = asyncio.Event()
        sock.setblocking(False)
        self._resume()

    def _resume(self) -> None:
        self._retry = None
        if not self._reading and not self._closed.is_set():
            self._loop.add_reader(self._sock.fileno(), self._accept)
            self._reading = True

    def _pause(self, delay: float) -> None:
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False
        if self._retry is None and not self._closed.is_set():
            self._retry = self._loop.call_later(delay, self._resume)

    def _accept(self) -> None:
        for _ in range(BATCH):
            if not self._admit(self._held() + self._handing, self._handing):
                self._pause(RETRY_S)
                return
            try:
                conn, _ = self._sock.accept()
            except _AGAIN:
                return
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:  # the client went while it was queued
                    continue
                # out of descriptors despite the budget (others hold them): connections stay queued
                logger.warning("accepting a connection failed (%s); retrying in 1 s", exc)
                self._pause(1.0)
                return
            self._handing += 1
            self._loop.create_task(self._hand_over(conn))

    async def _hand_over(self, conn: socket.socket) -> None:
        try:
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as the loop's own server does
            await self._loop.connect_accepted_socket(self._factory, conn)
        except Exception:  # reset before it was set up: nothing to serve
            conn.close()
        finally:
            self._handing -= 1

    def close(self) -> None:
        """Stop accepting and close the listening socket (open connections are left alone)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._pause(0)
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._sock.close()

    async def wait_closed(self) -> None:
        await self._closed.wait()
