"""Limits on a request's headers, enforced in the HTTP server before any buffer grows with them.

uvicorn's parsers bound nothing on their own: httptools buffers a header of
any size (ten 100 MB headers took a gateway past 1 GB), neither parser has a
header-read timeout, and a fresh connection may stay silent for ever, so
slow-header connections (slowloris) can hold every file descriptor. Both
parsers are wrapped here alike, at the bytes they are fed:

- **size**: the bytes a request's headers have taken so far are counted as
  they arrive; past ``max_bytes`` (before the blank line that ends them)
  the connection is answered 431 and closed, and the parser is never fed
  them. Header count, line length and the total are checked exactly once
  the headers are parsed, before the application sees the request (431).
- **time**: a request's headers must arrive whole within ``timeout``
  seconds, counted from the connection's opening (a fresh connection) or
  from the first byte of the next request (a kept-alive one: the idle wait
  between requests stays uvicorn's ``--keep-alive``). Then 408 and close.
- **pending connections**: at most ``max_pending`` connections (and a
  quarter of the open-file limit) may be waiting for their headers. For
  another to be accepted (:mod:`agent_cache.gateway.accepting`), the one
  whose headers have been arriving in part for longest is closed (a slow
  sender: a legitimate request's headers come whole in one read), else the
  one that has said nothing for longest once it has had ``ROOM_GRACE_S``
  seconds (its client may not have sent yet) and nothing from it waits
  unread; else new connections wait in the kernel's queue meanwhile. So
  new (legitimate) connections are served while an attacker's hold nothing
  for long.
- **idle connections**: an idle kept-alive connection waits ``--keep-alive``
  as before; but while half the open-file limit are open (the other half is
  for the calls' connections to workers), a new connection is accepted only
  once one is closed: as above, else the one idle longest (as nginx
  reclaims kept-alive connections) once idle ``ROOM_GRACE_S`` seconds with
  no byte of a next request unread. A connection with a request under way
  is never closed to let another in.
- **requests sent ahead**: httptools parses every request in a read at
  once and queues those sent before the previous answer; a connection with
  more than ``MAX_PIPELINED`` queued is closed (256 KB of pipelined
  ``GET /health`` had queued 10,000 request objects per connection). Reads
  are fed to the parser in ``PARSE_SLICE`` pieces and the count is checked
  after each, so such a connection costs a slice of parsing, not a read's.
- **answers not read**: an answer whose bytes wait ``send_timeout`` seconds
  for the client to read any of them (the socket's buffer full) ends the
  connection, as nginx's ``send_timeout`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import json
import resource
import termios
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, cast

from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, Scope
from uvicorn.protocols.http.h11_impl import H11Protocol

from agent_cache.errors import ConfigError
from agent_cache.gateway.writes import HeadWithBody

DEFAULT_MAX_BYTES = 64 * 1024
DEFAULT_MAX_COUNT = 100
DEFAULT_MAX_LINE = 16 * 1024
DEFAULT_TIMEOUT = 10.0
DEFAULT_MAX_PENDING = 1024
DEFAULT_SEND_TIMEOUT = 60.0  # nginx's send_timeout
MAX_PIPELINED = 16  # requests a connection may send ahead of their answers before it is closed
PARSE_SLICE = 4096  # bytes fed to the parser at a time, so that the limits act between slices
# no connection that has sent nothing yet, or is idle, is closed to make room for another before it
# has had this long: a legitimate client may not have sent its request yet (one busy with many
# calls took hundreds of milliseconds), or may be reusing the idle connection (closed under its
# next call, a POST fails: httpx does not retry it)
ROOM_GRACE_S = 1.0


_FLAGS = {"max_bytes": "--max-header-bytes", "max_count": "--max-header-count", "max_line": "--max-header-line",
          "timeout": "--header-timeout", "max_pending": "--max-pending-connections",
          "send_timeout": "--send-timeout"}


@dataclass(frozen=True)
class HeaderLimits:
    """What one request's headers may take: bytes in all, header lines, bytes per line (the request
    line included), seconds to arrive; how many connections may wait for theirs at once; and how
    long an answer may wait for the client to read it."""

    max_bytes: int = DEFAULT_MAX_BYTES
    max_count: int = DEFAULT_MAX_COUNT
    max_line: int = DEFAULT_MAX_LINE
    timeout: float = DEFAULT_TIMEOUT
    max_pending: int = DEFAULT_MAX_PENDING
    send_timeout: float = DEFAULT_SEND_TIMEOUT

    def __post_init__(self) -> None:
        for name, flag in _FLAGS.items():
            if not getattr(self, name) > 0:
                raise ConfigError(flag, f"must be positive, got {getattr(self, name)!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``agent-cache serve`` flags of :class:`HeaderLimits`."""
    parser.add_argument("--max-header-bytes", type=int, default=DEFAULT_MAX_BYTES,
                        help="largest request line and headers in all, in bytes: 431 past it (default %(default)s)")
    parser.add_argument("--max-header-count", type=int, default=DEFAULT_MAX_COUNT,
                        help="most header lines in a request: 431 past it (default %(default)s)")
    parser.add_argument("--max-header-line", type=int, default=DEFAULT_MAX_LINE,
                        help="longest request line or header line, in bytes: 431 past it (default %(default)s)")
    parser.add_argument("--header-timeout", type=float, default=DEFAULT_TIMEOUT,
                        help="seconds a request's headers may take to arrive: 408 and close past it "
                             "(default %(default)s)")
    parser.add_argument("--max-pending-connections", type=int, default=DEFAULT_MAX_PENDING,
                        help="connections waiting for their request headers at once; one more closes the "
                             "slowest of them (default %(default)s, at most a quarter of the open-file limit)")
    parser.add_argument("--send-timeout", type=float, default=DEFAULT_SEND_TIMEOUT,
                        help="seconds an answer may wait for the client to read any of it before the "
                             "connection is closed (default %(default)s)")


def from_args(args: argparse.Namespace) -> HeaderLimits:
    """The limits the flags of :func:`add_arguments` give (``ConfigError`` naming a bad one)."""
    return HeaderLimits(max_bytes=args.max_header_bytes, max_count=args.max_header_count,
                        max_line=args.max_header_line, timeout=args.header_timeout,
                        max_pending=args.max_pending_connections, send_timeout=args.send_timeout)


def raise_open_file_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (each connection takes a file
    descriptor; a default soft limit of 1,024 would let a few hundred idle connections starve the
    rest) and return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft if soft != resource.RLIM_INFINITY else target
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # not allowed here: keep what we have
        return soft
    return target


def uvicorn_options(limits: HeaderLimits, http: str, connections: Connections) -> dict[str, Any]:
    """Keyword arguments for ``uvicorn.run``/``uvicorn.Config``: the HTTP protocol class (``http``:
    ``auto``, ``httptools`` or ``h11``) wrapped with ``limits``, its connections kept in ``connections``."""
    guarded = _GuardedH11 if _base_class(http) is H11Protocol else _GuardedHttpTools
    protocol = type(f"Limited{guarded.__name__}", (guarded,), {"guard_limits": limits, "guard_pending": connections})
    # h11 refuses (400) a header block past its own buffer bound: ours comes first, 431
    return {"http": protocol, "h11_max_incomplete_event_size": 2 * limits.max_bytes + (1 << 16)}


def _base_class(http: str) -> type[asyncio.Protocol]:
    if http == "h11":
        return H11Protocol
    try:
        import httptools  # noqa: F401 - as uvicorn's "auto" picks
    except ImportError:  # pragma: no cover - httptools is a dependency
        if http == "httptools":
            raise
        return H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return HttpToolsProtocol


class Connections:
    """The client connections as the limits see them. Those waiting for their headers, at most
    ``cap`` (a quarter of ``open_files``, or ``max_pending`` if lower): one more closes one of them,
    first the one whose headers have been arriving, in part, for longest (a slow sender), else the
    one that has said nothing for longest (its client may not have sent yet: a legitimate request
    comes whole in one read). Those idle between kept-alive requests, oldest first. ``max_open``,
    half of ``open_files``, is how many client connections the listener keeps open (the other half
    serves the calls' connections to workers); :meth:`admit` says when another may be accepted."""

    def __init__(self, open_files: int, max_pending: int) -> None:
        self.cap = max(1, min(max_pending, open_files // 4))
        self.max_open = max(self.cap, open_files // 2)
        # connection -> since when it waits in that state, oldest first
        self._silent: OrderedDict[_Guard, float] = OrderedDict()  # no byte of its headers yet
        self._partial: OrderedDict[_Guard, float] = OrderedDict()  # some, not all
        self._idle: OrderedDict[_Guard, float] = OrderedDict()

    def add(self, guard: _Guard) -> None:
        self._idle.pop(guard, None)
        self._silent[guard] = time.monotonic()
        while len(self) > self.cap:
            self._slowest().evict()

    def partial(self, guard: _Guard) -> None:
        """Some of the headers arrived, not all."""
        if self._silent.pop(guard, None) is not None:
            self._partial[guard] = time.monotonic()

    def discard(self, guard: _Guard) -> None:
        self._silent.pop(guard, None)
        self._partial.pop(guard, None)

    def idle(self, guard: _Guard) -> None:
        self._idle.pop(guard, None)
        self._idle[guard] = time.monotonic()

    def busy(self, guard: _Guard) -> None:
        self._idle.pop(guard, None)

    def _slowest(self) -> _Guard:
        return next(iter(self._partial or self._silent))

    def admit(self, open_now: int, arriving: int) -> bool:
        """Whether one more connection may be accepted now, ``open_now`` being open and ``arriving``
        of them not yet waiting for their headers (being set up). When ``cap`` wait for theirs, or
        ``max_open`` are open, one is closed to make room if one may go: the one whose headers have
        been arriving in part for longest; else the one that has said nothing for longest, once it
        has had ``ROOM_GRACE_S`` and nothing from it waits unread; else (only for ``max_open``) the
        one idle longest, on the same terms. If none may go, new connections wait in the kernel's
        queue and the listener looks again shortly."""
        waiting = len(self) + arriving
        if waiting < self.cap and open_now < self.max_open:
            return True
        old = time.monotonic() - ROOM_GRACE_S
        victim = next(iter(self._partial), None)
        if victim is None and self._silent:
            victim, since = next(iter(self._silent.items()))
            if since > old or _unread(victim.transport) > 0:
                victim = None
        if victim is not None:
            victim.evict()  # out of the waiting at once; its descriptor is free once it is lost
            return waiting - 1 < self.cap and open_now < self.max_open
        if waiting >= self.cap:
            return False
        for guard, since in list(self._idle.items()):
            if since > old:
                break  # the others went idle later still
            if _unread(guard.transport) > 0:  # its next request is here, not read yet: not idle
                self._idle.pop(guard)
                continue
            guard.evict()
            break
        return False

    def __len__(self) -> int:
        return len(self._silent) + len(self._partial)


def _unread(transport: asyncio.Transport) -> int:
    """Bytes received on the connection that the loop has not read yet (0 if that cannot be told)."""
    sock = transport.get_extra_info("socket")
    try:
        return int.from_bytes(fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"), "little")
    except (AttributeError, OSError, ValueError):
        return 0


def _in_headers(cycle: Any) -> bool:
    """True while the next bytes on a connection belong to a request's headers: no request yet, or
    the current one's body has arrived whole (or its answer is complete)."""
    return cycle is None or not cycle.more_body or cycle.response_complete


class _Guard:
    """One connection's header budget and timer (see the module's docstring)."""

    def __init__(self, limits: HeaderLimits, pending: Connections, loop: asyncio.AbstractEventLoop,
                 transport: asyncio.Transport, cycle: Callable[[], Any]) -> None:
        self.limits, self.pending, self.loop, self.transport = limits, pending, loop, transport
        self.cycle = cycle  # the protocol's current request/response cycle
        self.received = 0  # header bytes of the request being read
        self.tail = b""  # the last bytes of them: the blank line may span two reads
        self.phase_cycle: Any = None  # the cycle when the wait for headers began
        self.timer: asyncio.TimerHandle | None = None
        self.write_timer: asyncio.TimerHandle | None = None
        self.closed = False

    def start(self) -> None:
        """The wait for a request's headers begins (a connection opened, or a next request's first byte)."""
        self.phase_cycle = self.cycle()
        self.received, self.tail = 0, b""
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(self.limits.timeout, self._timed_out)
        self.pending.add(self)

    def stop(self) -> None:
        """The headers arrived whole (or the connection went)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.pending.discard(self)
        self.received, self.tail = 0, b""

    def admit(self, data: bytes) -> bool:
        """Whether ``data`` may be fed to the parser; else the connection is refused and closed."""
        if self.closed:
            return False
        self.pending.busy(self)
        if self.timer is not None and self.cycle() is not self.phase_cycle:
            self.stop()  # the parser completed them after an earlier read (h11 resumes a paused request)
        if not _in_headers(self.cycle()):
            return True
        if self.timer is None:
            self.start()
        size = self.received + len(data)
        if size > self.limits.max_bytes and _header_end(self.tail + data, self.limits.max_bytes - self.received
                                                        + len(self.tail)) < 0:
            self.refuse(431, f"request headers larger than {self.limits.max_bytes} bytes", "header_too_large")
            return False
        return True

    def fed(self, data: bytes, before: Any) -> None:
        """After the parser took ``data``: a new cycle means the headers arrived whole."""
        if self.closed or self.timer is None:
            return
        if self.cycle() is not before:
            self.stop()
        else:
            self.received += len(data)
            self.tail = (self.tail + data)[-3:]
            self.pending.partial(self)

    def _timed_out(self) -> None:
        self.timer = None
        if self.closed:
            return
        cycle = self.cycle()
        if cycle is not self.phase_cycle or not _in_headers(cycle):
            self.stop()  # they did arrive (parsed later than they were read)
            return
        if cycle is not None and not cycle.response_complete and not cycle.more_body:
            # a request sent ahead while the previous answer is under way: h11 parses it only
            # after that answer (its bytes are still counted), so its time starts again
            self.timer = self.loop.call_later(self.limits.timeout, self._timed_out)
            return
        if self.received == 0 and cycle is None:
            self.evict()  # never said a word
        else:
            self.refuse(408, f"request headers did not arrive within {self.limits.timeout:g} s", "request_timeout")

    def write_stalled(self) -> None:
        """The answer's bytes wait for the client to read them: past ``send_timeout`` without it
        reading, the connection goes (nginx's ``send_timeout``)."""
        if self.write_timer is None and not self.closed:
            self.write_timer = self.loop.call_later(self.limits.send_timeout, self._never_read)

    def write_resumed(self) -> None:
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def _never_read(self) -> None:
        self.write_timer = None
        self.stop()
        self.pending.busy(self)
        self.closed = True
        self.transport.abort()  # close() would wait for the unread bytes to be sent

    def evict(self) -> None:
        """Close the connection without an answer (it waited too long, or the cap needs its place)."""
        self.stop()
        self.pending.busy(self)
        self.closed = True
        self.transport.close()

    def refuse(self, status: int, message: str, code: str) -> None:
        """Answer ``status`` (unless a response is under way on the connection) and close it."""
        cycle = self.cycle()  # not while an answer is under way, nor after one sent before its request's end
        if cycle is None or (cycle.response_complete and not cycle.more_body):
            self.transport.write(_raw_error(status, message, code))
        self.evict()


def _header_end(data: bytes, within: int) -> int:
    """The offset of the blank line ending a header block in the first ``within`` bytes (+ 4), or -1."""
    window = data[:within + 4]
    ends = [i for i in (window.find(b"\r\n\r\n"), window.find(b"\n\n")) if 0 <= i < within]
    return min(ends) if ends else -1


_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _error_body(status: int, message: str, code: str, param: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                 "code": code}}).encode()


def _raw_error(status: int, message: str, code: str) -> bytes:
    body = _error_body(status, message, code)
    head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _REASONS[status], len(body)))
    return head + body


def checked_app(app: ASGI3Application, limits: HeaderLimits) -> ASGI3Application:
    """``app`` behind the exact header checks: count, each line's length and the total, from the
    parsed request (431 naming the header, connection closed)."""

    async def guarded(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] == "http":
            problem = header_problem(scope, limits)
            if problem is not None:
                message, param = problem
                body = _error_body(431, message, "header_too_large", param)
                await send({"type": "http.response.start", "status": 431,
                            "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                        (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def header_problem(scope: Scope, limits: HeaderLimits) -> tuple[str, str | None] | None:
    """What is over ``limits`` in a parsed HTTP request (a message and the header it names), or None."""
    if scope["type"] != "http":
        return None
    headers = list(scope["headers"])  # a list already (uvicorn's): no copy of the values
    if len(headers) > limits.max_count:
        return f"more than {limits.max_count} request headers ({len(headers)})", None
    # "METHOD target HTTP/1.1": the target as sent, path and query
    line = len(scope["method"]) + len(scope.get("raw_path") or b"") + len(scope["query_string"]) + 11
    if line > limits.max_line:
        return f"request line longer than {limits.max_line} bytes", "url"
    total = line + 2
    for name, value in headers:
        size = len(name) + len(value) + 2
        if size > limits.max_line:
            shown = name.decode("latin-1")[:100]
            return f"header {shown} longer than {limits.max_line} bytes", shown
        total += size + 2
    if total > limits.max_bytes:
        return f"request headers larger than {limits.max_bytes} bytes", None
    return None


class _GuardedMixin:
    """What the two parser classes below add to uvicorn's (set by :func:`uvicorn_options`)."""

    guard_limits: ClassVar[HeaderLimits]
    guard_pending: ClassVar[Connections]
    guard: _Guard | None = None


def _make(base: type[Any]) -> type[Any]:
    class Guarded(_GuardedMixin, base):  # type: ignore[misc] # one class per parser, the same additions
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.app: ASGI3Application = checked_app(self.app, self.guard_limits)

        def connection_made(self, transport: asyncio.Transport) -> None:
            transport = cast(asyncio.Transport, HeadWithBody(transport, self.loop))  # a head written with its body
            super().connection_made(transport)
            self.guard = _Guard(self.guard_limits, self.guard_pending, self.loop, transport, lambda: self.cycle)
            self.guard.start()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.guard is not None and self.timeout_keep_alive_task is not None:  # idle until the next request
                self.guard_pending.idle(self.guard)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.guard is not None:
                self.guard.closed = True
                self.guard.stop()
                self.guard_pending.busy(self.guard)
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            guard = self.guard
            if guard is None:
                super().data_received(data)
                return
            # httptools parses a whole read (up to 256 KB) at once, every request in it: fed in
            # slices, a connection sending requests far ahead is closed after a slice, before
            # the gateway spends its CPU parsing thousands of them (7,900 in 256 KB of "GET /health")
            for start in range(0, len(data), PARSE_SLICE):
                if self.transport.is_closing():  # closed by a limit, or by the parser on bad input
                    return
                self._feed(guard, data[start:start + PARSE_SLICE])  # a read shorter than a slice: not copied

        def _feed(self, guard: _Guard, data: bytes) -> None:
            if not guard.admit(data):
                return
            before = self.cycle
            super().data_received(data)
            guard.fed(data, before)
            # requests sent ahead of their answers queue up, each a request object; a client
            # that sends more than a few ahead is not one that reads its answers
            if len(getattr(self, "pipeline", ())) > MAX_PIPELINED:
                guard.evict()

        def pause_writing(self) -> None:  # the client reads its answers slower than they come
            super().pause_writing()
            if self.guard is not None:
                self.guard.write_stalled()

        def resume_writing(self) -> None:
            super().resume_writing()
            if self.guard is not None:
                self.guard.write_resumed()

    Guarded.__name__ = Guarded.__qualname__ = f"Guarded{base.__name__}"
    return Guarded


def _httptools_base() -> type[Any]:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is a dependency
        return H11Protocol
    return HttpToolsProtocol


_GuardedH11 = _make(H11Protocol)
_GuardedHttpTools = _make(_httptools_base())
