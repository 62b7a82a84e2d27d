"""The seam where routing plugs in: session -> worker URL, and feedback.

Placeholder until the router lands: one worker, or a stable hash of the
session id over the ``workers`` list (so every call of a session goes to the
same worker). The router replaces ``pick``/``report`` with its own
placement, pinning and load feedback; nothing else in this package changes.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Sequence


@dataclass
class WorkerStats:
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    errors: int = 0


@dataclass
class _WorkerSelector:
    workers: Sequence[str]
    stats: dict[str, WorkerStats] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def pick(self, session_id: str, *, attempt: int = 0) -> str:
        """Worker for this session; ``attempt`` > 0 after a retryable failure."""
        # A retry stays on the same worker: moving a session loses its cache,
        # and failover is the router's job once it lands.
        digest = hashlib.blake2b(session_id.encode(), digest_size=8).digest()
        return self.workers[int.from_bytes(digest, "big") % len(self.workers)]

    def report(self, worker: str, *, prompt_tokens: int = 0, cached_tokens: int = 0, error: bool = False) -> None:
        with self._lock:
            s = self.stats.setdefault(worker, WorkerStats())
            s.calls += 1
            s.errors += int(error)
            s.prompt_tokens += prompt_tokens
            s.cached_tokens += cached_tokens
