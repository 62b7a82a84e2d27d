"""Prometheus metrics of one router, on its own registry unless one is given."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.decisions = Counter(
            "agent_cache_routing_decisions", "Routing decisions by outcome", ["outcome"], registry=r
        )
        self.live_sessions = Gauge(
            "agent_cache_worker_live_sessions", "Live (non-expired) sessions pinned to a worker", ["worker"], registry=r
        )
        self.inflight = Gauge(
            "agent_cache_worker_inflight_calls", "Calls in flight from this process", ["worker"], registry=r
        )
        self.healthy = Gauge("agent_cache_worker_healthy", "1 if the worker's breaker is not open", ["worker"], registry=r)
        self.prompt_tokens = Counter(
            "agent_cache_prompt_tokens", "Prompt tokens reported", ["template", "worker"], registry=r
        )
        self.cached_tokens = Counter(
            "agent_cache_cached_tokens", "Prompt tokens served from the prefix cache", ["template", "worker"], registry=r
        )
        self.store_latency = Histogram(
            "agent_cache_store_latency_seconds", "Metadata store round trips", ["op"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.failovers = Counter("agent_cache_failovers", "Calls retried on another worker", ["worker"], registry=r)
        self.degraded = Gauge("agent_cache_store_degraded", "1 while routing without the store", registry=r)

    def hit_rate(self, template: str, worker: str) -> float | None:
        """cached / prompt tokens for one (template, worker), from this process's counters."""
        p = self.registry.get_sample_value("agent_cache_prompt_tokens_total", {"template": template, "worker": worker})
        c = self.registry.get_sample_value("agent_cache_cached_tokens_total", {"template": template, "worker": worker})
        return (c or 0.0) / p if p else None
