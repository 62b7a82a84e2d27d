"""``agent-cache metrics-server``: the shared store's picture, scraped as Prometheus text."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agent_cache.routing import RouteRequest, Router
from agent_cache.store.redis_store import delete_deployment
from tests.conftest import free_port

WORKERS = ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=5).text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_metrics_server_exports_what_routers_wrote_to_the_store(prefix, redis_url) -> None:
    router = Router(WORKERS, redis_url=redis_url, prefix=prefix, probe_interval=None, release_delay=0)
    placements = [router.route(RouteRequest(session_id=f"s{i}")) for i in range(6)]
    for p in placements[:4]:
        router.settle(p)
        router.report(p, prompt_tokens=1000, cached_tokens=600)
    router.flush()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agent_cache.cli", "metrics-server", "--redis", redis_url,
                             "--prefix", prefix, "--port", str(port)], stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        for _ in range(100):
            try:
                metrics = _scrape(url)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert metrics[("agent_cache_store_up", ())] == 1
        assert metrics[("agent_cache_store_sessions", ())] == 6
        by_worker = {w: sum(1 for p in placements if p.worker == w) for w in WORKERS}
        for w in WORKERS:
            assert metrics[("agent_cache_store_worker_sessions", (("worker", w),))] == by_worker[w]
        assert sum(metrics[("agent_cache_store_worker_inflight", (("worker", w),))] for w in WORKERS) == 2
        assert sum(metrics[("agent_cache_store_worker_prompt_tokens", (("worker", w),))] for w in WORKERS) == 4000
        assert sum(metrics[("agent_cache_store_worker_cached_tokens", (("worker", w),))] for w in WORKERS) == 2400
        assert metrics[("agent_cache_store_decisions", (("outcome", "placed_least_load"),))] >= 1
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
        router.close()
        delete_deployment(redis_url, prefix)


def test_metrics_server_reports_an_unreachable_store_as_down() -> None:
    port = free_port()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    proc = subprocess.Popen([sys.executable, "-m", "agent_cache.cli", "metrics-server", "--redis", dead,
                             "--port", str(port)], stderr=subprocess.PIPE)
    try:
        for _ in range(100):
            try:
                metrics = _scrape(f"http://127.0.0.1:{port}/metrics")
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert metrics[("agent_cache_store_up", ())] == 0
    finally:
        proc.terminate()
        proc.wait(10)
