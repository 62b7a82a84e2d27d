"""Placement rule as pure functions over a state snapshot (no I/O).

The memory store calls :func:`choose_worker` directly; the Redis Lua script
(:mod:`agent_cache.store.lua`) is a line-by-line port of it, and a test runs
random scenarios through both. Keep the two in step: same formula, same
evaluation order (floating-point results must be bit-identical).

Every term is in one unit, tokens a worker must prefill (see docs/routing.md)::

    m            = the pool's mean live session footprint (latest context tokens of a session)
    held(w)      = max(KV tokens of w's live sessions, their number x m): young sessions grow
    g            = expected footprint of the session: max(its tokens, m)
    u            = uncached prompt tokens per reported call (the running mean)
    cost(w)      = miss(w)                     template tokens, if w does not hold the template
                 + pushed_out(w)               tokens of other sessions pushed past w's capacity
                 + excess(w)                   held(w), scaled to the mean capacity, beyond
                                               balance_factor x the candidates' mean: a fair share
                 + u * inflight(w)             calls running there now, each still owed its prefill
    new session  -> the cheapest candidate (ties: rendezvous hash)
    pin moves    -> its worker is down / draining / removed; or its prefix was lost there
                    (its cached tokens dropped, unless its KV events show it resident again;
                    or they show it evicted) and that worker is past its capacity ("evicted")
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

    live_window: float = 60.0  # a session idle this long (s) is done: its KV no longer counts as held ...
    quiet_factor: float = 4.0  # ... or once quiet for this x its longest wait between a reply and its next call
    min_quiet: float = 2.0  # ... but never less than this (s): a loop without tools still counts as one session
    balance_factor: float = 1.25  # footprint up to this x the mean is a fair share; beyond it, excess work
    move_factor: float = 2.0  # a pin that lost its prefix moves when its worker's calls pass this x the mean ...
    slack: float = 2.0  # ... plus this many calls


def quiet_after(pause_ms: int, policy: Policy) -> int:
    """How long (ms) after a reply a session still counts in its worker's footprint.

    An agent session ends without saying so. Until it has waited once between
    a reply and its next call, ``live_window``; after that, ``quiet_factor``
    times its longest such wait (tool time), within ``min_quiet`` and
    ``live_window``.
    """
    live_ms = int(policy.live_window * 1000)
    if pause_ms <= 0:
        return live_ms
    return min(live_ms, max(int(policy.min_quiet * 1000), int(policy.quiet_factor * pause_ms)))


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
    prefix: str = ""  # the worker's KV events show the session's latest prefix "held" there, or "gone"


@dataclass(frozen=True)
class Snapshot:
    """What one decision needs: the pool's workers (config order), the pin, template holders."""

    workers: tuple[WorkerView, ...]
    pin: PinView | None = None
    template_workers: frozenset[str] = field(default_factory=frozenset)
    template_tokens: int = 0  # the session's template length (the route's token estimate)
    call_tokens: float | None = None  # uncached prompt tokens per reported call; None: nothing reported yet


@dataclass(frozen=True)
class Decision:
    worker: str | None  # None: no healthy worker in the pool
    outcome: str  # pinned | placed_template | placed_least_load | moved:<reason>
    epoch: int = 0


def mean_session(workers: tuple[WorkerView, ...]) -> float:
    """The pool's mean live session footprint (0 with no live session)."""
    total, count = 0.0, 0
    for w in workers:
        total = total + w.kv_tokens
        count = count + w.live_sessions
    return total / count if count > 0 else 0.0


def expected_footprint(workers: tuple[WorkerView, ...], tokens: int) -> float:
    """What a session will hold: its own tokens, or the pool's mean live session footprint if larger."""
    return max(float(tokens), mean_session(workers))


@dataclass(frozen=True)
class Scale:
    """What each candidate's cost is measured against (computed once per decision)."""

    session_tokens: float  # the pool's mean live session footprint: what a young session grows to
    mean_capacity: float  # footprints are scaled to it, so a worker of twice the memory counts half
    fair_share: float  # balance_factor x the candidates' mean scaled footprint
    call_tokens: float  # tokens of prefill one call in flight stands for


def projected(w: WorkerView, session_tokens: float) -> float:
    """What ``w``'s live sessions will hold: each at least the pool's mean session (young ones grow)."""
    return max(float(w.kv_tokens), w.live_sessions * session_tokens)


def scale_of(candidates: list[WorkerView], snapshot: Snapshot, policy: Policy) -> Scale:
    m = mean_session(snapshot.workers)
    total = 0.0
    for w in candidates:
        total = total + max(w.capacity, 1)
    mean_capacity = total / len(candidates)
    load = 0.0
    for w in candidates:
        load = load + projected(w, m) * (mean_capacity / max(w.capacity, 1))
    u = snapshot.call_tokens if snapshot.call_tokens is not None else float(snapshot.template_tokens)
    return Scale(m, mean_capacity, policy.balance_factor * (load / len(candidates)), u)


def cost(w: WorkerView, snapshot: Snapshot, g: float, scale: Scale) -> float:
    """Tokens of prefill that placing the session on ``w`` costs, now and later (module docstring)."""
    miss = 0.0 if w.url in snapshot.template_workers else float(snapshot.template_tokens)
    cap = max(w.capacity, 1)
    held = projected(w, scale.session_tokens)
    pushed = max(0.0, held + g - cap) - max(0.0, held - cap)
    excess = max(0.0, held * (scale.mean_capacity / cap) - scale.fair_share)
    return miss + pushed + excess + scale.call_tokens * w.inflight


def _cheapest(session_id: str, workers: list[WorkerView], snapshot: Snapshot, g: float, policy: Policy) -> WorkerView:
    # Ties (common on an idle fleet) go to the rendezvous winner, so processes agree.
    scale = scale_of(workers, snapshot, policy)
    best = workers[0]
    best_cost = cost(best, snapshot, g, scale)
    best_score = rendezvous_score(session_id, best.url)
    for w in workers[1:]:
        c = cost(w, snapshot, g, scale)
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
    # lost: the events say so at once; else the reported cached tokens dropped (a step late: that step
    # prefilled it again, so where the events show it resident again it is intact)
    lost = pin.prefix == "gone" or (pin.last_cached < pin.prev_cached and pin.prefix != "held")
    if not lost:
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
    chosen = _cheapest(session_id, candidates, snapshot, g, policy)
    if pin is not None:
        return Decision(chosen.url, f"moved:{reason}", pin.epoch + 1)
    outcome = "placed_template" if chosen.url in snapshot.template_workers else "placed_least_load"
    return Decision(chosen.url, outcome, 1)
