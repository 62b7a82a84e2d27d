"""The pipelined script connection against a real redis-server: replies reach the call that sent
them, under threads and tasks; a flushed script is reloaded; a frozen or dead Redis fails the
waiting calls fast and the next call reconnects."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from agent_cache.store.script_runner import AsyncScriptRunner, RedisAddress, Script, ScriptRunner

ECHO = Script.of("return {ARGV[1], KEYS[1]}")
FAILS = Script.of("return redis.error_reply('OOM command not allowed when used memory > maxmemory')")


def test_addresses_from_urls() -> None:
    a = RedisAddress.from_url("redis://agent:pa%3Ass@10.0.0.5:6390/3")
    assert (a.host, a.port, a.db, a.username, a.password) == ("10.0.0.5", 6390, 3, "agent", "pa:ss")
    assert RedisAddress.from_url("redis://127.0.0.1:6379?db=2").db == 2
    assert RedisAddress.from_url("unix:///tmp/r.sock?db=1") == RedisAddress(path="/tmp/r.sock", db=1)
    # what needs redis-py's connection options stays with redis-py
    for url in ("rediss://h:6379/0", "redis+sentinel://h:26379/m", "redis://h:6379/0?socket_timeout=1"):
        assert RedisAddress.from_url(url) is None, url


def test_threads_each_get_their_own_reply(redis_server) -> None:
    runner = ScriptRunner(RedisAddress.from_url(redis_server.url), timeout=2.0)
    wrong: list[tuple[str, object]] = []

    def run(t: int) -> None:
        for i in range(300):
            value = f"{t}-{i}"
            got = runner.evalsha(ECHO, [f"k{t}"], [value])
            if got != [value.encode(), f"k{t}".encode()]:
                wrong.append((value, got))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    runner.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # the gateway runs on uvloop
def test_tasks_each_get_their_own_reply_and_a_cancelled_one_leaves_the_order_intact(redis_server, loop) -> None:
    async def main() -> list[object]:
        runner = AsyncScriptRunner(RedisAddress.from_url(redis_server.url), timeout=2.0)

        async def run(t: int) -> list[object]:
            out = []
            for i in range(200):
                value = f"{t}-{i}"
                got = await runner.evalsha(ECHO, ["k"], [value])
                if got != [value.encode(), b"k"]:
                    out.append((value, got))
            return out

        cancelled = asyncio.ensure_future(runner.evalsha(ECHO, ["k"], ["gone"]))
        await asyncio.sleep(0)
        cancelled.cancel()
        results = await asyncio.gather(*[run(t) for t in range(16)])
        runner.close()
        return [w for r in results for w in r]

    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        assert uvloop.run(main()) == []
    else:
        assert asyncio.run(main()) == []


def test_a_flushed_script_is_loaded_again_and_error_replies_keep_redis_py_classes(redis_server) -> None:
    runner = ScriptRunner(RedisAddress.from_url(redis_server.url), timeout=2.0)
    assert runner.evalsha(ECHO, ["k"], ["a"]) == [b"a", b"k"]
    admin = redis.Redis(port=redis_server.port)
    admin.script_flush()
    admin.close()
    assert runner.evalsha(ECHO, ["k"], ["b"]) == [b"b", b"k"]
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        runner.evalsha(FAILS, ["k"], [])
    assert runner.evalsha(ECHO, ["k"], ["c"]) == [b"c", b"k"]  # an error reply leaves the connection usable

    async def flushed_async() -> object:
        arunner = AsyncScriptRunner(RedisAddress.from_url(redis_server.url), timeout=2.0)
        await arunner.evalsha(ECHO, ["k"], ["x"])
        admin = redis.Redis(port=redis_server.port)
        admin.script_flush()
        admin.close()
        try:
            return await arunner.evalsha(ECHO, ["k"], ["y"])
        finally:
            arunner.close()

    assert asyncio.run(flushed_async()) == [b"y", b"k"]
    runner.close()


def test_a_frozen_redis_fails_every_waiting_call_within_the_timeout_then_calls_reconnect(redis_server_factory) -> None:
    server = redis_server_factory()
    runner = ScriptRunner(RedisAddress.from_url(server.url), timeout=0.3)
    arunner = AsyncScriptRunner(RedisAddress.from_url(server.url), timeout=0.3)
    assert runner.evalsha(ECHO, ["k"], ["warm"]) == [b"warm", b"k"]
    errors: list[tuple[type, float]] = []

    def call() -> None:
        t0 = time.monotonic()
        try:
            runner.evalsha(ECHO, ["k"], ["frozen"])
        except redis.exceptions.RedisError as exc:
            errors.append((type(exc), time.monotonic() - t0))

    async def acalls() -> list[tuple[type, float]]:
        await arunner.evalsha(ECHO, ["k"], ["warm"])
        out = []

        async def one() -> None:
            t0 = time.monotonic()
            try:
                await arunner.evalsha(ECHO, ["k"], ["frozen"])
            except redis.exceptions.RedisError as exc:
                out.append((type(exc), time.monotonic() - t0))

        server.pause()
        await asyncio.gather(*[one() for _ in range(6)])
        return out

    try:
        aerrors = asyncio.run(acalls())
        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.resume()
    for found in (errors, aerrors):
        assert len(found) == 6
        assert all(issubclass(kind, (redis.exceptions.TimeoutError, redis.exceptions.ConnectionError))
                   for kind, _ in found)
        assert max(seconds for _, seconds in found) < 1.5  # about the 0.3 s timeout, not a hang
    assert runner.evalsha(ECHO, ["k"], ["back"]) == [b"back", b"k"]  # a fresh connection
    server.stop()
    with pytest.raises(redis.exceptions.ConnectionError):
        runner.evalsha(ECHO, ["k"], ["dead"])
    runner.close()


def test_a_connection_redis_closed_while_idle_is_replaced_before_use(redis_server_factory) -> None:
    server = redis_server_factory()
    admin = redis.Redis(port=server.port)
    admin.config_set("timeout", 1)  # Redis closes clients idle for a second
    admin.close()
    runner = ScriptRunner(RedisAddress.from_url(server.url), timeout=0.5)
    assert runner.evalsha(ECHO, ["k"], ["a"]) == [b"a", b"k"]
    time.sleep(2.5)  # the server's idle check runs about ten times a second
    assert runner.evalsha(ECHO, ["k"], ["b"]) == [b"b", b"k"]  # no ConnectionError: a fresh connection
    runner.close()


def test_calls_waiting_for_a_reconnect_to_a_frozen_redis_all_fail_within_one_timeout(redis_server_factory) -> None:
    server = redis_server_factory()

    async def main() -> list[float]:
        arunner = AsyncScriptRunner(RedisAddress.from_url(server.url), timeout=0.3)
        await arunner.evalsha(ECHO, ["k"], ["warm"])
        arunner.close()  # the next calls must open a connection
        server.pause()
        out: list[float] = []

        async def one() -> None:
            t0 = time.monotonic()
            with pytest.raises((redis.exceptions.TimeoutError, redis.exceptions.ConnectionError)):
                await arunner.evalsha(ECHO, ["k"], ["x"])
            out.append(time.monotonic() - t0)

        await asyncio.gather(*[one() for _ in range(10)])
        return out

    try:
        seconds = asyncio.run(main())
    finally:
        server.resume()
    assert len(seconds) == 10 and max(seconds) < 1.2  # not one timeout after another (3 s)
