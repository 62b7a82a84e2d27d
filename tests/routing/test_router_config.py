"""Bad input is refused at construction with the field named."""

from __future__ import annotations

import pytest

from agent_cache.errors import ConfigError, InvalidRequestError, RoutingError
from agent_cache.routing import RouteRequest, Router


@pytest.mark.parametrize(
    "workers, field",
    [
        ([], "workers"),
        ("http://a:1", "workers"),
        (["http://a:1", "ftp://b:2"], "workers[1]"),
        (["http://a:1", {"url": "grpc://b:2", "pool": "x"}], "workers[1]"),
        ([{"pool": "x"}], "workers[0]"),
        ([{"url": "http://a:1", "pool": ""}], "workers[0].pool"),
        (["http://a:1", "http://a:1/"], "workers[1]"),
    ],
)
def test_bad_workers(workers, field):
    with pytest.raises(ConfigError) as e:
        Router(workers, probe_interval=None)
    assert e.value.field == field


@pytest.mark.parametrize("url", ["localhost:6379", "http://x", "redis://h:99999999", "redis+sentinel://h:1"])
def test_bad_redis_url(url):
    with pytest.raises(ConfigError) as e:
        Router(["http://a:1"], redis_url=url, probe_interval=None)
    assert e.value.field == "redis_url"


@pytest.mark.parametrize("pools", [{"canary": 1.0}, {"default": 0.5}, {"default": 1.5}, {}])
def test_bad_pools(pools):
    with pytest.raises(ConfigError) as e:
        Router(["http://a:1"], pools=pools, probe_interval=None)
    assert e.value.field == "pools"


@pytest.mark.parametrize("field, value", [
    ("live_window", 0.0), ("quiet_factor", -1.0), ("min_quiet", -0.5), ("balance_factor", 0.9), ("slack", -1.0),
    ("quiet_factor", float("inf")), ("balance_factor", float("nan")),
])
def test_bad_policy_values(field, value):
    from agent_cache.placement import Policy

    with pytest.raises(ConfigError) as e:
        Router(["http://a:1"], policy=Policy(**{field: value}), probe_interval=None)
    assert e.value.field == f"policy.{field}"


@pytest.mark.parametrize("url, where", [
    ("redis+sentinel://127.0.0.1:1,127.0.0.1:2/mymaster/0", "'mymaster'"),
    ("unix:///tmp/agent-cache-no-such-redis.sock?db=1", "/tmp/agent-cache-no-such-redis.sock"),
    ("rediss://user:secret@127.0.0.1:1/0", "127.0.0.1:1"),
])
def test_sentinel_unix_and_tls_urls_construct_and_connect_where_they_say(url, where):
    from agent_cache.errors import StoreUnavailableError
    from agent_cache.store import RedisStore

    store = RedisStore(url)  # constructing connects nowhere: nothing listens at these addresses
    try:
        assert store.url == url
        with pytest.raises(StoreUnavailableError) as e:
            store.ping()
        assert where in str(e.value) and "secret" not in str(e.value)
    finally:
        store.close()


@pytest.mark.parametrize("url", ["redis+sentinel://127.0.0.1:26379", "redis+sentinel:///mymaster", "unix://",
                                 "http://127.0.0.1:6379"])
def test_malformed_redis_urls_are_refused_naming_the_field(url):
    from agent_cache.store import RedisStore

    with pytest.raises(ConfigError) as e:
        RedisStore(url)
    assert e.value.field == "redis_url"


def test_unknown_pool_in_request():
    with Router(["http://a:1"], probe_interval=None) as r:
        with pytest.raises(RoutingError):
            r.route(RouteRequest("s", pool="nope"))
        with pytest.raises(InvalidRequestError):  # the route request's, not the router's configuration
            r.route(RouteRequest(""))
