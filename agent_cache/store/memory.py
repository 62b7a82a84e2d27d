"""In-process metadata store: the embedded default for a single process.

One ``threading.Lock`` makes each operation atomic across threads; operations
are short dict updates, so the async face takes the same lock inline rather
than hopping to a thread (holding it for microseconds does not stall a loop).
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from typing import Any, Mapping, Sequence

from agent_cache.placement.rule import PinView, Policy, Snapshot, WorkerView, choose_worker, quiet_after
from agent_cache.store.base import (
    DEFAULT_SESSION_TTL,
    DEFAULT_TEMPLATE_WINDOW,
    STATS_TEMPLATES,
    Lease,
    ReleaseBatch,
    Releases,
    RouteQuery,
    RouteResult,
    UsageReport,
    template_retention,
    to_ms,
)

# Distinct sessions per template are counted exactly up to this many recent
# ones (a session seen again after it left this window counts twice); the
# Redis store's HyperLogLog is approximate in the same spirit, and bounded.
_RECENT_SESSIONS = 1024


class _Worker:
    __slots__ = ("inflight", "kv_tokens", "active", "sessions", "state", "capacity", "prompt", "cached")

    def __init__(self) -> None:
        self.inflight = 0
        self.kv_tokens = 0  # footprint: tokens held by the live sessions attached here
        self.active = 0  # live sessions attached here (used within the policy's live window)
        self.sessions = 0  # sessions attached here (until they expire or move)
        self.state = "up"
        self.capacity = 0
        self.prompt = 0
        self.cached = 0


class MemoryStore:
    """Thread- and task-safe in-process store implementing both store faces."""

    round_trip = False  # calls are local: the router releases at once instead of batching

    def __init__(
        self,
        *,
        session_ttl: float = DEFAULT_SESSION_TTL,
        template_window: float = DEFAULT_TEMPLATE_WINDOW,
    ) -> None:
        self.session_ttl = session_ttl
        self.template_window = template_window
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], dict[str, Any]] = {}
        self._templates: dict[tuple[str, str], dict[str, int]] = {}  # -> worker -> last use (ms)
        self._template_stats: dict[tuple[str, str], list[int]] = {}  # -> [prompt, cached]
        self._template_info: dict[tuple[str, str], dict[str, Any]] = {}
        # every template in use -> last use (ms), oldest first: its records go once it is past retention
        self._template_use: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._workers: dict[str, _Worker] = {}
        self._outcomes: dict[str, int] = {}
        self._usage = [0, 0]  # every reported call's uncached prompt tokens, summed; calls reported
        # every pinned session -> last use (ms), oldest first: expiry pops from the front
        self._live: OrderedDict[tuple[str, str], int] = OrderedDict()
        # the sessions counted in their worker's footprint -> until when (ms), and a heap of (until, session)
        # to find the ones gone quiet in O(log n); entries an update superseded are skipped as they surface
        self._active: dict[tuple[str, str], int] = {}
        self._quiet_at: list[tuple[int, tuple[str, str]]] = []
        self._released: dict[tuple[str, str], int] = {}  # (source, worker) -> last total applied

    # --- helpers (caller holds the lock) -------------------------------------

    def _worker(self, url: str) -> _Worker:
        w = self._workers.get(url)
        if w is None:
            w = self._workers[url] = _Worker()
        return w

    def _purge(self, now_ms: int) -> None:
        # O(expired), not O(sessions): a heap of quiet times, and live sessions kept in last-use order
        while self._quiet_at and self._quiet_at[0][0] < now_ms:
            until, key = heapq.heappop(self._quiet_at)
            if self._active.get(key) == until:  # else superseded, or expiry and moves took it out
                self._deactivate(self._sessions[key], key)
        cutoff = now_ms - to_ms(self.session_ttl)
        while self._live:
            key, seen = next(iter(self._live.items()))
            if seen >= cutoff:
                break
            del self._live[key]
            rec = self._sessions.pop(key, None)
            if rec is not None:
                self._detach(rec)
        gone = now_ms - to_ms(template_retention(self.session_ttl, self.template_window))
        while self._template_use:
            key, used = next(iter(self._template_use.items()))
            if used >= gone:
                break
            del self._template_use[key]
            self._templates.pop(key, None)
            self._template_stats.pop(key, None)
            self._template_info.pop(key, None)

    def _use_template(self, key: tuple[str, str], now_ms: int) -> None:
        self._template_use[key] = max(now_ms, self._template_use.get(key, now_ms))
        self._template_use.move_to_end(key)

    def _detach(self, rec: dict[str, Any]) -> None:
        """Drop a session from its worker's accounting."""
        w = self._worker(rec["worker"])
        if rec["active"]:
            w.kv_tokens -= rec["held"]
            w.active -= 1
            rec["active"] = False
            self._active.pop((rec["tenant"], rec["session"]), None)
        w.sessions -= 1

    def _deactivate(self, rec: dict[str, Any], key: tuple[str, str]) -> None:
        """The session went quiet: its KV is no longer counted as held (it may be done)."""
        w = self._worker(rec["worker"])
        w.kv_tokens -= rec["held"]
        w.active -= 1
        rec["active"] = False
        del self._active[key]

    def _activate(self, rec: dict[str, Any], until_ms: int) -> None:
        """Count the session in its worker's footprint until ``until_ms`` (or a later activation)."""
        key = (rec["tenant"], rec["session"])
        if not rec["active"]:
            w = self._worker(rec["worker"])
            w.kv_tokens += rec["held"]
            w.active += 1
            rec["active"] = True
        self._active[key] = until_ms
        heapq.heappush(self._quiet_at, (until_ms, key))
        if len(self._quiet_at) > 2 * len(self._active) + 1024:  # superseded entries: rebuild
            self._quiet_at = [(t, k) for k, t in self._active.items()]
            heapq.heapify(self._quiet_at)

    def _touch(self, key: tuple[str, str], now_ms: int) -> None:
        self._live[key] = now_ms
        self._live.move_to_end(key)

    # --- sync face ------------------------------------------------------------

    def route(
        self, query: RouteQuery, policy: Policy, now: float, releases: Releases = None, lease: Lease | None = None,
        reports: Sequence[UsageReport] = (),
    ) -> RouteResult:
        # ``lease`` is not needed here: this store lives and dies with its router
        now_ms = to_ms(now)
        key = (query.tenant, query.session_id)
        live_ms = to_ms(policy.live_window)
        with self._lock:
            self._release(releases)
            self._purge(now_ms)
            for r in reports:  # the router's queued usage, before the pin is read (as the Lua script)
                self._apply_report(r)
            rec = self._sessions.get(key)
            pause = 0
            if rec is not None:
                pause = max(rec["pause"], now_ms - rec["last_seen"])  # the longest wait for its next call
                self._activate(rec, now_ms + live_ms)  # its history is live again before the decision weighs it
            views = []
            for spec in query.workers:
                w = self._worker(spec.url)
                views.append(WorkerView(spec.url, spec.state, w.inflight, w.kv_tokens, spec.capacity, w.active))
            pin = None
            if rec is not None:
                prefix = next((s.prefix for s in query.workers if s.url == rec["worker"]), "")  # the first, as in Lua
                pin = PinView(rec["worker"], rec["epoch"], rec["last_cached"], rec["prev_cached"], rec["held"], prefix)
            holders: frozenset[str] = frozenset()
            if query.template_id:
                cutoff = now_ms - to_ms(self.template_window)
                used = self._templates.get((query.tenant, query.template_id), {})
                holders = frozenset(u for u, t in used.items() if t >= cutoff)
                seen = {s.url: s.template for s in query.workers if s.template}
                if seen:  # the workers' KV events know better than the marks
                    holders = frozenset(u for u in holders if seen.get(u) != "lacks") | frozenset(
                        u for u, t in seen.items() if t == "held")
            snapshot = Snapshot(tuple(views), pin, holders, query.prompt_tokens_estimate, self._call_tokens())
            decision = choose_worker(snapshot, query.session_id, policy)
            if decision.worker is None:
                return RouteResult(None, decision.outcome, decision.epoch)
            previous = rec["worker"] if rec is not None and decision.outcome.startswith("moved:") else None
            self._apply(query, rec, decision.worker, decision.outcome, decision.epoch, now_ms, pause, policy)
            return RouteResult(decision.worker, decision.outcome, decision.epoch, previous)

    def _apply(
        self, query: RouteQuery, rec: dict[str, Any] | None, url: str, outcome: str, epoch: int, now_ms: int,
        pause: int, policy: Policy,
    ) -> None:
        key = (query.tenant, query.session_id)
        live_ms = to_ms(policy.live_window)
        w = self._worker(url)
        if rec is None:
            rec = self._sessions[key] = {
                "worker": url, "template": query.template_id or "", "pool": query.pool,
                "tenant": query.tenant, "session": query.session_id, "created": now_ms, "last_seen": now_ms,
                "steps": 0, "prompt_tokens": 0, "cached_tokens": 0, "last_cached": 0, "prev_cached": 0,
                "epoch": epoch, "held": 0, "active": False, "pause": 0, "quiet": 0, "open": 0,
            }  # fmt: skip
            w.sessions += 1
            self._activate(rec, now_ms + live_ms)
        elif outcome.startswith("moved:"):
            self._detach(rec)
            rec["worker"] = url
            rec["epoch"] = epoch
            rec["last_cached"] = 0
            rec["prev_cached"] = 0
            # The new worker re-prefills the whole history, so it holds as much as before.
            w.sessions += 1
            self._activate(rec, now_ms + live_ms)
        est = query.prompt_tokens_estimate
        if est > rec["held"]:
            w.kv_tokens += est - rec["held"]
            rec["held"] = est
        rec["last_seen"] = now_ms
        rec["pause"] = pause
        rec["quiet"] = quiet_after(pause, policy)
        rec["open"] = rec["open"] + 1 if outcome == "pinned" else 1  # its calls routed and not reported
        rec["steps"] += 1
        self._touch(key, now_ms)
        w.inflight += 1
        if query.template_id:
            marks = self._templates.setdefault((query.tenant, query.template_id), {})
            if outcome != "pinned":  # what abandon() restores if this placement's call fails
                rec["tprev"] = marks.get(url)
            marks[url] = now_ms
            self._use_template((query.tenant, query.template_id), now_ms)
        self._outcomes[outcome] = self._outcomes.get(outcome, 0) + 1

    def _release(self, releases: ReleaseBatch | Mapping[str, int] | None) -> None:
        if releases is None:
            return
        releases = ReleaseBatch.of(releases)
        source = releases.source
        for url, total in releases.totals.items():
            count = releases.deltas[url]
            if source:
                last = self._released.get((source, url))
                if last is not None:
                    count = total - last
            if count > 0:
                w = self._worker(url)
                w.inflight = max(0, w.inflight - count)
                if source:
                    self._released[(source, url)] = total

    def renew(self, lease: Lease, held: Mapping[str, int], now: float, releases: Releases = None) -> None:
        self.release_many(releases or {}, now)  # no leases in process: only the owed releases

    def release(self, worker: str, now: float) -> None:
        self.release_many({worker: 1}, now)

    def release_many(self, releases: ReleaseBatch | Mapping[str, int], now: float) -> None:
        with self._lock:
            self._release(releases)

    def report(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
               prompt_tokens: int, cached_tokens: int, now: float, releases: Releases = None) -> None:
        self.report_many([UsageReport(tenant, session_id, worker, epoch, template_id, prompt_tokens, cached_tokens,
                                      now)], now, releases)

    def report_many(self, reports: Sequence[UsageReport], now: float, releases: Releases = None) -> None:
        with self._lock:
            self._release(releases)
            for r in reports:
                self._apply_report(r)

    def _call_tokens(self) -> float | None:
        uncached, calls = self._usage
        return uncached / calls if calls > 0 else None

    def _apply_report(self, r: UsageReport) -> None:
        now_ms = to_ms(r.now)
        w = self._worker(r.worker)
        w.prompt += r.prompt_tokens
        w.cached += r.cached_tokens
        self._usage[0] += max(0, r.prompt_tokens - r.cached_tokens)
        self._usage[1] += 1
        rec = self._sessions.get((r.tenant, r.session_id))
        if rec is not None and rec["worker"] == r.worker and rec["epoch"] == r.epoch:
            rec["open"] = max(0, rec["open"] - 1)
            if rec["open"] == 0 or not rec["active"]:  # else another call is running: its route's time stands
                self._activate(rec, now_ms + rec["quiet"])  # the call ended: live while its next one may come
            rec["prompt_tokens"] += r.prompt_tokens
            rec["cached_tokens"] += r.cached_tokens
            rec["prev_cached"] = rec["last_cached"]
            rec["last_cached"] = r.cached_tokens
            w.kv_tokens += r.prompt_tokens - rec["held"]
            rec["held"] = r.prompt_tokens
            rec["last_seen"] = now_ms
            self._touch((r.tenant, r.session_id), now_ms)
        if r.template_id:
            st = self._template_stats.setdefault((r.tenant, r.template_id), [0, 0])
            st[0] += r.prompt_tokens
            st[1] += r.cached_tokens
            self._templates.setdefault((r.tenant, r.template_id), {})[r.worker] = now_ms
            self._use_template((r.tenant, r.template_id), now_ms)

    def abandon(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                now: float, releases: Releases = None) -> None:
        """The first call of a placement failed: undo it (the pin, its KV estimate, the template mark it set).

        Only if the pin is still that placement's (same worker and epoch); the
        template mark is restored only if nothing marked it since.
        """
        with self._lock:
            self._release(releases)
            key = (tenant, session_id)
            rec = self._sessions.get(key)
            if rec is None or rec["worker"] != worker or rec["epoch"] != epoch:
                return
            del self._sessions[key]
            self._live.pop(key, None)
            self._detach(rec)
            if template_id:
                marks = self._templates.get((tenant, template_id), {})
                if marks.get(worker) == rec["last_seen"]:
                    if rec.get("tprev") is None:
                        del marks[worker]
                    else:
                        marks[worker] = rec["tprev"]

    def get_session(self, tenant: str, session_id: str, now: float) -> dict[str, Any] | None:
        with self._lock:
            rec = self._sessions.get((tenant, session_id))
            if rec is None or rec["last_seen"] < to_ms(now) - to_ms(self.session_ttl):
                return None
            return dict(rec)

    def set_worker(self, url: str, state: str, capacity: int, now: float) -> None:
        with self._lock:
            w = self._worker(url)
            w.state = state
            w.capacity = capacity

    def record_template(
        self, tenant: str, template_id: str, token_length: int, session_id: str | None, now: float
    ) -> None:
        with self._lock:
            key = (tenant, template_id)
            info = self._template_info.setdefault(
                key, {"first_seen": now, "sessions": 0, "recent": OrderedDict(), "token_length": token_length}
            )
            info["token_length"] = token_length
            recent = info["recent"]
            if session_id is not None and session_id not in recent:
                info["sessions"] += 1
                recent[session_id] = None
                if len(recent) > _RECENT_SESSIONS:
                    recent.popitem(last=False)
            self._use_template(key, to_ms(now))

    def template_info(self, tenant: str, template_id: str) -> dict[str, Any] | None:
        with self._lock:
            info = self._template_info.get((tenant, template_id))
            if info is None:
                return None
            return {
                "first_seen": info["first_seen"],
                "sessions": info["sessions"],
                "token_length": info["token_length"],
            }

    def stats(self, now: float, *, templates: bool = True) -> dict[str, Any]:
        now_ms = to_ms(now)
        with self._lock:
            # Read-only, like the Redis store: expired sessions are purged on the next route.
            workers = {}
            for url, w in self._workers.items():
                workers[url] = {
                    "state": w.state, "capacity": w.capacity, "sessions": w.sessions,
                    "inflight": w.inflight, "kv_tokens": w.kv_tokens, "live_sessions": w.active,
                    "prompt_tokens": w.prompt, "cached_tokens": w.cached,
                }  # fmt: skip
            cutoff = now_ms - to_ms(self.template_window)
            used_templates: dict[str, dict[str, Any]] = {}
            in_window = 0
            for (tenant, tid), last in reversed(self._template_use.items()):  # the recent ones: O(live)
                if last < cutoff or not templates:
                    break
                in_window += 1
                if len(used_templates) >= STATS_TEMPLATES:
                    continue
                used = self._templates.get((tenant, tid), {})
                st = self._template_stats.get((tenant, tid), [0, 0])
                used_templates[f"{tenant}/{tid}"] = {
                    "workers": sorted(u for u, t in used.items() if t >= cutoff),
                    "prompt_tokens": st[0],
                    "cached_tokens": st[1],
                }
            return {
                "workers": workers,
                "templates": used_templates,
                "templates_in_window": in_window,
                "sessions": sum(w["sessions"] for w in workers.values()),
                "outcomes": dict(self._outcomes),
                "uncached_per_call": self._call_tokens(),
            }

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None

    # --- async face -----------------------------------------------------------

    async def aroute(
        self, query: RouteQuery, policy: Policy, now: float, releases: Releases = None, lease: Lease | None = None,
        reports: Sequence[UsageReport] = (),
    ) -> RouteResult:
        return self.route(query, policy, now, releases, lease, reports)

    async def areport_many(self, reports: Sequence[UsageReport], now: float, releases: Releases = None) -> None:
        self.report_many(reports, now, releases)

    async def arelease(self, worker: str, now: float) -> None:
        self.release(worker, now)

    async def arelease_many(self, releases: ReleaseBatch | Mapping[str, int], now: float) -> None:
        self.release_many(releases, now)

    async def areport(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                      prompt_tokens: int, cached_tokens: int, now: float, releases: Releases = None) -> None:
        self.report(tenant, session_id, worker, epoch, template_id, prompt_tokens, cached_tokens, now, releases)

    async def aabandon(self, tenant: str, session_id: str, worker: str, epoch: int, template_id: str | None,
                       now: float, releases: Releases = None) -> None:
        self.abandon(tenant, session_id, worker, epoch, template_id, now, releases)

    async def aping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
