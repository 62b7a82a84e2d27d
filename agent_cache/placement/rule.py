"""Placement rule as pure functions over a state snapshot (no I/O).

The memory store calls :func:`choose_worker` directly; the Redis Lua script
(:mod:`agent_cache.store.lua`) is a line-by-line port of it, and a test runs
random scenarios through both. Keep the two in step: same formula, same
evaluation order (floating-point results must be bit-identical).

Every term is in one unit, tokens a worker must prefill (see docs/routing.md)::

    footprint(w) = KV tokens of w's live sessions (latest context each)
    g            = expected footprint of the session: max(its tokens, mean live session footprint)
    cost(w)      = miss(w)                     template tokens, if w does not hold the template
                 + pushed_out(w)               tokens of other sessions pushed past w's capacity
                 + footprint(w) * scale(w)     what w's sessions hold and will keep asking of it
                 + g * inflight(w)             calls running there now
    new session  -> the cheapest candidate (ties: rendezvous hash)
    pin moves    -> its worker is down / draining / removed; or its prefix was lost there
                    (cached tokens dropped) and that worker is past its capacity ("evicted")
                    while another has room; or it is overloaded in calls ("overloaded")
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_cache.placement.hashing import rendezvous_score

UP = "up"
DOWN = "down"
DRAINING = "draining"


@dataclass(frozen=True)
class Policy:
    """Tunables of the placement rule (defaults documented in docs/routing.md)."""

    live_window: float = 60.0  # a session idle this long (s) is done: its KV no longer counts as held
    move_factor: float = 2.0  # a pin that lost its prefix moves when its worker's calls pass this x the mean ...
    slack: float = 2.0  # ... plus this many calls


@dataclass(frozen=True)
class WorkerView:
    url: str
    state: str = UP
    inflight: int = 0
    kv_tokens: int = 0  # footprint: the latest context tokens of the worker's live sessions, summed
    capacity: int = 1
    live_sessions: int = 0  # sessions counted in kv_tokens


@dataclass(frozen=True)
class PinView:
    worker: str
    epoch: int = 0
    last_cached: int = 0  # cached tokens reported for the latest step
    prev_cached: int = 0  # ... and for the step before it
    held: int = 0  # the session's tokens counted in its worker's footprint


@dataclass(frozen=True)
class Snapshot:
    """What one decision needs: the pool's workers (config order), the pin, template holders."""

    workers: tuple[WorkerView, ...]
    pin: PinView | None = None
    template_workers: frozenset[str] = field(default_factory=frozenset)
    template_tokens: int = 0  # the session's template length (the route's token estimate)


@dataclass(frozen=True)
class Decision:
    worker: str | None  # None: no healthy worker in the pool
    outcome: str  # pinned | placed_template | placed_least_load | moved:<reason>
    epoch: int = 0


def expected_footprint(workers: tuple[WorkerView, ...], tokens: int) -> float:
    """What a session will hold: its own tokens, or the pool's mean live session footprint if larger."""
    total, count = 0.0, 0
    for w in workers:
        total = total + w.kv_tokens
        count = count + w.live_sessions
    mean = total / count if count > 0 else 0.0
    return max(float(tokens), mean)


def cost(w: WorkerView, snapshot: Snapshot, g: float, mean_capacity: float) -> float:
    """Tokens of prefill that placing the session on ``w`` costs, now and later (module docstring)."""
    miss = 0.0 if w.url in snapshot.template_workers else float(snapshot.template_tokens)
    cap = max(w.capacity, 1)
    pushed = max(0.0, w.kv_tokens + g - cap) - max(0.0, float(w.kv_tokens - cap))
    return miss + pushed + w.kv_tokens * (mean_capacity / cap) + g * w.inflight


def _cheapest(session_id: str, workers: list[WorkerView], snapshot: Snapshot, g: float) -> WorkerView:
    # Ties (common on an idle fleet) go to the rendezvous winner, so processes agree.
    total = 0.0
    for w in workers:
        total = total + max(w.capacity, 1)
    mean_capacity = total / len(workers)
    best = workers[0]
    best_cost = cost(best, snapshot, g, mean_capacity)
    best_score = rendezvous_score(session_id, best.url)
    for w in workers[1:]:
        c = cost(w, snapshot, g, mean_capacity)
        s = rendezvous_score(session_id, w.url)
        if c < best_cost or (c == best_cost and s > best_score):
            best, best_cost, best_score = w, c, s
    return best


def _move_reason(snapshot: Snapshot, policy: Policy) -> str | None:
    pin = snapshot.pin
    assert pin is not None
    current = next((w for w in snapshot.workers if w.url == pin.worker), None)
    if current is None:
        return "removed"
    if current.state == DOWN:
        return "unhealthy"
    if current.state == DRAINING:
        return "draining"
    if pin.last_cached >= pin.prev_cached:
        return None  # the prefix is intact: never move it for balance alone
    healthy = [w for w in snapshot.workers if w.state == UP]
    if current.kv_tokens > current.capacity:
        for w in healthy:
            if w.url != pin.worker and w.kv_tokens + pin.held <= w.capacity:
                return "evicted"
    total = 0.0
    for w in healthy:
        total = total + w.inflight
    mean = total / len(healthy)
    if current.inflight > policy.move_factor * mean + policy.slack:
        return "overloaded"
    return None


def choose_worker(snapshot: Snapshot, session_id: str, policy: Policy = Policy()) -> Decision:
    """Keep the pin unless it must move; otherwise place on the cheapest candidate."""
    pin = snapshot.pin
    reason: str | None = None
    if pin is not None:
        reason = _move_reason(snapshot, policy)
        if reason is None:
            return Decision(pin.worker, "pinned", pin.epoch)
    candidates = [w for w in snapshot.workers if w.state == UP and (pin is None or w.url != pin.worker)]
    if not candidates:
        return Decision(None, "none", pin.epoch if pin else 0)
    if reason == "evicted" and pin is not None:  # only where it fits: another full worker would evict it again
        candidates = [w for w in candidates if w.kv_tokens + pin.held <= w.capacity]
    g = expected_footprint(snapshot.workers, max(snapshot.template_tokens, pin.held if pin else 0))
    chosen = _cheapest(session_id, candidates, snapshot, g)
    if pin is not None:
        return Decision(chosen.url, f"moved:{reason}", pin.epoch + 1)
    outcome = "placed_template" if chosen.url in snapshot.template_workers else "placed_least_load"
    return Decision(chosen.url, outcome, 1)
