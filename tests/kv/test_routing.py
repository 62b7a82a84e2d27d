"""The router consumes the workers' KV events through its one seam (``KvView``, a ``CacheView``): exact template
holders, lost events, restarts, evicted sessions."""

from __future__ import annotations

import json
import random
import time
import uuid

import httpx
import pytest

from agent_cache.processes import free_port
from agent_cache.errors import ConfigError
from agent_cache.kv import EventSource, KvView, parse_sources
from agent_cache.kv.events import KVEventBatch
from agent_cache.kv.indexer import KvIndexer
from agent_cache.kv.state import KvState
from agent_cache.placement.hashing import rendezvous_pick
from agent_cache.routing.config import session_key
from agent_cache.routing.router import Placement, RouteRequest, Router
from agent_cache.sim import SimWorkerThread, WorkerOptions
from agent_cache.sim.radix import RadixCache
from agent_cache.store.base import WorkerSpec
from agent_cache.store.memory import MemoryStore

W0, W1, W2 = "http://w0", "http://w1", "http://w2"


def random_tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100_000) for _ in range(n)]


def _feed(state: KvState, url: str, cache: RadixCache, seq: int) -> int:
    state.apply(url, seq, KVEventBatch(time.time(), cache.take_events()))
    return seq + 1


@pytest.mark.parametrize("page_size", [1, 16])
def test_holders_follow_the_radix_tree_through_splits_and_evictions(page_size: int) -> None:
    rng = random.Random(page_size)
    templates = {f"t{i}": random_tokens(rng, 600) for i in range(6)}
    state = KvState()
    for tid, toks in templates.items():
        state.learn_template(tid, toks)
    cache = RadixCache(6_000, page_size=page_size, enable_kv_events=True)
    seq = 0
    checked = 0
    for step in range(150):
        tid = rng.choice(list(templates)[: 2 + step // 30])
        cache.insert(templates[tid] + random_tokens(rng, rng.randrange(50, 900)))
        seq = _feed(state, W0, cache, seq)
        for t, toks in templates.items():
            truth = cache.match_prefix(toks).length >= len(toks) // page_size * page_size * 0.9
            found = state.holders(t, [W0])
            assert found is not None
            held, known = found
            assert known == {W0}
            assert (W0 in held) == truth, (step, t)
            checked += truth
        seq = _feed(state, W0, cache, seq)  # match_prefix above may split nodes: SGLang publishes splits too
    assert checked > 100 and cache.evicted_tokens > 0
    assert state.cached_tokens(W0) is not None


def test_a_lost_batch_makes_the_worker_unknown_until_it_restarts() -> None:
    rng = random.Random(1)
    toks = random_tokens(rng, 400)
    state = KvState()
    state.learn_template("t", toks)
    cache = RadixCache(10_000, enable_kv_events=True)
    cache.insert(toks)
    _feed(state, W0, cache, 0)
    assert state.holders("t", [W0]) == ({W0}, {W0})
    cache.insert(random_tokens(rng, 100))
    cache.take_events()  # batch 1 is lost
    cache.insert(random_tokens(rng, 100))
    _feed(state, W0, cache, 2)
    assert state.holders("t", [W0]) == (set(), set()) and state.gaps == 1
    restarted = RadixCache(10_000, enable_kv_events=True)  # a restart: sequence 0, AllBlocksCleared first
    restarted.insert(toks)
    _feed(state, W0, restarted, 0)
    assert state.holders("t", [W0]) == ({W0}, {W0})
    assert state.holders("unlearned", [W0]) is None


def _route_new(router: Router, tid: str, tenant: str = "default") -> str:
    placement = router.route(RouteRequest(f"s-{uuid.uuid4().hex[:8]}", template_id=tid, tenant=tenant,
                                          prompt_tokens_estimate=400))
    router.done(placement)
    return placement.worker


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_exact_holders_replace_the_placed_once_marks(backend: str, request: pytest.FixtureRequest) -> None:
    rng = random.Random(2)
    toks = random_tokens(rng, 400)
    view = KvView()
    state = view.state
    state.learn_template("t", toks)
    caches = {u: RadixCache(10_000, enable_kv_events=True) for u in (W0, W1, W2)}
    for u, c in caches.items():
        _feed(state, u, c, 0)  # every worker known, empty
    kwargs: dict = {"store": MemoryStore()} if backend == "memory" else {
        "redis_url": request.getfixturevalue("redis_url"), "prefix": f"kvev-{uuid.uuid4().hex[:8]}"}
    with Router([W0, W1, W2], probe_interval=None, release_delay=0, kv_events=view, **kwargs) as router:
        first = _route_new(router, "t")  # nobody holds it: least load
        other = next(u for u in (W0, W1, W2) if u != first)
        caches[other].insert(toks)  # ... but the events say another worker holds it now
        _feed(state, other, caches[other], 1)
        assert _route_new(router, "t") == other  # the mark on `first` is overruled: its events show no template
    with Router([W0, W1, W2], probe_interval=None, release_delay=0, **(
            {"store": MemoryStore()} if backend == "memory" else {**kwargs, "prefix": kwargs["prefix"] + "b"})) as plain:
        first = _route_new(plain, "t")
        assert _route_new(plain, "t") == first  # without events: the mark decides, as before


def test_with_two_cache_namespaces_in_play_events_give_only_absence() -> None:
    """SGLang keeps each extra_key's cache apart (no extra_key is a namespace of its own), and events carry no
    extra_key: once a router has routed two namespaces, a worker holding a template's tokens may hold another
    namespace's copy, no hit; a worker holding none holds nobody's. With one namespace, a copy is its own."""
    rng = random.Random(3)
    toks = random_tokens(rng, 400)

    def fleet() -> tuple[KvView, dict[str, RadixCache], dict[str, int]]:
        view = KvView()
        view.learn_template_ids("t", toks)
        caches = {u: RadixCache(10_000, enable_kv_events=True) for u in (W0, W1, W2)}
        return view, caches, {u: _feed(view.state, u, c, 0) for u, c in caches.items()}

    def new_session(router: Router, tenant: str) -> Placement:
        p = router.route(RouteRequest(f"s-{uuid.uuid4().hex[:8]}", template_id="t", tenant=tenant,
                                      prompt_tokens_estimate=400))
        router.done(p)
        return p

    for tenants in (["acme"], ["default", "acme"]):
        view, caches, seqs = fleet()
        state = view.state
        with Router([W0, W1, W2], store=MemoryStore(), probe_interval=None, release_delay=0,
                    kv_events=view) as router:
            marked = [new_session(router, t).worker for t in tenants][-1]  # the template's mark is there ...
            elsewhere = next(u for u in (W0, W1, W2) if u != marked)
            caches[elsewhere].insert(toks)  # ... its tokens only elsewhere: whose copy, the events do not say
            seqs[elsewhere] = _feed(state, elsewhere, caches[elsewhere], seqs[elsewhere])
            placed = new_session(router, "acme")
            if len(tenants) == 1:  # one namespace: the copy is acme's own
                assert (placed.worker, placed.outcome) == (elsewhere, "placed_template")
            else:  # two: not the marked worker (its events show no copy), not elsewhere (maybe not acme's)
                assert placed.outcome == "placed_least_load"


def test_event_sources_are_checked_and_named_as_the_workers_are() -> None:
    assert parse_sources(" http://w0:30000/v1/ = tcp://w0:5557 |ipc:///tmp/r ") == {
        "http://w0:30000": EventSource("tcp://w0:5557", "ipc:///tmp/r")}
    for bad, said in [("", "at least one"), ("http://w0=w0:5557", "not a ZeroMQ endpoint"),
                      ("http://w0=tcp://a:1,http://w0/=tcp://a:2", "named twice"), ("http://w0", "expected URL=")]:
        with pytest.raises(ConfigError, match=said) as err:
            parse_sources(bad)
        assert err.value.field == "kv_events"


def test_the_indexer_follows_a_sim_worker_and_its_restart() -> None:
    pub, replay = free_port(), free_port()
    config = {"publisher": "zmq", "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}
    worker = SimWorkerThread(WorkerOptions(time_scale=0.0, kv_events_config=json.dumps(config)))
    worker.start()
    state = KvState()
    sources = parse_sources(f"{worker.url}=tcp://127.0.0.1:{pub}|tcp://127.0.0.1:{replay}")
    assert sources == {worker.url: EventSource(f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")}
    indexer = KvIndexer(state, sources).start()
    system = " ".join(f"rule {i}: check the file before editing it." for i in range(40))
    try:
        with httpx.Client(base_url=worker.url, timeout=10) as client:
            template = client.post("/tokenize", json={"messages": [{"role": "system", "content": system}]}).json()
            state.learn_template("sys", template["tokens"][:-8])
            deadline = time.time() + 10
            while time.time() < deadline and state.holders("sys", [worker.url]) != ({worker.url}, {worker.url}):
                body = {"model": "m", "max_tokens": 2,
                        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "go"}]}
                client.post("/v1/chat/completions", json=body).raise_for_status()
                time.sleep(0.1)
            assert state.holders("sys", [worker.url]) == ({worker.url}, {worker.url})
            assert indexer.batches >= 1 and indexer.bad == 0
            worker.stop()
            worker.start()  # the same port, an empty cache, a new publisher from sequence 0
            deadline, i = time.time() + 10, 0
            while time.time() < deadline and state.holders("sys", [worker.url]) != (set(), {worker.url}):
                i += 1  # a new prompt each time: a prefill pass that stores something publishes a batch
                body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"hello {i}"}]}
                client.post("/v1/chat/completions", json=body).raise_for_status()
                time.sleep(0.1)
            assert state.holders("sys", [worker.url]) == (set(), {worker.url})
    finally:
        indexer.close()
        worker.stop()


def test_a_session_prefix_is_held_then_gone_as_the_worker_evicts_it() -> None:
    """A session's prefix, fingerprinted at both of its own ends: its last message's end resident -> "held"
    (a radix tree evicts leaves first, so the path to it is there too); only that leaf evicted -> not known
    (part of it is left: staying is cheaper); its first message's start evicted as well -> "gone"; a
    fingerprint never seen resident since it was learnt (its events not in yet) is never "gone"."""
    rng = random.Random(4)
    history, tail = random_tokens(rng, 1_500), random_tokens(rng, 300)
    head = history[:300]
    state = KvState()
    cache = RadixCache(4_000, enable_kv_events=True)
    seq = _feed(state, W0, cache, 0)
    state.learn_session("default", "s1", tail, W0, head_ids=head)  # learnt before its blocks are stored
    assert state.session_prefix("default", "s1", W0) == ""
    cache.insert(history + tail)
    seq = _feed(state, W0, cache, seq)
    assert state.session_prefix("default", "s1", W0) == "held"
    assert state.session_prefix("default", "s1", W1) == ""  # learnt on W0 only
    cache.insert(history + random_tokens(rng, 2_300))  # another branch off its history: LRU evicts s1's leaf only
    seq = _feed(state, W0, cache, seq)
    assert cache.match_prefix(history + tail).length == len(history)
    assert state.session_prefix("default", "s1", W0) == ""  # its history is left: not gone
    cache.insert(random_tokens(rng, 4_000))  # other sessions' calls: all of it goes
    seq = _feed(state, W0, cache, seq)
    assert cache.match_prefix(history).length == 0
    assert state.session_prefix("default", "s1", W0) == "gone"
    specs = state.annotate(None, (WorkerSpec(W0), WorkerSpec(W1)), session=("default", "s1"))
    assert [s.prefix for s in specs] == ["gone", ""] and state.prefixes_gone == 1
    state.learn_session("default", "s2", tail[:15], W0, head_ids=tail[:15])  # shorter than an anchor window
    assert state.sessions == 1
    state.learn_session("default", "s1", tail, W0, head_ids=head)
    cache.insert(history + tail)
    seq = _feed(state, W0, cache, seq)
    assert state.session_prefix("default", "s1", W0) == "held"
    state.learn_session("acme", "s9", tail, W0)  # another session's last message, the same text
    assert state.session_prefix("default", "s1", W0) == ""  # resident, but the copy may be s9's
    state.forget_session("acme", "s9")
    assert state.session_prefix("default", "s1", W0) == "held"
    restarted = RadixCache(4_000, enable_kv_events=True)  # a restart: AllBlocksCleared, sequence 0
    _feed(state, W0, restarted, 0)
    assert state.session_prefix("default", "s1", W0) == "gone"


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_an_evicted_session_moves_before_its_next_step_and_a_resident_one_stays(
        backend: str, request: pytest.FixtureRequest) -> None:
    """Its worker past capacity: the events' "gone" moves the session at once, where the reported cached
    tokens would move it only after a step that missed; a drop reported while the events show the prefix
    resident again (that step prefilled it) moves nothing. Without events: today's rule."""
    rng = random.Random(5)
    history, tail = random_tokens(rng, 1_500), random_tokens(rng, 300)
    urls = [W0, W1, W2]
    first = rendezvous_pick(session_key("s1"), urls)  # where an idle fleet places s1 (ties: the hash)
    assert first is not None
    caps = {u: 5_000 if u == first else 50_000 for u in urls}
    outcomes: dict[bool, list[str]] = {}
    for events in (True, False):
        view = KvView()
        state = view.state
        caches = {u: RadixCache(4_000, enable_kv_events=True) for u in urls}
        seqs = {u: _feed(state, u, c, 0) for u, c in caches.items()}
        kwargs: dict = {"store": MemoryStore()} if backend == "memory" else {
            "redis_url": request.getfixturevalue("redis_url"), "prefix": f"kvs-{uuid.uuid4().hex[:8]}"}
        seen = []
        with Router(urls, probe_interval=None, release_delay=0, capacities=caps,
                    kv_events=view if events else None, **kwargs) as router:

            def step(prompt: int, cached: int) -> Placement:
                p = router.route(RouteRequest("s1", template_id="t", prompt_tokens_estimate=3_000))
                router.done(p)
                router.report(p, prompt_tokens=prompt, cached_tokens=cached)
                seen.append(p.outcome)
                return p

            p = step(9_000, 0)  # placed on `first`, now past its capacity
            assert p.worker == first
            caches[first].insert(history + tail)
            seqs[first] = _feed(state, first, caches[first], seqs[first])
            state.learn_session("default", session_key("s1"), tail, first, head_ids=history[:300])
            step(9_200, 8_900)  # pinned: intact, by both the events and the report
            caches[first].insert(random_tokens(rng, 3_000))  # evicted, before s1's next step
            seqs[first] = _feed(state, first, caches[first], seqs[first])
            p = step(9_400, 100)
            if events:
                caches[p.worker].insert(history + tail)  # the moved step prefilled it there
                seqs[p.worker] = _feed(state, p.worker, caches[p.worker], seqs[p.worker])
                state.learn_session("default", session_key("s1"), tail, p.worker, head_ids=history[:300])
        outcomes[events] = seen
    assert outcomes[True] == ["placed_least_load", "pinned", "moved:evicted"], outcomes
    # without events the miss is found only in the reported usage: the step that missed stays, the next moves
    assert outcomes[False] == ["placed_least_load", "pinned", "pinned"], outcomes


def test_a_router_takes_only_a_view_of_the_workers_caches_and_a_view_fed_directly_learns_as_its_learner() -> None:
    """``Router(kv_events=...)`` takes the seam's shape (``KvView``), not the state inside it; a view fed
    directly (a simulation knowing the token ids) learns a session's ends less their edges, as from a worker."""
    with pytest.raises(ConfigError, match="KvView") as err:
        Router([W0], probe_interval=None, kv_events=KvState())  # type: ignore[arg-type]
    assert err.value.field == "kv_events"
    rng = random.Random(7)
    history, tail = random_tokens(rng, 1_500), random_tokens(rng, 300)
    view, edged = KvView(), KvState()
    cache = RadixCache(4_000, enable_kv_events=True)
    cache.insert(history + tail)
    view.apply(W0, 0, KVEventBatch(time.time(), cache.take_events()))
    view.learn_session_ids("default", "s1", W0, tail, history[:300])
    edged.learn_session("default", "s1", tail[8:-8], W0, head_ids=history[8:292])
    assert view.state.session_prefix("default", "s1", W0) == "held"
    assert view.state._sessions[("default", "s1")].tail == edged._sessions[("default", "s1")].tail
    specs = view.mark((WorkerSpec(W0), WorkerSpec(W1)), None, namespace=None, session=("default", "s1"))
    assert [s.prefix for s in specs] == ["held", ""]
    view.close()
