"""Workloads, the virtual-clock engine and the policies, on small inputs."""

from __future__ import annotations

import pytest

from agent_cache.bench.fleetsim import FleetConfig, simulate
from agent_cache.bench.registry import REGISTRY, SIM_POLICIES, make_policies
from agent_cache.bench.report import all_metrics, write_atomic
from agent_cache.bench.workloads import GEN_PROMPT, WorkloadParams, arrival_times, generate
from agent_cache.errors import ConfigError
from agent_cache.sim.latency import DEFAULT_LATENCY


def _calls(spec):
    return [(c.raw, c.tmpl, c.output, c.think_s) for c in spec.start()]


def test_generated_sessions_are_deterministic_and_restartable() -> None:
    a = generate(WorkloadParams(sessions=20, seed=3))
    b = generate(WorkloadParams(sessions=20, seed=3))
    for x, y in zip(a, b):
        assert x.arrival_s == y.arrival_s and _calls(x) == _calls(y) == _calls(x)
    assert _calls(a[0]) != _calls(generate(WorkloadParams(sessions=20, seed=4))[0])


def test_react_calls_extend_the_previous_call() -> None:
    calls = list(generate(WorkloadParams(sessions=1, mean_calls=6, seed=1))[0].start())
    for prev, cur in zip(calls, calls[1:]):
        for form in ("raw", "tmpl"):
            done = getattr(prev, form) + prev.output
            assert getattr(cur, form)[: len(done)] == done  # prompt + output is a prefix of the next prompt
        assert list(cur.raw[-len(GEN_PROMPT):]) == list(GEN_PROMPT)


def test_templates_share_a_prefix_only_in_templatized_form() -> None:
    ss = generate(WorkloadParams(sessions=40, templates=1, tenants=1, seed=2))
    a, b = next(ss[0].start()), next(ss[1].start())
    assert a.tmpl_template == b.tmpl_template and a.raw_template != b.raw_template

    def common(x, y):
        n = 0
        while n < min(len(x), len(y)) and x[n] == y[n]:
            n += 1
        return n

    assert common(a.tmpl, b.tmpl) > 1000 > 50 > common(a.raw, b.raw)


def test_reflexion_alternates_two_prompt_families() -> None:
    ss = generate(WorkloadParams(kind="reflexion", sessions=30, trial_success=0.0, max_trials=3, seed=5))
    families = {c.tmpl_template for c in ss[0].start()}
    assert len(families) == 2


def test_bursty_arrivals_keep_the_count_and_order() -> None:
    import random

    t = arrival_times(100, 5.0, "bursty", random.Random(0))
    assert len(t) == 100 and t == sorted(t)


def test_bad_workload_parameters() -> None:
    with pytest.raises(ConfigError, match="arrivals"):
        generate(WorkloadParams(arrivals="fractal"))


def test_single_worker_latencies_follow_the_model() -> None:
    ss = generate(WorkloadParams(sessions=5, rate=0.01, seed=7))  # far apart: no queueing
    res = simulate(ss, make_policies(["no-cache"], 1, 1, 0)[0], FleetConfig(workers=1))
    calls = [c for s in ss for c in s.start()]
    assert res.sessions_done == 5 and res.calls == len(calls) and res.cached_tokens == 0
    expected = sorted(DEFAULT_LATENCY.prefill_seconds(len(c.raw)) for c in calls)
    assert sorted(res.ttfts) == pytest.approx(expected)


def test_sticky_policy_hits_every_later_call_with_room() -> None:
    ss = generate(WorkloadParams(sessions=10, rate=0.05, seed=8))
    res = simulate(ss, make_policies(["consistent-hash"], 4, 1, 0)[0], FleetConfig(workers=4))
    expected = 0
    for s in ss:
        calls = list(s.start())
        expected += sum(len(p.raw) + len(p.output) for p in calls[:-1])
    assert res.cached_tokens >= expected  # every later call hits its whole history


@pytest.mark.slow
def test_small_capacity_evicts_and_stays_bounded() -> None:
    ss = generate(WorkloadParams(sessions=60, rate=20, seed=10))
    cfg = FleetConfig(workers=2, capacity_tokens=6_000)
    results = [simulate(ss, p, cfg) for p in make_policies(list(SIM_POLICIES), 2, 1, 0)]
    m = all_metrics(results)
    for name, r in zip(m, results):
        assert r.sessions_done == 60, name
        if not REGISTRY[name].bound:
            assert r.peak_kv_tokens <= 2 * 6_000
        assert m[name]["token_hit_rate"] <= m["oracle"]["token_hit_rate"] + 1e-12


def test_write_atomic_leaves_nothing_on_failure(tmp_path) -> None:
    with pytest.raises(TypeError):
        write_atomic(str(tmp_path / "x.json"), 12345)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
