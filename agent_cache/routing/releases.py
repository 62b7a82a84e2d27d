"""In-flight releases owed to the store, and the thread that writes them late.

Ending a call must lower its worker's in-flight count in the store. On Redis
that would be a round trip of its own per call; instead the router keeps the
count here and hands it to its next store write (the next route or usage
report carries it in the same script). A :class:`~agent_cache.background.Flusher`
writes whatever is still pending after ``delay`` seconds, so other processes
see a finished call at most that late. The same ledger holds releases owed while the store is down,
and a write that timed out (it may have reached Redis) is simply sent again:
batches carry running totals, which the store applies once.
"""

from __future__ import annotations

import os
import threading
import uuid

from agent_cache.store.base import ReleaseBatch

# bumped in a forked child: how a ledger knows it was forked without asking the kernel its pid per call
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))


class PendingReleases:
    """This router's releases: running totals per worker, how much the store acknowledged, and the calls
    still in flight (thread-safe).

    :meth:`take` returns what is not acknowledged yet as a
    :class:`~agent_cache.store.base.ReleaseBatch`; :meth:`acknowledge` it once a
    store write carrying it succeeded. A failed write needs nothing: the next
    batch carries the same totals, and the store applies a total only once.
    """

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._generation = _forks[0]
        self._lock = threading.Lock()
        self.source = uuid.uuid4().hex  # this router in this process
        self._released: dict[str, int] = {}
        self._acked: dict[str, int] = {}
        self._held: dict[str, int] = {}  # calls in flight through the store, per worker (this router's lease)

    def _own(self) -> None:
        # A forked child starts afresh, under a source of its own: the parent's
        # releases are the parent's to write, and a lock held by another thread
        # at fork time would never be released in the child.
        if self._generation != _forks[0]:
            self._reset()

    def current_source(self) -> str:
        """This router's source id in this process (a forked child gets its own)."""
        self._own()
        return self.source

    def hold(self, worker: str) -> None:
        """A route through the store counted a call in flight on ``worker``."""
        self._own()
        with self._lock:
            self._held[worker] = self._held.get(worker, 0) + 1

    def held(self) -> dict[str, int]:
        """Calls in flight through the store per worker, released ones excluded (what the lease should hold)."""
        self._own()
        with self._lock:
            return {w: n for w, n in self._held.items() if n > 0}

    def add(self, worker: str, count: int = 1) -> None:
        self._own()
        with self._lock:
            self._released[worker] = self._released.get(worker, 0) + count
            if worker in self._held:
                self._held[worker] = max(0, self._held[worker] - count)

    def take(self) -> ReleaseBatch | None:
        """What the store has not acknowledged yet (None: nothing)."""
        self._own()
        with self._lock:
            if self._released == self._acked:  # acknowledged totals never exceed released ones
                return None
            totals = {w: t for w, t in self._released.items() if t > self._acked.get(w, 0)}
            return ReleaseBatch(self.source, totals, {w: t - self._acked.get(w, 0) for w, t in totals.items()})

    def acknowledge(self, batch: ReleaseBatch | None) -> None:
        if batch is None or batch.source != self.source:
            return
        with self._lock:
            for w, t in batch.totals.items():
                if t > self._acked.get(w, 0):
                    self._acked[w] = t
