"""The Redis store against a real redis-server."""

from __future__ import annotations

import multiprocessing as mp
import random

import pytest
import redis

from agent_cache.errors import ConfigError, StoreUnavailableError
from agent_cache.placement.rule import Policy
from agent_cache.routing.releases import PendingReleases
from agent_cache.store import MemoryStore, RedisStore, RouteQuery, WorkerSpec
from agent_cache.store.base import UsageReport

A, B, C = "http://a:1", "http://b:1", "http://c:1"
WS = (WorkerSpec(A, capacity=10_000), WorkerSpec(B, capacity=10_000), WorkerSpec(C, capacity=10_000))
P = Policy()


def q(sid: str, tid: str | None = "t1", tenant: str = "default", workers=WS, est: int = 0) -> RouteQuery:
    return RouteQuery(tenant, sid, tid, "default", workers, est)


def test_pin_report_release(redis_server, prefix):
    st = RedisStore(redis_server.url, prefix=prefix)
    r1 = st.route(q("s1", est=1000), P, 100.0)
    r2 = st.route(q("s1"), P, 101.0)
    assert (r2.worker, r2.outcome, r2.epoch) == (r1.worker, "pinned", 1)
    st.release(r1.worker, 101.0)
    st.report("default", "s1", r1.worker, r1.epoch, "t1", 1500, 900, 102.0)
    w = st.stats(102.0)["workers"][r1.worker]
    assert (w["inflight"], w["kv_tokens"], w["sessions"], w["cached_tokens"]) == (1, 1500, 1, 900)
    rec = st.get_session("default", "s1", 102.0)
    assert rec["worker"] == r1.worker and rec["steps"] == 2 and rec["last_cached"] == 900
    st.close()


def test_keys_are_hash_tagged_and_tenant_namespaced(redis_server, prefix):
    st = RedisStore(redis_server.url, prefix=prefix)
    st.route(q("s1", tenant="acme:corp"), P, 0.0)
    st.route(q("s1", tenant="globex"), P, 0.0)
    raw = redis.Redis.from_url(redis_server.url)
    ks = sorted(k.decode() for k in raw.keys(f"{{{prefix}}}*"))
    assert all(k.startswith(f"{{{prefix}}}:") for k in ks)
    assert f"{{{prefix}}}:s:acme%3Acorp:s1" in ks and f"{{{prefix}}}:s:globex:s1" in ks
    assert st.get_session("acme", "s1", 0.0) is None
    # no prompt text anywhere: only ids, URLs and counts
    assert st.template_info("acme:corp", "t1") is None


def test_template_registry_methods(redis_server, prefix):
    st = RedisStore(redis_server.url, prefix=prefix)
    st.record_template("default", "t9", 1200, "s1", 5.0)
    st.record_template("default", "t9", 1300, "s2", 6.0)
    st.record_template("default", "t9", 1300, "s2", 7.0)
    assert st.template_info("default", "t9") == {"first_seen": 5.0, "sessions": 2, "token_length": 1300}
    assert st.template_info("default", "nope") is None


def test_pins_survive_new_store_object(redis_server, prefix):
    first = RedisStore(redis_server.url, prefix=prefix)
    placed = {f"s{i}": first.route(q(f"s{i}"), P, 10.0).worker for i in range(30)}
    first.close()
    second = RedisStore(redis_server.url, prefix=prefix)
    for sid, worker in placed.items():
        r = second.route(q(sid), P, 11.0)
        assert (r.worker, r.outcome) == (worker, "pinned")


@pytest.mark.parametrize(
    "url",
    ["", "http://localhost:6379", "redis://", "redis://host:notaport/0", "unix://", "redis+sentinel://h:26379"],
)
def test_bad_url_is_config_error(url):
    with pytest.raises(ConfigError) as e:
        RedisStore(url)
    assert e.value.field == "redis_url"


def test_down_redis_fails_fast_as_unavailable():
    import time

    st = RedisStore("redis://127.0.0.1:1/0")
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailableError):
        st.route(q("s1"), P, 0.0)
    assert time.monotonic() - t0 < 1.0


async def test_async_face(redis_server, prefix):
    st = RedisStore(redis_server.url, prefix=prefix)
    r1 = await st.aroute(q("s1", est=10), P, 0.0)
    r2 = await st.aroute(q("s1"), P, 1.0)
    assert r2.worker == r1.worker and r2.outcome == "pinned"
    await st.areport("default", "s1", r1.worker, 1, "t1", 20, 5, 2.0)
    await st.arelease(r1.worker, 2.0)
    await st.aping()
    assert st.stats(2.0)["workers"][r1.worker]["inflight"] == 1
    await st.aclose()


# --- the Lua script and the Python rule agree ------------------------------------


def _scenario(seed: int, memory: MemoryStore, rstore: RedisStore, marks: bool = False) -> int:
    """``marks``: the workers carry random KV event marks (template held/lacks, session prefix held/gone)."""
    rng = random.Random(seed)
    urls = [f"http://w{i}:8000" for i in range(rng.randint(2, 5))]
    caps = {u: rng.choice([1000, 5000, 20000]) for u in urls}
    policy = Policy(live_window=rng.choice([1.0, 5.0, 60.0]), quiet_factor=rng.choice([1.0, 4.0]),
                    min_quiet=rng.choice([0.0, 2.0]), balance_factor=rng.choice([1.0, 1.25, 2.0]),
                    move_factor=rng.choice([1.0, 2.0]), slack=rng.choice([0.0, 1.0, 2.0]))
    now = 1_000.0
    live: list[tuple[str, str, int, str, str | None]] = []
    ledger = PendingReleases()  # releases carried by the next route or report, as the router does
    queued: list[UsageReport] = []  # usage reports carried by the next route, as the router does
    compared = 0
    for _ in range(120):
        op = rng.random()
        now += rng.choice([0.001, 0.5, 3.0, 40.0])
        if op < 0.6:
            states = {u: rng.choices(["up", "down", "draining"], [8, 1, 1])[0] for u in urls}
            present = [u for u in urls if rng.random() > 0.05]
            workers = tuple(WorkerSpec(u, states[u], caps[u]) for u in present)
            if marks:
                workers = tuple(WorkerSpec(w.url, w.state, w.capacity, rng.choice(["", "held", "lacks"]),
                                           rng.choice(["", "", "held", "gone"])) for w in workers)
            tenant = rng.choice(["default", "acme"])
            sid = f"s{rng.randint(0, 15)}"
            query = RouteQuery(tenant, sid, rng.choice([None, "t1", "t2", "t3"]), "default", workers, rng.randint(0, 3000))
            batch = ledger.take()
            a = memory.route(query, policy, now, batch, reports=queued)
            b = rstore.route(query, policy, now, batch, reports=queued)
            queued = []
            if rng.random() < 0.8:  # else: as if the reply timed out, so the batch goes again
                ledger.acknowledge(batch)
            assert a == b, (seed, query)
            compared += 1
            if a.worker:
                live.append((tenant, sid, a.epoch, a.worker, query.template_id))
        elif op < 0.8 and live:
            tenant, sid, epoch, worker, _ = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.5:
                memory.release(worker, now)
                rstore.release(worker, now)
            else:
                ledger.add(worker)
        elif live and rng.random() < 0.25:  # the call failed: undo the placement (a no-op for a pin)
            tenant, sid, epoch, worker, tid = rng.choice(live)
            batch = ledger.take()
            memory.abandon(tenant, sid, worker, epoch, tid, now, batch)
            rstore.abandon(tenant, sid, worker, epoch, tid, now, batch)
            ledger.acknowledge(batch)
            a_rec, b_rec = memory.get_session(tenant, sid, now), rstore.get_session(tenant, sid, now)
            assert (a_rec is None) == (b_rec is None), (seed, sid)
        elif live:
            tenant, sid, epoch, worker, _ = rng.choice(live)
            p = rng.randint(100, 4000)
            c = rng.randint(0, p)
            tid = rng.choice([None, "t1", "t2"])
            if rng.random() < 0.5:
                queued.append(UsageReport(tenant, sid, worker, epoch, tid, p, c, now))
                continue
            batch = ledger.take()
            memory.report(tenant, sid, worker, epoch, tid, p, c, now, batch)
            rstore.report(tenant, sid, worker, epoch, tid, p, c, now, batch)
            ledger.acknowledge(batch)
    ma, rb = memory.stats(now), rstore.stats(now)
    for url, w in ma["workers"].items():
        for field in ("inflight", "kv_tokens", "live_sessions", "sessions", "prompt_tokens", "cached_tokens"):
            assert w[field] == rb["workers"].get(url, {}).get(field, 0), (seed, url, field)
    assert ma["outcomes"] == rb["outcomes"]
    assert ma["uncached_per_call"] == rb["uncached_per_call"], seed  # what a call in flight weighs
    for tid in ("default/t1", "default/t2", "default/t3", "acme/t1", "acme/t2", "acme/t3"):
        assert (ma["templates"].get(tid, {}).get("workers") == rb["templates"].get(tid, {}).get("workers")), (seed, tid)
    return compared


def test_lua_script_matches_python_rule(redis_server):
    total = 0
    moves: dict[str, int] = {}
    for seed in range(40):
        memory = MemoryStore(session_ttl=60.0, template_window=30.0)
        rstore = RedisStore(redis_server.url, prefix=f"eq-{seed}-{random.random()}", session_ttl=60.0, template_window=30.0)
        total += _scenario(seed, memory, rstore)
        for outcome, count in memory.stats(0)["outcomes"].items():
            moves[outcome] = moves.get(outcome, 0) + count
        rstore.close()
    assert total > 2000
    assert moves.get("placed_template", 0) > 0 and moves.get("moved:unhealthy", 0) > 0, moves


def test_lua_script_matches_python_rule_with_kv_event_marks(redis_server):
    """The marks a router fed KV events adds (template held / lacks, the session's prefix held / gone)."""
    total = 0
    moves: dict[str, int] = {}
    for seed in range(20):
        memory = MemoryStore(session_ttl=60.0, template_window=30.0)
        rstore = RedisStore(redis_server.url, prefix=f"eqm-{seed}-{random.random()}", session_ttl=60.0,
                            template_window=30.0)
        total += _scenario(1000 + seed, memory, rstore, marks=True)
        for outcome, count in memory.stats(0)["outcomes"].items():
            moves[outcome] = moves.get(outcome, 0) + count
        rstore.close()
    assert total > 1000
    assert moves.get("moved:evicted", 0) > 0 and moves.get("placed_template", 0) > 0, moves


def test_kv_events_prefix_marks_move_an_evicted_session_at_once_and_keep_a_resident_one(redis_server, prefix):
    """"gone": moved before any drop is reported; "held": a reported drop moves nothing (that step
    prefilled the prefix again). Both stores alike."""
    urls = ["http://x:1", "http://y:1", "http://z:1"]
    results = []
    for store in (MemoryStore(), RedisStore(redis_server.url, prefix=prefix)):
        r = store.route(RouteQuery("default", "s1", "t1", "default",
                                   tuple(WorkerSpec(u, "up", 20_000) for u in urls), 3_000), P, 0.0)
        first = r.worker
        spec = lambda mark: tuple(WorkerSpec(u, "up", 5_000 if u == first else 20_000,  # noqa: E731
                                             prefix=mark if u == first else "") for u in urls)
        store.report("default", "s1", first, r.epoch, "t1", 9_000, 2_000, 1.0)  # past 5,000 there
        store.report("default", "s1", first, r.epoch, "t1", 9_500, 8_900, 2.0)  # intact, as reported
        out = [store.route(RouteQuery("default", "s1", "t1", "default", spec(""), 0), P, 3.0),
               store.route(RouteQuery("default", "s1", "t1", "default", spec("held"), 0), P, 3.1),
               store.route(RouteQuery("default", "s1", "t1", "default", spec("gone"), 0), P, 3.2)]
        moved_to = out[-1].worker
        store.report("default", "s1", moved_to, out[-1].epoch, "t1", 9_800, 5_000, 4.0)
        store.report("default", "s1", moved_to, out[-1].epoch, "t1", 9_900, 50, 5.0)  # a drop, reported...
        held = tuple(WorkerSpec(u, "up", 5_000 if u == moved_to else 20_000, prefix="held" if u == moved_to else "")
                     for u in urls)
        out.append(store.route(RouteQuery("default", "s1", "t1", "default", held, 0), P, 6.0))  # ... resident again
        out.append(store.route(RouteQuery("default", "s1", "t1", "default", tuple(
            WorkerSpec(w.url, w.state, w.capacity) for w in held), 0), P, 7.0))  # no events: the drop decides
        results.append((first, [(x.worker, x.outcome) for x in out]))
        store.close()
    assert results[0] == results[1]
    first, seen = results[0]
    assert [o for _, o in seen] == ["pinned", "pinned", "moved:evicted", "pinned", "moved:evicted"], seen
    assert seen[2][0] != first


def test_lua_and_python_move_a_session_that_lost_its_prefix_alike(redis_server, prefix):
    """The rebalancing paths (evicted, overloaded) on a fixed script, through both stores."""
    urls = ["http://x:1", "http://y:1", "http://z:1"]

    def workers(cap_first: int) -> tuple[WorkerSpec, ...]:
        return tuple(WorkerSpec(u, "up", cap_first if i == 0 else 20_000) for i, u in enumerate(urls))

    results = []
    for store in (MemoryStore(), RedisStore(redis_server.url, prefix=prefix)):
        out = []
        r = store.route(RouteQuery("default", "s1", "t1", "default", workers(20_000), 3_000), P, 0.0)
        first = r.worker
        ordered = [first] + [u for u in urls if u != first]  # the pinned worker first: capacities follow it
        spec = lambda cap: tuple(WorkerSpec(u, "up", cap if u == first else 20_000) for u in ordered)  # noqa: E731
        store.report("default", "s1", first, r.epoch, "t1", 9_000, 2_000, 1.0)
        store.report("default", "s1", first, r.epoch, "t1", 9_500, 100, 2.0)  # the prefix was lost
        # its worker is past a capacity of 5,000 and another has room: evicted
        out.append(store.route(RouteQuery("default", "s1", "t1", "default", spec(5_000), 0), P, 3.0))
        moved_to = out[-1].worker
        store.report("default", "s1", moved_to, out[-1].epoch, "t1", 9_800, 5_000, 4.0)
        store.report("default", "s1", moved_to, out[-1].epoch, "t1", 9_900, 50, 5.0)
        for k in range(12):  # calls pile up in flight there: overloaded once past 2 x the mean + 2
            out.append(store.route(RouteQuery("default", "s1", "t1", "default", spec(20_000), 0), P, 6.0 + k))
        results.append((first, [(x.worker, x.outcome, x.epoch) for x in out]))
        store.close()
    assert results[0] == results[1]
    outcomes = [o for _, o, _ in results[0][1]]
    assert outcomes[0] == "moved:evicted" and "moved:overloaded" in outcomes, outcomes


def _live_sessions(store, now: float) -> int:
    """Sessions counted in a footprint, over all workers."""
    return sum(w["live_sessions"] for w in store.stats(now)["workers"].values())


def test_a_session_counts_in_the_footprint_until_quiet_for_four_times_its_longest_pause(redis_server, prefix):
    """Agent sessions end without saying so: one that paused 2 s between calls is done after 8 s of quiet."""

    seen = []
    for store in (MemoryStore(), RedisStore(redis_server.url, prefix=prefix)):
        r = store.route(q("s1", est=1000), P, 0.0)
        store.report("default", "s1", r.worker, r.epoch, "t1", 1200, 0, 1.0)  # no pause yet: the live window
        store.route(q("s1"), P, 3.0)  # a 2 s pause (tool time)
        store.report("default", "s1", r.worker, r.epoch, "t1", 1500, 1000, 4.0)  # counted until 4 + 4 x 2
        store.route(q("s2", tid="t2"), P, 11.9)
        at_11_9 = _live_sessions(store, 11.9)
        store.route(q("s3", tid="t3"), P, 12.1)  # the next decision takes s1 out
        at_12_1 = _live_sessions(store, 12.1)
        kv = store.stats(12.1)["workers"][r.worker]["kv_tokens"]
        back = store.route(q("s1"), P, 13.0)  # and its next call brings it back, still pinned
        seen.append((at_11_9, at_12_1, kv, back.outcome, _live_sessions(store, 13.0)))
        store.close()
    assert seen[0] == seen[1]
    assert seen[0][:2] == (2, 2) and seen[0][3:] == ("pinned", 3), seen  # s1 and s2; then s2 and s3
    assert seen[0][2] == 0  # s1's 1,500 tokens no longer count on its worker (s2 and s3 hold none)


def test_a_session_with_a_call_still_running_stays_in_the_footprint(redis_server, prefix):
    """Two calls of one session in flight: the first one's report does not end the session's count."""

    seen = []
    for store in (MemoryStore(), RedisStore(redis_server.url, prefix=prefix)):
        r = store.route(q("s1", est=1000), P, 0.0)
        store.report("default", "s1", r.worker, r.epoch, "t1", 1200, 0, 1.0)
        store.route(q("s1"), P, 1.5)  # call 2
        store.route(q("s1"), P, 1.6)  # call 3, in parallel
        store.report("default", "s1", r.worker, r.epoch, "t1", 1500, 1000, 3.0)  # call 2 ends; call 3 runs on
        store.route(q("s2", tid="t2"), P, 5.5)  # past 3.0 + the 2 s quiet time
        running = _live_sessions(store, 5.5)
        store.report("default", "s1", r.worker, r.epoch, "t1", 1600, 1200, 6.0)  # call 3 ends
        store.route(q("s3", tid="t3"), P, 8.5)  # past 6.0 + 2 s: s1 has gone quiet
        seen.append((running, _live_sessions(store, 8.5)))
        store.close()
    assert seen[0] == seen[1] == (2, 2), seen  # s1 and s2; then s2 and s3


# --- many processes placing the same new sessions at once ------------------------


def _racer(url: str, prefix: str, start, out) -> None:
    st = RedisStore(url, prefix=prefix, socket_timeout=5.0)
    start.wait()
    placed = {}
    for i in range(200):
        placed[f"s{i}"] = st.route(q(f"s{i}", tid=f"t{i % 3}"), P, 50.0).worker
    out.put(placed)


@pytest.mark.slow
def test_32_processes_agree_on_every_new_session(redis_server, prefix):
    ctx = mp.get_context("fork")
    start = ctx.Event()
    out = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(redis_server.url, prefix, start, out)) for _ in range(32)]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    first = results[0]
    assert all(r == first for r in results)
    st = RedisStore(redis_server.url, prefix=prefix)
    stats = st.stats(50.0)
    assert stats["sessions"] == 200
    assert sum(w["inflight"] for w in stats["workers"].values()) == 32 * 200
    outcomes = stats["outcomes"]
    assert outcomes["pinned"] == 31 * 200


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_a_release_batch_delivered_twice_counts_once(kind, redis_server, prefix):
    """A write that timed out after Redis ran it is sent again: its releases must not apply twice."""
    st = MemoryStore() if kind == "memory" else RedisStore(redis_server.url, prefix=prefix)
    placed = [st.route(q(f"s{i}", workers=WS[:1]), P, 1.0) for i in range(4)]
    assert st.stats(1.0)["workers"][A]["inflight"] == 4
    ledger = PendingReleases()
    ledger.add(A)
    first = ledger.take()
    st.route(q("s0", workers=WS[:1]), P, 2.0, first)  # reached the store, but the reply was lost
    ledger.add(A)
    again = ledger.take()  # the lost one again, and a new one
    assert (again.totals[A], again.deltas[A]) == (2, 2)
    st.route(q("s1", workers=WS[:1]), P, 3.0, again)
    ledger.acknowledge(again)
    st.release_many(again, 4.0)  # delivered a third time: still nothing more
    # 4 placed + 2 pinned calls, 2 released once each
    assert st.stats(4.0)["workers"][A]["inflight"] == 4
    assert ledger.take() is None and placed[0].worker == A
