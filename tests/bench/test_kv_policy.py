"""agent-cache-kv in the fleet simulation: the workers' KV events reach the routers."""

from __future__ import annotations

from agent_cache.bench.fleetsim import FleetConfig, simulate
from agent_cache.bench.policies import AgentCacheKv
from agent_cache.bench.registry import make_policies
from agent_cache.bench.workloads import WorkloadParams, generate


def test_the_kv_policy_learns_every_worker_and_sends_only_the_sessions_calls() -> None:
    ss = generate(WorkloadParams(sessions=40, rate=20, seed=3))
    cfg = FleetConfig(workers=3, capacity_tokens=60_000)
    (pol,) = make_policies(["agent-cache-kv"], 3, 1, 0, capacity=60_000)
    assert isinstance(pol, AgentCacheKv)
    res = simulate(ss, pol, cfg)
    assert res.sessions_done == 40 and res.calls > 40
    assert all(pol.kv.state.known(u) for u in pol.urls) and pol.kv.state.gaps == 0 and res.kv_events["event_gaps"] == 0
    assert sum(pol.kv.state.cached_tokens(u) or 0 for u in pol.urls) > 0
    (plain,) = make_policies(["agent-cache"], 3, 1, 0, capacity=60_000)
    assert simulate(ss, plain, cfg).calls == res.calls


def test_the_kv_policy_learns_sessions_last_messages_and_finds_evicted_prefixes_under_pressure() -> None:
    ss = generate(WorkloadParams(sessions=60, rate=20, seed=4))
    cfg = FleetConfig(workers=3, capacity_tokens=12_000)  # tight: sessions' prefixes are evicted
    (pol,) = make_policies(["agent-cache-kv"], 3, 1, 0, capacity=12_000)
    assert isinstance(pol, AgentCacheKv)
    res = simulate(ss, pol, cfg)
    assert res.sessions_done == 60 and res.evicted_tokens > 0
    assert pol.kv.state.sessions > 0  # last messages fingerprinted as the workers tokenize them
    assert pol.kv.state.prefixes_gone > 0  # and some found evicted before the session's next step


def test_the_renamed_router_differs_from_agent_cache_only_where_a_tie_is_broken() -> None:
    """agent-cache-renamed is the noise floor: the same router, only its workers' names (the tie-breaking hash)."""
    ss = generate(WorkloadParams(sessions=40, rate=20, seed=5))
    keys = ("calls", "prompt_tokens", "cached_tokens", "ttfts")

    def run(name: str, workers: int) -> tuple:
        (pol,) = make_policies([name], workers, 1, 0, capacity=60_000)
        res = simulate(ss, pol, FleetConfig(workers=workers, capacity_tokens=60_000))
        return tuple(getattr(res, k) for k in keys)

    assert run("agent-cache", 1) == run("agent-cache-renamed", 1)  # one worker: nothing to break a tie between
    assert run("agent-cache", 4) != run("agent-cache-renamed", 4)


def test_the_cost_measure_runs_on_a_tiny_input() -> None:
    from agent_cache.bench.kv_cost import measure

    m = measure(tokens=2_000, node=500)
    assert m["events"] == 2  # the reset, then 0.5.23's merged stores
    assert m["decode_us_per_event"] > 0 and m["index_us_per_token"] > 0
    # a count per resident page hash and the anchors: never the tokens (which would add 30+ bytes a token)
    assert 0 < m["state_bytes_per_token"] < 120
