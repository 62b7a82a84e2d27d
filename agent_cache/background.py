"""Background writes off the call path: a thread that flushes queued work shortly after it is queued.

The router's in-flight releases and the template registry's bookkeeping are
queued by the call and written here, so a slow or frozen store never stalls
a call (nor an event loop).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

logger = logging.getLogger("agent_cache")


class Flusher:
    """A daemon thread that calls ``flush`` ``delay`` seconds after the first :meth:`kick`."""

    def __init__(self, delay: float, flush: Callable[[], None], name: str = "agent-cache-flush") -> None:
        self.delay = delay
        self.name = name
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
                    self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
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
                logger.exception("%s failed", self.name)

    def close(self) -> None:
        self._stopped.set()
        self._kicked.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
