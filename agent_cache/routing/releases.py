"""In-flight releases owed to the store, and the thread that writes them late.

Ending a call must lower its worker's in-flight count in the store. On Redis
that would be a round trip of its own per call; instead the router keeps the
count here and hands it to its next store write (the next route or usage
report carries it in the same script). The flusher writes whatever is still
pending after ``delay`` seconds, so other processes see a finished call at
most that late. The same ledger holds releases owed while the store is down.
"""

from __future__ import annotations

import os
import threading
from typing import Callable

from agent_cache.routing.degraded import logger


class PendingReleases:
    """Worker URL -> calls that ended but are not yet released in the store (thread-safe)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def _own(self) -> None:
        # A forked child starts empty: the parent's releases are the parent's to write
        # (the child writing them too would release those calls twice), and a lock
        # held by another thread at fork time would never be released in the child.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._lock = threading.Lock()
            self._counts = {}

    def add(self, worker: str, count: int = 1) -> None:
        self._own()
        with self._lock:
            self._counts[worker] = self._counts.get(worker, 0) + count

    def take(self) -> dict[str, int]:
        """Everything pending, now owed by the caller: :meth:`restore` it if the write fails."""
        self._own()
        with self._lock:
            counts, self._counts = self._counts, {}
        return counts

    def restore(self, counts: dict[str, int]) -> None:
        for worker, count in counts.items():
            self.add(worker, count)

    def total(self) -> int:
        self._own()
        with self._lock:
            return sum(self._counts.values())

    def __bool__(self) -> bool:
        self._own()
        return bool(self._counts)


class ReleaseFlusher:
    """A daemon thread that calls ``flush`` ``delay`` seconds after the first :meth:`kick`."""

    def __init__(self, delay: float, flush: Callable[[], None]) -> None:
        self.delay = delay
        self._flush = flush
        self._kicked = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def kick(self) -> None:
        if self._thread is None or not self._thread.is_alive():  # first use, or in a forked child
            with self._lock:
                if self._stopped.is_set():
                    return
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="agent-cache-release", daemon=True)
                    self._thread.start()
        if not self._kicked.is_set():  # set() takes a lock: skip it while a flush is already due
            self._kicked.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._kicked.wait()
            if self._stopped.wait(self.delay):
                return
            self._kicked.clear()  # before flushing: a kick during the flush starts another round
            try:
                self._flush()
            except Exception:  # never let the flusher die silently
                logger.exception("release flush failed")

    def close(self) -> None:
        self._stopped.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
