"""The routers of a process on prometheus_client's default registry, scraped over HTTP."""

from __future__ import annotations

import gc

import httpx
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server

from agent_cache.routing import Router
from agent_cache.routing.router import RouteRequest
from tests.conftest import free_port

URLS = ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]  # never contacted


def _decisions() -> float:
    return sum(REGISTRY.get_sample_value("agent_cache_routing_decisions_total", {"outcome": o}) or 0
               for o in ("placed_least_load", "placed_template", "pinned"))


def test_every_router_of_the_process_is_on_the_default_registry() -> None:
    gc.collect()  # routers of earlier tests that are gone leave the sum
    before = _decisions()
    a, b = Router(URLS, probe_interval=None), Router(URLS, probe_interval=None)
    own = CollectorRegistry()
    c = Router(URLS, probe_interval=None, registry=own)  # a registry given: its metrics go there only
    for router, calls in ((a, 3), (b, 2), (c, 4)):
        for i in range(calls):
            router.done(router.route(RouteRequest(f"s{i}")))
    assert _decisions() - before == 5
    assert own.get_sample_value("agent_cache_routing_decisions_total", {"outcome": "placed_least_load"}) == 4
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1")
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        server.shutdown()
    assert "agent_cache_routing_decisions_total" in text and "agent_cache_store_latency_seconds" in text
    for r in (a, b, c):
        r.close()
