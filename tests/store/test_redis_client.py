"""The store's one Redis client (redis-py) against real redis-servers: a flushed script is loaded
again; a frozen Redis fails every waiting call within the socket timeout and later calls reconnect;
a connection Redis closed while idle is replaced; a refusing Redis is a StoreRefusedError on the
check and on calls alike, with the password never shown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redis

from agent_cache.errors import StoreError, StoreRefusedError, StoreUnavailableError
from agent_cache.placement.rule import Policy
from agent_cache.store import RedisStore, RouteQuery, WorkerSpec

WORKERS = (WorkerSpec("http://w1", "up", 100_000), WorkerSpec("http://w2", "up", 100_000))


def _route(store: RedisStore, sid: str) -> str | None:
    return store.route(RouteQuery("default", sid, "t1", "default", WORKERS), Policy(), time.time()).worker


async def _aroute(store: RedisStore, sid: str) -> str | None:
    return (await store.aroute(RouteQuery("default", sid, "t1", "default", WORKERS), Policy(), time.time())).worker


def test_a_flushed_script_is_loaded_again_on_both_faces(redis_server, prefix) -> None:
    store = RedisStore(redis_server.url, prefix=prefix)
    first = _route(store, "s1")
    admin = redis.Redis(port=redis_server.port)
    admin.script_flush()
    assert _route(store, "s1") == first  # NOSCRIPT: loaded and run again, the pin intact

    async def flushed_async() -> tuple[str | None, str | None]:
        before = await _aroute(store, "s1")
        admin.script_flush()
        try:
            return before, await _aroute(store, "s1")
        finally:
            await store.aclose()

    assert asyncio.run(flushed_async()) == (first, first)
    admin.close()
    store.close()


def test_a_frozen_redis_fails_every_waiting_call_within_the_timeout_then_calls_reconnect(redis_server_factory,
                                                                                          prefix) -> None:
    server = redis_server_factory()
    store = RedisStore(server.url, prefix=prefix, socket_timeout=0.3)
    assert _route(store, "warm") is not None
    errors: list[tuple[type, float]] = []

    def call(i: int) -> None:
        t0 = time.monotonic()
        try:
            _route(store, f"frozen-{i}")
        except StoreUnavailableError as exc:
            errors.append((type(exc), time.monotonic() - t0))

    async def acalls() -> list[float]:
        await _aroute(store, "awarm")
        out: list[float] = []

        async def one(i: int) -> None:
            t0 = time.monotonic()
            with pytest.raises(StoreUnavailableError):
                await _aroute(store, f"afrozen-{i}")
            out.append(time.monotonic() - t0)

        server.pause()
        await asyncio.gather(*[one(i) for i in range(10)])
        await store.aclose()
        return out

    try:
        aseconds = asyncio.run(acalls())
        threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        server.resume()
    assert len(errors) == 6 and len(aseconds) == 10
    assert max(seconds for _, seconds in errors) < 1.5 and max(aseconds) < 1.5  # about 0.3 s, not a hang
    assert _route(store, "back") is not None  # a fresh connection
    server.stop()
    with pytest.raises(StoreUnavailableError):
        _route(store, "dead")
    store.close()


def test_a_connection_redis_closed_while_idle_is_replaced_before_use(redis_server_factory, prefix) -> None:
    server = redis_server_factory()
    admin = redis.Redis(port=server.port)
    admin.config_set("timeout", 1)  # Redis closes clients idle for a second
    admin.close()
    store = RedisStore(server.url, prefix=prefix, socket_timeout=0.5)
    first = _route(store, "s1")
    time.sleep(2.5)  # the server's idle check runs about ten times a second
    assert _route(store, "s1") == first  # no StoreUnavailableError: a fresh connection
    store.close()


def test_threads_each_get_their_own_reply(redis_server, prefix) -> None:
    store = RedisStore(redis_server.url, prefix=prefix, socket_timeout=2.0)
    pins = {f"s{i}": _route(store, f"s{i}") for i in range(12)}
    wrong: list[tuple[str, str | None]] = []

    def run(sid: str) -> None:
        for _ in range(100):
            got = _route(store, sid)
            if got != pins[sid]:
                wrong.append((sid, got))

    threads = [threading.Thread(target=run, args=(sid,)) for sid in pins]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and set(pins.values()) <= {w.url for w in WORKERS}
    store.close()


def _refusals(server_port: int, acl_port: int) -> dict[str, str]:
    return {
        "wrong password": f"redis://:wrongpw@127.0.0.1:{acl_port}/0",
        "wrong user": f"redis://nobody:wrongpw@127.0.0.1:{acl_port}/0",
        "no password": f"redis://127.0.0.1:{acl_port}/0",
        "database out of range": f"redis://:s3cret@127.0.0.1:{acl_port}/99",
        # a password given to a Redis without one: refused when the client speaks RESP2
        "password to a Redis without one": f"redis://:wrongpw@127.0.0.1:{server_port}/0?protocol=2",
    }


def test_a_refusing_redis_is_a_store_refused_error_on_check_and_calls_alike(redis_server, redis_server_factory,
                                                                           prefix) -> None:
    secured = redis_server_factory(password="s3cret")
    for case, url in _refusals(redis_server.port, secured.port).items():
        store = RedisStore(url, prefix=prefix)
        for attempt in (store.check, lambda: _route(store, "s1"), store.ping):
            with pytest.raises(StoreRefusedError) as err:
                attempt()
            assert isinstance(err.value, StoreError) and err.value.field == "redis_url", case
            assert "wrongpw" not in str(err.value) and "s3cret" not in str(err.value), case

        async def on_asyncio() -> None:
            try:
                with pytest.raises(StoreRefusedError):
                    await store.acheck()
                with pytest.raises(StoreRefusedError):
                    await _aroute(store, "s1")
            finally:
                await store.aclose()

        asyncio.run(on_asyncio())
        store.close()


def test_the_check_names_a_command_the_acl_rules_leave_out(redis_server_factory, prefix) -> None:
    secured = redis_server_factory(password="s3cret")
    admin = redis.Redis(port=secured.port, password="s3cret")
    everything = ["+evalsha", "+eval", "+script|load", "+ping", "+hgetall", "+hmget", "+hget", "+hset", "+hsetnx",
                  "+hincrby", "+del", "+zadd", "+zrem", "+zrange", "+zrangebyscore", "+zrevrangebyscore", "+zcount",
                  "+zremrangebyscore", "+zscore", "+sadd", "+smembers", "+pexpire", "+pfadd", "+pfcount", "+multi",
                  "+exec"]
    admin.execute_command("ACL", "SETUSER", "full", "on", ">pw", f"~{{{prefix}}}*", *everything)
    admin.execute_command("ACL", "SETUSER", "narrow", "on", ">pw", f"~{{{prefix}}}*",
                          *(c for c in everything if c != "+pexpire"))
    admin.close()
    RedisStore(f"redis://full:pw@127.0.0.1:{secured.port}/0", prefix=prefix).check()  # allowed: no error
    narrow = RedisStore(f"redis://narrow:pw@127.0.0.1:{secured.port}/0", prefix=prefix)
    with pytest.raises(StoreRefusedError, match="PEXPIRE"):
        narrow.check()  # before any call met the missing command inside a script
    narrow.close()


def test_an_event_loops_calls_share_a_bounded_set_of_connections(redis_server, prefix) -> None:
    from agent_cache.store.redis_client import ASYNC_CONNECTIONS

    name = f"bounded-{prefix}"
    store = RedisStore(redis_server.url, prefix=prefix, socket_timeout=2.0, client_name=name)
    admin = redis.Redis(port=redis_server.port)

    async def main() -> tuple[list[str | None], int]:
        workers = await asyncio.gather(*[_aroute(store, f"s{i % 50}") for i in range(400)])
        opened = sum(1 for c in admin.client_list() if c.get("name") == name)
        await store.aclose()
        return workers, opened

    workers, opened = asyncio.run(main())
    assert len(workers) == 400 and set(workers) <= {w.url for w in WORKERS}
    assert 1 <= opened <= ASYNC_CONNECTIONS, opened
    admin.close()
    store.close()
