"""Prometheus metrics of the KV event path: what each worker's events say, and how the subscriber keeps up.

Collected from the live views' indexers of this process when ``/metrics`` is read
(registered once on prometheus_client's default registry, as the routers'
metrics are), so nothing runs on a call's path. Two indexers following one
worker in one process report it once (they read the same events).
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent_cache.kv.indexer import KvIndexer
from agent_cache.kv.tokens import KvTokens


class _KvCollector(Collector):
    def __init__(self) -> None:
        self._parts: "weakref.WeakKeyDictionary[KvIndexer, KvTokens]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._registered = False

    def add(self, indexer: KvIndexer, learner: KvTokens) -> None:
        with self._lock:
            self._parts[indexer] = learner
            if not self._registered:
                REGISTRY.register(self)
                self._registered = True

    def remove(self, indexer: KvIndexer) -> None:
        with self._lock:
            self._parts.pop(indexer, None)

    def collect(self) -> Iterator[Metric]:
        known = GaugeMetricFamily("agent_cache_kv_worker_known", "1 while the worker's KV events are complete "
                                  "since a cache reset (0: never heard, events lost, or a restart seen)",
                                  labels=["worker"])
        cached = GaugeMetricFamily("agent_cache_kv_cached_tokens", "tokens the worker's radix tree holds, "
                                   "from its KV events", labels=["worker"])
        templates = GaugeMetricFamily("agent_cache_kv_templates", "templates whose token fingerprints are learnt")
        sessions = GaugeMetricFamily("agent_cache_kv_sessions", "sessions whose last message's fingerprint is learnt")
        counters = {name: CounterMetricFamily(f"agent_cache_kv_{name}", doc) for name, doc in (
            ("batches", "KV event batches applied"), ("replayed", "batches fetched from a replay endpoint"),
            ("gaps", "batches that arrived after a lost one"), ("undecodable", "batches that did not decode"),
            ("token_lookups_failed", "tokenizations (templates, sessions' last messages) a worker did not answer"),
            ("prefixes_gone", "routes that found, from its events, that the session's worker evicted its prefix"),
            ("session_lookups_dropped", "sessions' last messages not tokenized (the queue full, the worker failing)"))}
        values = dict.fromkeys(counters, 0.0)
        learnt = tails = 0
        workers: dict[str, int | None] = {}
        for indexer, learner in list(self._parts.items()):
            heard = indexer.state.workers()
            for url in indexer.sources:
                workers.setdefault(url, heard.get(url))
            learnt += indexer.state.templates
            tails += indexer.state.sessions
            values["prefixes_gone"] += indexer.state.prefixes_gone
            values["batches"] += indexer.batches
            values["replayed"] += indexer.replayed
            values["gaps"] += indexer.state.gaps
            values["undecodable"] += indexer.bad
            values["token_lookups_failed"] += learner.failed
            values["session_lookups_dropped"] += learner.sessions_dropped
        for url, tokens in workers.items():
            known.add_metric([url], float(tokens is not None))
            if tokens is not None:
                cached.add_metric([url], float(tokens))
        templates.add_metric([], float(learnt))
        sessions.add_metric([], float(tails))
        yield from (known, cached, templates, sessions)
        for name, family in counters.items():
            family.add_metric([], values[name])
            yield family


KV_METRICS = _KvCollector()
