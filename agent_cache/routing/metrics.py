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
# Tenants are bounded the same way: a keys file names them, but a process that serves
# many (or a ChatSGLang per customer) must not grow without end.
MAX_TENANT_LABELS = 100
OTHER_TENANT = OTHER_TEMPLATE

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
# A call's latencies, in seconds, from milliseconds to minutes. The GenAI semantic conventions'
# recommended boundaries, widened where agent calls go past them: a TTFT behind a long queue
# (20-80 s), a decode faster than their first 10 ms bucket (an H100 decodes a token in ~7 ms),
# a long agent step (to 5.5 min).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
                1.0, 2.5)
DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
                    163.84, 327.68)
# before the worker: checks and templating (a 20 MB body takes seconds), rate limits, the store's round trip
ROUTE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                 5.0, 10.0)
# how a call ended (the ``outcome`` label of the request duration)
OK, ERROR, CANCELLED = "ok", "error", "cancelled"
NO_WORKER = "none"  # the ``worker`` label of a call that failed before any worker was chosen
# the ``gen_ai_token_type`` label: the GenAI conventions' input and output, and the input tokens the
# worker's prefix cache served (part of input)
INPUT, OUTPUT, CACHED = "input", "output", "cached"


class BoundedLabels:
    """A label's values, bounded: each value is its own label while fewer than ``limit`` have been
    seen, and every later one is ``other`` (values that come early and stay, an agent's template or
    a keys file's tenants, keep their series; values that differ per call cannot add series without end)."""

    def __init__(self, limit: int, other: str) -> None:
        self.limit = limit
        self.other = other
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str | None) -> str:
        v = value or ""
        if v in self._seen:  # the common case, without the lock (a set read is atomic)
            return v
        with self._lock:
            if v in self._seen or len(self._seen) < self.limit:
                self._seen.add(v)
                return v
        return self.other


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

    def __init__(self, registry: CollectorRegistry | None = None, max_template_labels: int = MAX_TEMPLATE_LABELS,
                 max_tenant_labels: int = MAX_TENANT_LABELS) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_template_labels = max_template_labels
        # the ``template`` label of a template id and the ``tenant`` label of a tenant: themselves while
        # labels last, then ``other``
        self.template_label = BoundedLabels(max_template_labels, OTHER_TEMPLATE)
        self.tenant_label = BoundedLabels(max_tenant_labels, OTHER_TENANT)
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
        # one call's latencies, observed once per call by its lifecycle (routing/call_latency.py); the
        # names mirror the OpenTelemetry GenAI metrics (gen_ai.server.*) in Prometheus form
        self.time_to_first_token = Histogram(
            "agent_cache_gen_ai_server_time_to_first_token_seconds",
            "A served call's time from its arrival to the first bytes of its answer from the worker, by the "
            "worker that answered", ["worker"], buckets=TTFT_BUCKETS, registry=r)
        self.time_per_output_token = Histogram(
            "agent_cache_gen_ai_server_time_per_output_token_seconds",
            "A served call's time per output token after the first", ["worker"], buckets=TPOT_BUCKETS, registry=r)
        self.request_duration = Histogram(
            "agent_cache_gen_ai_server_request_duration_seconds",
            "A call's time from its arrival to the last bytes of its answer (or its failure), by the last "
            "worker tried and outcome (ok, error, cancelled)", ["worker", "outcome"],
            buckets=DURATION_BUCKETS, registry=r)
        self.route_duration = Histogram(
            "agent_cache_route_duration_seconds",
            "A call's time from its arrival to its request going to its first worker: checks, templating, "
            "limits, the routing decision and its store round trip", ["worker"], buckets=ROUTE_BUCKETS,
            registry=r)
        self.tenant_tokens = Counter(
            "agent_cache_tenant_tokens", "Tokens of served calls by tenant: input, output, and cached (the input "
            "tokens served from the prefix cache)", ["tenant", "gen_ai_token_type"], registry=r)
        # every labelled metric by id: a removed worker's series are found through the children asked for
        self._labelled = {id(m): m for m in (
            self.decisions, self.live_sessions, self.inflight, self.healthy, self.prompt_tokens, self.cached_tokens,
            self.store_latency, self.failovers, self.time_to_first_token, self.time_per_output_token,
            self.request_duration, self.route_duration, self.tenant_tokens)}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        if registry is None:
            PROCESS_ROUTERS.add(self)

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: the call path asks for the same few on every call
        (labels are bounded: workers, outcomes, ``max_template_labels`` templates, ``max_tenant_labels`` tenants)."""
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def forget_worker(self, url: str) -> None:
        """Drop every series labelled with a removed worker, so workers that come and go (discovery, admin
        changes) leave no series behind."""
        removed: list[tuple[Any, tuple[str, ...]]] = [
            (self.live_sessions, (url,)), (self.inflight, (url,)), (self.healthy, (url,)), (self.failovers, (url,))]
        for key in [k for k in list(self._children) if url in k[1]]:  # a copy: calls add children meanwhile
            self._children.pop(key, None)
            # with other labels (template, outcome) the labels it was asked for are only known here
            removed.append((self._labelled[key[0]], key[1]))
        for metric, labels in removed:
            try:
                metric.remove(*labels)
            except KeyError:  # never labelled, or already removed
                pass

    def hit_rate(self, template: str, worker: str) -> float | None:
        """cached / prompt tokens for one (template, worker), from this process's counters."""
        p = self.registry.get_sample_value("agent_cache_prompt_tokens_total", {"template": template, "worker": worker})
        c = self.registry.get_sample_value("agent_cache_cached_tokens_total", {"template": template, "worker": worker})
        return (c or 0.0) / p if p else None
