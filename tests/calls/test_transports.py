"""Both worker transports (httpx, the reference, and the gateway's fast path) against the same
scripted servers on loopback sockets: answers with a length, chunked streams cut at any byte,
keep-alive reuse, a connection the worker closed while idle, answers that end with their
connection, garbage, silence, a broken stream, a slow first byte, early sends."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable

import pytest

from agent_cache.calls.httpx_transport import HttpxTransport, SyncHttpxTransport
from agent_cache.errors import (
    MalformedResponseError,
    StreamError,
    WorkerBadRequestError,
    WorkerConnectionError,
    WorkerTimeoutError,
)
from agent_cache.gateway.upstream import Upstream

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
KINDS = ["httpx", "fast"]


def _transport(kind: str, timeout: float, api_key: str | None = None, stall: float | None = None) -> Any:
    if kind == "httpx":
        return HttpxTransport(timeout=timeout, max_connections=4, api_key=api_key, stall=stall)
    return Upstream(timeout=timeout, max_connections=4, api_key=api_key, stall=stall)


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def _serve(handler: Handler, test: Callable[[str, list[int]], Awaitable[None]]) -> list[int]:
    """Run ``test(url, connections)`` against a server calling ``handler`` per connection."""
    connections: list[int] = []

    async def main() -> None:
        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(1)
            try:
                await handler(reader, writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            await test(f"http://127.0.0.1:{port}", connections)
        finally:
            server.close()

    asyncio.run(main())
    return connections


def _answer(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


async def _lines(transport: Any, url: str, **kwargs: Any) -> list[bytes]:
    return [line async for line in transport.stream(url, "/v1/chat/completions", b"{}", **kwargs)]


@pytest.mark.parametrize("kind", KINDS)
def test_answers_with_a_length_reuse_one_kept_alive_connection(kind: str) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await _read_request(reader)
            seen.append(request)
            writer.write(_answer(b'{"n": %d}' % len(seen)))
            await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 2.0, api_key="k-1")
        assert [await up.post(url + "/base", "/v1/chat/completions", b'{"a":1}') for _ in range(3)] == [
            b'{"n": 1}', b'{"n": 2}', b'{"n": 3}']
        assert await up.get_json(url + "/base", "/v1/models") == {"n": 4}
        await up.aclose()

    assert len(_serve(handler, test)) == 1
    assert seen[0].startswith(b"POST /base/v1/chat/completions HTTP/1.1\r\n")
    assert b"authorization: bearer k-1\r\n" in seen[0].lower() and seen[0].endswith(b'\r\n\r\n{"a":1}')


@pytest.mark.parametrize("kind", KINDS)
def test_a_chunked_stream_cut_anywhere_comes_out_line_by_line(kind: str) -> None:
    events = b'data: {"a": 1}\n\ndata: {"b": 2}\n\ndata: [DONE]\n\n'

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(0, len(events), 7):  # chunks that split lines and events
            piece = events[i:i + 7]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.002)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 2.0)
        lines = await _lines(up, url, first_byte_timeout=1.0)
        assert lines == [b'data: {"a": 1}\n', b"\n", b'data: {"b": 2}\n', b"\n", b"data: [DONE]\n", b"\n"]
        await up.aclose()

    _serve(handler, test)


def _answer_once_then_close(after: float) -> Handler:
    """A worker that answers one request on a connection, says keep-alive, and closes it ``after``
    seconds later without reading more (as uvicorn closes an idle connection after 5 s)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer(b"{}"))
        await writer.drain()
        await asyncio.sleep(after)

    return handler


@pytest.mark.parametrize("kind", KINDS)
def test_a_stale_keep_alive_connection_is_replaced_without_an_error(kind: str) -> None:
    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 2.0)
        assert await up.post(url, "/generate", b"{}") == b"{}"
        await asyncio.sleep(0.2)
        assert await up.post(url, "/generate", b"{}") == b"{}"
        await up.aclose()

    assert len(_serve(_answer_once_then_close(0.05), test)) == 2


@pytest.mark.parametrize("kind", KINDS)
def test_an_answer_that_ends_with_its_connection_is_whole(kind: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b'HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"whole": true}')
        await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 2.0)
        assert await up.post(url, "/generate", b"{}") == b'{"whole": true}'
        await up.aclose()

    _serve(handler, test)


def _misbehaving(mode: dict[str, str]) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        if mode["now"] == "garbage":
            writer.write(b"<html>not http</html>\r\n\r\n")
        elif mode["now"] == "stalls mid-stream":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:\n\r\n")
        elif mode["now"] == "breaks mid-stream":
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.transport.abort()
            return
        await writer.drain()
        await asyncio.sleep(2)  # silent

    return handler


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_silent_past_the_stall_bound_breaks_while_a_slow_whole_answer_waits_the_timeout(kind: str) -> None:
    mode = {"now": "stalls mid-stream"}

    async def slow_whole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if mode["now"] != "slow whole answer":
            return await _misbehaving(mode)(reader, writer)
        await _read_request(reader)
        await asyncio.sleep(0.8)  # a long /generate: nothing until the whole answer
        writer.write(_answer(b'{"text": "done"}'))
        await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 5.0, stall=0.3)
        started = time.monotonic()
        with pytest.raises(StreamError):
            async for _ in up.stream(url, "/generate", b"{}", first_byte_timeout=2.0):
                pass
        assert time.monotonic() - started < 1.5  # the stall bound, not the 5 s timeout
        mode["now"] = "slow whole answer"
        assert await up.post(url, "/generate", b"{}") == b'{"text": "done"}'
        await up.aclose()

    _serve(slow_whole, test)


@pytest.mark.parametrize("kind", KINDS)
def test_garbage_silence_and_a_broken_stream_raise_typed_errors(kind: str) -> None:
    mode = {"now": "garbage"}

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 0.3)
        with pytest.raises(MalformedResponseError):
            await up.post(url, "/generate", b"{}")
        mode["now"] = "silent"
        with pytest.raises(WorkerTimeoutError):
            await up.post(url, "/generate", b"{}")
        with pytest.raises(WorkerTimeoutError):
            await _lines(up, url, first_byte_timeout=0.2)
        for broken in ("stalls mid-stream", "breaks mid-stream"):
            mode["now"] = broken
            got = []
            with pytest.raises(StreamError):
                async for line in up.stream(url, "/generate", b"{}", first_byte_timeout=0.2):
                    got.append(line)
            assert got == [b"data:\n"]
        await up.aclose()

    _serve(_misbehaving(mode), test)


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_the_worker_held_before_closing_is_not_sent_again(kind: str) -> None:
    requests: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        requests.append(await _read_request(reader))
        writer.write(_answer(b"{}"))
        await writer.drain()
        requests.append(await _read_request(reader))  # the second call, on the kept-alive connection
        await asyncio.sleep(0.3)  # works on it, then dies without answering

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 2.0)
        assert await up.post(url, "/generate", b"{}") == b"{}"
        with pytest.raises(WorkerConnectionError):
            await up.post(url, "/generate", b"{}")
        await up.aclose()

    _serve(handler, test)
    assert len(requests) == 2  # ran once: not replayed on a new connection


@pytest.mark.parametrize("kind", KINDS)
def test_an_error_status_with_a_large_body_on_a_stream_is_read_whole(kind: str) -> None:
    body = b'{"error": {"message": "' + b"x" * (3 << 20) + b'"}}'

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(_answer(body, b"400 Bad Request"))
        await writer.drain()
        await reader.read()

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 1.0)
        with pytest.raises(WorkerBadRequestError):
            await _lines(up, url, first_byte_timeout=1.0)
        await up.aclose()

    _serve(handler, test)


@pytest.mark.parametrize("kind", KINDS)
def test_a_slow_first_byte_is_bounded_by_one_deadline_for_headers_and_first_line(kind: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await asyncio.sleep(0.3)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")  # late headers, then nothing
        await writer.drain()
        await asyncio.sleep(3)

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 10.0)
        t0 = time.monotonic()
        with pytest.raises(WorkerTimeoutError):
            await _lines(up, url, first_byte_timeout=0.4)
        assert time.monotonic() - t0 < 0.6  # one deadline for headers and first line (0.3 + 0.4 before)
        await up.aclose()

    _serve(handler, test)


def _counting_stream(seen: list[bytes]) -> Handler:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await _read_request(reader))
            writer.write(_answer(b'data: {"n": %d}\n\n' % len(seen)))
            await writer.drain()

    return handler


@pytest.mark.parametrize("kind", KINDS)
def test_an_early_send_is_read_by_its_stream_or_dropped(kind: str) -> None:
    seen: list[bytes] = []

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 2.0)
        assert await up.post(url, "/generate", b"{}") == b'data: {"n": 1}\n\n'  # a kept-alive connection
        sent = up.send_early(url, "/generate", b'{"early":1}')
        assert sent is not None and sent.worker == url
        assert await _lines(up, url, early=sent) == [b'data: {"n": 2}\n', b"\n"]
        dropped = up.send_early(url, "/generate", b'{"early":2}')
        assert dropped is not None
        up.drop(dropped)
        assert await up.post(url, "/generate", b"{}") != b""  # the transport goes on
        await up.aclose()

    _serve(_counting_stream(seen), test)
    assert seen[1].endswith(b'{"early":1}')


@pytest.mark.parametrize("kind", KINDS)
def test_a_whole_answer_sent_early_is_read_by_post(kind: str) -> None:
    seen: list[bytes] = []

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 2.0)
        await up.post(url, "/v1/chat/completions", b"{}")  # a kept-alive connection
        sent = up.send_early(url, "/v1/chat/completions", b'{"early":1}')
        assert sent is not None
        await asyncio.sleep(0.05)  # the route's round trip
        assert await up.post(url, "/v1/chat/completions", b"", early=sent) == b'data: {"n": 2}\n\n'
        await up.aclose()

    assert len(_serve(_counting_stream(seen), test)) == 1  # on the kept-alive connection
    assert seen[1].endswith(b'{"early":1}')


@pytest.mark.parametrize("kind", KINDS)
def test_a_worker_is_alive_when_its_health_answers_200_in_time(kind: str) -> None:
    mode = {"now": "ok"}

    async def health(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            request = await _read_request(reader)
            assert request.startswith(b"GET /health ")
            if mode["now"] == "silent":
                await asyncio.sleep(5)
            writer.write(_answer(b"", b"200 OK" if mode["now"] == "ok" else b"503 Service Unavailable"))
            await writer.drain()

    async def test(url: str, connections: list[int]) -> None:
        up = _transport(kind, 5.0)
        assert await up.alive(url, 1.0)
        mode["now"] = "unhealthy"
        assert not await up.alive(url, 1.0)
        mode["now"] = "silent"
        started = time.monotonic()
        assert not await up.alive(url, 0.3)
        assert time.monotonic() - started < 1.0  # its own bound, not the transport's timeout
        mode["now"] = "ok"
        assert await up.alive(url, 1.0)  # on a new connection: the silent one was closed
        assert not await up.alive("http://127.0.0.1:9", 1.0)  # nothing listens there
        await up.aclose()

    _serve(health, test)


def test_the_fast_path_sends_early_only_on_an_idle_connection_and_resends_one_found_stale() -> None:
    seen: list[bytes] = []

    async def test(url: str, connections: list[int]) -> None:
        up = Upstream(timeout=2.0, max_connections=4)
        assert up.send_early(url, "/generate", b"{}") is None  # nothing to send on yet
        await up.post(url, "/generate", b"{}")
        dropped = up.send_early(url, "/generate", b"{}")
        assert dropped is not None
        up.drop(dropped)
        assert up.send_early(url, "/generate", b"{}") is None  # the dropped connection is not reused
        await up.aclose()

    assert len(_serve(_counting_stream(seen), test)) == 1

    async def stale(url: str, connections: list[int]) -> None:
        up = Upstream(timeout=2.0, max_connections=4)
        assert await up.post(url, "/generate", b"{}") == b"{}"
        sent = up.send_early(url, "/generate", b"{}")  # before the close is seen: the connection looks idle
        assert sent is not None
        await asyncio.sleep(0.15)  # the route's round trip, slower than the stale-connection window
        assert await _lines(up, url, early=sent) == [b"{}"]
        await up.aclose()

    assert len(_serve(_answer_once_then_close(0.02), stale)) == 2


def test_the_sync_httpx_transport_reads_lines_and_types_its_errors() -> None:
    mode = {"now": "silent"}

    async def test(url: str, connections: list[int]) -> None:
        def run() -> None:
            up = SyncHttpxTransport(timeout=0.3)
            with pytest.raises(WorkerTimeoutError):
                list(up.stream(url, "/generate", b"{}", first_byte_timeout=0.2))
            mode["now"] = "stalls mid-stream"
            got = []
            with pytest.raises(StreamError):
                for line in up.stream(url, "/generate", b"{}"):
                    got.append(line)
            assert got == [b"data:\n"]
            mode["now"] = "garbage"
            with pytest.raises(MalformedResponseError):
                list(up.stream(url, "/generate", b"{}"))
            up.close()

        await asyncio.to_thread(run)

    _serve(_misbehaving(mode), test)


def test_the_httpx_transport_writes_a_requests_head_and_body_at_once() -> None:
    from agent_cache.calls.httpx_transport import _HeadWithBody

    class Recorded:
        def __init__(self) -> None:
            self.writes: list[bytes] = []

        async def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self.writes.append(buffer)

        async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return b"HTTP/1.1 200 OK\r\n"

    async def main() -> None:
        inner = Recorded()
        stream = _HeadWithBody(inner)  # type: ignore[arg-type]
        post = b"POST /generate HTTP/1.1\r\nHost: w\r\nContent-Length: 2\r\n\r\n"
        await stream.write(post)
        await stream.write(b"{}")
        await stream.write(b"")  # the end of the message
        get = b"GET /health HTTP/1.1\r\nHost: w\r\n\r\n"
        await stream.write(get)
        await stream.write(post)
        await stream.read(100)  # an answer read before a body came: the head went first
        assert inner.writes == [post + b"{}", get, post]

    asyncio.run(main())
