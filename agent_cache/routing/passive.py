"""Passive health: real calls' outcomes fed to the workers' breakers, and the gauges they move.

Only a worker's own failures count: the router never feeds a failure the request caused
(``BackendError.request_fault``), and holds back a 5xx awaiting a second opinion until its verdict
(:func:`~agent_cache.routing.lifecycle.call_flow`).
"""

from __future__ import annotations

from typing import Callable, Sequence

from agent_cache.errors import BackendError, WorkerConnectionError, WorkerRefusedError
from agent_cache.routing.config import WorkerConfig
from agent_cache.routing.degraded import logger
from agent_cache.routing.health import HealthTracker
from agent_cache.routing.metrics import RouterMetrics
from agent_cache.values import Placement


class PassiveHealth:
    def __init__(self, health: HealthTracker, metrics: RouterMetrics,
                 workers: Callable[[], Sequence[WorkerConfig]]) -> None:
        self.health = health
        self.metrics = metrics
        self._workers = workers

    def failed(self, placement: Placement, exc: BackendError) -> None:
        """A real call on ``placement.worker`` failed with a retryable error of the worker's own."""
        # A refused connection is proof enough; other errors must repeat to open the breaker, and open
        # no more than the pool's share of breakers (see agent_cache.routing.health)
        pool = [w.url for w in self._workers() if w.pool == placement.pool]
        # a refusal another worker did not share (a wrong key or path) is as much proof as a refused connection
        hard = isinstance(exc, (WorkerConnectionError, WorkerRefusedError))
        if self.health.failure(placement.worker, hard=hard, pool=pool):
            logger.warning("worker %s marked unhealthy: %s", placement.worker, exc)
            self.metrics.healthy.labels(placement.worker).set(0)
        self.metrics.failovers.labels(placement.worker).inc()

    def judge(self, placement: Placement, error: BackendError, *, blame: bool = True) -> None:
        """The verdict on a failure settled unjudged (held for a second opinion): counted if it was the
        worker's own (``blame``, not the request's fault), else nothing (a half-open worker's trial slot
        is free again)."""
        if error.request_fault or not blame:
            self.health.release((placement.worker,))
        else:
            self.failed(placement, error)

    def succeeded(self, placement: Placement) -> None:
        """A real call on ``placement.worker`` succeeded."""
        if self.health.success(placement.worker):
            self.metrics.healthy.labels(placement.worker).set(1)
