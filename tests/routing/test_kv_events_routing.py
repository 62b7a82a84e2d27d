"""The router consumes the workers' KV events: exact template holders, lost events, restarts."""

from __future__ import annotations

import json
import random
import time
import uuid

import httpx
import pytest

from agent_cache.bench.realfleet import free_port
from agent_cache.errors import ConfigError
from agent_cache.kv_events import KVEventBatch
from agent_cache.routing.kv_indexer import EventSource, KvIndexer, parse_sources
from agent_cache.routing.kv_state import KvState
from agent_cache.routing.router import Placement, RouteRequest, Router
from agent_cache.sim import SimWorkerThread, WorkerOptions
from agent_cache.sim.radix import RadixCache
from agent_cache.store.memory import MemoryStore

W0, W1, W2 = "http://w0", "http://w1", "http://w2"


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100_000) for _ in range(n)]


def _feed(state: KvState, url: str, cache: RadixCache, seq: int) -> int:
    state.apply(url, seq, KVEventBatch(time.time(), cache.take_events()))
    return seq + 1


@pytest.mark.parametrize("page_size", [1, 16])
def test_holders_follow_the_radix_tree_through_splits_and_evictions(page_size: int) -> None:
    rng = random.Random(page_size)
    templates = {f"t{i}": _tokens(rng, 600) for i in range(6)}
    state = KvState()
    for tid, toks in templates.items():
        state.learn_template(tid, toks)
    cache = RadixCache(6_000, page_size=page_size, enable_kv_events=True)
    seq = 0
    checked = 0
    for step in range(150):
        tid = rng.choice(list(templates)[: 2 + step // 30])
        cache.insert(templates[tid] + _tokens(rng, rng.randrange(50, 900)))
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
    toks = _tokens(rng, 400)
    state = KvState()
    state.learn_template("t", toks)
    cache = RadixCache(10_000, enable_kv_events=True)
    cache.insert(toks)
    _feed(state, W0, cache, 0)
    assert state.holders("t", [W0]) == ({W0}, {W0})
    cache.insert(_tokens(rng, 100))
    cache.take_events()  # batch 1 is lost
    cache.insert(_tokens(rng, 100))
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
    toks = _tokens(rng, 400)
    state = KvState()
    state.learn_template("t", toks)
    caches = {u: RadixCache(10_000, enable_kv_events=True) for u in (W0, W1, W2)}
    for u, c in caches.items():
        _feed(state, u, c, 0)  # every worker known, empty
    kwargs: dict = {"store": MemoryStore()} if backend == "memory" else {
        "redis_url": request.getfixturevalue("redis_url"), "prefix": f"kvev-{uuid.uuid4().hex[:8]}"}
    with Router([W0, W1, W2], probe_interval=None, release_delay=0, kv_events=state, **kwargs) as router:
        first = _route_new(router, "t")  # nobody holds it: least load
        other = next(u for u in (W0, W1, W2) if u != first)
        caches[other].insert(toks)  # ... but the events say another worker holds it (say, a prewarm)
        _feed(state, other, caches[other], 1)
        assert _route_new(router, "t") == other  # the mark on `first` is overruled: its events show no template
    with Router([W0, W1, W2], probe_interval=None, release_delay=0, **(
            {"store": MemoryStore()} if backend == "memory" else {**kwargs, "prefix": kwargs["prefix"] + "b"})) as plain:
        first = _route_new(plain, "t")
        assert _route_new(plain, "t") == first  # without events: the mark decides, as before


def test_a_tenant_with_its_own_extra_key_trusts_a_copy_only_when_no_other_template_shares_its_tokens() -> None:
    """SGLang keeps each extra_key's cache apart, and events carry no extra_key: where two learnt templates
    share their tokens (two tenants' copies of one system prompt), a worker holding the tokens may hold the
    other's copy, no hit for this tenant; a worker holding none holds nobody's copy."""
    rng = random.Random(3)
    shared, own = _tokens(rng, 400), _tokens(rng, 400)
    state = KvState()
    state.learn_template("acme:t", shared)
    state.learn_template("beta:t", shared)  # beta's system prompt is the same text
    state.learn_template("acme:u", own)
    assert state.ambiguous("acme:t") and state.ambiguous("beta:t") and not state.ambiguous("acme:u")
    caches = {u: RadixCache(10_000, enable_kv_events=True) for u in (W0, W1, W2)}
    seqs = {u: _feed(state, u, c, 0) for u, c in caches.items()}
    with Router([W0, W1, W2], store=MemoryStore(), probe_interval=None, release_delay=0, kv_events=state) as router:

        def new_session(tenant: str, tid: str) -> Placement:
            p = router.route(RouteRequest(f"s-{uuid.uuid4().hex[:8]}", template_id=tid, tenant=tenant,
                                          prompt_tokens_estimate=400))
            router.done(p)
            return p

        def cache(url: str, toks: list[int]) -> None:
            caches[url].insert(toks)
            seqs[url] = _feed(state, url, caches[url], seqs[url])

        first = new_session("acme", "acme:t").worker  # acme's copy is computed there ...
        other = next(u for u in (W0, W1, W2) if u != first)
        cache(first, shared)
        cache(other, shared)  # ... and beta's elsewhere
        caches[first] = RadixCache(10_000, enable_kv_events=True)  # first restarts: acme's copy is gone
        seqs[first] = _feed(state, first, caches[first], 0)
        # not first (its events show no copy), not other (its copy may be beta's): least load
        assert new_session("acme", "acme:t").outcome == "placed_least_load"
        assert new_session("default", "acme:t").worker == other  # no extra_key: any copy is a hit

        marked = new_session("acme", "acme:u").worker  # its mark is there, its tokens nowhere
        elsewhere = next(u for u in (W0, W1, W2) if u != marked)
        cache(elsewhere, own)  # acme's own copy, say from a prewarm: no other template has these tokens
        placed = new_session("acme", "acme:u")
        assert (placed.worker, placed.outcome) == (elsewhere, "placed_template")


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
