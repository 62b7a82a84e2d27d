"""The router: pins sessions to workers, places new ones, fails over.

Decisions happen in the store (one atomic round trip, so every process
agrees); the router supplies the pool's workers with their health state and
capacity, and handles what the store cannot: health, retries on another
worker, and rendezvous-hash routing while the store is down.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from agent_cache.background import Flusher
from agent_cache.backends.protocol import Usage
from agent_cache.backends.sglang import SGLangClient
from agent_cache.errors import (
    BackendError,
    ConfigError,
    NoHealthyWorkerError,
    RoutingError,
    StoreError,
    StoreUnavailableError,
    WorkerConnectionError,
    WorkerTimeoutError,
)
from agent_cache.routing.config import (
    DEFAULT_POOL,
    WorkerConfig,
    check_policy,
    check_tenant,
    parse_pools,
    parse_worker,
    parse_workers,
    session_key,
)
from agent_cache.routing.degraded import StoreAvailability, logger
from agent_cache.placement.hashing import pool_for_session, rendezvous_pick
from agent_cache.routing.first_byte import DEFAULT_FACTOR, DEFAULT_FLOOR, FirstByteDeadlines
from agent_cache.routing.health import HealthTracker
from agent_cache.routing.lifecycle import CallLifecycle
from agent_cache.routing.metrics import RouterMetrics
from agent_cache.routing.recent import RecentWorkers
from agent_cache.placement.rule import DOWN, DRAINING, UP, Policy
from agent_cache.routing.releases import PendingReleases
from agent_cache.store.base import (
    DEFAULT_PREFIX,
    DEFAULT_SESSION_TTL,
    Lease,
    MetadataStore,
    Releases,
    RouteQuery,
    UsageReport,
    WorkerSpec,
)
from agent_cache.store.memory import MemoryStore

T = TypeVar("T")
DEFAULT_CAPACITY = 200_000  # KV tokens assumed until /server_info answers
DEFAULT_PROBE_TIMEOUT = 5.0  # SGLang's /health takes >= 1 s (a one-token generation after a 1 s sleep)
# How late other processes may see a finished call (its in-flight count).
# Agent calls last seconds; 10 ms of staleness does not change a placement,
# and not paying a round trip per finished call halves the store traffic.
DEFAULT_RELEASE_DELAY = 0.01
# How long a router's in-flight counts stand in a shared store without renewal:
# a client killed mid-call stops renewing, and its counts are reclaimed this
# long after its last write. Routers renew every lease / 3 while calls run.
DEFAULT_LEASE = 30.0


# outcomes decided without the store: nothing to release or report there
_STORELESS = ("degraded", "last_resort")


@dataclass(frozen=True)
class RouteRequest:
    session_id: str
    template_id: str | None = None
    tenant: str = "default"
    pool: str | None = None
    prompt_tokens_estimate: int = 0


@dataclass(frozen=True)
class Placement:
    worker: str
    outcome: str  # pinned | placed_template | placed_least_load | moved:<reason> | degraded
    epoch: int
    session_id: str = ""
    tenant: str = "default"
    template_id: str | None = None
    pool: str = DEFAULT_POOL


class Router:
    """Session-sticky, template-aware, load-bounded routing over SGLang workers.

    ``store``: a :class:`MetadataStore` (default: an in-process
    :class:`MemoryStore`), or pass ``redis_url`` to share decisions across
    processes. ``probe_interval``: seconds between active ``/health`` probes
    in a background thread (``None``: no probes; breakers then reopen lazily
    after their cooldown and the next call is the trial). ``probe_timeout``:
    SGLang's ``/health`` runs a one-token generation and waits at least 1 s
    (up to 20 s under load), so the default is 5 s and a probe that times out
    counts as a soft failure: ``failure_threshold`` of them in a row open the
    breaker, while a refused connection or an error status opens it at once. ``release_delay``:
    with a store behind a network (Redis), a finished call's in-flight count
    rides on this router's next store write, or is written by a background
    thread after at most this many seconds (``0``: its own round trip at once).
    """

    def __init__(
        self,
        workers: Sequence[str | Mapping[str, Any]],
        *,
        store: MetadataStore | None = None,
        redis_url: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        session_ttl: float = DEFAULT_SESSION_TTL,
        policy: Policy | None = None,
        pools: Mapping[str, float] | None = None,
        probe_interval: float | None = 5.0,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        failure_threshold: int = 3,
        cooldown: float = 2.0,
        max_attempts: int = 3,
        default_capacity: int = DEFAULT_CAPACITY,
        capacities: Mapping[str, int] | None = None,
        registry: Any = None,
        clock: Callable[[], float] = time.time,
        release_delay: float = DEFAULT_RELEASE_DELAY,
        lease: float = DEFAULT_LEASE,
        first_byte_floor: float = DEFAULT_FLOOR,
        first_byte_factor: float = DEFAULT_FACTOR,
    ) -> None:
        self._workers: list[WorkerConfig] = parse_workers(workers)
        self._pools = parse_pools(pools, {w.pool for w in self._workers})
        if store is not None and redis_url is not None:
            raise ConfigError("store", "pass either store or redis_url, not both")
        if max_attempts < 1:
            raise ConfigError("max_attempts", f"must be >= 1, got {max_attempts}")
        if probe_interval is not None and probe_interval <= 0:
            raise ConfigError("probe_interval", f"must be > 0 or None, got {probe_interval}")
        if not isinstance(release_delay, (int, float)) or release_delay < 0:
            raise ConfigError("release_delay", f"must be a number of seconds >= 0, got {release_delay!r}")
        if not isinstance(lease, (int, float)) or lease <= 0:
            raise ConfigError("lease", f"must be a number of seconds > 0, got {lease!r}")
        if redis_url is not None:
            from agent_cache.store.redis_store import RedisStore

            store = RedisStore(redis_url, prefix=prefix, session_ttl=session_ttl)
        self.store: MetadataStore = store if store is not None else MemoryStore(session_ttl=session_ttl)
        self.policy = check_policy(policy or Policy())
        self.max_attempts = max_attempts
        self.default_capacity = default_capacity
        self._capacity: dict[str, int] = dict(capacities or {})
        self._draining: set[str] = set()
        # the pools' worker specs as routes send them, kept until the configuration changes
        self._specs_memo: dict[tuple[Any, ...], tuple[WorkerSpec, ...]] = {}
        self._config_version = 0
        self._config_lock = threading.Lock()
        # in-flight counts placed through the store but not yet released there:
        # deferred to the next store write, or owed while the store is unreachable
        self._pending = PendingReleases()
        # usage reports queued for the next store write, like the releases
        self._reports: list[UsageReport] = []
        self._reports_lock = threading.Lock()
        remote = getattr(self.store, "round_trip", True)  # the memory store releases for free
        self._flusher = Flusher(release_delay, self.flush, "agent-cache-release") if remote and release_delay > 0 else None
        self.lease = lease
        # a router with calls in flight renews its lease in the background (see renew)
        self._renewer = Flusher(lease / 3, self._renew_loop, "agent-cache-lease") if remote else None
        self._lock = threading.Lock()
        self.health = HealthTracker(failure_threshold, cooldown)
        # a streamed call's wait for a worker's next bytes, from its recent times to first token
        self.first_byte = FirstByteDeadlines(first_byte_floor, first_byte_factor)
        self.availability = StoreAvailability()
        # where each session's last call here went: a caller may send there while the store decides
        self.recent = RecentWorkers()
        self.metrics = RouterMetrics(registry)
        self._clock = clock
        self._probe_interval = probe_interval
        self._probe_timeout = probe_timeout
        self._stop = threading.Event()
        self._probe_thread: threading.Thread | None = None
        self._clients: dict[str, SGLangClient] = {}
        if probe_interval is not None:
            self._probe_thread = threading.Thread(target=self._probe_loop, args=(weakref.ref(self), probe_interval,
                                                  self._stop), name="agent-cache-probe", daemon=True)
            self._probe_thread.start()

    # --- configuration --------------------------------------------------------------

    @property
    def workers(self) -> list[WorkerConfig]:
        return list(self._workers)

    def add_worker(self, url: str | Mapping[str, Any], pool: str | None = None) -> str:
        """Add a worker; no existing pin moves (new sessions may land on it)."""
        spec = parse_worker(url if pool is None or not isinstance(url, str) else {"url": url, "pool": pool}, "worker")
        with self._lock:
            if any(w.url == spec.url for w in self._workers):
                raise ConfigError("worker", f"{spec.url} is already configured")
            self._workers = [*self._workers, spec]
            self._config_changed()
        return spec.url

    def remove_worker(self, url: str) -> None:
        """Remove a worker; only its sessions move (reason ``removed``) on their next call."""
        with self._lock:
            self._workers = [w for w in self._workers if w.url != url.rstrip("/")]
            self._config_changed()
        self.health.forget(url)
        self.first_byte.forget(url.rstrip("/"))

    def drain(self, url: str) -> None:
        """No new sessions; pinned ones move on their next call (reason ``draining``)."""
        self._draining.add(url.rstrip("/"))
        self._config_changed()

    def undrain(self, url: str) -> None:
        self._draining.discard(url.rstrip("/"))
        self._config_changed()

    def _config_changed(self) -> None:
        with self._config_lock:
            self._config_version += 1
            self._specs_memo = {}

    def extra_key_for(self, tenant: str) -> str | None:
        """SGLang ``extra_key`` that keeps one tenant's cache entries apart from another's."""
        return None if tenant == "default" else tenant

    def pool_for(self, request: RouteRequest) -> str:
        if request.pool is not None:
            if not any(w.pool == request.pool for w in self._workers):
                raise RoutingError(f"pool {request.pool!r} has no workers")
            return request.pool
        if self._pools is not None:
            return pool_for_session(request.session_id, self._pools)
        pools = [w.pool for w in self._workers]
        return DEFAULT_POOL if DEFAULT_POOL in pools else pools[0]

    # --- routing --------------------------------------------------------------------

    def _specs(self, pool: str, exclude: set[str]) -> tuple[WorkerSpec, ...]:
        version = self._config_version  # read before the workers: a change in between is never kept
        workers = self._workers
        down = self.health.down(w.url for w in workers)
        key = (pool, frozenset(exclude) if exclude else None, frozenset(down) if down else None,
               version, self.default_capacity)
        specs = self._specs_memo.get(key)
        if specs is None:
            if len(self._specs_memo) >= 256:  # exclusions and open breakers come and go: stay bounded
                self._specs_memo = {}
            specs = self._specs_memo[key] = self._make_specs([w for w in workers if w.pool == pool], exclude, down)
        return specs

    def _make_specs(self, members: list[WorkerConfig], exclude: set[str], down: set[str]) -> tuple[WorkerSpec, ...]:
        out = []
        for w in members:
            if w.url in exclude or w.url in down:
                state = DOWN
            elif w.url in self._draining:
                state = DRAINING
            else:
                state = UP
            out.append(WorkerSpec(w.url, state, self._capacity.get(w.url, self.default_capacity)))
        return tuple(out)

    def _query(self, request: RouteRequest, exclude: set[str]) -> RouteQuery:
        if not isinstance(request.session_id, str) or not request.session_id:
            raise ConfigError("session_id", "a non-empty session id is needed to route")
        check_tenant(request.tenant)
        pool = self.pool_for(request)
        return RouteQuery(
            request.tenant, session_key(request.session_id), request.template_id, pool,
            self._specs(pool, exclude), request.prompt_tokens_estimate,
        )  # fmt: skip

    def _degraded(self, request: RouteRequest, query: RouteQuery) -> Placement:
        worker = rendezvous_pick(query.session_id, [w.url for w in query.workers if w.state == UP])
        if worker is None:
            raise NoHealthyWorkerError(f"no healthy worker in pool {query.pool!r}")
        return self._placed(request, query, worker, "degraded", 0)

    def _placed(self, request: RouteRequest, query: RouteQuery, worker: str, outcome: str, epoch: int) -> Placement:
        self.metrics.child(self.metrics.decisions, outcome).inc()
        self.metrics.child(self.metrics.inflight, worker).inc()
        return Placement(worker, outcome, epoch, query.session_id, request.tenant, request.template_id, query.pool)

    def _from_result(self, request: RouteRequest, query: RouteQuery, result: Any) -> Placement:
        if result.worker is None:
            raise NoHealthyWorkerError(f"no healthy worker in pool {query.pool!r}")
        self._pending.hold(result.worker)
        if self._renewer is not None:
            self._renewer.kick()
        return self._placed(request, query, result.worker, result.outcome, result.epoch)

    def _lease(self) -> Lease:
        return Lease(self._pending.current_source(), self.lease)

    def renew(self) -> None:
        """Tell the store what this router really has in flight and renew its lease (one round trip).

        Runs every ``lease / 3`` seconds in the background while calls are in
        flight; it also corrects a count whose route reply was lost (a timeout
        during a store freeze).
        """
        self._write(lambda releases: self.store.renew(self._lease(), self._pending.held(), self._clock(), releases))

    def _renew_loop(self) -> None:
        self.renew()
        if self._pending.held() and self._renewer is not None:
            self._renewer.kick()  # calls still in flight: renew again in lease / 3

    def route(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
        """Pick the worker for one call and count it in flight; pair with :meth:`done`."""
        query = self._query(request, set(exclude))
        if self.availability.should_try():
            releases = self._pending.take()
            t0 = time.perf_counter()
            reports = self._take_reports()
            try:
                result = self.store.route(query, self.policy, self._clock(), releases, self._lease(), reports)
            except StoreUnavailableError as exc:
                self.availability.failed(exc)
                self.metrics.degraded.set(1)
            else:
                self._pending.acknowledge(releases)
                self.metrics.child(self.metrics.store_latency, "route").observe(time.perf_counter() - t0)
                self.availability.succeeded()
                self.metrics.degraded.set(0)
                return self._from_result(request, query, result)
        return self._degraded(request, query)

    def likely_worker(self, request: RouteRequest) -> str | None:
        """The worker that served this session's last call in this process, if it can take a call now
        (up, not draining, still in the request's pool); None otherwise.

        A hint for sending early: the route (:meth:`aroute`) still decides, and a caller that sent here
        drops that send when the route names another worker. None with an in-process store, whose
        routes cost no round trip to overlap.
        """
        if not getattr(self.store, "round_trip", True):
            return None
        worker = self.recent.get(request.tenant, request.session_id)
        if worker is None:
            return None
        try:
            specs = self._specs(self.pool_for(request), set())
        except (RoutingError, ConfigError):
            return None  # the route raises it
        for spec in specs:
            if spec.url == worker:
                return worker if spec.state == UP else None
        return None

    def last_resort(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
        """A worker of the pool even though none is healthy: for a caller that retries with backoff.

        Breakers open on evidence that may be stale (a worker restarting);
        the caller's own retry is then the trial call. Not recorded in the store.
        """
        pool = self.pool_for(request)
        urls = [w.url for w in self._workers if w.pool == pool]
        worker = rendezvous_pick(request.session_id, [u for u in urls if u not in exclude] or urls)
        if worker is None:
            raise NoHealthyWorkerError(f"pool {pool!r} has no workers")
        query = self._query(request, set(exclude))
        return self._placed(request, query, worker, "last_resort", 0)

    def done(self, placement: Placement) -> None:
        """The call finished (either way): release its in-flight count (see ``release_delay``)."""
        if self._release_later(placement):
            self.flush()

    def _release_later(self, placement: Placement) -> bool:
        """Queue the release; True if the caller should write it now."""
        self.metrics.child(self.metrics.inflight, placement.worker).dec()
        if placement.outcome in _STORELESS:
            return False
        self._pending.add(placement.worker)
        if self.availability.degraded:
            return False  # paid with the first write once the store answers
        if self._flusher is not None:
            self._flusher.kick()
            return False
        return True

    def flush(self) -> None:
        """Write pending in-flight releases and queued usage reports to the store now (one round trip)."""
        if self.availability.degraded:
            return
        reports = self._take_reports()

        def write(releases: Releases) -> None:
            if reports:
                self.store.report_many(reports, self._clock(), releases)
            elif releases is not None:
                self.store.release_many(releases, self._clock())

        self._write(write)

    def _write(self, write: Callable[[Releases], object]) -> None:
        """One store write carrying the releases this router owes; acknowledged once it succeeded."""
        if self.availability.degraded:
            return  # owed releases wait for the first write once the store answers
        releases = self._pending.take()
        try:
            write(releases)
        except (StoreError, ConfigError) as exc:  # a Redis refusing this client fails routes, not background writes
            self._store_failed(exc)
        else:
            self._pending.acknowledge(releases)

    async def _awrite(self, write: Callable[[Releases], Awaitable[object]]) -> None:
        """Async :meth:`_write`."""
        if self.availability.degraded:
            return
        releases = self._pending.take()
        try:
            await write(releases)
        except (StoreError, ConfigError) as exc:
            self._store_failed(exc)
        else:
            self._pending.acknowledge(releases)

    def _usage(self, placement: Placement, prompt_tokens: int, cached_tokens: int) -> UsageReport | None:
        """Count a successful call's usage in the metrics; the report for the store, if it takes one."""
        tid = self.metrics.template_label(placement.template_id)
        self.metrics.child(self.metrics.prompt_tokens, tid, placement.worker).inc(prompt_tokens)
        self.metrics.child(self.metrics.cached_tokens, tid, placement.worker).inc(cached_tokens)
        if placement.outcome in _STORELESS or self.availability.degraded:
            return None
        return UsageReport(placement.tenant, placement.session_id, placement.worker, placement.epoch,
                           placement.template_id, prompt_tokens, cached_tokens, self._clock())

    def _queue_report(self, report: UsageReport) -> bool:
        """Queue the report for this router's next store write; False if it must be written now."""
        if self._flusher is None:
            return False
        with self._reports_lock:
            self._reports.append(report)
        self._flusher.kick()
        return True

    def _take_reports(self) -> list[UsageReport]:
        # a failed write drops what it carried: reports are not idempotent, and only feed statistics
        # and the next decisions (a lost one costs at most one stale eviction signal)
        with self._reports_lock:
            reports, self._reports = self._reports, []
        return reports

    def report(self, placement: Placement, *, prompt_tokens: int, cached_tokens: int) -> None:
        """Usage of a successful call: feeds hit statistics, the footprint and the move signals.

        With Redis it rides on this router's next store write (the next route,
        or the background flush within ``release_delay``), so a call costs one
        round trip.
        """
        report = self._usage(placement, prompt_tokens, cached_tokens)
        if report is not None and not self._queue_report(report):
            self._write(lambda releases: self.store.report_many([report], self._clock(), releases))

    def _store_failed(self, exc: StoreError | ConfigError) -> None:
        if isinstance(exc, StoreUnavailableError):
            self.availability.failed(exc)
            self.metrics.degraded.set(1)
        else:
            logger.warning("metadata store error ignored: %s", exc)

    def failed(self, placement: Placement, exc: BackendError) -> None:
        """Passive health: a real call on ``placement.worker`` failed with a retryable error."""
        # A refused connection is proof enough; other errors must repeat to open the breaker.
        if self.health.failure(placement.worker, hard=isinstance(exc, WorkerConnectionError)):
            logger.warning("worker %s marked unhealthy: %s", placement.worker, exc)
            self.metrics.healthy.labels(placement.worker).set(0)
        self.metrics.failovers.labels(placement.worker).inc()

    def succeeded(self, placement: Placement) -> None:
        """Passive health: a real call on ``placement.worker`` succeeded."""
        if self.health.success(placement.worker):
            self.metrics.healthy.labels(placement.worker).set(1)

    def settle(self, placement: Placement, error: BaseException | None = None, usage: Usage | None = None) -> None:
        """An attempt ended: release its in-flight count; then its usage and passive health on success;
        on a worker error, passive health (if retryable) and, if this call placed the session, undo it."""
        self.done(placement)
        self._remember(placement, error)
        if error is None:
            self.succeeded(placement)
            if usage is not None:
                self.report(placement, prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens or 0)
        elif isinstance(error, BackendError):
            if error.retryable:
                self.failed(placement, error)
            if self._undoable(placement):
                self.abandon(placement)

    def _remember(self, placement: Placement, error: BaseException | None) -> None:
        if error is None:
            self.recent.served(placement.tenant, placement.session_id, placement.worker)
        else:
            self.recent.forget(placement.tenant, placement.session_id)

    @staticmethod
    def _undoable(placement: Placement) -> bool:
        """A placement made by this call (not a pin it followed), recorded in the store."""
        return placement.outcome != "pinned" and placement.outcome not in _STORELESS

    def abandon(self, placement: Placement) -> None:
        """The worker did not serve the call that placed the session: undo the placement in the store
        (pin, KV estimate, template mark), so a failed call leaves no state behind."""
        self._write(lambda releases: self.store.abandon(
            placement.tenant, placement.session_id, placement.worker, placement.epoch, placement.template_id,
            self._clock(), releases))

    def execute(self, request: RouteRequest, call: Callable[[str], T]) -> tuple[T, Placement]:
        """Run ``call(worker_url)`` on the session's worker; on a retryable BackendError move and retry
        (at most ``max_attempts`` tries, see :mod:`agent_cache.routing.lifecycle`)."""
        return CallLifecycle(self, request, max_attempts=self.max_attempts).run(lambda p: (call(p.worker), None))

    # --- async face -----------------------------------------------------------------

    async def aroute(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
        query = self._query(request, set(exclude))
        astore = self.store
        if self.availability.should_try():
            releases = self._pending.take()
            t0 = time.perf_counter()
            reports = self._take_reports()
            try:
                result = await astore.aroute(  # type: ignore[attr-defined]
                    query, self.policy, self._clock(), releases, self._lease(), reports)
            except StoreUnavailableError as exc:
                self.availability.failed(exc)
                self.metrics.degraded.set(1)
            else:
                self._pending.acknowledge(releases)
                self.metrics.child(self.metrics.store_latency, "route").observe(time.perf_counter() - t0)
                self.availability.succeeded()
                self.metrics.degraded.set(0)
                return self._from_result(request, query, result)
        return self._degraded(request, query)

    async def adone(self, placement: Placement) -> None:
        if self._release_later(placement):
            await self.aflush()

    async def aflush(self) -> None:
        """Async :meth:`flush`."""
        if self.availability.degraded:
            return
        reports = self._take_reports()

        async def write(releases: Releases) -> None:
            if reports:
                await self.store.areport_many(reports, self._clock(), releases)  # type: ignore[attr-defined]
            elif releases is not None:
                await self.store.arelease_many(releases, self._clock())  # type: ignore[attr-defined]

        await self._awrite(write)

    async def areport(self, placement: Placement, *, prompt_tokens: int, cached_tokens: int) -> None:
        """Async :meth:`report`."""
        report = self._usage(placement, prompt_tokens, cached_tokens)
        if report is not None and not self._queue_report(report):
            await self._awrite(
                lambda releases: self.store.areport_many([report], self._clock(), releases))  # type: ignore[attr-defined]

    async def asettle(self, placement: Placement, error: BaseException | None = None,
                      usage: Usage | None = None) -> None:
        """Async :meth:`settle`."""
        await self.adone(placement)
        self._remember(placement, error)
        if error is None:
            self.succeeded(placement)
            if usage is not None:
                await self.areport(placement, prompt_tokens=usage.prompt_tokens, cached_tokens=usage.cached_tokens or 0)
        elif isinstance(error, BackendError):
            if error.retryable:
                self.failed(placement, error)
            if self._undoable(placement):
                await self.aabandon(placement)

    async def aabandon(self, placement: Placement) -> None:
        """Async :meth:`abandon`."""
        await self._awrite(lambda releases: self.store.aabandon(  # type: ignore[attr-defined]
            placement.tenant, placement.session_id, placement.worker, placement.epoch, placement.template_id,
            self._clock(), releases))

    async def aexecute(self, request: RouteRequest, call: Callable[[str], Awaitable[T]]) -> tuple[T, Placement]:
        """Async :meth:`execute`: ``await call(worker_url)`` with the same failover."""
        async def attempt(p: Placement) -> tuple[T, None]:
            return await call(p.worker), None

        return await CallLifecycle(self, request, max_attempts=self.max_attempts).arun(attempt)

    # --- health probes --------------------------------------------------------------

    def _client(self, url: str) -> SGLangClient:
        c = self._clients.get(url)
        if c is None:
            c = self._clients[url] = SGLangClient(url, timeout=self._probe_timeout)
        return c

    def probe_once(self) -> None:
        """Probe every worker's ``/health`` now, in parallel (the background thread calls this)."""
        workers = [w for w in list(self._workers)]
        if not workers or self._stop.is_set():
            return
        with ThreadPoolExecutor(max_workers=min(16, len(workers)), thread_name_prefix="agent-cache-probe") as pool:
            list(pool.map(self._probe_worker, workers))
        self._refresh_gauges()

    def _probe_worker(self, w: WorkerConfig) -> None:
        if self._stop.is_set():
            return
        client = self._client(w.url)
        try:
            client.health(timeout=self._probe_timeout)
        except BackendError as exc:
            # a slow /health is SGLang under load, not a dead worker: soft
            hard = not isinstance(exc, WorkerTimeoutError)
            if self.health.failure(w.url, hard=hard):
                logger.warning("worker %s failed its health probe: %s", w.url, exc)
            self.metrics.healthy.labels(w.url).set(0)
            return
        if self.health.success(w.url):
            logger.warning("worker %s healthy again", w.url)
        self.metrics.healthy.labels(w.url).set(1)
        if w.url not in self._capacity:
            try:  # metadata is not health: a worker without the route is still up
                cap = client.server_info().get("max_total_num_tokens")
            except BackendError as exc:
                logger.info("worker %s: no capacity from its server info (%s)", w.url, exc)
                return
            if isinstance(cap, int) and cap > 0:
                self._capacity[w.url] = cap
                self._config_changed()

    def _refresh_gauges(self) -> None:
        if self.availability.degraded:
            return
        try:
            stats = self.store.stats(self._clock(), templates=False)  # workers only: cheap at any template count
        except (StoreError, ConfigError):
            return
        for url, w in stats["workers"].items():
            self.metrics.live_sessions.labels(url).set(w["sessions"])

    @staticmethod
    def _probe_loop(ref: "weakref.ref[Router]", interval: float, stop: threading.Event) -> None:
        # holds the router only while probing: a router dropped without close() ends its thread
        while not stop.is_set() and not sys.is_finalizing():
            router = ref()
            if router is None:
                return
            try:
                router.probe_once()
            except Exception as exc:  # never let the prober die silently
                if sys.is_finalizing() or "interpreter shutdown" in str(exc):  # the process is exiting
                    return
                logger.exception("health probe loop error")
            del router
            stop.wait(interval)

    def close(self) -> None:
        """Stop the background threads, write pending releases, close the store and clients."""
        self._stop.set()
        if self._flusher is not None:
            self._flusher.close()
        self.flush()  # owed releases and queued reports
        if self._renewer is not None:
            self._renewer.close()
            self.renew()  # ends this router's lease
        if self._probe_thread is not None:
            self._probe_thread.join(timeout=5)
        for c in self._clients.values():
            c.close()
        self._clients.clear()
        self.store.close()

    async def aclose(self) -> None:
        """Async :meth:`close`: also closes the store's asyncio client (call it in the loop that used it)."""
        if self._flusher is not None:
            self._flusher.close()
        await self.aflush()
        aclose = getattr(self.store, "aclose", None)
        if aclose is not None:
            await aclose()
        await asyncio.to_thread(self.close)  # its last writes are sync: off the event loop

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
