"""State stays bounded when every session brings its own template: key TTLs, purges, metrics labels."""

from __future__ import annotations

import time

import redis

from agent_cache.backends.protocol import Usage
from agent_cache.placement.rule import Policy
from agent_cache.routing.call_latency import CallLatency
from agent_cache.routing.metrics import MAX_TEMPLATE_LABELS, MAX_TENANT_LABELS, OTHER_TEMPLATE, OTHER_TENANT
from agent_cache.routing.router import Placement
from agent_cache.routing.router import RouteRequest, Router
from agent_cache.store import MemoryStore, RedisStore, RouteQuery, WorkerSpec, keys
from agent_cache.store.base import STATS_TEMPLATES, template_retention

A, B = "http://a:1", "http://b:1"
WS = (WorkerSpec(A, capacity=100_000), WorkerSpec(B, capacity=100_000))
P = Policy()
TTL = 5.0


def q(sid: str, tid: str | None) -> RouteQuery:
    return RouteQuery("default", sid, tid, "default", WS, 100)


def _one_template_per_session(store, n: int, t0: float) -> None:
    for i in range(n):
        r = store.route(q(f"s{i}", f"t{i}"), P, t0 + i * 0.001)
        store.release(r.worker, t0)
        store.report("default", f"s{i}", r.worker, r.epoch, f"t{i}", 500, 0, t0 + i * 0.001)
        store.record_template("default", f"t{i}", 40, f"s{i}", t0)


def _keys_without_ttl(client: redis.Redis, prefix: str) -> list[str]:
    names = list(client.scan_iter(match=keys.tag(prefix) + ":*", count=1000))
    return sorted(n.decode() for n in names if client.pttl(n) == -1)


def test_redis_keys_without_ttl_do_not_grow_with_sessions(redis_server, prefix):
    client = redis.Redis.from_url(redis_server.url)
    counts = {}
    for n in (40, 400):
        p = f"{prefix}-{n}"
        st = RedisStore(redis_server.url, prefix=p, session_ttl=TTL)
        _one_template_per_session(st, n, 1000.0)
        later = 1000.0 + template_retention(TTL, st.template_window) + TTL + 1
        st.route(q("steady", None), P, later)  # the next decision purges what expired
        assert client.zcard(keys.live(p)) == 1
        assert client.zcard(keys.templates_in_use(p)) == 0
        no_ttl = _keys_without_ttl(client, p)
        counts[n] = len(no_ttl)
        assert not [k for k in no_ttl if ":s:" in k or ":t" in k.split("}")[1][:3]], no_ttl
        # every template record carries a TTL
        for kind in (keys.template, keys.template_stats, keys.template_info, keys.template_sessions):
            assert 0 < client.pttl(kind(p, "default", "t7")) <= template_retention(TTL, st.template_window) * 1000
        assert 0 < client.pttl(keys.session(p, "default", "steady")) <= 2 * TTL * 1000
        w = st.stats(later)["workers"]
        assert sum(x["sessions"] for x in w.values()) == 1 and sum(x["kv_tokens"] for x in w.values()) == 100
        st.close()
    assert counts[40] == counts[400], counts


def test_stats_read_only_templates_used_in_the_window(redis_server, prefix):
    st = RedisStore(redis_server.url, prefix=prefix, session_ttl=TTL, template_window=60.0)
    _one_template_per_session(st, 30, 1000.0)
    st.route(q("late", "t-late"), P, 1100.0)
    assert set(st.stats(1100.0)["templates"]) == {"default/t-late"}
    assert st.stats(1100.0, templates=False)["templates"] == {}
    st.close()


def test_stats_list_the_most_recent_templates_only(redis_server, prefix):
    for st in (RedisStore(redis_server.url, prefix=prefix, session_ttl=TTL), MemoryStore(session_ttl=TTL)):
        _one_template_per_session(st, STATS_TEMPLATES + 50, 1000.0)
        stats = st.stats(1001.0)
        assert len(stats["templates"]) == STATS_TEMPLATES and stats["templates_in_window"] == STATS_TEMPLATES + 50
        assert f"default/t{STATS_TEMPLATES + 49}" in stats["templates"] and "default/t0" not in stats["templates"]
        st.close()


def test_a_session_key_expired_by_redis_is_recounted(redis_server, prefix):
    """A deployment that stopped routing for twice the TTL: Redis dropped the session keys; the counts follow."""
    client = redis.Redis.from_url(redis_server.url)
    st = RedisStore(redis_server.url, prefix=prefix, session_ttl=TTL)
    placed = {f"s{i}": st.route(q(f"s{i}", None), P, 1000.0).worker for i in range(6)}
    client.delete(keys.session(prefix, "default", "s0"), keys.session(prefix, "default", "s1"))  # as their TTL does
    st.route(q("s2", None), P, 1000.0 + TTL + 1)  # every other session expired: purged, s0 and s1 are orphans
    w = st.stats(1000.0 + TTL + 1)["workers"]
    assert {u: x["sessions"] for u, x in w.items() if x["sessions"]} == {placed["s2"]: 1}
    assert sum(x["kv_tokens"] for x in w.values()) == 100
    assert sum(x["live_sessions"] for x in w.values()) == 1
    assert client.zcard(keys.live(prefix)) == 1
    st.close()


def test_memory_store_forgets_expired_templates():
    st = MemoryStore(session_ttl=TTL, template_window=60.0)
    _one_template_per_session(st, 50, 1000.0)
    assert st.template_info("default", "t3")["sessions"] == 1
    assert len(st.stats(1000.0)["templates"]) == 50
    later = 1000.0 + template_retention(TTL, 60.0) + 1
    st.route(q("steady", "t-steady"), P, later)
    assert st.template_info("default", "t3") is None
    assert list(st.stats(later)["templates"]) == ["default/t-steady"]
    assert len(st._templates) == 1 and len(st._template_stats) == 0 and len(st._sessions) == 1


def test_memory_store_counts_template_sessions_in_bounded_memory():
    st = MemoryStore()
    for i in range(3000):
        st.record_template("default", "t", 10, f"s{i}", 1000.0)
    st.record_template("default", "t", 10, "s2999", 1000.0)  # seen again: counted once
    assert st.template_info("default", "t")["sessions"] == 3000
    assert len(st._template_info[("default", "t")]["recent"]) == 1024


def test_template_labels_are_bounded():
    router = Router([A, B], probe_interval=None)
    for i in range(MAX_TEMPLATE_LABELS + 30):
        p = router.route(RouteRequest(f"s{i}", template_id=f"t{i}"))
        router.done(p)
        router.report(p, prompt_tokens=100, cached_tokens=10)
    labels = {s.labels["template"] for m in router.metrics.registry.collect() if m.name == "agent_cache_prompt_tokens"
              for s in m.samples}
    assert len(labels) == MAX_TEMPLATE_LABELS + 1 and OTHER_TEMPLATE in labels
    assert "t0" in labels and f"t{MAX_TEMPLATE_LABELS + 29}" not in labels
    other = sum(router.metrics.registry.get_sample_value("agent_cache_prompt_tokens_total",
                                                         {"template": OTHER_TEMPLATE, "worker": w}) or 0
                for w in (A, B))
    assert other == 30 * 100
    router.close()


def test_tenant_labels_are_bounded_by_the_same_mechanism():
    router = Router([A, B], probe_interval=None)
    tokens = "agent_cache_tenant_tokens_total"
    for i in range(MAX_TENANT_LABELS + 20):  # a served call of each tenant
        call = CallLatency(router.metrics, time.monotonic())
        call.sent(A, time.monotonic())
        call.ended(Placement(A, "pinned", 1, f"s{i}", tenant=f"tenant-{i}"), None, answered=time.monotonic(),
                   usage=Usage(prompt_tokens=10, completion_tokens=2, cached_tokens=4))
    labels = {s.labels["tenant"] for m in router.metrics.registry.collect() if m.name == "agent_cache_tenant_tokens"
              for s in m.samples}
    assert len(labels) == MAX_TENANT_LABELS + 1 and OTHER_TENANT in labels
    assert "tenant-0" in labels and f"tenant-{MAX_TENANT_LABELS}" not in labels
    get = router.metrics.registry.get_sample_value
    assert get(tokens, {"tenant": OTHER_TENANT, "gen_ai_token_type": "input"}) == 20 * 10
    assert get(tokens, {"tenant": OTHER_TENANT, "gen_ai_token_type": "cached"}) == 20 * 4
    router.close()
