"""A finished call's in-flight release rides on the next store write: one round trip per call."""

from __future__ import annotations

import asyncio
import time

import pytest
import redis

from agent_cache.errors import ConfigError
from agent_cache.routing import RouteRequest, Router
from agent_cache.store import RedisStore

URLS = [f"http://10.0.0.{i}:30000" for i in range(1, 5)]


def _script_calls(url: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("commandstats").get("cmdstat_evalsha", {"calls": 0})["calls"])
    finally:
        client.close()


def _inflight(url: str, prefix: str) -> int:
    store = RedisStore(url, prefix=prefix)
    try:
        return sum(w["inflight"] for w in store.stats(time.time())["workers"].values())
    finally:
        store.close()


def test_route_and_done_cost_one_round_trip(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=60.0)
    router.route(RouteRequest("warm"))  # loads the script
    before = _script_calls(redis_server.url)
    for i in range(200):
        router.done(router.route(RouteRequest(f"s{i % 40}", template_id="t")))
    assert _script_calls(redis_server.url) - before == 200
    # every release but the last was written by the next decision; the last waits
    assert _inflight(redis_server.url, prefix) == 2  # "warm" (never done) and the 200th call
    router.flush()
    assert _inflight(redis_server.url, prefix) == 1
    router.close()


def test_the_usage_report_rides_on_the_next_route_with_the_release(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=60.0)
    placement = router.route(RouteRequest("s1", template_id="t"))
    router.done(placement)
    router.report(placement, prompt_tokens=100, cached_tokens=0)
    # nothing written yet: the call cost one round trip (its route)
    assert _inflight(redis_server.url, prefix) == 1
    assert router.store.get_session("default", "s1", time.time())["prompt_tokens"] == 0
    nxt = router.route(RouteRequest("s1", template_id="t"))  # carries the release and the report
    assert nxt.outcome == "pinned"
    assert _inflight(redis_server.url, prefix) == 1  # the new call only
    rec = router.store.get_session("default", "s1", time.time())
    assert rec["prompt_tokens"] == 100 and rec["held"] == 100
    router.done(nxt)
    router.close()  # writes what is still owed
    assert _inflight(redis_server.url, prefix) == 0


def test_other_processes_see_a_release_within_the_delay(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=0.05)
    placement = router.route(RouteRequest("s1"))
    router.done(placement)
    deadline = time.monotonic() + 5
    while _inflight(redis_server.url, prefix) != 0:
        assert time.monotonic() < deadline, "the background flush never came"
        time.sleep(0.01)
    router.close()


async def test_async_face_batches_too(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=60.0)
    await router.aroute(RouteRequest("warm"))
    before = _script_calls(redis_server.url)

    async def session(i: int) -> None:
        for _ in range(5):
            await router.adone(await router.aroute(RouteRequest(f"s{i}")))

    await asyncio.gather(*(session(i) for i in range(10)))
    assert _script_calls(redis_server.url) - before == 50
    await router.aflush()
    assert _inflight(redis_server.url, prefix) == 1  # "warm"
    router.close()


async def test_a_router_flushing_in_its_loop_writes_there_without_its_thread(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=0.05)
    router.outbox.flush_in(asyncio.get_running_loop())  # as the gateway does
    for i in range(3):
        await router.asettle(await router.aroute(RouteRequest(f"s{i}")))
        deadline = time.monotonic() + 5
        while _inflight(redis_server.url, prefix) != 0:  # written in this loop, within the delay
            assert time.monotonic() < deadline, "the flush never came"
            await asyncio.sleep(0.01)
    assert router.outbox._flusher is not None and router.outbox._flusher._thread is None  # noqa: SLF001
    await asyncio.to_thread(lambda: router.done(router.route(RouteRequest("elsewhere"))))  # another thread's
    deadline = time.monotonic() + 5
    while _inflight(redis_server.url, prefix) != 0:  # ... by the flusher's thread
        assert time.monotonic() < deadline, "the thread's flush never came"
        await asyncio.sleep(0.01)
    await router.aclose()


def test_close_writes_pending_releases(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=60.0)
    router.done(router.route(RouteRequest("s1")))
    router.close()
    assert _inflight(redis_server.url, prefix) == 0


def test_zero_delay_releases_at_once(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=0)
    router.done(router.route(RouteRequest("s1")))
    assert _inflight(redis_server.url, prefix) == 0
    router.close()


@pytest.mark.parametrize("bad", [-1, "soon"])
def test_bad_release_delay(bad):
    with pytest.raises(ConfigError, match="release_delay"):
        Router(URLS, probe_interval=None, release_delay=bad)


def _connections(url: str) -> int:
    """Clients connected to the server, this probe excluded."""
    client = redis.Redis.from_url(url)
    try:
        return len(client.client_list()) - 1
    finally:
        client.close()


async def test_aclose_writes_releases_and_closes_every_redis_connection(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=60.0)
    await router.adone(await router.aroute(RouteRequest("s1")))
    router.store.ping()  # the sync client is connected too
    assert _connections(redis_server.url) >= 2
    await router.aclose()
    deadline = time.monotonic() + 5
    while _connections(redis_server.url) != 0:
        assert time.monotonic() < deadline, "a Redis connection was left open"
        time.sleep(0.02)
    assert _inflight(redis_server.url, prefix) == 0


def _flush_in_child(router: Router) -> None:
    router.flush()


def test_a_forked_child_does_not_write_the_parents_releases(redis_server, prefix):
    import multiprocessing as mp

    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, release_delay=60.0)
    placements = [router.route(RouteRequest(f"s{i}")) for i in range(3)]
    router.done(placements[0])  # pending in the parent
    child = mp.get_context("fork").Process(target=_flush_in_child, args=(router,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert _inflight(redis_server.url, prefix) == 3  # the child wrote nothing
    router.flush()
    assert _inflight(redis_server.url, prefix) == 2
    router.close()
