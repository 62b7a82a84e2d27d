"""The fleet: which workers a router routes to, changed while it serves and shared by every replica.

Workers come from three places: the command line (``--workers``, ``--pool``),
the admin endpoints (``POST`` / ``DELETE /workers``) and DNS discovery
(``--workers-dns``). The last two write to the fleet board
(:mod:`agent_cache.store.fleet_board`), which lives in the deployment's Redis
when it has one; every replica reads the board each ``refresh`` seconds and
applies it to its router, so all replicas agree within one refresh.

A worker leaves in two steps. *Draining*: no new session is placed on it and
each session pinned to it moves at its next call (the router's ``draining``
state); calls already running on it finish there. *Gone*: once no call is in
flight on it in the store (all replicas' counts), or ``drain_timeout``
seconds after the drain began, whichever comes first, any replica marks it
gone and every replica drops it. The in-flight check waits at least two
refreshes, so a replica that had not yet seen the drain cannot still be
starting calls there.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from agent_cache.errors import ConfigError, StoreError
from agent_cache.routing.config import parse_worker
from agent_cache.routing.discovery import DnsTarget, HostsFileResolver, Resolver, discover, system_resolver
from agent_cache.routing.router import Router
from agent_cache.store.fleet_board import DRAINING, GONE, UP, FleetBoard, FleetEntry
from agent_cache.values import DEFAULT_POOL

logger = logging.getLogger("agent_cache.fleet")

DEFAULT_REFRESH = 2.0  # seconds between reads of the shared board
DEFAULT_DNS_INTERVAL = 10.0  # seconds between DNS resolutions
# the longest a removed worker drains (--worker-drain-timeout); not the gateway's own --drain-timeout on SIGTERM
DEFAULT_WORKER_DRAIN_TIMEOUT = 120.0
GONE_RETENTION = 60.0  # s a removed worker's entry stays on the board (at least 10 refreshes)
STATIC = "static"  # the source of a worker given on the command line
ADMIN, DNS = "admin", "dns"


@dataclass(frozen=True)
class FleetConfig:
    """How the fleet changes at run time (``agent-cache serve --help`` documents each)."""

    dns: tuple[DnsTarget, ...] = ()
    dns_interval: float = DEFAULT_DNS_INTERVAL
    dns_hosts: str | None = None  # a hosts-format file resolving the DNS names instead of the system
    drain_timeout: float = DEFAULT_WORKER_DRAIN_TIMEOUT
    refresh: float = DEFAULT_REFRESH
    admin_on_loopback: bool = False  # without API keys, the admin endpoints answer loopback clients

    def __post_init__(self) -> None:
        for name in ("dns_interval", "drain_timeout", "refresh"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ConfigError(name, f"expected seconds > 0, got {value!r}")


@dataclass(frozen=True)
class FleetWorker:
    """One worker as this replica routes to it now."""

    url: str
    pool: str
    state: str  # up | draining
    source: str  # static | admin | dns
    healthy: bool


class Fleet:
    """Applies the board (and DNS discovery) to one router, in a background thread."""

    def __init__(self, router: Router, board: FleetBoard, config: FleetConfig | None = None, *,
                 resolver: Resolver | None = None, clock: Callable[[], float] = time.time) -> None:
        self.router = router
        self.board = board
        self.config = config or FleetConfig()
        if resolver is None:
            resolver = HostsFileResolver(self.config.dns_hosts) if self.config.dns_hosts else system_resolver
        self.resolver = resolver
        self._clock = clock
        self._static = {w.url: w.pool for w in router.workers}
        self._draining: set[str] = set()
        self._refused: set[str] = set()  # board entries the router refused (logged once each)
        self._sources: dict[str, str] = {url: STATIC for url in self._static}
        self._lock = threading.Lock()  # one apply at a time (the thread's and an admin call's)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: str | None = None

    # --- admin ------------------------------------------------------------------------

    def add(self, url: str, pool: str | None = None) -> FleetEntry:
        """Add a worker (or bring a draining one back) on every replica; applied here at once.

        ConfigError when the URL is malformed or the worker is already in another pool.
        """
        spec = parse_worker({"url": url, "pool": pool if pool is not None else DEFAULT_POOL}, "url")
        for _ in range(5):  # another replica may write in between: read again
            entries = self.board.entries()
            current = entries.get(spec.url)
            now_pool = self._pool_of(spec.url, current)
            if now_pool is not None and now_pool != spec.pool:
                raise ConfigError("pool", f"{spec.url} is in pool {now_pool!r}; delete it first to move it")
            if current is not None and current.state == UP:
                self.refresh()
                return current
            entry = FleetEntry(spec.url, spec.pool, UP, self._clock(), ADMIN)
            if self.board.replace(entry, current):
                self.refresh()
                return entry
        raise StoreError("the fleet board kept changing; try again")

    def remove(self, url: str) -> FleetEntry | None:
        """Drain a worker on every replica, then drop it (see the module docstring); None if not in the fleet."""
        url = parse_worker(url, "url").url
        for _ in range(5):
            entries = self.board.entries()
            current = entries.get(url)
            pool = self._pool_of(url, current)
            if pool is None:
                return None
            if current is not None and current.state == DRAINING:
                return current
            entry = FleetEntry(url, pool, DRAINING, self._clock(), ADMIN)
            if self.board.replace(entry, current):
                self.refresh()
                return entry
        raise StoreError("the fleet board kept changing; try again")

    def _pool_of(self, url: str, entry: FleetEntry | None) -> str | None:
        """The worker's pool if it is in the fleet (up or draining), else None."""
        if entry is not None:
            return None if entry.state == GONE else entry.pool
        return self._static.get(url)

    def workers(self) -> list[FleetWorker]:
        """The workers this replica routes to (draining ones included)."""
        down = self.router.health.down(w.url for w in self.router.workers)
        return [FleetWorker(w.url, w.pool, DRAINING if w.url in self._draining else UP,
                            self._sources.get(w.url, ADMIN), w.url not in down) for w in self.router.workers]

    # --- applying the board -----------------------------------------------------------

    def refresh(self) -> None:
        """Read the board, finish the drains that are due, and apply it to the router."""
        with self._lock:
            try:
                entries = self.board.entries()
                entries = self._finish_drains(entries)
                entries = self._prune(entries)
            except StoreError as exc:
                self._warn(f"fleet board unavailable, keeping the current workers: {exc}")
                return
            self._apply(entries)

    def _finish_drains(self, entries: dict[str, FleetEntry]) -> dict[str, FleetEntry]:
        now = self._clock()
        due = [e for e in entries.values() if e.state == DRAINING]
        if not due:
            return entries
        inflight: dict[str, int] | None = None
        asked = False
        settle = 2 * self.config.refresh
        for e in due:
            age = now - e.since
            if age < settle:
                continue
            if age < self.config.drain_timeout:
                if not asked:
                    inflight, asked = self._inflight(now), True
                if inflight is None or inflight.get(e.url, 0) > 0:  # unknown counts wait for the timeout
                    continue
            gone = FleetEntry(e.url, e.pool, GONE, now, e.source)
            if self.board.replace(gone, e):
                logger.info("worker %s drained (%.1f s): removed", e.url, age)
                entries = {**entries, e.url: gone}
        return entries

    def _prune(self, entries: dict[str, FleetEntry]) -> dict[str, FleetEntry]:
        """Delete the entries of removed workers once every replica has applied them (``gone`` for
        ``gone_retention`` s), so workers that come and go leave nothing on the board. A worker of the
        command line keeps its ``gone`` entry: without it, it would come back (replicas of one deployment
        share their command line)."""
        now = self._clock()
        retention = max(GONE_RETENTION, 10 * self.config.refresh)
        for e in [e for e in entries.values() if e.state == GONE and e.url not in self._static
                  and now - e.since > retention]:
            if self.board.delete(e):
                entries = {url: v for url, v in entries.items() if url != e.url}
        return entries

    def loads(self) -> dict[str, int] | None:
        """Calls in flight per worker, every replica's (from the store); None when the store cannot say."""
        return self._inflight(self._clock())

    def _inflight(self, now: float) -> dict[str, int] | None:
        """Calls in flight per worker in the store (every replica's); None when the store cannot say."""
        try:
            stats = self.router.store.stats(now, templates=False)
        except StoreError:
            return None
        return {url: int(w.get("inflight", 0)) for url, w in stats["workers"].items()}

    def _apply(self, entries: dict[str, FleetEntry]) -> None:
        """Apply the board to the router."""
        desired: dict[str, tuple[str, str, str]] = {url: (pool, UP, STATIC) for url, pool in self._static.items()}
        for e in entries.values():
            if e.state == GONE:
                desired.pop(e.url, None)
            else:
                desired[e.url] = (e.pool, e.state, e.source)
        current = {w.url: w.pool for w in self.router.workers}
        for url, pool in current.items():
            if url not in desired or desired[url][0] != pool:
                self.router.undrain(url)
                self.router.remove_worker(url)
                self._draining.discard(url)
                logger.info("worker %s left the fleet", url)
        current = {w.url: w.pool for w in self.router.workers}
        for url, (pool, state, source) in desired.items():
            if url not in current:
                try:
                    self.router.add_worker(url, pool)
                except ConfigError as exc:  # an entry this replica cannot apply (written by hand, another version)
                    if url not in self._refused:  # logged once; skipped on every pass, never fatal
                        self._refused.add(url)
                        logger.warning("fleet board entry skipped: %s", exc)
                    continue
                logger.info("worker %s joined pool %s (%s)", url, pool, source)
            if state == DRAINING and url not in self._draining:
                self.router.drain(url)
                self._draining.add(url)
                logger.info("worker %s draining", url)
            elif state == UP and url in self._draining:
                self.router.undrain(url)
                self._draining.discard(url)
        self._sources = {url: source for url, (_, _, source) in desired.items()}

    # --- DNS discovery ------------------------------------------------------------------

    def discover(self) -> None:
        """Resolve the DNS targets once: new addresses join, addresses no longer listed drain.

        A name that does not resolve changes nothing (its workers stay until it resolves again).
        Discovery leaves alone the workers an admin added or deleted.
        """
        if not self.config.dns:
            return
        found, failed = discover(self.config.dns, self.resolver)
        if failed:
            self._warn("DNS discovery: " + "; ".join(failed))
        try:
            entries = self.board.entries()
            now = self._clock()
            for url, pool in found.items():
                e = entries.get(url)
                if e is None and url in self._static:
                    continue
                if e is None or (e.source == DNS and e.state != UP):
                    self.board.replace(FleetEntry(url, pool, UP, now, DNS), e)
            if not failed:
                for e in entries.values():
                    if e.source == DNS and e.state == UP and e.url not in found:
                        self.board.replace(FleetEntry(e.url, e.pool, DRAINING, now, DNS), e)
        except StoreError as exc:
            self._warn(f"fleet board unavailable, DNS discovery not recorded: {exc}")

    # --- background thread --------------------------------------------------------------

    def start(self) -> None:
        """Apply the board (and resolve DNS) once now, then every ``refresh`` (and ``dns_interval``) seconds."""
        self.discover()
        self.refresh()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="agent-cache-fleet", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        last_dns = time.monotonic()
        while not self._stop.wait(self.config.refresh):
            try:
                if self.config.dns and time.monotonic() - last_dns >= self.config.dns_interval:
                    last_dns = time.monotonic()
                    self.discover()
                self.refresh()
            except Exception:  # the thread must outlive any one bad round
                logger.exception("fleet refresh failed")

    def _warn(self, message: str) -> None:
        if message != self._warned:  # once per distinct problem, not once per refresh
            logger.warning(message)
            self._warned = message

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.board.close()


__all__ = ["ADMIN", "DNS", "STATIC", "Fleet", "FleetConfig", "FleetWorker"]
