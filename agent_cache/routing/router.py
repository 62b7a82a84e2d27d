"""The router: pins sessions to workers, places new ones, fails over.

Decisions happen in the store (one atomic round trip, so every process
agrees); the router supplies the pool's workers with their health state and
capacity, and handles what the store cannot: health, retries on another
worker, and routing while the store is down (each session to the worker this
process last used for it, else by rendezvous hash). What it owes
the store is written late by its :class:`~agent_cache.routing.outbox.Outbox`;
its workers are probed by a :class:`~agent_cache.routing.prober.Prober`.
Each operation that talks to the store is written once as a flow of store
commands (:mod:`agent_cache.routing.store_ops`), run by the sync and the
async face (:mod:`agent_cache.routing.async_face`); passive health is
:class:`~agent_cache.routing.passive.PassiveHealth`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import AbstractSet, Any, Awaitable, Callable, Mapping, Sequence, TypeVar

from agent_cache import exit_flush
from agent_cache.errors import (BackendError, ConfigError, InvalidRequestError, NoHealthyWorkerError, RoutingError,
                                StoreError, StoreUnavailableError)
from agent_cache.routing.async_face import AsyncFace
from agent_cache.routing.config import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PROBE_INTERVAL,
    WorkerConfig,
    check_policy,
    check_router_args,
    check_tenant,
    parse_pools,
    parse_worker,
    parse_workers,
    session_key,
)
from agent_cache.routing.degraded import StoreAvailability, logger
from agent_cache.placement.hashing import pool_for_session, rendezvous_pick
from agent_cache.routing.first_byte import DEFAULT_FACTOR, DEFAULT_FLOOR, FirstByteDeadlines
from agent_cache.routing.health import CLOSED, HealthTracker
from agent_cache.routing.cache_view import CacheView
from agent_cache.routing.lifecycle import CallLifecycle
from agent_cache.routing.metrics import RouterMetrics
from agent_cache.routing.outbox import Outbox
from agent_cache.routing.passive import PassiveHealth
from agent_cache.routing.prober import Prober
from agent_cache.routing.recent import RecentWorkers
from agent_cache.routing.store_ops import Flow, StoreOp, run
from agent_cache.placement.rule import DOWN, DRAINING, UP, Policy
from agent_cache.store.base import (
    DEFAULT_PREFIX,
    DEFAULT_SESSION_TTL,
    MetadataStore,
    RouteQuery,
    UsageReport,
    WorkerSpec,
)
from agent_cache.store.memory import MemoryStore
from agent_cache.values import DEFAULT_POOL, STORELESS, Placement, RouteRequest, Usage

T = TypeVar("T")
DEFAULT_CAPACITY = 200_000  # KV tokens assumed until /server_info answers
DEFAULT_PROBE_TIMEOUT = 5.0  # SGLang's /health takes >= 1 s (a one-token generation after a 1 s sleep)
# How late other processes may see a finished call (its in-flight count).
# Agent calls last seconds; 10 ms of staleness does not change a placement,
# and not paying a round trip per finished call halves the store traffic.
DEFAULT_RELEASE_DELAY = 0.01
# How long a router's in-flight counts stand in a shared store without renewal:
# a client killed mid-call stops renewing, and its counts are reclaimed this
# long after its last write. Routers renew every lease / 3 (2 s) while calls run.
DEFAULT_LEASE = 6.0

__all__ = ["DEFAULT_CAPACITY", "DEFAULT_LEASE", "DEFAULT_PROBE_TIMEOUT", "DEFAULT_RELEASE_DELAY", "Placement", "RouteRequest", "Router"]


class Router(AsyncFace):
    """Session-sticky, template-aware, load-bounded routing over SGLang workers.

    ``store``: a :class:`MetadataStore` (default: an in-process
    :class:`MemoryStore`), or pass ``redis_url`` to share decisions across
    processes. ``probe_interval``: seconds between active ``/health`` probes
    in a background thread (``None``: no probes; breakers then reopen lazily
    after their cooldown and the next call is the trial). ``probe_timeout``:
    SGLang's ``/health`` waits at least 1 s (idle: a one-token generation;
    busy: it answers after the next forward pass, about 1 s; it gives up after
    20 s only when the scheduler is stuck), so the default is 5 s and a probe that times out
    counts as a soft failure: ``failure_threshold`` of them in a row open the
    breaker, while a refused connection or an error status opens it at once. ``release_delay``:
    with a store behind a network (Redis), a finished call's in-flight count
    rides on this router's next store write, or is written by a background
    thread after at most this many seconds (``0``: its own round trip at once).
    ``kv_events``: the workers' caches as their KV events show them, a
    :class:`~agent_cache.routing.cache_view.CacheView` (``agent_cache.kv.KvView``):
    each route's workers are marked from it; its maker closes it.
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
        probe_interval: float | None = DEFAULT_PROBE_INTERVAL,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        failure_threshold: int = 3,
        cooldown: float = 2.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        default_capacity: int = DEFAULT_CAPACITY,
        capacities: Mapping[str, int] | None = None,
        registry: Any = None,
        clock: Callable[[], float] = time.time,
        release_delay: float = DEFAULT_RELEASE_DELAY, lease: float = DEFAULT_LEASE,
        first_byte_floor: float = DEFAULT_FLOOR,
        first_byte_factor: float = DEFAULT_FACTOR, kv_events: CacheView | None = None,  # agent_cache.kv.KvView
        allow_empty: bool = False,  # start with no worker: they are added later (discovery, admin)
    ) -> None:
        self._workers: list[WorkerConfig] = parse_workers(workers, allow_empty=allow_empty)
        self._pools = parse_pools(pools, {w.pool for w in self._workers})
        if store is not None and redis_url is not None:
            raise ConfigError("store", "pass either store or redis_url, not both")
        if kv_events is not None and not isinstance(kv_events, CacheView):
            raise ConfigError("kv_events", f"expected the workers' KV events followed, agent_cache.kv.KvView(...), "
                                           f"got {type(kv_events).__name__} (docs/routing.md, \"KV events\")")
        check_router_args(max_attempts, probe_interval, release_delay, lease)
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
        self._lock = threading.Lock()
        self.health = HealthTracker(failure_threshold, cooldown)
        # a streamed call's wait for a worker's next bytes, from its recent times to first token
        self.first_byte = FirstByteDeadlines(first_byte_floor, first_byte_factor)
        self.availability = StoreAvailability()
        # where each session's last call here went: a caller may send there while the store decides
        self.recent = RecentWorkers()
        self.metrics = RouterMetrics(registry)
        self.passive = PassiveHealth(self.health, self.metrics, lambda: self._workers)
        self._clock = clock
        self.kv_events = kv_events  # the workers' caches as their KV events show them (routing/cache_view.py)
        self.lease = lease
        self.outbox = Outbox(self.store, self.availability, self._store_failed, clock, release_delay, lease)
        self.prober = Prober(lambda: self._workers, self.health, self.metrics, self._capacity, self._config_changed,
                             self._refresh_gauges, probe_timeout)
        if probe_interval is not None:
            self.prober.start(probe_interval)
        exit_flush.register(self, Router.close)  # owed releases and reports written at exit (bounded)

    # --- configuration --------------------------------------------------------------

    @property
    def workers(self) -> list[WorkerConfig]:
        return list(self._workers)

    def add_worker(self, url: str | Mapping[str, Any], pool: str | None = None) -> str:
        """Add a worker; no existing pin moves. While probes run, it takes new sessions only once it has
        answered one (it is probed at once); without probes, from now on."""
        spec = parse_worker(url if pool is None or not isinstance(url, str) else {"url": url, "pool": pool}, "worker")
        with self._lock:
            if any(w.url == spec.url for w in self._workers):
                raise ConfigError("worker", f"{spec.url} is already configured")
            probed = self.prober.running
            if probed:  # a pod still loading its model refuses connections: no session until it answers
                self.health.await_probe(spec.url)
                self.metrics.healthy.labels(spec.url).set(0)
            self._workers = [*self._workers, spec]
            self._config_changed()
        if probed:
            self.prober.probe_soon(spec.url)
        return spec.url

    def remove_worker(self, url: str) -> None:
        """Remove a worker; only its sessions move (reason ``removed``) on their next call."""
        with self._lock:
            self._workers = [w for w in self._workers if w.url != url.rstrip("/")]
            self._config_changed()
        # the prober first: it waits for a probe result being recorded (which a later one will not be)
        self.prober.forget(url.rstrip("/"))
        self.health.forget(url)
        self.first_byte.forget(url.rstrip("/"))
        self.metrics.forget_worker(url.rstrip("/"))

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
        return DEFAULT_POOL if DEFAULT_POOL in pools or not pools else pools[0]

    # --- routing --------------------------------------------------------------------

    def specs(self, pool: str, exclude: AbstractSet[str] = frozenset(),
              trials: set[str] | None = None) -> tuple[WorkerSpec, ...]:
        """The pool's workers as routes see them (state, KV capacity); with ``trials``, a half-open worker's
        trial slot may be offered to this route (added to ``trials``: the caller releases those unused)."""
        version = self._config_version  # read before the workers: a change in between is never kept
        workers = self._workers
        down, offered = self.health.unavailable((w.url for w in workers if w.pool == pool), claim=trials is not None)
        if trials is not None:
            trials |= offered
        key = (pool, frozenset(exclude) if exclude else None, frozenset(down) if down else None,
               version, self.default_capacity)
        specs = self._specs_memo.get(key)
        if specs is None:
            if len(self._specs_memo) >= 256:  # exclusions and open breakers come and go: stay bounded
                self._specs_memo = {}
            specs = self._specs_memo[key] = self._make_specs([w for w in workers if w.pool == pool], exclude, down)
        return specs

    def _make_specs(self, members: list[WorkerConfig], exclude: AbstractSet[str],
                    down: set[str]) -> tuple[WorkerSpec, ...]:
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

    def _query(self, request: RouteRequest, exclude: set[str], trials: set[str] | None = None) -> RouteQuery:
        if not isinstance(request.session_id, str) or not request.session_id:
            raise InvalidRequestError("session_id", "a non-empty session id is needed to route")
        check_tenant(request.tenant)
        pool, kv, tid = self.pool_for(request), self.kv_events, request.template_id
        specs, sid = self.specs(pool, exclude, trials), session_key(request.session_id)
        if kv is not None:  # the route's workers marked (template held / lacks, session gone) as their events tell
            specs = kv.mark(specs, tid, namespace=self.extra_key_for(request.tenant), session=(request.tenant, sid))
        return RouteQuery(request.tenant, sid, tid, pool, specs, request.prompt_tokens_estimate)

    def _degraded(self, request: RouteRequest, query: RouteQuery) -> Placement:
        """Without the store: the worker this process last used for the session, if it can take the call
        (the session keeps its cache through a store outage); else the rendezvous hash's pick."""
        up = [w.url for w in query.workers if w.state == UP]
        worker = self.recent.get(request.tenant, request.session_id)
        if worker not in up:
            worker = rendezvous_pick(query.session_id, up)
        if worker is None:
            raise NoHealthyWorkerError(f"no healthy worker in pool {query.pool!r}")
        return self._placed(request, query, worker, "degraded", 0)

    def _placed(self, request: RouteRequest, query: RouteQuery, worker: str, outcome: str, epoch: int) -> Placement:
        self.metrics.child(self.metrics.decisions, outcome).inc()
        self.metrics.child(self.metrics.inflight, worker).inc()
        return Placement(worker, outcome, epoch, query.session_id, request.tenant, request.template_id, query.pool)

    def renew(self) -> None:
        """Renew this router's lease and in-flight counts now (one round trip; see :class:`Outbox`)."""
        self.outbox.renew()

    def _route(self, request: RouteRequest, exclude: set[str] | frozenset[str]) -> Flow[Placement]:
        trials: set[str] = set()  # half-open workers whose trial slot this route holds: released unless chosen
        placement: Placement | None = None
        try:
            placement = yield from self._route_with(request, exclude, trials)
            return placement
        finally:
            if trials:
                self.health.release(trials - {placement.worker if placement is not None else ""})

    def _route_with(self, request: RouteRequest, exclude: set[str] | frozenset[str],
                    trials: set[str]) -> Flow[Placement]:
        query = self._query(request, set(exclude), trials)
        if self.availability.should_try():
            releases = self.outbox.pending.take()
            t0 = time.perf_counter()
            reports = self.outbox.take_reports()
            try:
                result = yield StoreOp("route", (query, self.policy, self._clock(), releases,
                                                 self.outbox.lease_record(), reports))
            except StoreUnavailableError as exc:
                self._store_failed(exc)
            else:
                self.outbox.pending.acknowledge(releases)
                self.metrics.child(self.metrics.store_latency, "route").observe(time.perf_counter() - t0)
                self.availability.succeeded()
                self.metrics.degraded.set(0)
                if result.worker is None:
                    raise NoHealthyWorkerError(f"no healthy worker in pool {query.pool!r}")
                self.outbox.routed(result.worker)
                return self._placed(request, query, result.worker, result.outcome, result.epoch)
        return self._degraded(request, query)

    def route(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
        """Pick the worker for one call and count it in flight; pair with :meth:`done`."""
        return run(self.store, self._route(request, exclude))

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
            specs = self.specs(self.pool_for(request))
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

    def second_opinion(self, request: RouteRequest, *, exclude: set[str] | frozenset[str] = frozenset()) -> Placement:
        """Another healthy worker of the pool for a call whose failure may be the request's fault; not
        recorded in the store, so the session's pin stays where it is whatever the answer."""
        query = self._query(request, set(exclude))
        closed = [w.url for w in query.workers if w.state == UP and self.health.state(w.url) == CLOSED]
        worker = rendezvous_pick(query.session_id, closed)
        if worker is None:
            raise NoHealthyWorkerError(f"no other healthy worker in pool {query.pool!r}")
        return self._placed(request, query, worker, "second_opinion", 0)

    def _done(self, placement: Placement) -> Flow[None]:
        self.metrics.child(self.metrics.inflight, placement.worker).dec()
        if placement.outcome not in STORELESS and self.outbox.release(placement.worker):
            yield from self.outbox.flush_flow()

    def done(self, placement: Placement) -> None:
        """The call finished (either way): release its in-flight count (see ``release_delay``)."""
        self.health.release((placement.worker,))
        run(self.store, self._done(placement))

    def flush(self) -> None:
        """Write pending in-flight releases and queued usage reports to the store now (one round trip)."""
        run(self.store, self.outbox.flush_flow())

    def _usage(self, placement: Placement, prompt_tokens: int, cached_tokens: int) -> UsageReport | None:
        """Count a successful call's usage in the metrics; the report for the store, if it takes one."""
        tid = self.metrics.template_label(placement.template_id)
        self.metrics.child(self.metrics.prompt_tokens, tid, placement.worker).inc(prompt_tokens)
        self.metrics.child(self.metrics.cached_tokens, tid, placement.worker).inc(cached_tokens)
        if placement.outcome in STORELESS or self.availability.degraded:
            return None
        return UsageReport(placement.tenant, placement.session_id, placement.worker, placement.epoch,
                           placement.template_id, prompt_tokens, cached_tokens, self._clock())

    def _report(self, placement: Placement, prompt_tokens: int, cached_tokens: int) -> Flow[None]:
        report = self._usage(placement, prompt_tokens, cached_tokens)
        if report is not None and not self.outbox.queue_report(report):
            yield from self.outbox.write(lambda releases: StoreOp("report_many", ([report], self._clock(), releases)))

    def report(self, placement: Placement, *, prompt_tokens: int, cached_tokens: int) -> None:
        """Usage of a successful call: feeds hit statistics, the footprint and the move signals.

        With Redis it rides on this router's next store write (the next route,
        or the background flush within ``release_delay``), so a call costs one
        round trip.
        """
        run(self.store, self._report(placement, prompt_tokens, cached_tokens))

    def _store_failed(self, exc: StoreError) -> None:
        if isinstance(exc, StoreUnavailableError):
            self.availability.failed(exc)
            self.metrics.degraded.set(1)
        else:
            logger.warning("metadata store error ignored: %s", exc)

    def judge(self, placement: Placement, error: BackendError, *, blame: bool = True) -> None:
        """The verdict on a failure settled unjudged (see :class:`PassiveHealth`)."""
        self.passive.judge(placement, error, blame=blame)

    def _settle(self, placement: Placement, error: BaseException | None, usage: Usage | None,
                judged: bool) -> Flow[None]:
        yield from self._done(placement)
        blamed = judged and isinstance(error, BackendError) and error.retryable and not error.request_fault
        self._remember(placement, error, blamed)
        if error is None:
            self.passive.succeeded(placement)
            if usage is not None:
                yield from self._report(placement, usage.prompt_tokens, usage.cached_tokens or 0)
            return
        if blamed:
            assert isinstance(error, BackendError)
            self.passive.failed(placement, error)
        elif judged:  # no verdict on the worker: a half-open one's trial slot is free again
            self.health.release((placement.worker,))
        if isinstance(error, BackendError) and self._undoable(placement):
            yield from self._abandon(placement)

    def settle(self, placement: Placement, error: BaseException | None = None, usage: Usage | None = None, *,
               judged: bool = True) -> None:
        """An attempt ended: release its in-flight count; then its usage and passive health on success;
        on a worker error, passive health (if retryable, not the request's fault, and ``judged``: a
        failure awaiting a second opinion is not) and, if this call placed the session, undo it."""
        run(self.store, self._settle(placement, error, usage, judged))

    def _remember(self, placement: Placement, error: BaseException | None, blamed: bool) -> None:
        if error is None:
            self.recent.served(placement.tenant, placement.session_id, placement.worker)
        elif blamed:  # the worker failed the session: no hint to send there again
            self.recent.forget(placement.tenant, placement.session_id)

    @staticmethod
    def _undoable(placement: Placement) -> bool:
        """A placement made by this call (not a pin it followed), recorded in the store."""
        return placement.outcome != "pinned" and placement.outcome not in STORELESS

    def _abandon(self, placement: Placement) -> Flow[None]:
        yield from self.outbox.write(lambda releases: StoreOp("abandon", (
            placement.tenant, placement.session_id, placement.worker, placement.epoch, placement.template_id,
            self._clock(), releases)))

    def abandon(self, placement: Placement) -> None:
        """The worker did not serve the call that placed the session: undo the placement in the store
        (pin, KV estimate, template mark), so a failed call leaves no state behind."""
        run(self.store, self._abandon(placement))

    def execute(self, request: RouteRequest, call: Callable[[str], T]) -> tuple[T, Placement]:
        """Run ``call(worker_url)`` on the session's worker; on a retryable BackendError move and retry
        (at most ``max_attempts`` tries, see :mod:`agent_cache.routing.lifecycle`)."""
        return CallLifecycle(self, request, max_attempts=self.max_attempts).run(lambda p: (call(p.worker), None))

    async def aexecute(self, request: RouteRequest, call: Callable[[str], Awaitable[T]]) -> tuple[T, Placement]:
        """Async :meth:`execute`: ``await call(worker_url)`` with the same failover."""
        async def attempt(p: Placement) -> tuple[T, None]:
            return await call(p.worker), None

        return await CallLifecycle(self, request, max_attempts=self.max_attempts).arun(attempt)

    # --- health probes --------------------------------------------------------------

    def probe_once(self) -> None:
        """Probe every worker's ``/health`` now, in parallel (the background thread calls this)."""
        self.prober.probe_once()

    def _refresh_gauges(self) -> None:
        if self.availability.degraded:
            return
        try:
            stats = self.store.stats(self._clock(), templates=False)  # workers only: cheap at any template count
        except StoreError:
            return
        # The store keeps a record of every worker it was ever asked about, removed ones included: only
        # the configured ones are labelled, under the lock that removes a worker (whose series it drops
        # after), so a removed worker's series cannot come back.
        with self._lock:
            configured = {w.url for w in self._workers}
            for url, w in stats["workers"].items():
                if url in configured:
                    self.metrics.live_sessions.labels(url).set(w["sessions"])

    def close(self) -> None:
        """Stop the background threads, write pending releases, close the store and clients."""
        exit_flush.unregister(self)
        self.prober.stop()
        self.outbox.close()  # owed releases and queued reports; ends this router's lease
        self.prober.close()
        self.store.close()

    async def aclose(self) -> None:
        """Async :meth:`close`: also closes the store's asyncio client (call it in the loop that used it)."""
        self.outbox.stop_flushing()
        await self.aflush()
        aclose = getattr(self.store, "aclose", None)
        if aclose is not None:
            await aclose()
        await asyncio.to_thread(self.close)  # its last writes are sync: off the event loop

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
