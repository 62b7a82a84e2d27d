"""How long to wait for a worker's streamed answer to start (or a whole answer to come) before
trying another worker.

A hung worker (a stuck GPU, a frozen process) keeps its socket open and
sends nothing; a fixed stall timeout must allow for the slowest legitimate
prefill and so waits long. The deadline here follows each worker's recent
time to first token instead: ``factor`` times its 95th percentile over the
last ``window`` streamed calls, never under ``floor``, never over the
caller's own timeout. Calls sent whole (``whole=True``) keep their own
record, of times to the whole answer: that deadline is when the caller asks
whether the worker is alive (:func:`~agent_cache.calls.attempt.awhole`). A worker with fewer than ``min_samples`` calls (new,
or never streamed to yet) is judged by the last ``window`` calls of every
worker; only when there are not that many either does the caller's timeout
apply unchanged (a new session's first call on a hung worker new to the
router had waited for the whole timeout).

A call larger than the worker's recent ones (its body's bytes against the
95th percentile of recent calls' bytes) gets a deadline larger in
proportion, and so does one queued behind calls larger than that which
still wait for their first byte (their bytes beyond the usual): a long
prompt's prefill, its own or one queued ahead of it, is not a sign that the
worker hung (a 100,000-token prompt, about 6 s to its first token, had
missed a deadline learned from short calls, been retried elsewhere and
counted against every worker it tried). Calls of the usual size ahead add
nothing: the recent times already include their queueing, and on a hung
worker each call sent there would otherwise have stretched the next one's
deadline (new sessions' first calls took up to 12 s to leave it).
"""

from __future__ import annotations

import bisect
import threading
from collections import deque

from agent_cache.errors import ConfigError
from agent_cache.percentile import sorted_percentile

DEFAULT_FLOOR = 5.0  # seconds: a deadline is never shorter than this
DEFAULT_FACTOR = 3.0
WINDOW = 64
MIN_SAMPLES = 8


class _Recent:
    """The last ``window`` samples (seconds, bytes), and each kept sorted, so a percentile costs no sort."""

    __slots__ = ("samples", "times", "sizes")

    def __init__(self, window: int) -> None:
        self.samples: deque[tuple[float, int]] = deque(maxlen=window)
        self.times: list[float] = []
        self.sizes: list[int] = []

    def add(self, seconds: float, size: int) -> None:
        if len(self.samples) == self.samples.maxlen:
            old_t, old_n = self.samples[0]
            del self.times[bisect.bisect_left(self.times, old_t)]
            del self.sizes[bisect.bisect_left(self.sizes, old_n)]
        self.samples.append((seconds, size))
        bisect.insort(self.times, seconds)
        bisect.insort(self.sizes, size)

    def __len__(self) -> int:
        return len(self.samples)


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
        # (worker, whole) -> seconds to first byte or to the whole answer, and call bytes
        self._samples: dict[tuple[str, bool], _Recent] = {}
        self._fleet = {whole: _Recent(window) for whole in (False, True)}  # every worker's, for one without a record
        # worker -> bytes of each call sent and not yet answered, streamed or whole (they queue alike)
        self._waiting: dict[str, list[int]] = {}
        self._lock = threading.Lock()

    def observe(self, worker: str, seconds: float, size: int = 0, *, whole: bool = False) -> None:
        """A streamed call of ``size`` bytes on ``worker`` produced its first token ``seconds`` after it was sent
        (``whole``: a call sent whole got its answer)."""
        with self._lock:
            recent = self._samples.get((worker, whole))
            if recent is None:
                recent = self._samples[worker, whole] = _Recent(self._window)
            recent.add(seconds, size)
            self._fleet[whole].add(seconds, size)

    def _record(self, worker: str, whole: bool) -> _Recent | None:
        """The samples that judge ``worker``: its own, else every worker's, else None (too few)."""
        for recent in (self._samples.get((worker, whole)), self._fleet[whole]):
            if recent is not None and len(recent) >= self._min_samples:
                return recent
        return None

    def deadline(self, worker: str, cap: float | None, size: int = 0, *, whole: bool = False) -> float | None:
        """Seconds to wait for ``worker``'s first bytes of a call of ``size`` bytes (as :meth:`waiting`
        counts them; ``whole``: for its whole answer): the adaptive deadline, scaled up for a call larger
        than the recent ones, at most ``cap``."""
        with self._lock:
            recent = self._record(worker, whole)
            if recent is None:
                return cap
            p95 = sorted_percentile(recent.times, 0.95)
            usual = sorted_percentile(recent.sizes, 0.95)
        wait = max(self.floor, self.factor * p95) * max(1.0, size / max(usual, 1))
        return wait if cap is None else min(wait, cap)

    def waiting(self, worker: str, size: int) -> int:
        """A call of ``size`` bytes is sent to ``worker`` (:meth:`answered` once it is no longer waiting):
        the bytes its deadline counts, its own and those beyond the usual size of each call there still
        waiting for its first byte."""
        with self._lock:
            ahead = self._waiting.setdefault(worker, [])
            recent = self._record(worker, False) or self._record(worker, True)
            usual = sorted_percentile(recent.sizes, 0.95) if recent else 0
            counted = size + sum(max(0, n - usual) for n in ahead)
            ahead.append(size)
        return int(counted)

    def answered(self, worker: str, size: int) -> None:
        """A call counted by :meth:`waiting` got its first byte, or ended without."""
        with self._lock:
            ahead = self._waiting.get(worker)
            if ahead is not None and size in ahead:
                ahead.remove(size)
                if not ahead:
                    del self._waiting[worker]

    def forget(self, worker: str) -> None:
        with self._lock:
            for whole in (False, True):
                self._samples.pop((worker, whole), None)
