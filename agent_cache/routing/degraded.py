"""When the store is unreachable: stop asking it for a while, then try again.

One caller per backoff window probes the store; everyone else routes by
rendezvous hash at once, so a dead Redis never adds a timeout per call.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

logger = logging.getLogger("agent_cache.routing")


class StoreAvailability:
    def __init__(
        self, initial_backoff: float = 0.5, max_backoff: float = 10.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.initial_backoff = initial_backoff
        self.max_backoff = max_backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._down = False
        self._backoff = initial_backoff
        self._next_try = 0.0

    @property
    def degraded(self) -> bool:
        return self._down

    def should_try(self) -> bool:
        """True if the store should be asked now (it is up, or this caller gets the retry slot)."""
        if not self._down:
            return True
        with self._lock:
            now = self._clock()
            if now >= self._next_try:
                self._next_try = now + self._backoff  # others keep routing degraded meanwhile
                return True
            return False

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if not self._down:
                self._down = True
                self._backoff = self.initial_backoff
                logger.warning("metadata store unavailable (%s); routing in degraded mode (rendezvous hashing)", exc)
            else:
                self._backoff = min(self._backoff * 2, self.max_backoff)
            self._next_try = self._clock() + self._backoff

    def succeeded(self) -> None:
        if not self._down:
            return
        with self._lock:
            if self._down:
                self._down = False
                self._backoff = self.initial_backoff
                logger.warning("metadata store reachable again; leaving degraded mode")
