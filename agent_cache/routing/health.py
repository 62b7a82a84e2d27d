"""Worker health: a circuit breaker per worker, fed by probes and real calls.

closed -> (failures reach the threshold, or one hard failure) -> open
open   -> (cooldown elapsed) -> half-open: the worker may be tried again
half-open -> success -> closed;  failure -> open with a doubled cooldown
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterable

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, failure_threshold: int = 3, cooldown: float = 2.0, max_cooldown: float = 30.0) -> None:
        self.failure_threshold = failure_threshold
        self.base_cooldown = cooldown
        self.max_cooldown = max_cooldown
        self.cooldown = cooldown
        self.failures = 0
        self.opened_at = 0.0
        self._open = False

    def state(self, now: float) -> str:
        if not self._open:
            return CLOSED
        return HALF_OPEN if now >= self.opened_at + self.cooldown else OPEN

    def record_success(self) -> None:
        self.failures = 0
        self._open = False
        self.cooldown = self.base_cooldown

    def record_failure(self, now: float, *, hard: bool = False) -> None:
        if self._open:
            if now >= self.opened_at + self.cooldown:  # a half-open trial failed
                self.cooldown = min(self.cooldown * 2, self.max_cooldown)
                self.opened_at = now
            return
        self.failures += 1
        if hard or self.failures >= self.failure_threshold:
            self._open = True
            self.opened_at = now


class HealthTracker:
    """Thread-safe breakers for a set of workers."""

    def __init__(
        self,
        failure_threshold: int = 3,
        cooldown: float = 2.0,
        max_cooldown: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._args = (failure_threshold, cooldown, max_cooldown)
        self._clock = clock
        self._lock = threading.Lock()
        self._breakers: dict[str, CircuitBreaker] = {}

    def _breaker(self, url: str) -> CircuitBreaker:
        b = self._breakers.get(url)
        if b is None:
            b = self._breakers[url] = CircuitBreaker(*self._args)
        return b

    def down(self, urls: Iterable[str]) -> set[str]:
        """The URLs whose breaker is open; the others may take calls (half-open ones are trials).

        One lock and one clock read for the whole pool.
        """
        with self._lock:
            now = self._clock()
            return {u for u in urls if u in self._breakers and self._breakers[u].state(now) == OPEN}

    def state(self, url: str) -> str:
        with self._lock:
            return self._breaker(url).state(self._clock())

    def success(self, url: str) -> bool:
        """Returns True when this closed a breaker that was open."""
        with self._lock:
            b = self._breaker(url)
            was_open = b.state(self._clock()) != CLOSED
            b.record_success()
            return was_open

    def failure(self, url: str, *, hard: bool = False) -> bool:
        """Returns True when this opened the breaker."""
        with self._lock:
            b = self._breaker(url)
            before = b.state(self._clock())
            b.record_failure(self._clock(), hard=hard)
            return before == CLOSED and b.state(self._clock()) != CLOSED

    def forget(self, url: str) -> None:
        with self._lock:
            self._breakers.pop(url, None)
