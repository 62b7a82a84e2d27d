"""What an API key may do: pools, reserved fields, admin endpoints, and how workers are named to it."""

from __future__ import annotations

import uuid
from typing import Iterator

import httpx
import pytest

from agent_cache.server_processes import AgentCacheGateways
from agent_cache.gateway.errors import RequestRejectedError
from agent_cache.gateway.authz import OPERATOR, check_fields, choose_pool, hide_urls, shown_worker, worker_id
from agent_cache.gateway.keys import ApiKey
from agent_cache.sim import SimFleet

KEYS = """\
sk-user team-u
sk-bound team-b pools=a,b
sk-a team-a a
sk-admin ops role=admin
sk-prio team-p allow=priority,lora_path
"""


@pytest.fixture(scope="module")
def fleet() -> Iterator[SimFleet]:
    with SimFleet(3) as f:
        yield f


def test_keys_bind_pools_fields_endpoints_and_see_worker_ids(procs, fleet, redis_url, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    gw = AgentCacheGateways(procs, fleet.urls[:1], redis_url=redis_url, args=[
        "--prefix", f"t-{uuid.uuid4().hex[:10]}", "--api-keys", str(keys),
        "--pool", f"a={fleet.urls[1]}", "--pool", f"b={fleet.urls[2]}"])
    base = gw.urls[0]

    def call(key: str, extra: dict | None = None, **headers: str) -> httpx.Response:
        return httpx.post(base + "/v1/chat/completions", headers={"authorization": f"Bearer {key}", **headers},
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                **(extra or {})})

    def refused(r: httpx.Response, status: int, param: str) -> None:
        assert r.status_code == status and r.json()["error"]["param"] == param, r.text
        assert param in r.json()["error"]["message"]

    # the worker header: an opaque id to a tenant's key, the URL to an admin's
    assert call("sk-user").headers["x-agent-cache-worker"] == worker_id(fleet.urls[0])
    assert call("sk-admin").headers["x-agent-cache-worker"] == fleet.urls[0]
    # a key's pools bind it: the pool header chooses among them only
    assert call("sk-bound", **{"x-agent-cache-pool": "b"}).headers["x-agent-cache-worker"] == worker_id(fleet.urls[2])
    refused(call("sk-bound", **{"x-agent-cache-pool": "default"}), 403, "x-agent-cache-pool")
    refused(call("sk-bound"), 400, "x-agent-cache-pool")  # two pools: the header must choose
    refused(call("sk-a", **{"x-agent-cache-pool": "b"}), 403, "x-agent-cache-pool")
    assert call("sk-a").headers["x-agent-cache-worker"] == worker_id(fleet.urls[1])
    assert call("sk-user", **{"x-agent-cache-pool": "b"}).status_code == 200  # no pool in the key: any
    # reserved fields: only where allow= names them
    refused(call("sk-user", {"priority": 5}), 403, "priority")
    refused(call("sk-user", {"lora_path": "x"}), 403, "lora_path")
    assert "priority" in call("sk-user", {"priority": 5}).json()["error"]["message"]
    assert call("sk-prio", {"priority": 5}).status_code == 200
    # /metrics needs an admin key; /health and a bare /ready stay open to probes
    assert httpx.get(base + "/metrics").status_code == 401
    r = httpx.get(base + "/metrics", headers={"authorization": "Bearer sk-user"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_required"
    metrics = httpx.get(base + "/metrics", headers={"authorization": "Bearer sk-admin"})
    assert metrics.status_code == 200 and "agent_cache_gateway_requests_total" in metrics.text
    assert httpx.get(base + "/health").status_code == 200
    assert httpx.get(base + "/ready").json() == {"status": "ready"}
    assert httpx.get(base + "/ready", headers={"authorization": "Bearer sk-user"}).json() == {"status": "ready"}
    assert httpx.get(base + "/ready", headers={"authorization": "Bearer sk-admin"}).json() == {
        "status": "ready", "store": "ok"}


def test_without_keys_everything_stays_allowed(procs, fleet, redis_url):
    gw = AgentCacheGateways(procs, fleet.urls[:1], redis_url=redis_url,
                            args=["--prefix", f"t-{uuid.uuid4().hex[:10]}"])
    r = httpx.post(gw.urls[0] + "/v1/chat/completions",
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                         "priority": 3})
    assert r.status_code == 200 and r.headers["x-agent-cache-worker"] == fleet.urls[0]
    assert httpx.get(gw.urls[0] + "/metrics").status_code == 200
    assert httpx.get(gw.urls[0] + "/ready").json()["store"] == "ok"


def test_worker_ids_are_short_stable_and_replace_urls_in_messages():
    url = "http://10.0.0.7:30000"
    assert worker_id(url) == worker_id(url) != worker_id("http://10.0.0.8:30000")
    assert len(worker_id(url)) == 14 and worker_id(url).startswith("w-")
    assert hide_urls(f"boom (worker {url}). Then {url}/v1, ok") == (
        f"boom (worker {worker_id(url)}). Then {worker_id(url + '/v1')}, ok")
    assert shown_worker(OPERATOR, url) == url and shown_worker(ApiKey("t"), url) == worker_id(url)
    assert shown_worker(None, url) == worker_id(url)


def test_pool_and_field_checks():
    bound = ApiKey("t", pool="a", pools=frozenset({"a", "b"}))
    assert choose_pool(bound, None) == "a" and choose_pool(bound, "b") == "b"
    assert choose_pool(ApiKey("t", pools=frozenset({"c"})), None) == "c"
    assert choose_pool(ApiKey("t"), "z") == "z" and choose_pool(ApiKey("t"), None) is None
    with pytest.raises(RequestRejectedError) as exc:
        choose_pool(bound, "z")
    assert exc.value.status == 403 and exc.value.param == "x-agent-cache-pool"
    with pytest.raises(RequestRejectedError) as exc:
        check_fields(ApiKey("t", allow=frozenset({"priority"})), {"priority": 1, "lora_id": 3})
    assert exc.value.param == "lora_id"  # /generate's adapter choice is covered by allow=lora_path
    check_fields(ApiKey("t"), {"priority": None})
    check_fields(OPERATOR, {"priority": 1, "lora_path": "x", "lora_id": 2})
