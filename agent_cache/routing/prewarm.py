"""Hot templates prefilled ahead of need (see docs/routing.md, "Prewarming").

A template is *hot* when new sessions of it start at ``threshold`` per
minute or more (the seed's ``prefetch_threshold``, counted over the last
minute). After each placement of a new session of a hot template, while
fewer workers hold it than ``max(spread, rate / threshold)``, the cheapest
worker that does not hold it is prewarmed, so the template's next sessions
can be spread without a miss. (The worker a session was just placed on is
never prewarmed for it: the session's own first call is already on its
way there, and a prefill beside it would only compute the template twice.)

A prewarm is a one-token request of the template's prompt, sent off the
call path by whoever acts on :meth:`Prewarmer.plan`; each worker gets at
most ``per_worker_per_minute`` of them. A *hit* is a new session placed on
a worker because it held the template there thanks to a prewarm
(``placed_template`` on a worker prewarmed for it within ``hit_window`` s).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable


@dataclass
class PrewarmCounts:
    prewarms: int = 0
    hits: int = 0
    refused: int = 0  # wanted, but the worker's per-minute budget was spent
    by_worker: dict[str, int] = field(default_factory=dict)


class Prewarmer:
    """Which (worker, template) pairs to prefill after a placement; bounded per worker and per minute."""

    def __init__(self, *, threshold: float = 6.0, per_worker_per_minute: int = 4, spread: int = 2,
                 hit_window: float = 120.0) -> None:
        self.threshold = threshold
        self.per_worker_per_minute = per_worker_per_minute
        self.spread = spread
        self.hit_window = hit_window
        self.counts = PrewarmCounts()
        self._starts: dict[str, deque[float]] = {}  # template -> new-session times within the last minute
        self._sent: dict[str, deque[float]] = {}  # worker -> prewarm times within the last minute
        self._warmed: dict[tuple[str, str], float] = {}  # (template, worker) -> when prewarmed
        self._lock = threading.Lock()

    def rate(self, template_id: str, now: float) -> float:
        """New sessions of the template in the last minute."""
        q = self._starts.get(template_id)
        if q is None:
            return 0.0
        while q and q[0] <= now - 60.0:
            q.popleft()
        return float(len(q))

    def plan(self, template_id: str | None, worker: str, outcome: str, holders: frozenset[str],
             candidates: Iterable[str], now: float) -> list[str]:
        """Workers to prewarm ``template_id`` on after a route; ``holders``: who holds it (before this call),
        ``candidates``: the pool's up workers with room for the template beside what they cache (a prewarm
        must not evict a session's prefix; the bench policy asks for the tree within half the pool), cheapest
        first. Only new sessions count."""
        if not template_id or not outcome.startswith("placed_"):
            return []
        with self._lock:
            self._starts.setdefault(template_id, deque()).append(now)
            if len(self._starts) > 10_000:  # bounded: the oldest template's window goes
                self._starts.pop(next(iter(self._starts)))
            if outcome == "placed_template" and self._warmed.get((template_id, worker), -1e18) > now - self.hit_window:
                self.counts.hits += 1
            if self.rate(template_id, now) < self.threshold:
                return []
            held = set(holders) | {worker}
            want = max(self.spread, int(self.rate(template_id, now) / self.threshold))
            if len(held) >= want:
                return []
            spare = next((w for w in candidates if w not in held), None)
            return [spare] if spare is not None and self._take(template_id, spare, now) else []

    def _take(self, template_id: str, worker: str, now: float) -> bool:
        q = self._sent.setdefault(worker, deque())
        while q and q[0] <= now - 60.0:
            q.popleft()
        if len(q) >= self.per_worker_per_minute:
            self.counts.refused += 1
            return False
        q.append(now)
        self._warmed[(template_id, worker)] = now
        if len(self._warmed) > 10_000:
            self._warmed.pop(next(iter(self._warmed)))
        self.counts.prewarms += 1
        self.counts.by_worker[worker] = self.counts.by_worker.get(worker, 0) + 1
        return True
