"""The store's hot path to Redis: EVALSHA of its scripts, packed by hiredis, on lean connections.

Every model call runs one store script. Through redis-py each such call
checks a connection out of a pool, packs its arguments in Python (asyncio)
and goes through layers of command handling; that client-side work cost
more than the script itself (``python -m agent_cache.bench.routing_bench``).
Here the tasks of an event loop share one connection: each writes its
packed command and the replies come back in order (RESP pipelining), so
calls in flight together share round trips and system calls. Threads each
keep a connection of their own (sharing one, 16 threads queued on its
reads and ran slower than redis-py).

A connection that fails or stays silent for ``timeout`` seconds fails every
call waiting on it (redis-py's ``ConnectionError``/``TimeoutError``, which
the store maps to :class:`~agent_cache.errors.StoreUnavailableError`), and
the next call opens a new one. Error replies become redis-py's exception
classes, so callers handle both clients alike.

Used for plain ``redis://`` and ``unix://`` URLs; TLS, Sentinel, Cluster and
clients brought by the caller keep redis-py (:mod:`agent_cache.store.redis_store`).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
from redis._parsers.base import BaseParser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError



@dataclass(frozen=True)
class Script:
    """A Lua script and its SHA1, as EVALSHA names it."""

    text: str
    sha: str

    @classmethod
    def of(cls, text: str) -> "Script":
        return cls(text, hashlib.sha1(text.encode()).hexdigest())


@dataclass(frozen=True)
class RedisAddress:
    """Where and as whom to connect: a TCP host and port or a unix socket path, then AUTH and SELECT."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_url(cls, url: str) -> "RedisAddress | None":
        """The address of a plain ``redis://`` or ``unix://`` URL; None for what needs redis-py
        (TLS, Sentinel, Cluster, connection options in the query string)."""
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        if parts.scheme not in ("redis", "unix") or set(query) - {"db"}:
            return None
        user = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password else None
        db = int(query["db"][0]) if "db" in query else None
        if parts.scheme == "unix":
            return cls(path=unquote(parts.path), db=db or 0, username=user, password=password)
        if db is None and parts.path.strip("/"):
            db = int(unquote(parts.path).strip("/"))
        return cls(host=unquote(parts.hostname or "127.0.0.1"), port=parts.port or 6379, db=db or 0,
                   username=user, password=password)

    def handshake(self) -> list[bytes]:
        """The commands a new connection sends first (their replies are checked). The PING makes a
        Redis that wants a password say NOAUTH, where a long first command gets a protocol error."""
        out = []
        if self.password is not None:
            auth = ("AUTH", self.username, self.password) if self.username else ("AUTH", self.password)
            out.append(pack(*auth))
        if self.db:
            out.append(pack("SELECT", self.db))
        return out + [pack("PING")]


def pack(*args: Any) -> bytes:
    """One command in RESP (hiredis's C packer; its stub types the tuple as one element long)."""
    packed: bytes = hiredis.pack_command(args)
    return packed


def pack_evalsha(script: Script, keys: Sequence[str], args: Sequence[Any]) -> bytes:
    return pack("EVALSHA", script.sha, len(keys), *keys, *args)


def _reply(value: Any) -> Any:
    """A reply, or the redis-py exception an error reply stands for (raised)."""
    if isinstance(value, hiredis.ReplyError):
        raise BaseParser.parse_error(str(value))  # type: ignore[no-untyped-call]
    return value


class _Slot:
    """A sync call's place in the reply order."""

    __slots__ = ("done", "value", "error")

    def __init__(self) -> None:
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


class _SyncConnection:
    """One socket shared by threads: writes under one lock, and whichever thread holds the read
    lock reads for all, handing each reply to the oldest waiting call."""

    def __init__(self, address: RedisAddress, timeout: float) -> None:
        self.pid = os.getpid()
        self.broken: BaseException | None = None
        self._send_lock = threading.RLock()
        self._read_lock = threading.Lock()
        self._pending: deque[_Slot] = deque()
        self._parser = hiredis.Reader()
        try:
            if address.path is not None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                sock.connect(address.path)
            else:
                sock = socket.create_connection((address.host, address.port), timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except socket.timeout as exc:
            raise RedisTimeoutError(f"connecting to Redis timed out: {exc}") from None
        except OSError as exc:
            raise RedisConnectionError(f"cannot connect to Redis: {exc}") from None
        sock.settimeout(timeout)
        self._sock = sock
        try:
            for command in address.handshake():
                _reply(self.call(command))
        except BaseException:
            self.close()
            raise

    def call(self, packed: bytes) -> Any:
        slot = _Slot()
        with self._send_lock:
            if self.broken is not None:
                raise self.broken
            self._pending.append(slot)
            try:
                self._sock.sendall(packed)
            except OSError as exc:
                self._break(exc)
        with self._read_lock:
            while not slot.done:
                self._read()
        if slot.error is not None:
            raise slot.error
        return slot.value

    def _read(self) -> None:
        try:
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionResetError("Redis closed the connection")
            self._parser.feed(data)
            while (value := self._parser.gets()) is not False:
                slot = self._pending.popleft()
                slot.value, slot.done = value, True
        except (OSError, hiredis.ProtocolError, IndexError) as exc:
            self._break(exc)

    def _break(self, exc: BaseException) -> None:
        """Fail every call waiting on this connection; the next call opens another."""
        with self._send_lock:
            if self.broken is None:
                if isinstance(exc, socket.timeout):
                    self.broken = RedisTimeoutError(f"Redis did not answer in time: {exc}")
                else:
                    self.broken = RedisConnectionError(f"Redis connection lost: {exc}")
                self.close()
            while self._pending:
                slot = self._pending.popleft()
                slot.error, slot.done = self.broken, True

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


class ScriptRunner:
    """Runs the store's scripts from any number of threads, each thread on a connection of its own
    (one shared by all measured slower under 16 threads: they queue on its reads)."""

    def __init__(self, address: RedisAddress, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._local = threading.local()
        self._all: "weakref.WeakSet[_SyncConnection]" = weakref.WeakSet()

    def _connection(self) -> _SyncConnection:
        conn: _SyncConnection | None = getattr(self._local, "conn", None)
        if conn is None or conn.broken is not None or conn.pid != os.getpid():  # a forked child never shares
            conn = self._local.conn = _SyncConnection(self.address, self.timeout)
            self._all.add(conn)
        return conn

    def evalsha(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        packed = pack_evalsha(script, keys, args)
        try:
            return _reply(self._connection().call(packed))
        except NoScriptError:  # a restarted or flushed Redis: load it and run again
            _reply(self._connection().call(pack("SCRIPT", "LOAD", script.text)))
            return _reply(self._connection().call(packed))

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all = weakref.WeakSet()
        self._local = threading.local()


class _Protocol(asyncio.Protocol):
    """One connection shared by an event loop's tasks: replies resolve the oldest waiting future."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.broken: BaseException | None = None
        self._pending: deque[asyncio.Future[Any]] = deque()
        self._parser = hiredis.Reader()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's is no subclass)

    def data_received(self, data: bytes) -> None:
        self._parser.feed(data)
        try:
            while (value := self._parser.gets()) is not False:
                future = self._pending.popleft()
                if not future.done():  # its caller may have been cancelled
                    future.set_result(value)
        except (hiredis.ProtocolError, IndexError) as exc:
            self.fail(RedisConnectionError(f"unexpected data from Redis: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(RedisConnectionError(f"Redis connection lost: {exc or 'closed'}"))

    def send(self, packed: bytes) -> "asyncio.Future[Any]":
        if self.broken is not None or self.transport is None:
            raise self.broken or RedisConnectionError("not connected to Redis")
        # written at once, not gathered per loop iteration: Redis then runs one call's script while
        # this process handles another's reply, where a batch would make the two take turns
        future = asyncio.get_running_loop().create_future()
        self._pending.append(future)
        self.transport.write(packed)
        return future

    def timed_out(self, future: "asyncio.Future[Any]") -> None:
        if not future.done():
            self.fail(RedisTimeoutError("Redis did not answer in time"))

    def fail(self, exc: BaseException) -> None:
        if self.broken is None:
            self.broken = exc
            if self.transport is not None:
                self.transport.abort()
        while self._pending:
            future = self._pending.popleft()
            if not future.done():
                future.set_exception(self.broken)


class AsyncScriptRunner:
    """Async :class:`ScriptRunner`, bound to the event loop that first uses it."""

    def __init__(self, address: RedisAddress, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connection(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.broken is None:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            protocol = self._protocol
            if protocol is None or protocol.broken is not None:
                protocol = self._protocol = await self._open()
        return protocol

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        try:
            if self.address.path is not None:
                opening = loop.create_unix_connection(_Protocol, self.address.path)
            else:
                opening = loop.create_connection(_Protocol, self.address.host, self.address.port)
            transport, protocol = await asyncio.wait_for(opening, self.timeout)
        except asyncio.TimeoutError:
            raise RedisTimeoutError("connecting to Redis timed out") from None
        except OSError as exc:
            raise RedisConnectionError(f"cannot connect to Redis: {exc}") from None
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for command in self.address.handshake():
                _reply(await self._await(protocol, command))
        except BaseException:
            transport.abort()
            raise
        return protocol

    async def _await(self, protocol: _Protocol, packed: bytes) -> Any:
        future = protocol.send(packed)
        deadline = asyncio.get_running_loop().call_later(self.timeout, protocol.timed_out, future)
        try:
            return await future
        finally:
            deadline.cancel()

    async def evalsha(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        packed = pack_evalsha(script, keys, args)
        try:
            return _reply(await self._await(await self._connection(), packed))
        except NoScriptError:
            load = pack("SCRIPT", "LOAD", script.text)
            _reply(await self._await(await self._connection(), load))
            return _reply(await self._await(await self._connection(), packed))

    def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.transport is not None:
            protocol.transport.close()


__all__ = ["Script", "RedisAddress", "ScriptRunner", "AsyncScriptRunner", "RedisError"]
