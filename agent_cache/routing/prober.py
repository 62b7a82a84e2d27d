"""Active health probes of a router's workers, and each worker's KV capacity from its server info."""

from __future__ import annotations

import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

import httpx

from agent_cache.backends.sglang import SGLangClient
from agent_cache.errors import BackendError, WorkerTimeoutError
from agent_cache.routing.config import WorkerConfig
from agent_cache.routing.degraded import logger
from agent_cache.routing.health import OPEN, HealthTracker
from agent_cache.routing.metrics import RouterMetrics


class Prober:
    """Probes every worker's ``/health`` in parallel, every ``interval`` seconds in a background thread
    once :meth:`start` ran.

    A slow ``/health`` is SGLang under load: a timeout is a soft failure, a
    refused connection or an error status a hard one. A worker that answers
    and has no known capacity is asked for ``max_total_num_tokens``, which
    goes into ``capacity``; ``capacity_found`` is then called. ``after_round``
    runs after each round of probes. A worker named to :meth:`probe_soon` (one
    just added) is probed at once, alone, rather than at the next round.

    Every probe goes through one shared connection pool: a client per worker
    cost about 1 MB and milliseconds of CPU each, which a fleet of a thousand
    workers paid on its first round.
    """

    PARALLEL = 16  # probes at a time

    def __init__(self, workers: Callable[[], Sequence[WorkerConfig]], health: HealthTracker, metrics: RouterMetrics,
                 capacity: dict[str, int], capacity_found: Callable[[], None], after_round: Callable[[], None],
                 timeout: float) -> None:
        self._workers = workers
        self.health = health
        self.metrics = metrics
        self.capacity = capacity
        self._capacity_found = capacity_found
        self._after_round = after_round
        self.timeout = timeout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()  # a worker waits in ``_soon``
        self._soon: set[str] = set()
        self._soon_lock = threading.Lock()
        limits = httpx.Limits(max_connections=self.PARALLEL, max_keepalive_connections=self.PARALLEL)
        self._http = httpx.Client(limits=limits, timeout=timeout)
        self._clients: dict[str, SGLangClient] = {}  # per worker: its metadata route, over the shared pool
        # A probe's result is recorded (health, series, client, capacity) only while its worker is configured,
        # under this lock, which :meth:`forget` takes too: a probe that ends after its worker was removed
        # leaves nothing behind.
        self._record_lock = threading.Lock()
        self._urls: tuple[object, frozenset[str]] = (None, frozenset())  # the workers' list -> its URLs

    def start(self, interval: float) -> None:
        self._thread = threading.Thread(target=self._loop, args=(weakref.ref(self), interval, self._stop, self._wake),
                                        name="agent-cache-probe", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the background thread probes the workers (a new worker then waits for its first probe)."""
        return self._thread is not None and not self._stop.is_set()

    def probe_soon(self, url: str) -> None:
        """Probe ``url`` now in the background thread, without waiting for the next round."""
        with self._soon_lock:
            self._soon.add(url)
        self._wake.set()

    def _client(self, url: str) -> SGLangClient | None:
        c = self._clients.get(url)
        if c is None:
            with self._record_lock:
                if not self._configured(url):
                    return None
                c = self._clients.setdefault(url, SGLangClient(url, timeout=self.timeout, http=self._http))
        return c

    def forget(self, url: str) -> None:
        """A removed worker (already out of the workers' list): its probe client and its capacity dropped,
        once any probe result being recorded is; later ones are not (workers that come and go leave
        nothing behind)."""
        with self._record_lock:
            self._clients.pop(url, None)
            self.capacity.pop(url, None)

    def _configured(self, url: str) -> bool:
        workers = self._workers()  # a new list on each change: its URLs are computed once per change
        known = self._urls
        if known[0] is not workers:
            known = self._urls = (workers, frozenset(w.url for w in workers))
        return url in known[1]

    def probe_once(self) -> None:
        """Probe every worker now, in parallel."""
        self._take_soon()  # this round probes them
        workers = list(self._workers())
        if not workers or self._stop.is_set():
            return
        self._probe(workers)
        self._after_round()

    def probe_queued(self) -> None:
        """Probe the workers named to :meth:`probe_soon` since the last round."""
        urls = self._take_soon()
        workers = [w for w in self._workers() if w.url in urls]
        if workers and not self._stop.is_set():
            self._probe(workers)

    def _take_soon(self) -> set[str]:
        with self._soon_lock:
            self._wake.clear()
            urls, self._soon = self._soon, set()
        return urls

    def _probe(self, workers: Sequence[WorkerConfig]) -> None:
        with ThreadPoolExecutor(max_workers=min(self.PARALLEL, len(workers)),
                                thread_name_prefix="agent-cache-probe") as pool:
            list(pool.map(self._probe_worker, workers))

    def _probe_worker(self, w: WorkerConfig) -> None:
        if self._stop.is_set():
            return
        client = self._client(w.url)
        if client is None:  # removed since the round began
            return
        try:
            client.health(timeout=self.timeout)
        except BackendError as exc:
            with self._record_lock:
                if not self._configured(w.url):
                    return
                # a slow /health is SGLang under load, not a dead worker: soft
                hard = not isinstance(exc, WorkerTimeoutError)
                if self.health.failure(w.url, hard=hard, probe=True):
                    logger.warning("worker %s failed its health probe: %s", w.url, exc)
                self.metrics.healthy.labels(w.url).set(0)
            return
        with self._record_lock:
            if not self._configured(w.url):
                return
            first = self.health.unproven(w.url)
            if self.health.success(w.url, probe=True):
                if first:
                    logger.info("worker %s answered its first probe: it takes sessions", w.url)
                else:
                    logger.warning("worker %s healthy again", w.url)
            # half-open takes a trial
            self.metrics.healthy.labels(w.url).set(0 if self.health.state(w.url) == OPEN else 1)
        if w.url not in self.capacity:
            try:  # metadata is not health: a worker without the route is still up
                cap = client.server_info().get("max_total_num_tokens")
            except BackendError as exc:
                logger.info("worker %s: no capacity from its server info (%s)", w.url, exc)
                return
            if isinstance(cap, int) and cap > 0:
                with self._record_lock:
                    if not self._configured(w.url):
                        return
                    self.capacity[w.url] = cap
                self._capacity_found()

    @staticmethod
    def _loop(ref: "weakref.ref[Prober]", interval: float, stop: threading.Event, wake: threading.Event) -> None:
        # holds the prober only while probing: a router dropped without close() ends its thread
        next_round = 0.0
        while not stop.is_set() and not sys.is_finalizing():
            prober = ref()
            if prober is None:
                return
            try:
                if time.monotonic() >= next_round:
                    prober.probe_once()
                    next_round = time.monotonic() + interval
                else:
                    prober.probe_queued()
            except Exception as exc:  # never let the prober die silently
                if sys.is_finalizing() or "interpreter shutdown" in str(exc):  # the process is exiting
                    return
                logger.exception("health probe loop error")
            del prober
            wake.wait(max(0.0, next_round - time.monotonic()))

    def stop(self) -> None:
        """Tell the thread to stop (a probe under way ends soon after)."""
        self._stop.set()
        self._wake.set()

    def close(self) -> None:
        """Stop the thread, wait for it, close the probe clients."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._clients.clear()
        self._http.close()
