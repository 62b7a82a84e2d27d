"""The delay relay in front of a real Redis: every round trip takes at least twice the delay, and bytes pass whole."""

from __future__ import annotations

import threading
import time
from urllib.parse import urlsplit

import redis

from agent_cache.bench.delay_relay import serve
from agent_cache.processes import free_port


def test_a_round_trip_through_the_relay_takes_twice_its_delay_and_keeps_the_bytes(redis_server) -> None:
    target = urlsplit(redis_server.url)
    port = free_port()
    threading.Thread(target=serve, args=(port, (target.hostname, target.port), 0.002), daemon=True).start()
    client = redis.Redis(port=port, socket_timeout=5.0)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            assert time.monotonic() < deadline, "the relay never listened"
            time.sleep(0.02)
    t0 = time.perf_counter()
    for _ in range(20):
        assert client.ping()
    assert (time.perf_counter() - t0) / 20 >= 0.004  # 2 ms each way
    value = bytes(range(256)) * 4096  # 1 MiB, read back whole and in order
    client.set("delay-relay-test", value)
    try:
        assert client.get("delay-relay-test") == value
    finally:
        client.delete("delay-relay-test")
        client.close()
