"""Placement rule as pure functions over a state snapshot (no I/O).

The memory store calls :func:`choose_worker` directly; the Redis Lua script
(:mod:`agent_cache.store.lua`) is a line-by-line port of it, and a test runs
random scenarios through both. Keep the two in step: same formula, same
evaluation order (floating-point results must be bit-identical).

Cost function (see docs/routing.md)::

    load(w)  = inflight(w) + kv_weight * kv_tokens(w) / capacity(w)
    mean     = average load over the healthy workers of the pool
    holder w is eligible   if load(w) <= (1 + epsilon) * mean + slack
    pin moves (overload)   if load(w) >  move_factor * mean + slack
                           and the session's cached tokens dropped
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent_cache.routing.hashing import rendezvous_score

UP = "up"
DOWN = "down"
DRAINING = "draining"


@dataclass(frozen=True)
class Policy:
    """Tunables of the placement rule (defaults documented in docs/routing.md)."""

    epsilon: float = 0.25  # bounded-load slack over the pool mean for template holders
    slack: float = 2.0  # absolute slack (in in-flight-call units) so a quiet fleet still reuses caches
    move_factor: float = 2.0  # a pin moves only past this multiple of the mean ...
    kv_weight: float = 4.0  # a worker with a full KV pool counts as this many in-flight calls


@dataclass(frozen=True)
class WorkerView:
    url: str
    state: str = UP
    inflight: int = 0
    kv_tokens: int = 0
    capacity: int = 1


@dataclass(frozen=True)
class PinView:
    worker: str
    epoch: int = 0
    last_cached: int = 0  # cached tokens reported for the latest step
    prev_cached: int = 0  # ... and for the step before it


@dataclass(frozen=True)
class Snapshot:
    """What one decision needs: the pool's workers (config order), the pin, template holders."""

    workers: tuple[WorkerView, ...]
    pin: PinView | None = None
    template_workers: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Decision:
    worker: str | None  # None: no healthy worker in the pool
    outcome: str  # pinned | placed_template | placed_least_load | moved:<reason>
    epoch: int = 0


def load(w: WorkerView, policy: Policy) -> float:
    return w.inflight + policy.kv_weight * w.kv_tokens / max(w.capacity, 1)


def _mean(workers: list[WorkerView], policy: Policy) -> float:
    total = 0.0
    for w in workers:
        total = total + load(w, policy)
    return total / len(workers) if workers else 0.0


def _least_loaded(session_id: str, workers: list[WorkerView], policy: Policy) -> WorkerView:
    # Ties (common on an idle fleet) go to the rendezvous winner, so processes agree.
    best = workers[0]
    best_load = load(best, policy)
    best_score = rendezvous_score(session_id, best.url)
    for w in workers[1:]:
        lw = load(w, policy)
        sw = rendezvous_score(session_id, w.url)
        if lw < best_load or (lw == best_load and sw > best_score):
            best, best_load, best_score = w, lw, sw
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
    healthy = [w for w in snapshot.workers if w.state == UP]
    mean = _mean(healthy, policy)
    if load(current, policy) > policy.move_factor * mean + policy.slack and pin.last_cached < pin.prev_cached:
        return "overloaded"
    return None


def choose_worker(snapshot: Snapshot, session_id: str, policy: Policy = Policy()) -> Decision:
    """Keep the pin unless it must move; otherwise place by template, then by load."""
    pin = snapshot.pin
    reason: str | None = None
    if pin is not None:
        reason = _move_reason(snapshot, policy)
        if reason is None:
            return Decision(pin.worker, "pinned", pin.epoch)
    candidates = [w for w in snapshot.workers if w.state == UP and (pin is None or w.url != pin.worker)]
    if not candidates:
        return Decision(None, "none", pin.epoch if pin else 0)
    mean = _mean(candidates, policy)
    bound = (1.0 + policy.epsilon) * mean + policy.slack
    holders = [w for w in candidates if w.url in snapshot.template_workers and load(w, policy) <= bound]
    if holders:
        chosen, outcome = _least_loaded(session_id, holders, policy), "placed_template"
    else:
        chosen, outcome = _least_loaded(session_id, candidates, policy), "placed_least_load"
    if pin is not None:
        return Decision(chosen.url, f"moved:{reason}", pin.epoch + 1)
    return Decision(chosen.url, outcome, 1)
