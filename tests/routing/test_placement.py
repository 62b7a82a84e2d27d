"""The pure placement rule."""

from __future__ import annotations

import pytest

from agent_cache.placement.hashing import pool_for_session, rendezvous_pick
from agent_cache.placement.rule import (
    DOWN,
    DRAINING,
    PinView,
    Snapshot,
    Policy,
    WorkerView,
    choose_worker,
    cost,
    expected_footprint,
    mean_session,
    projected,
    quiet_after,
    scale_of,
)

A, B, C = "http://a:1", "http://b:1", "http://c:1"
CAP = 100_000


def views(*footprints: int, inflight: tuple[int, ...] = (0, 0, 0), cap: int = CAP) -> tuple[WorkerView, ...]:
    """Workers A, B, C with the given footprints (one live session per 1,000 tokens) and calls in flight."""
    return tuple(WorkerView(u, inflight=n, kv_tokens=f, capacity=cap, live_sessions=f // 1000)
                 for u, f, n in zip((A, B, C), footprints, inflight))


def test_reuse_a_holder_whose_extra_footprint_is_below_the_template():
    # A holds the 3,000-token template and 2,000 more tokens of live sessions than B and C: reuse pays
    d = choose_worker(Snapshot(views(2_000, 0, 0), None, frozenset({A}), 3_000), "s1")
    assert (d.worker, d.outcome, d.epoch) == (A, "placed_template", 1)


def test_spill_when_the_holders_excess_over_a_fair_share_passes_what_reuse_saves():
    # the pool's mean is a third of A's footprint, so A's fair share (1.25 x the mean) is 5/12 of it:
    # at 5,000 tokens A exceeds it by 2,917 < 3,000: reuse still pays
    assert choose_worker(Snapshot(views(5_000, 0, 0), None, frozenset({A}), 3_000), "s1").worker == A
    # at 5,500 by 3,208 > 3,000: spill
    d = choose_worker(Snapshot(views(5_500, 0, 0), None, frozenset({A}), 3_000), "s1")
    assert d.outcome == "placed_least_load" and d.worker in (B, C)


def test_a_full_worker_is_avoided():
    # B is past its capacity: one more session there pushes another session's tokens out
    ws = views(0, 0, 0, cap=10_000)
    ws = (ws[0], WorkerView(B, kv_tokens=10_000, capacity=10_000, live_sessions=2), ws[2])
    s = Snapshot(ws, None, frozenset({B}), 3_000)
    g = expected_footprint(ws, 3_000)
    assert g == 5_000  # the mean live session holds more than the template
    scale = scale_of(list(ws), s, Policy())
    assert scale.fair_share == pytest.approx(1.25 * 10_000 / 3) and scale.call_tokens == 3_000
    # no miss, pushes 5,000 out, 5,833 beyond its fair share
    assert cost(ws[1], s, g, scale) == pytest.approx(0 + 5_000 + (10_000 - 1.25 * 10_000 / 3))
    assert cost(ws[0], s, g, scale) == 3_000
    assert choose_worker(s, "s").worker in (A, C)


def test_calls_in_flight_count_as_work():
    # before any usage is reported, a call in flight stands for the template's tokens
    d = choose_worker(Snapshot(views(0, 0, 0, inflight=(3, 0, 0)), None, frozenset({A}), 1_000), "s")
    assert d.worker in (B, C)


def test_a_call_in_flight_weighs_the_uncached_tokens_reported_per_call():
    # 300 uncached tokens per call: three calls in flight (900) cost less than a 1,000-token miss
    busy = views(0, 0, 0, inflight=(3, 0, 0))
    assert choose_worker(Snapshot(busy, None, frozenset({A}), 1_000, call_tokens=300.0), "s").worker == A
    assert choose_worker(Snapshot(busy, None, frozenset({A}), 1_000, call_tokens=400.0), "s").worker in (B, C)


def test_a_trickle_of_one_agents_sessions_spreads():
    # sessions of one agent arrive one at a time; each holds its 3,000-token template plus 2,000 of history
    fp = {A: 0, B: 0, C: 0}
    holders: set[str] = set()
    used = []
    for i in range(12):
        ws = tuple(WorkerView(u, kv_tokens=f, capacity=CAP, live_sessions=f // 5_000) for u, f in fp.items())
        d = choose_worker(Snapshot(ws, None, frozenset(holders), 3_000), f"s{i}")
        assert d.worker is not None
        fp[d.worker] += 5_000
        holders.add(d.worker)
        used.append(d.worker)
    # every worker takes sessions; none holds more than its fair share (1.25 x the mean) plus what reuse
    # saves (the template) and the session that crossed it
    assert set(used) == {A, B, C} and max(fp.values()) <= 1.25 * sum(fp.values()) / 3 + 3_000 + 5_000, fp


def test_young_sessions_count_as_what_the_pools_sessions_hold():
    # A's six sessions just started (3,000 tokens in all), B's one holds 9,000: the pool's mean session
    # holds 12,000 / 7, so A's will hold about 10,286 and B is the lighter worker
    ws = (WorkerView(A, kv_tokens=3_000, capacity=CAP, live_sessions=6),
          WorkerView(B, kv_tokens=9_000, capacity=CAP, live_sessions=1))
    assert projected(ws[0], mean_session(ws)) == pytest.approx(6 * 12_000 / 7)
    for i in range(20):
        assert choose_worker(Snapshot(ws), f"s{i}", Policy(balance_factor=1.0)).worker == B


def test_a_session_counts_until_quiet_for_four_times_its_longest_pause():
    p = Policy()  # live window 60 s, quiet factor 4, at least 2 s
    assert quiet_after(0, p) == 60_000  # no pause seen yet: the live window
    assert quiet_after(3_000, p) == 12_000
    assert quiet_after(100, p) == 2_000  # a loop without tools: the floor
    assert quiet_after(20_000, p) == 60_000  # never longer than the live window


def test_ties_broken_by_rendezvous_hash():
    for i in range(50):
        sid = f"s{i}"
        d = choose_worker(Snapshot(views(0, 0, 0)), sid)
        assert d.worker == rendezvous_pick(sid, [A, B, C])


def test_an_intact_session_never_moves_for_balance():
    pin = PinView(A, epoch=3, last_cached=100, prev_cached=50, held=2_000)
    over = views(200_000, 0, 0, inflight=(50, 0, 0))
    assert choose_worker(Snapshot(over, pin), "s").outcome == "pinned"


def test_a_session_that_lost_its_prefix_on_a_full_worker_moves_where_it_fits():
    lost = PinView(A, epoch=3, last_cached=10, prev_cached=500, held=8_000)
    ws = (WorkerView(A, kv_tokens=12_000, capacity=10_000, live_sessions=3),
          WorkerView(B, kv_tokens=5_000, capacity=10_000, live_sessions=1),
          WorkerView(C, kv_tokens=1_000, capacity=10_000, live_sessions=1))
    d = choose_worker(Snapshot(ws, lost), "s")
    assert (d.worker, d.outcome, d.epoch) == (C, "moved:evicted", 4)  # B has no room for its 8,000 tokens
    # nowhere it fits: it stays (another full worker would evict it again)
    tight = (ws[0], ws[1], WorkerView(C, kv_tokens=5_000, capacity=10_000, live_sessions=1))
    assert choose_worker(Snapshot(tight, lost), "s").outcome == "pinned"
    # a worker within its capacity: the prefix loss was something else, the pin stays
    roomy = (WorkerView(A, kv_tokens=9_000, capacity=10_000, live_sessions=3),) + ws[1:]
    assert choose_worker(Snapshot(roomy, lost), "s").outcome == "pinned"


def test_overloaded_in_calls_and_prefix_lost_moves():
    lost = PinView(A, epoch=3, last_cached=10, prev_cached=500)
    d = choose_worker(Snapshot(views(0, 0, 0, inflight=(50, 0, 0)), lost), "s")
    assert d.outcome == "moved:overloaded" and d.epoch == 4 and d.worker != A
    assert choose_worker(Snapshot(views(0, 0, 0, inflight=(1, 0, 0)), lost), "s").outcome == "pinned"


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


def test_pool_fraction_is_deterministic_and_close():
    fr = {"production": 0.8, "canary": 0.2}
    picks = [pool_for_session(f"s{i}", fr) for i in range(5000)]
    assert picks == [pool_for_session(f"s{i}", fr) for i in range(5000)]
    assert 0.17 < picks.count("canary") / 5000 < 0.23


def test_adding_worker_rendezvous_moves_only_to_new():
    before = {f"s{i}": rendezvous_pick(f"s{i}", [A, B]) for i in range(300)}
    after = {s: rendezvous_pick(s, [A, B, C]) for s in before}
    assert all(after[s] in (before[s], C) for s in before)
