"""How long to wait for a worker's streamed answer to start before trying another worker.

A hung worker (a stuck GPU, a frozen process) keeps its socket open and
sends nothing; a fixed stall timeout must allow for the slowest legitimate
prefill and so waits long. The deadline here follows each worker's recent
time to first token instead: ``factor`` times its 95th percentile over the
last ``window`` streamed calls, never under ``floor``, never over the
caller's own timeout. Until a worker has ``min_samples`` calls, the caller's
timeout applies unchanged.
"""

from __future__ import annotations

import threading
from collections import deque

from agent_cache.errors import ConfigError
from agent_cache.percentile import sorted_percentile

DEFAULT_FLOOR = 5.0  # seconds: a deadline is never shorter than this
DEFAULT_FACTOR = 3.0
WINDOW = 64
MIN_SAMPLES = 8


class FirstByteDeadlines:
    """Per worker: recent times to first token, and the deadline they imply."""

    def __init__(self, floor: float = DEFAULT_FLOOR, factor: float = DEFAULT_FACTOR, window: int = WINDOW,
                 min_samples: int = MIN_SAMPLES) -> None:
        if not isinstance(floor, (int, float)) or floor <= 0:
            raise ConfigError("first_byte_floor", f"must be seconds > 0, got {floor!r}")
        if not isinstance(factor, (int, float)) or factor < 1:
            raise ConfigError("first_byte_factor", f"must be >= 1, got {factor!r}")
        self.floor = float(floor)
        self.factor = float(factor)
        self._window = window
        self._min_samples = min_samples
        self._samples: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def observe(self, worker: str, seconds: float) -> None:
        """A streamed call on ``worker`` produced its first token ``seconds`` after it was sent."""
        with self._lock:
            recent = self._samples.get(worker)
            if recent is None:
                recent = self._samples[worker] = deque(maxlen=self._window)
            recent.append(seconds)

    def deadline(self, worker: str, cap: float | None) -> float | None:
        """Seconds to wait for ``worker``'s next bytes: the adaptive deadline, at most ``cap``."""
        with self._lock:
            recent = sorted(self._samples.get(worker) or ())
        if len(recent) < self._min_samples:
            return cap
        p95 = sorted_percentile(recent, 0.95)
        wait = max(self.floor, self.factor * p95)
        return wait if cap is None else min(wait, cap)

    def forget(self, worker: str) -> None:
        with self._lock:
            self._samples.pop(worker, None)
