"""The shared store's picture as Prometheus metrics (``agent-cache metrics-server``).

Each router process exports its own counters (``routing/metrics.py``); this
exports what the deployment shares in the store, read at scrape time: live
sessions and in-flight calls per worker, estimated KV footprint, tokens and
hit rate, decisions by outcome. One exporter per deployment is enough,
whatever the number of router processes or gateway replicas.
"""

from __future__ import annotations

import time
from typing import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent_cache.errors import StoreError
from agent_cache.store.base import MetadataStore
from agent_cache.store.stats import stats_snapshot

_PER_WORKER = (
    ("sessions", "agent_cache_store_worker_sessions", "Live sessions pinned to the worker"),
    ("inflight", "agent_cache_store_worker_inflight", "Calls in flight on the worker, from every router"),
    ("kv_tokens", "agent_cache_store_worker_kv_tokens", "Estimated KV tokens of the worker's live sessions"),
    ("prompt_tokens", "agent_cache_store_worker_prompt_tokens", "Prompt tokens reported by the worker's calls"),
    ("cached_tokens", "agent_cache_store_worker_cached_tokens", "Of which served from the worker's prefix cache"),
)


class StoreCollector(Collector):
    """Reads ``store.stats`` once per scrape; ``agent_cache_store_up`` is 0 while the store cannot be read."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("agent_cache_store_up", "1 if the metadata store answered this scrape")
        try:
            snapshot = stats_snapshot(self.store, time.time())
        except StoreError:
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        sessions = GaugeMetricFamily("agent_cache_store_sessions", "Live sessions in the deployment")
        sessions.add_metric([], snapshot["sessions"])
        yield sessions
        templates = GaugeMetricFamily("agent_cache_store_templates", "Templates used within the template window")
        templates.add_metric([], snapshot.get("templates_in_window", len(snapshot["templates"])))
        yield templates
        workers = snapshot["workers"]
        for key, name, doc in _PER_WORKER:
            family = GaugeMetricFamily(name, doc, labels=["worker"])
            for url, w in sorted(workers.items()):
                family.add_metric([url], w.get(key) or 0)
            yield family
        rate = GaugeMetricFamily("agent_cache_store_worker_hit_rate", "cached / prompt tokens of the worker",
                                 labels=["worker"])
        for url, w in sorted(workers.items()):
            if w.get("hit_rate") is not None:
                rate.add_metric([url], w["hit_rate"])
        yield rate
        decisions = GaugeMetricFamily("agent_cache_store_decisions", "Routing decisions recorded, by outcome",
                                      labels=["outcome"])
        for outcome, count in sorted(snapshot["outcomes"].items()):
            decisions.add_metric([outcome], count)
        yield decisions
