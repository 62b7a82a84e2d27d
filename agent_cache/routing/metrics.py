"""Prometheus metrics of one router, on its own registry unless one is given."""

from __future__ import annotations

import threading
import weakref
from typing import Any, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

# Series per template are bounded: the first this many template ids a process
# sees get their own label (an agent's template comes with its first call and
# stays), every later one counts under OTHER_TEMPLATE. Prompts that differ per
# session (a customer number the templater cannot see) would otherwise add two
# series per session for the life of the process.
MAX_TEMPLATE_LABELS = 50
OTHER_TEMPLATE = "other"

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class _ProcessRouters(Collector):
    """The metrics of every live router of this process that was given no registry, summed.

    Registered once on prometheus_client's default registry, so
    ``start_http_server(port)`` or ``make_asgi_app()`` serve them with no
    wiring; each router keeps its own registry (several routers in one
    process would otherwise register the same names twice).
    """

    def __init__(self) -> None:
        self._routers: "weakref.WeakSet[RouterMetrics]" = weakref.WeakSet()
        self._lock = threading.Lock()
        self._registered = False

    def add(self, metrics: "RouterMetrics") -> None:
        with self._lock:
            self._routers.add(metrics)
            if not self._registered:
                REGISTRY.register(self)
                self._registered = True

    def collect(self) -> Iterator[Metric]:
        families: dict[str, tuple[Metric, dict[tuple[str, tuple[tuple[str, str], ...]], float]]] = {}
        for router in list(self._routers):
            for family in router.registry.collect():
                metric, values = families.setdefault(
                    family.name, (Metric(family.name, family.documentation, family.type, family.unit), {}))
                for sample in family.samples:
                    if sample.name.endswith("_created"):  # a creation time: summing it means nothing
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    values[key] = values.get(key, 0.0) + sample.value
        for metric, values in families.values():
            for (name, labels), value in values.items():
                metric.add_sample(name, dict(labels), value)
            yield metric


PROCESS_ROUTERS = _ProcessRouters()


class RouterMetrics:
    """One router's metrics: on ``registry`` if given, else on a registry of its own that
    prometheus_client's default registry reads, summed with the process's other routers."""

    def __init__(self, registry: CollectorRegistry | None = None, max_template_labels: int = MAX_TEMPLATE_LABELS) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_template_labels = max_template_labels
        self._template_labels: set[str] = set()
        self._labels_lock = threading.Lock()
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
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        if registry is None:
            PROCESS_ROUTERS.add(self)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: the call path asks for the same few on every call
        (labels are bounded: workers, outcomes, ``max_template_labels`` templates)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def forget_worker(self, url: str) -> None:
        """Drop every series labelled with a removed worker, so workers that come and go (discovery, admin
        changes) leave no series behind."""
        per_template = {id(self.prompt_tokens): self.prompt_tokens, id(self.cached_tokens): self.cached_tokens}
        removed: list[tuple[Any, tuple[str, ...]]] = [
            (self.live_sessions, (url,)), (self.inflight, (url,)), (self.healthy, (url,)), (self.failovers, (url,))]
        for key in [k for k in self._children if url in k[1]]:
            del self._children[key]
            if key[0] in per_template:  # (template, worker): the labels it was asked for are only known here
                removed.append((per_template[key[0]], key[1]))
        for metric, labels in removed:
            try:
                metric.remove(*labels)
            except KeyError:  # never labelled
                pass

    def template_label(self, template_id: str | None) -> str:
        """The ``template`` label of a template id: itself while labels last, then ``other``."""
        tid = template_id or ""
        with self._labels_lock:
            if tid in self._template_labels:
                return tid
            if len(self._template_labels) < self.max_template_labels:
                self._template_labels.add(tid)
                return tid
        return OTHER_TEMPLATE

    def hit_rate(self, template: str, worker: str) -> float | None:
        """cached / prompt tokens for one (template, worker), from this process's counters."""
        p = self.registry.get_sample_value("agent_cache_prompt_tokens_total", {"template": template, "worker": worker})
        c = self.registry.get_sample_value("agent_cache_cached_tokens_total", {"template": template, "worker": worker})
        return (c or 0.0) / p if p else None
