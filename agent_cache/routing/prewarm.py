"""Hot templates prefilled ahead of need (see docs/routing.md, "Prewarming").

A template is *hot* when new sessions of it start at ``threshold`` per
minute or more (the seed's ``prefetch_threshold``, counted over the last
minute). After each placement of a new session of a hot template, while
fewer workers hold it than ``max(spread, rate / threshold)``, the cheapest
worker that does not hold it is prewarmed, so the template's next sessions
can be spread without a miss. (The worker a session was just placed on is
never prewarmed for it: the session's own first call is already on its
way there, and a prefill beside it would only compute the template twice.)

When a worker drains (:meth:`Prewarming.drained`, a hook of the router's
``drain_hooks``: ``Router.drain`` and the gateway's fleet run it), each hot
template it held is prewarmed the same way on another worker, while fewer
of the remaining workers hold it than that number: the sessions placed
while it drains, and the pins that move off it, then find it cached.

A prewarm is a one-token request of the template's prompt, sent off the
call path by whoever acts on :meth:`Prewarmer.plan`; each worker gets at
most ``per_worker_per_minute`` of them, and a worker prewarmed for a
template counts as holding it for ``pending`` s (its events may lag the
prefill). A *hit* is the first new session placed on a worker because it
held the template there thanks to a prewarm (``placed_template`` on a
worker prewarmed for it within ``hit_window`` s): one per prewarm at most.
Each router process plans alone: with N gateway replicas a template needs
N times the rate to be hot in each, and each spends its own budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from agent_cache.background import Jobs
from agent_cache.errors import ConfigError
from agent_cache.placement.rule import UP
from agent_cache.routing.kv_tokens import system_text

if TYPE_CHECKING:
    from agent_cache.routing.router import Router
    from agent_cache.routing.types import Placement

log = logging.getLogger(__name__)
DEFAULT_THRESHOLD = 6.0  # new sessions a minute that make a template hot (the seed's prefetch_threshold)
PER_WORKER_PER_MINUTE = 4  # prewarms a worker takes a minute at most
PREWARM_TIMEOUT = 60.0  # a long template's prefill on a busy worker


@dataclass
class PrewarmCounts:
    prewarms: int = 0
    hits: int = 0
    refused: int = 0  # wanted, but the worker's per-minute budget was spent
    for_drains: int = 0  # of the prewarms, those sent because a holder of the template was drained
    by_worker: dict[str, int] = field(default_factory=dict)


class Prewarmer:
    """Which (worker, template) pairs to prefill after a placement; bounded per worker and per minute."""

    def __init__(self, *, threshold: float = DEFAULT_THRESHOLD, per_worker_per_minute: int = PER_WORKER_PER_MINUTE,
                 spread: int = 2, hit_window: float = 120.0, pending: float = 60.0) -> None:
        self.threshold = threshold
        self.per_worker_per_minute = per_worker_per_minute
        self.spread = spread
        self.hit_window = hit_window
        self.pending = pending  # a prewarm's worker counts as holding the template this long (events lag)
        self.counts = PrewarmCounts()
        self._starts: dict[str, deque[float]] = {}  # template -> new-session times within the last minute
        self._sent: dict[str, deque[float]] = {}  # worker -> prewarm times within the last minute
        self._warmed: dict[tuple[str, str], float] = {}  # (template, worker) -> when prewarmed
        self._unclaimed: set[tuple[str, str]] = set()  # prewarms no session has hit yet
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
            key = (template_id, worker)
            if outcome == "placed_template" and key in self._unclaimed \
                    and self._warmed.get(key, -1e18) > now - self.hit_window:
                self._unclaimed.discard(key)  # one hit per prewarm: later sessions there hit on their own
                self.counts.hits += 1
            if self.rate(template_id, now) < self.threshold:
                return []
            return self._fill(template_id, set(holders) | {worker}, candidates, now)

    def replace(self, template_id: str, holders: frozenset[str], candidates: Iterable[str], now: float) -> list[str]:
        """Workers to prewarm a hot ``template_id`` on when one of its holders drains: ``holders``, those that
        stay (the drained one left out); ``candidates`` as for :meth:`plan`. No session start is counted."""
        with self._lock:
            if self.rate(template_id, now) < self.threshold:
                return []
            out = self._fill(template_id, set(holders), candidates, now)
            self.counts.for_drains += len(out)
            return out

    def _fill(self, template_id: str, held: set[str], candidates: Iterable[str], now: float) -> list[str]:
        candidates = list(candidates)
        # a worker prewarmed within `pending` s holds it, as far as this plan goes: its events may not
        # show the prefill yet, and asking again would prefill it twice
        held |= {w for w in candidates if self._warmed.get((template_id, w), -1e18) > now - self.pending}
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
        self._unclaimed.add((template_id, worker))
        if len(self._warmed) > 10_000:  # bounded: the oldest prewarm goes
            oldest = next(iter(self._warmed))
            del self._warmed[oldest]
            self._unclaimed.discard(oldest)
        self.counts.prewarms += 1
        self.counts.by_worker[worker] = self.counts.by_worker.get(worker, 0) + 1
        return True


class Prewarming:
    """Acts on a :class:`Prewarmer` in a deployment: after each served call of a new session, the plan's
    prewarms are sent as one-token chats of the template's first message (and tools) under the tenant's
    ``extra_key``, on a background thread; never on the call's path.

    A worker is a candidate when the router offers it to the pool's routes (up, not draining) and its
    KV events say its tree stays within half its KV pool with the template added (the pool also holds
    the running requests' KV; a prewarm must not evict a session's prefix).
    """

    MAX_QUEUED = 64
    MAX_RECENT = 1_000  # templates remembered for drains (the least recently started goes first)

    def __init__(self, router: "Router", *, prewarmer: Prewarmer | None = None,
                 send: Callable[[str, dict[str, Any]], None] | None = None, api_key: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if router.kv_events is None:
            raise ConfigError("kv_events", "prewarming needs the workers' KV events: Router(kv_events=KvState())")
        self.router, self.kv = router, router.kv_events
        self.prewarmer = prewarmer or Prewarmer()
        self._clock = clock
        self._send = send or (lambda url, body: _send_chat(url, body, api_key))
        self._jobs = Jobs(self._prefill, "kv-prewarm", max_queued=self.MAX_QUEUED,
                          join_timeout=2)  # best effort: a prefill under way is not waited for (a daemon thread)
        self.failed = 0
        self.dropped = 0  # planned while MAX_QUEUED were waiting
        # (template, tenant) -> its prewarm body, tokens and pool, from its latest new session: drains replay them
        self._recent: dict[tuple[str, str], tuple[dict[str, Any], int, str]] = {}
        self._recent_lock = threading.Lock()
        router.drain_hooks.add(self.drained)  # a holder drained (the fleet, or Router.drain): prewarmed elsewhere

    def targets(self, template_id: str, template_tokens: int, placement: "Placement") -> list[str]:
        """The workers to prefill ``template_id`` on after ``placement`` (also counts the session's start)."""
        held, room = self._holders_and_room(template_id, template_tokens, placement.pool)
        return self.prewarmer.plan(template_id, placement.worker, placement.outcome, held, room, self._clock())

    def _holders_and_room(self, template_id: str, template_tokens: int, pool: str) -> tuple[frozenset[str], list[str]]:
        """Who holds the template in ``pool``, and the up workers with room for it, emptiest first (a draining
        worker holds it for this plan until its own drain asks for its replacement)."""
        specs = self.router.specs(pool)
        found = self.kv.holders(template_id, [s.url for s in specs])
        room: list[str] = []  # the template's tokens not learnt yet: who holds it is unknown, nothing is sent
        if found is not None:
            used = {s.url: self.kv.cached_tokens(s.url) for s in specs if s.state == UP}
            room = sorted((s.url for s in specs if used.get(s.url) is not None
                           and (used[s.url] or 0) + template_tokens <= s.capacity // 2), key=lambda u: used[u] or 0)
        return (found[0] if found is not None else frozenset()), room

    def drained(self, url: str) -> None:
        """A worker drains: the hot templates it held are prefilled on another worker with room while fewer
        than ``spread`` (or rate / threshold) of the others hold them, before their sessions spread there."""
        url = url.rstrip("/")
        with self._recent_lock:
            recent = list(self._recent.items())
        for (template_id, _tenant), (body, tokens, pool) in recent:
            held, room = self._holders_and_room(template_id, tokens, pool)
            if url not in held:
                continue
            serving = {s.url for s in self.router.specs(pool) if s.state == UP}  # draining or down ones do not
            for target in self.prewarmer.replace(template_id, held & serving, room, self._clock()):
                if not self._jobs.submit(target, body):
                    self.dropped += 1

    def after(self, template_id: str | None, messages: Sequence[Mapping[str, Any]],
              tools: Sequence[Mapping[str, Any]] | None, template_tokens: int, placement: "Placement",
              model: str | None = None) -> None:
        """After a served call: plan (and queue) the prewarms its placement calls for."""
        if not template_id or not placement.outcome.startswith("placed_") or system_text(messages) is None:
            return  # only a new session's call, and a template that starts with its stable message
        body: dict[str, Any] = {"messages": [dict(messages[0])], "max_tokens": 1}
        if tools:
            body["tools"] = [dict(t) for t in tools]
        if model is not None:
            body["model"] = model
        extra_key = self.router.extra_key_for(placement.tenant)
        if extra_key is not None:  # the tenant's own cache namespace, as its calls use
            body["extra_key"] = extra_key
        with self._recent_lock:  # what a drain of one of its holders prewarms elsewhere
            key = (template_id, placement.tenant)
            self._recent.pop(key, None)
            if len(self._recent) >= self.MAX_RECENT:
                self._recent.pop(next(iter(self._recent)))
            self._recent[key] = (body, template_tokens, placement.pool)
        for url in self.targets(template_id, template_tokens, placement):
            if not self._jobs.submit(url, body):
                self.dropped += 1

    def _prefill(self, url: str, body: dict[str, Any]) -> None:
        try:
            self._send(url, body)
        except Exception as exc:  # the next session of the template pays the prefill, as without prewarming
            self.failed += 1
            log.warning("prewarm of %s failed: %s", url, exc)

    def close(self) -> None:
        self.router.drain_hooks.remove(self.drained)
        self._jobs.close()


def _send_chat(url: str, body: dict[str, Any], api_key: str | None) -> None:
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=PREWARM_TIMEOUT).raise_for_status()
