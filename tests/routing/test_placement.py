"""The pure placement rule."""

from __future__ import annotations

from agent_cache.routing.hashing import pool_for_session, rendezvous_pick
from agent_cache.routing.placement import (
    DOWN,
    DRAINING,
    PinView,
    Policy,
    Snapshot,
    WorkerView,
    choose_worker,
    load,
)

A, B, C = "http://a:1", "http://b:1", "http://c:1"


def views(*loads: int, cap: int = 1000) -> tuple[WorkerView, ...]:
    return tuple(WorkerView(u, inflight=n, capacity=cap) for u, n in zip((A, B, C), loads))


def test_new_session_prefers_template_holder_within_bound():
    d = choose_worker(Snapshot(views(3, 0, 0), None, frozenset({A})), "s1")
    # mean 1, bound 1.25 * 1 + 2 = 3.25 >= 3
    assert (d.worker, d.outcome, d.epoch) == (A, "placed_template", 1)


def test_overloaded_holder_loses_to_least_loaded():
    d = choose_worker(Snapshot(views(9, 0, 1), None, frozenset({A})), "s1")
    assert (d.worker, d.outcome) == (B, "placed_least_load")


def test_ties_broken_by_rendezvous_hash():
    for i in range(50):
        sid = f"s{i}"
        d = choose_worker(Snapshot(views(0, 0, 0)), sid)
        assert d.worker == rendezvous_pick(sid, [A, B, C])


def test_pin_kept_until_a_reason():
    pin = PinView(A, epoch=3, last_cached=100, prev_cached=50)
    assert choose_worker(Snapshot(views(50, 0, 0), pin), "s").outcome == "pinned"
    # overloaded AND cache dropped -> move
    dropped = PinView(A, epoch=3, last_cached=10, prev_cached=500)
    d = choose_worker(Snapshot(views(50, 0, 0), dropped), "s")
    assert d.outcome == "moved:overloaded" and d.epoch == 4 and d.worker != A
    # cache dropped but not overloaded -> stay
    assert choose_worker(Snapshot(views(1, 0, 0), dropped), "s").outcome == "pinned"


def test_move_reasons():
    pin = PinView(A, epoch=1)
    ws = list(views(0, 0, 0))
    ws[0] = WorkerView(A, state=DOWN, capacity=1000)
    assert choose_worker(Snapshot(tuple(ws), pin), "s").outcome == "moved:unhealthy"
    ws[0] = WorkerView(A, state=DRAINING, capacity=1000)
    assert choose_worker(Snapshot(tuple(ws), pin), "s").outcome == "moved:draining"
    assert choose_worker(Snapshot(tuple(ws[1:]), pin), "s").outcome == "moved:removed"


def test_no_healthy_worker():
    ws = tuple(WorkerView(u, state=DOWN) for u in (A, B))
    assert choose_worker(Snapshot(ws), "s").worker is None


def test_kv_tokens_count_in_load():
    p = Policy()
    assert load(WorkerView(A, inflight=1, kv_tokens=500, capacity=1000), p) == 1 + p.kv_weight * 0.5
    # B is idle in calls but its KV pool is full: C wins
    ws = (WorkerView(B, kv_tokens=1000, capacity=1000), WorkerView(C, inflight=1, capacity=1000))
    assert choose_worker(Snapshot(ws), "s").worker == C


def test_pool_fraction_is_deterministic_and_close():
    fr = {"production": 0.8, "canary": 0.2}
    picks = [pool_for_session(f"s{i}", fr) for i in range(5000)]
    assert picks == [pool_for_session(f"s{i}", fr) for i in range(5000)]
    assert 0.17 < picks.count("canary") / 5000 < 0.23


def test_adding_worker_rendezvous_moves_only_to_new():
    before = {f"s{i}": rendezvous_pick(f"s{i}", [A, B]) for i in range(300)}
    after = {s: rendezvous_pick(s, [A, B, C]) for s in before}
    assert all(after[s] in (before[s], C) for s in before)
