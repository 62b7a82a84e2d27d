"""Request header limits of ``agent-cache serve`` (size, count, line, read timeout, pending
connections), through the real gateway process with either HTTP parser, and session ids in headers."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from typing import Iterator

import httpx
import pytest

from agent_cache.processes import Processes, free_port, wait_until
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet

BODY = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
TRICKLE = HEAD + b"x-a: " + b"b" * 1000  # valid header bytes, sent one a second


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(1) as f:
        yield f


def _gateway(procs: Processes, fleet: SimFleet, *args: str) -> str:
    return AgentCacheGateways(procs, fleet.urls, args=list(args)).urls[0]


def _port(url: str) -> int:
    return httpx.URL(url).port or 80


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


JSON = json.dumps(BODY).encode()


def _response(sock: socket.socket) -> bytes:
    """One whole response (content-length framed) read from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a whole response")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head


def _answer(sock: socket.socket, timeout: float) -> bytes:
    """What the gateway sends before it closes the connection (b"" for a close without an answer)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.slow
def test_header_limits_answer_431_naming_the_header(procs, fleet, http):
    url = _gateway(procs, fleet, "--http", http) + "/v1/chat/completions"
    with httpx.Client(timeout=10) as client:
        assert client.post(url, json=BODY, headers={f"x-h{i}": "v" for i in range(80)}).status_code == 200
        r = client.post(url, json=BODY, headers={f"x-h{i}": "v" for i in range(101)})
        assert r.status_code == 431 and r.json()["error"]["code"] == "header_too_large"
        r = client.post(url, json=BODY, headers={"x-big": "v" * 17_000})
        assert r.status_code == 431 and r.json()["error"]["param"] == "x-big"
        r = client.post(url + "?q=" + "a" * 17_000, json=BODY)
        assert r.status_code == 431 and r.json()["error"]["param"] == "url"
        r = client.post(url, json=BODY, headers={f"x-b{i}": "v" * 8_000 for i in range(9)})  # 72 KB in all
        assert r.status_code == 431 and "65536" in r.json()["error"]["message"]
        assert client.post(url, json=BODY, headers={f"x-b{i}": "v" * 8_000 for i in range(7)}).status_code == 200


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_flagged_limits_apply(procs, fleet, http):
    url = _gateway(procs, fleet, "--http", http, "--max-header-bytes", "2000", "--max-header-count", "8",
                   "--max-header-line", "300") + "/v1/chat/completions"
    with httpx.Client(timeout=10) as client:
        assert client.post(url, json=BODY).status_code == 200  # httpx sends 7 headers
    raw = HEAD + b"connection: close\r\ncontent-length: 2\r\n\r\n{}"
    with socket.create_connection(("127.0.0.1", _port(url))) as s:  # 4 headers: 400 for the body, not 431
        s.sendall(raw)
        assert _answer(s, 5).startswith(b"HTTP/1.1 400")
    for extra, param in ((b"x-a: b\r\n" * 6, b'"param": null'), (b"x-long: " + b"v" * 300 + b"\r\n", b"x-long")):
        with socket.create_connection(("127.0.0.1", _port(url))) as s:
            s.sendall(HEAD + extra + b"content-length: 2\r\n\r\n{}")
            answer = _answer(s, 5)
            assert answer.startswith(b"HTTP/1.1 431") and param in answer


@pytest.mark.parametrize("http", ["auto", "h11"])
def test_huge_headers_are_refused_before_they_are_buffered(procs, fleet, http):
    gw = AgentCacheGateways(procs, fleet.urls, args=["--http", http])
    pid, port = gw.procs[0].pid, _port(gw.urls[0])
    httpx.post(gw.urls[0] + "/v1/chat/completions", json=BODY, timeout=10)
    before = _rss_mb(pid)
    sent, answers = [0] * 10, [b""] * 10
    chunk = b"a" * (1 << 20)

    def attack(i: int) -> None:  # a 100 MB x-session-id, as fast as the gateway takes it
        with socket.create_connection(("127.0.0.1", port)) as s:
            try:
                s.sendall(HEAD + b"x-session-id: ")
                for _ in range(100):
                    s.sendall(chunk)
                    sent[i] += len(chunk)
            except OSError:  # closed by the gateway
                pass
            answers[i] = _answer(s, 5)

    threads = [threading.Thread(target=attack, args=(i,)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    grown = _rss_mb(pid) - before
    assert grown < 20, f"RSS grew {grown:.0f} MB"
    assert all(n < 100 * len(chunk) for n in sent), sent  # every one was cut off
    assert all(a == b"" or a.startswith(b"HTTP/1.1 431") for a in answers)
    assert httpx.post(gw.urls[0] + "/v1/chat/completions", json=BODY, timeout=10).status_code == 200


@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.slow
def test_header_read_timeout_and_idle_keep_alive(procs, fleet, http):
    url = _gateway(procs, fleet, "--http", http, "--header-timeout", "1.5")
    port = _port(url)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port)) as slow, socket.create_connection(("127.0.0.1", port)) as mute:
        slow.sendall(HEAD)
        assert _answer(slow, 10).startswith(b"HTTP/1.1 408")
        assert _answer(mute, 10) == b""  # a connection that never spoke: closed without an answer
    assert 1.4 < time.monotonic() - started < 5
    with socket.create_connection(("127.0.0.1", port)) as s:  # an idle kept-alive connection is not a slow request
        s.settimeout(10)
        for pause in (0, 2.5):
            time.sleep(pause)
            s.sendall(HEAD + b"content-length: %d\r\n\r\n%s" % (len(JSON), JSON))
            assert _response(s).startswith(b"HTTP/1.1 200")
    with socket.create_connection(("127.0.0.1", port)) as s:  # a byte a second restarts nothing
        s.settimeout(10)
        t0 = time.monotonic()
        try:
            for b in HEAD:
                s.sendall(bytes([b]))
                time.sleep(0.25)
        except OSError:
            pass
        assert _answer(s, 10).startswith(b"HTTP/1.1 408") and time.monotonic() - t0 < 4


def _gateway_with_few_files(procs, worker: str, *extra: str) -> tuple[int, str]:
    """``agent-cache serve`` in front of ``worker`` with 256 file descriptors; its port and URL once healthy."""
    port = free_port()
    argv = ["prlimit", "--nofile=256:256", sys.executable, "-m", "agent_cache.cli", "serve", "--workers",
            worker, "--port", str(port), *extra]
    proc = procs.start("gateway", argv)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/health", timeout=2).status_code == 200, [proc], "gateway", timeout=60)
    return port, url


@pytest.mark.slow
def test_slow_header_connections_do_not_starve_calls(procs, fleet):
    """The slowloris case at a small scale: a gateway with 256 file descriptors, 400 connections
    sending headers at a byte a second (reopened when closed, as an attacker does) and legitimate
    calls at the same time. Without the pending-connection cap the slow ones hold every descriptor
    (0 of 40 calls succeed)."""
    port, url = _gateway_with_few_files(procs, fleet.urls[0], "--max-pending-connections", "50",
                                        "--header-timeout", "60")
    stop = threading.Event()
    opened = [0]

    def slowloris() -> None:
        socks: dict[socket.socket, int] = {}  # connection -> header bytes sent
        while not stop.is_set():
            while len(socks) < 400 and not stop.is_set():
                try:
                    socks[socket.create_connection(("127.0.0.1", port), timeout=1)] = 0
                    opened[0] += 1
                except OSError:
                    break
            for s, n in list(socks.items()):
                try:
                    s.send(TRICKLE[n:n + 1])
                    socks[s] = n + 1
                except OSError:
                    del socks[s]
                    s.close()
            stop.wait(1.0)
        for s in socks:
            s.close()

    attacker = threading.Thread(target=slowloris)
    attacker.start()
    try:
        time.sleep(3)
        ok = 0
        with httpx.Client(timeout=3) as client:  # the header timeout (60 s) does not come into it
            for _ in range(40):
                try:
                    ok += client.post(url + "/v1/chat/completions", json=BODY,
                                      headers={"connection": "close"}).status_code == 200
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
    finally:
        stop.set()
        attacker.join(30)
    assert opened[0] > 400  # the attacker's connections were closed and reopened
    assert ok >= 38, f"{ok} of 40 calls succeeded"


@pytest.mark.slow
def test_idle_kept_alive_connections_do_not_starve_calls(procs, fleet):
    """300 connections that each made a call and stay idle (kept alive), on a gateway with 256 file
    descriptors: past half of them the oldest idle ones are closed, so new calls are served. Without
    that, the idle ones hold every descriptor for --keep-alive (75 s) and no call is served."""
    port, url = _gateway_with_few_files(procs, fleet.urls[0])
    idle: list[socket.socket] = []
    try:
        unanswered = 0
        while len(idle) < 300 and unanswered < 3:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            idle.append(s)
            try:
                s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
                _response(s)
            except OSError:  # not accepted (no descriptor left), or closed at once: kept on this side
                unanswered += 1
        ok = 0
        with httpx.Client(timeout=3) as client:
            for _ in range(20):
                try:
                    ok += client.post(url + "/v1/chat/completions", json=BODY,
                                      headers={"connection": "close"}).status_code == 200
                except httpx.HTTPError:
                    pass
        assert ok == 20, f"{ok} of 20 calls succeeded"
    finally:
        for s in idle:
            s.close()


async def _slow_header_connections(port: int, count: int, stop: threading.Event, opened: list[int]) -> None:
    """``count`` connections sending valid header bytes at one a second, each reopened as soon as
    the gateway closes it (as an attacker with more connections than the gateway's descriptors does)."""

    async def one() -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            opened[0] += 1

            async def trickle() -> None:
                for i in range(len(TRICKLE)):
                    writer.write(TRICKLE[i:i + 1])
                    await asyncio.sleep(1)

            sending = asyncio.ensure_future(trickle())
            try:
                await reader.read(65536)  # returns when the gateway closes it
            except OSError:
                pass
            sending.cancel()
            writer.close()

    tasks = [asyncio.ensure_future(one()) for _ in range(count)]
    while not stop.is_set():
        await asyncio.sleep(0.1)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.slow
def test_calls_survive_more_slow_header_connections_than_file_descriptors(procs, fleet):
    """A gateway with 256 file descriptors under 400 slow-header connections, each reopened at once
    when closed, answers every legitimate call, 32 at a time, over kept-alive connections and over
    fresh ones. Before, the gateway accepted every queued connection at once: one burst took every
    descriptor, and uvloop then accepted and closed the queued connections, legitimate ones too
    (their clients saw a read error), or calls could not reach their worker (503)."""
    port, url = _gateway_with_few_files(procs, fleet.urls[0])
    stop, opened = threading.Event(), [0]
    attacker = threading.Thread(target=lambda: asyncio.run(_slow_header_connections(port, 400, stop, opened)))
    attacker.start()
    failures: list[str] = []

    async def calls(client: httpx.AsyncClient, headers: dict[str, str]) -> None:
        async def one() -> None:
            try:
                answer = await client.post(url + "/v1/chat/completions", json=BODY, headers=headers)
                if answer.status_code != 200:
                    failures.append(f"{answer.status_code}")
            except httpx.HTTPError as exc:
                failures.append(repr(exc))

        await asyncio.gather(*[one() for _ in range(32)])

    async def legitimate() -> None:
        async with httpx.AsyncClient(timeout=30) as kept, httpx.AsyncClient(timeout=30) as fresh:
            for _ in range(3):
                await asyncio.gather(calls(kept, {}), calls(fresh, {"connection": "close"}))
                await asyncio.sleep(1)

    try:
        time.sleep(3)
        asyncio.run(legitimate())
    finally:
        stop.set()
        attacker.join(30)
    assert opened[0] > 400  # the attacker's connections were closed and reopened
    assert not failures, f"{len(failures)} of 192 calls failed: {sorted(set(failures))}"


def test_session_ids_in_headers_are_utf8_and_echoes_bounded(procs, fleet):
    url = _gateway(procs, fleet) + "/v1/chat/completions"
    with httpx.Client(timeout=10) as client:
        for session in ("sess-é", "会话"):
            by_header = client.post(url, json=BODY, headers=[(b"x-session-id", session.encode())])
            by_user = client.post(url, json={**BODY, "user": session})
            assert by_header.status_code == by_user.status_code == 200, by_header.text
            assert by_header.headers["x-agent-cache-session"] == by_user.headers["x-agent-cache-session"]
        # a control character in a header: the HTTP parser refuses the request itself
        assert client.post(url, json=BODY, headers=[(b"x-session-id", b"a\x01b")]).status_code == 400
        r = client.post(url, json=BODY, headers=[(b"x-session-id", b"\xff\xfe")])
        assert r.status_code == 400 and r.json()["error"]["param"] == "x-session-id"
        r = client.post(url, json={**BODY, "user": "a\u0085b"})  # a C1 control (NEL)
        assert r.status_code == 400 and r.json()["error"]["param"] == "user"
        long_id = "é" * 1_000_000
        r = client.post(url, json={**BODY, "user": long_id})
        echoed = r.headers["x-agent-cache-session"]
        assert r.status_code == 200 and echoed.startswith("sha256:") and len(echoed) == 71
        r = client.post(url, json=BODY, headers=[(b"x-session-id", long_id[:5_000].encode())])
        assert r.status_code == 200 and len(r.headers["x-agent-cache-session"]) == 71


@pytest.mark.parametrize("http", ["httptools", "h11"])
@pytest.mark.slow
def test_requests_sent_ahead_of_unread_answers_hold_no_memory(procs, fleet, http):
    """100 connections each send 256 KB of pipelined requests (10,922 of them) and read nothing:
    before the cap httptools queued every one (458 MB -> 2,754 MB)."""
    gw = AgentCacheGateways(procs, fleet.urls, args=["--http", http])
    pid, port = gw.procs[0].pid, _port(gw.urls[0])
    assert httpx.get(gw.urls[0] + "/health", timeout=10).status_code == 200
    before = _rss_mb(pid)
    one = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
    socks = []
    try:
        for _ in range(100):
            s = socket.create_connection(("127.0.0.1", port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(5)
            try:
                s.sendall(one * (256 * 1024 // len(one)))
            except OSError:  # closed by the gateway
                pass
            socks.append(s)
        time.sleep(2)
        grown = _rss_mb(pid) - before
        started = time.monotonic()
        assert httpx.get(gw.urls[0] + "/health", timeout=10).status_code == 200
        assert time.monotonic() - started < 2
    finally:
        for s in socks:
            s.close()
    assert grown < 60, f"RSS grew {grown:.0f} MB"


@pytest.mark.slow
def test_an_answer_never_read_ends_its_connection(procs, fleet):
    """A stream whose reader reads nothing: the connection goes after --send-timeout, its call ends."""
    gw = _gateway(procs, fleet, "--send-timeout", "2", "--extra-fields", "sim_output")
    # a scripted answer of 60,000 tokens, ~14 MB of events: far more than the kernel buffers
    # (4 MB for the sender at most) hold, so the gateway's writes must wait for the reader
    body = json.dumps({**BODY, "max_tokens": 60_000, "stream": True, "sim_output": "word " * 60_000}).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
    with s:
        s.connect(("127.0.0.1", _port(gw)))
        s.sendall(HEAD + b"content-length: %d\r\n\r\n" % len(body) + body)
        wait_until(lambda: httpx.get(gw + "/health", timeout=5).json()["inflight"] == 1, [], "the call", timeout=20)
        # nothing read: once the buffers are full the gateway waits 2 s, then drops the connection
        wait_until(lambda: httpx.get(gw + "/health", timeout=5).json()["inflight"] == 0, [], "the call to end",
                   timeout=30)
        s.settimeout(5)
        got = 0
        try:
            while chunk := s.recv(1 << 20):
                got += len(chunk)
        except ConnectionResetError:  # dropped with unread bytes: the kernel resets the connection
            pass
    assert 0 < got < 6_000_000, got  # cut off: well under half of the whole stream
