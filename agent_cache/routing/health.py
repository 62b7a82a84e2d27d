"""Worker health: a circuit breaker per worker, fed by probes and real calls.

closed -> (failures reach the threshold, or one hard failure) -> open
open   -> (cooldown elapsed) -> half-open: one trial call may go to the worker
half-open -> success -> closed;  failure -> open with a doubled cooldown

Outlier ejection is capped as Envoy's ``max_ejection_percent``: soft failures
of real calls (passive health) open at most ``max_ejection_percent`` of a
pool's breakers at a time, and at least one (Envoy too ejects one host where
the share rounds to none). A probe's failure and a refused connection are
proof the worker cannot serve, and are not capped.

A half-open worker takes one trial call at a time: it is offered to one route
(:meth:`HealthTracker.unavailable`), which keeps it if it chose the worker or
gives it back (:meth:`HealthTracker.release`); every other route sees the
worker down until the trial's verdict (or ``TRIAL_TIMEOUT``).

A worker added while the router probes (:meth:`HealthTracker.await_probe`)
starts open and stays open, with no trial call, until a probe or a call it
served succeeds: a pod still loading its model refuses every connection, and
a new worker looks idle, so placement would otherwise send it new sessions first.
So does an open worker whose probe failed (as Envoy's active health checks):
a hung worker (SIGSTOP) had taken a new session as its trial call each time
its cooldown ran out, which waited out its first-byte deadline.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Collection, Iterable

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"
DEFAULT_MAX_EJECTION_PERCENT = 10.0  # Envoy's outlier detection default
TRIAL_TIMEOUT = 60.0  # seconds a trial call holds a half-open worker's single slot at most


class CircuitBreaker:
    def __init__(self, failure_threshold: int = 3, cooldown: float = 2.0, max_cooldown: float = 30.0) -> None:
        self.failure_threshold = failure_threshold
        self.base_cooldown = cooldown
        self.max_cooldown = max_cooldown
        self.cooldown = cooldown
        self.failures = 0
        self.opened_at = 0.0
        self.passive = False  # opened by soft failures of real calls: counts against the ejection cap
        self.trial_until = 0.0  # a half-open worker's trial call is in flight until then
        self.unproven = False  # added and never answered
        self.awaits_probe = False  # open until a success, never half-open: a probe failed, or it never answered
        self._open = False

    def state(self, now: float) -> str:
        if not self._open:
            return CLOSED
        return HALF_OPEN if now >= self.opened_at + self.cooldown and not self.awaits_probe else OPEN

    def record_success(self) -> None:
        self.failures = 0
        self.unproven = self.awaits_probe = False
        self._open = False
        self.passive = False
        self.trial_until = 0.0
        self.cooldown = self.base_cooldown

    def would_open(self, *, hard: bool) -> bool:
        return not self._open and (hard or self.failures + 1 >= self.failure_threshold)

    def record_failure(self, now: float, *, hard: bool = False, passive: bool = False) -> None:
        self.trial_until = 0.0
        if self._open:
            if not passive:
                self.passive = False  # a probe confirms it: no longer a passive ejection
            if now >= self.opened_at + self.cooldown:  # a half-open trial failed
                self.cooldown = min(self.cooldown * 2, self.max_cooldown)
                self.opened_at = now
            return
        self.failures += 1
        if hard or self.failures >= self.failure_threshold:
            self._open = True
            self.opened_at = now
            self.passive = passive and not hard


class HealthTracker:
    """Thread-safe breakers for a set of workers."""

    def __init__(
        self,
        failure_threshold: int = 3,
        cooldown: float = 2.0,
        max_cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        max_ejection_percent: float = DEFAULT_MAX_EJECTION_PERCENT,
    ) -> None:
        self._args = (failure_threshold, cooldown, max_cooldown)
        self._clock = clock
        self.max_ejection_percent = max_ejection_percent
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}

    def _breaker(self, url: str) -> CircuitBreaker:
        b = self._breakers.get(url)
        if b is None:
            b = self._breakers[url] = CircuitBreaker(*self._args)
        return b

    def _blocked(self, b: CircuitBreaker, now: float) -> bool:
        state = b.state(now)
        return state == OPEN or (state == HALF_OPEN and now < b.trial_until)

    def down(self, urls: Iterable[str]) -> set[str]:
        """The URLs that may not take a call now: open breakers, and half-open ones whose trial is in flight."""
        return self.unavailable(urls, claim=False)[0]

    def unavailable(self, urls: Iterable[str], *, claim: bool = True) -> tuple[set[str], set[str]]:
        """:meth:`down`, and (with ``claim``, for a route) the half-open URLs whose trial slot this caller now
        holds (to :meth:`release` unless it sends its call there). One lock and one clock read for the pool."""
        with self._lock:
            now = self._clock()
            down: set[str] = set()
            trials: set[str] = set()
            for u in urls:
                b = self._breakers.get(u)
                if b is None:
                    continue
                if self._blocked(b, now):
                    down.add(u)
                elif claim and b.state(now) == HALF_OPEN:
                    b.trial_until = now + TRIAL_TIMEOUT
                    trials.add(u)
            return down, trials

    def await_probe(self, url: str) -> None:
        """A worker just added: down until it first answers (see the module docstring)."""
        with self._lock:
            b = self._breakers[url] = CircuitBreaker(*self._args)
            b._open, b.unproven, b.awaits_probe, b.opened_at = True, True, True, self._clock()

    def unproven(self, url: str) -> bool:
        """Whether ``url`` was added and has not answered yet."""
        with self._lock:
            b = self._breakers.get(url)
            return b is not None and b.unproven

    def release(self, urls: Iterable[str]) -> None:
        """Give back trial slots without a verdict (the route chose another worker, or the trial call
        ended for a reason that says nothing about the worker)."""
        with self._lock:
            for u in urls:
                b = self._breakers.get(u)
                if b is not None:
                    b.trial_until = 0.0

    def state(self, url: str) -> str:
        with self._lock:
            return self._breaker(url).state(self._clock())

    def success(self, url: str, *, probe: bool = False) -> bool:
        """Returns True when this closed a breaker that was open.

        A probe's success does not end a passive ejection (as in Envoy, where active health checks and
        outlier detection are separate): the worker answers ``/health`` but failed real calls, and its
        half-open trial call decides.
        """
        with self._lock:
            b = self._breaker(url)
            if probe and b.passive and b.state(self._clock()) != CLOSED:
                return False
            was_open = b.state(self._clock()) != CLOSED
            b.record_success()
            return was_open

    def failure(self, url: str, *, hard: bool = False, pool: Collection[str] | None = None,
                probe: bool = False) -> bool:
        """Returns True when this opened the breaker.

        ``pool``: the worker's pool, for a real call's failure (passive health): a soft one does not open
        the breaker while the pool's share of passive ejections is used up. ``probe``: a probe's failure;
        an open breaker then waits for a probe (or a served call) to close it.
        """
        with self._lock:
            now = self._clock()
            b = self._breaker(url)
            before = b.state(now)
            if pool is not None and not hard and b.would_open(hard=hard) and self._cap_reached(url, pool, now):
                return False  # the failure is not forgotten: the next one asks again
            b.record_failure(now, hard=hard, passive=pool is not None)
            b.awaits_probe = b.awaits_probe or (probe and b.state(now) != CLOSED)
            return before == CLOSED and b.state(now) != CLOSED

    def _cap_reached(self, url: str, pool: Collection[str], now: float) -> bool:
        allowed = max(1, math.floor(len(pool) * self.max_ejection_percent / 100))
        ejected = sum(1 for u in pool if u != url and u in self._breakers
                      and self._breakers[u].passive and self._breakers[u].state(now) == OPEN)
        return ejected >= allowed

    def forget(self, url: str) -> None:
        with self._lock:
            self._breakers.pop(url, None)
