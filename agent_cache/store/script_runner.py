"""The store's hot path to Redis: EVALSHA of its scripts, packed by hiredis, on lean connections.

Every model call runs one store script. Through redis-py each such call
checks a connection out of a pool, packs its arguments in Python (asyncio)
and goes through layers of command handling; that client-side work cost
more than the script itself (``python -m agent_cache.bench.routing_bench``).
Here the tasks of an event loop share one connection: each writes its
packed command and the replies come back in order (RESP pipelining), so
calls in flight together share round trips and system calls. A thread's
call takes an idle connection for itself and gives it back (sharing one,
16 threads queued on its reads and ran slower than redis-py); one that
Redis closed while idle is noticed before use and replaced.

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
import select
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
        if user is not None and password is None:
            return None  # redis-py's own handling of a user without a password
        try:
            db = int(query["db"][0]) if "db" in query else None
            if parts.scheme != "unix" and db is None and parts.path.strip("/"):
                db = int(unquote(parts.path).strip("/"))
        except ValueError:
            return None  # redis-py ignores a database path that is not a number
        if parts.scheme == "unix":
            return cls(path=unquote(parts.path), db=db or 0, username=user, password=password)
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


class _SyncConnection:
    """One socket, used by one thread at a time (the runner hands connections out and takes them back)."""

    def __init__(self, address: RedisAddress, timeout: float | None) -> None:
        self.pid = os.getpid()
        self.broken = False
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
        """Send one command and read its reply; any failure leaves the connection broken (a command
        cut short, or a reply still on its way, would shift every later reply)."""
        try:
            self._sock.sendall(packed)
            while (value := self._parser.gets()) is False:
                data = self._sock.recv(65536)
                if not data:
                    raise ConnectionResetError("Redis closed the connection")
                self._parser.feed(data)
            return value
        except BaseException as exc:
            self.broken = True
            self.close()
            if isinstance(exc, socket.timeout):
                raise RedisTimeoutError(f"Redis did not answer in time: {exc}") from None
            if isinstance(exc, (OSError, hiredis.ProtocolError)):
                raise RedisConnectionError(f"Redis connection lost: {exc}") from None
            raise

    def stale(self) -> bool:
        """Readable while idle: Redis closed it (an idle timeout, a restart) or sent what nobody asked for."""
        try:
            return bool(select.select([self._sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


class ScriptRunner:
    """Runs the store's scripts from any number of threads: each call takes an idle connection (or
    opens one) and gives it back, so threads never wait on each other's replies and a new thread
    reuses an old connection. (One connection shared by 16 threads ran slower than redis-py.)"""

    MAX_IDLE = 64

    def __init__(self, address: RedisAddress, timeout: float | None) -> None:
        self.address = address
        self.timeout = timeout
        self._idle: deque[_SyncConnection] = deque()  # append and pop are atomic: no lock

    def _take(self) -> _SyncConnection:
        while True:
            try:
                conn = self._idle.pop()
            except IndexError:
                return _SyncConnection(self.address, self.timeout)
            if conn.pid == os.getpid() and not conn.stale():  # a forked child never shares
                return conn
            conn.close()

    def _call(self, packed: bytes) -> Any:
        conn = self._take()
        value = conn.call(packed)  # a failure leaves it broken: not given back
        if len(self._idle) < self.MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()
        return _reply(value)

    def evalsha(self, script: Script, keys: Sequence[str], args: Sequence[Any]) -> Any:
        packed = pack_evalsha(script, keys, args)
        try:
            return self._call(packed)
        except NoScriptError:  # a restarted or flushed Redis: load it and run again
            self._call(pack("SCRIPT", "LOAD", script.text))
            return self._call(packed)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


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

    def __init__(self, address: RedisAddress, timeout: float | None) -> None:
        self.address = address
        self.timeout = timeout
        self._protocol: _Protocol | None = None
        self._connecting: asyncio.Lock | None = None
        self._failed: tuple[float, BaseException] | None = None  # the last failed opening, and when

    async def _connection(self) -> _Protocol:
        protocol = self._protocol
        if protocol is not None and protocol.broken is None:
            return protocol
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        loop = asyncio.get_running_loop()
        waiting_since = loop.time()
        async with self._connecting:
            protocol = self._protocol
            if protocol is None or protocol.broken is not None:
                failed = self._failed
                if failed is not None and failed[0] >= waiting_since:
                    # an opening failed while this call waited: fail with it, not after another try
                    raise type(failed[1])(str(failed[1]))
                try:
                    protocol = self._protocol = await self._open()
                except Exception as exc:  # not a cancelled caller's CancelledError: the next waiter tries
                    self._failed = (loop.time(), exc)
                    raise
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
        if self.timeout is None:
            return await future
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
