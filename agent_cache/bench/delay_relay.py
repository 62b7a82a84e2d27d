"""A TCP relay that holds every chunk for a fixed time, as a network hop to another host would.

The overhead benchmark puts it in front of Redis (``--store-delay-ms``) to
measure the routing paths with the store on another host. Each direction of
each connection has a reader thread and a writer thread: a chunk read at
time t is written at t + delay (``time.sleep`` keeps sub-millisecond delays,
where an event loop's timers round to whole milliseconds); chunks keep their
order, and bandwidth is not limited.

    python -m agent_cache.bench.delay_relay --port 7001 --to 127.0.0.1:6379 --delay-ms 0.25
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
import time
from collections import deque
from typing import Sequence


def _pipe(src: socket.socket, dst: socket.socket, delay: float) -> None:
    """Copy ``src`` to ``dst``, each chunk ``delay`` seconds after it arrived."""
    held: deque[tuple[float, bytes]] = deque()
    ready = threading.Condition()

    def read() -> None:
        try:
            while chunk := src.recv(1 << 16):
                with ready:
                    held.append((time.monotonic() + delay, chunk))
                    ready.notify()
        except OSError:
            pass
        with ready:
            held.append((0.0, b""))  # the end: the writer closes its side
            ready.notify()

    def write() -> None:
        try:
            while True:
                with ready:
                    while not held:
                        ready.wait()
                    due, chunk = held.popleft()
                if not chunk:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(chunk)
        except OSError:
            pass
        for sock in (dst, src):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    threading.Thread(target=read, daemon=True).start()
    threading.Thread(target=write, daemon=True).start()


def serve(port: int, target: tuple[str, int], delay: float) -> None:
    """Accept connections on 127.0.0.1:``port`` forever, relaying each to ``target``."""
    listener = socket.create_server(("127.0.0.1", port))
    while True:
        client, _ = listener.accept()
        try:
            upstream = socket.create_connection(target)
        except OSError:
            client.close()
            continue
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _pipe(client, upstream, delay)
        _pipe(upstream, client, delay)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_cache.bench.delay_relay", description=__doc__.split("\n\n")[0])
    p.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    p.add_argument("--to", required=True, metavar="HOST:PORT", help="where to relay")
    p.add_argument("--delay-ms", type=float, required=True, help="one-way delay added to every chunk, in ms")
    args = p.parse_args(argv)
    host, _, port = args.to.rpartition(":")
    if not host or not port.isdigit():
        print(f"error: --to expects HOST:PORT, got {args.to!r}", file=sys.stderr)
        return 2
    if args.delay_ms < 0:
        print(f"error: --delay-ms must be >= 0, got {args.delay_ms}", file=sys.stderr)
        return 2
    serve(args.port, (host, int(port)), args.delay_ms / 1000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
