"""The in-process store: pins, moves, accounting, expiry, tenants, templates."""

from __future__ import annotations

import threading

from agent_cache.placement.rule import Policy
from agent_cache.store import MemoryStore, RouteQuery, WorkerSpec

A, B = "http://a:1", "http://b:1"
WS = (WorkerSpec(A, capacity=10_000), WorkerSpec(B, capacity=10_000))
P = Policy()


def q(sid: str, tid: str | None = "t1", tenant: str = "default", workers=WS, est: int = 0) -> RouteQuery:
    return RouteQuery(tenant, sid, tid, "default", workers, est)


def test_pin_and_accounting():
    st = MemoryStore()
    r1 = st.route(q("s1", est=1000), P, 100.0)
    assert r1.outcome in ("placed_least_load", "placed_template") and r1.epoch == 1
    r2 = st.route(q("s1"), P, 101.0)
    assert (r2.worker, r2.outcome) == (r1.worker, "pinned")
    s = st.stats(101.0)["workers"][r1.worker]
    assert s["inflight"] == 2 and s["kv_tokens"] == 1000 and s["sessions"] == 1
    st.release(r1.worker, 102.0)
    st.release(r1.worker, 102.0)
    st.release(r1.worker, 102.0)  # never negative
    st.report("default", "s1", r1.worker, r1.epoch, "t1", 1500, 900, 102.0)
    s = st.stats(102.0)["workers"][r1.worker]
    assert s["inflight"] == 0 and s["kv_tokens"] == 1500 and s["cached_tokens"] == 900
    rec = st.get_session("default", "s1", 102.0)
    assert rec["steps"] == 2 and rec["last_cached"] == 900 and rec["worker"] == r1.worker


def test_second_session_of_template_goes_to_holder():
    st = MemoryStore()
    r1 = st.route(q("s1"), P, 0.0)
    st.release(r1.worker, 0.0)
    r2 = st.route(q("s2"), P, 1.0)
    assert (r2.worker, r2.outcome) == (r1.worker, "placed_template")


def test_idle_session_expires_with_injected_clock():
    st = MemoryStore(session_ttl=60.0)
    r = st.route(q("s1", est=500), P, 0.0)
    st.release(r.worker, 0.0)
    assert st.get_session("default", "s1", 59.0) is not None
    st.route(q("s1"), P, 59.0)  # use refreshes the TTL
    assert st.get_session("default", "s1", 118.0) is not None
    assert st.get_session("default", "s1", 120.0) is None
    assert st.stats(120.0)["workers"][r.worker]["kv_tokens"] == 500  # reads never write
    st.route(q("s2"), P, 120.0)  # the next decision purges what expired
    stats = st.stats(120.0)
    assert stats["sessions"] == 1 and stats["workers"][r.worker]["kv_tokens"] == 0


def test_move_on_unhealthy_bumps_epoch_and_moves_tokens():
    st = MemoryStore()
    r = st.route(q("s1", est=700), P, 0.0)
    other = B if r.worker == A else A
    down = tuple(WorkerSpec(w.url, "down" if w.url == r.worker else "up", w.capacity) for w in WS)
    m = st.route(q("s1", workers=down), P, 1.0)
    assert (m.worker, m.outcome, m.epoch, m.previous) == (other, "moved:unhealthy", 2, r.worker)
    w = st.stats(1.0)["workers"]
    assert w[r.worker]["kv_tokens"] == 0 and w[other]["kv_tokens"] == 700
    # a report for the old placement does not touch the moved pin
    st.report("default", "s1", r.worker, r.epoch, "t1", 100, 100, 2.0)
    assert st.get_session("default", "s1", 2.0)["last_cached"] == 0


def test_tenants_are_separate():
    st = MemoryStore()
    st.route(q("s1", tenant="acme"), P, 0.0)
    assert st.get_session("acme", "s1", 0.0) is not None
    assert st.get_session("default", "s1", 0.0) is None
    # template held for acme does not attract globex's sessions
    st.route(q("g1", tenant="globex", tid="t1"), P, 1.0)
    assert st.stats(1.0)["outcomes"].get("placed_template", 0) == 0


def test_template_registry_methods():
    st = MemoryStore()
    assert st.template_info("default", "t9") is None
    st.record_template("default", "t9", 1200, "s1", 5.0)
    st.record_template("default", "t9", 1200, "s1", 6.0)
    st.record_template("default", "t9", 1200, "s2", 7.0)
    st.record_template("default", "t9", 1200, None, 8.0)
    assert st.template_info("default", "t9") == {"first_seen": 5.0, "sessions": 2, "token_length": 1200}
    assert st.template_info("other", "t9") is None


def test_threads_racing_on_one_session_agree():
    st = MemoryStore()
    seen: list[str] = []
    barrier = threading.Barrier(16)

    def run() -> None:
        barrier.wait()
        seen.append(st.route(q("race"), P, 0.0).worker)

    ts = [threading.Thread(target=run) for _ in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(set(seen)) == 1


def test_abandon_undoes_a_failed_placement_and_restores_the_template_mark():
    st = MemoryStore()
    r1 = st.route(q("s1", est=1000), P, 100.0)
    st.report("default", "s1", r1.worker, r1.epoch, "t1", 1200, 0, 101.0)  # s1 served: r1.worker holds t1
    st.release(r1.worker, 101.0)
    r2 = st.route(q("s2", est=5000), P, 102.0)
    before = st.stats(102.0)["workers"][r2.worker]
    assert before["inflight"] == 1 and before["sessions"] >= 1
    st.abandon("default", "s2", r2.worker, r2.epoch, "t1", 103.0, {r2.worker: 1})
    assert st.get_session("default", "s2", 103.0) is None
    after = st.stats(103.0)["workers"][r2.worker]
    assert after["inflight"] == 0 and after["sessions"] == before["sessions"] - 1
    assert after["kv_tokens"] == before["kv_tokens"] - 5000 and after["live_sessions"] == before["live_sessions"] - 1
    # the mark s2's placement set is undone; the one s1's call earned stays
    assert st.stats(103.0)["templates"]["default/t1"]["workers"] == [r1.worker]
    assert st.get_session("default", "s1", 103.0)["worker"] == r1.worker


def test_abandon_leaves_a_pin_that_a_later_placement_owns_alone():
    st = MemoryStore()
    r1 = st.route(q("s1", est=1000), P, 100.0)
    st.abandon("default", "s1", r1.worker, r1.epoch + 1, "t1", 101.0)  # not this placement's epoch
    assert st.get_session("default", "s1", 101.0)["worker"] == r1.worker
    other = B if r1.worker == A else A
    st.abandon("default", "s1", other, r1.epoch, "t1", 101.0)  # nor its worker
    assert st.get_session("default", "s1", 101.0) is not None
