"""The benchmark measures the product: its agent-cache policy is the real Router, fed what a deployment sees."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agent_cache.bench.fleetsim import FleetConfig, common_prefix, simulate
from agent_cache.bench.policies import AgentCache, Dispatch
from agent_cache.bench.registry import make_policies
from agent_cache.bench.runner import capacity_arg, resolve_capacity
from agent_cache.bench.workloads import WorkloadParams, generate
from agent_cache.bench.trace_replay import load_trace
from agent_cache.routing.router import RouteRequest, Router
from agent_cache.store.memory import MemoryStore


class _Recording(AgentCache):
    """The bench's agent-cache policy, logging every input it gets and every decision it makes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []

    def route(self, call: Dispatch, fleet: Any) -> int:
        i = super().route(call, fleet)
        p = call.handle
        self.log.append(("route", self.now, call.session_id, call.template_id, call.template_tokens, call.tenant,
                         p.worker, p.outcome, p.epoch))
        return i

    def completed(self, call: Dispatch, worker: int, prompt_tokens: int, cached_tokens: int) -> None:
        super().completed(call, worker, prompt_tokens, cached_tokens)
        self.log.append(("completed", self.now, call.session_id, prompt_tokens, cached_tokens))


def test_the_bench_decides_as_the_product_does_for_the_same_inputs() -> None:
    sessions = generate(WorkloadParams(sessions=40, rate=10, seed=9))
    bench = _Recording(4, capacity=20_000)
    res = simulate(sessions, bench, FleetConfig(workers=4, capacity_tokens=20_000))
    assert res.sessions_done == 40

    # Replay the same inputs, in the same order and at the same times, on a fresh Router and store.
    now = [0.0]
    urls = [f"http://worker-{i}" for i in range(4)]
    router = Router(urls, store=MemoryStore(), probe_interval=None, release_delay=0,
                    capacities={u: 20_000 for u in urls}, clock=lambda: now[0])
    open_calls: dict[str, Any] = {}
    outcomes = []
    for entry in bench.log:
        now[0] = entry[1]
        if entry[0] == "route":
            _, _, sid, tid, tokens, tenant, worker, outcome, epoch = entry
            p = router.route(RouteRequest(sid, template_id=tid, tenant=tenant, prompt_tokens_estimate=tokens))
            assert (p.worker, p.outcome, p.epoch) == (worker, outcome, epoch)
            open_calls[sid] = p
            outcomes.append(outcome)
        else:
            _, _, sid, prompt, cached = entry
            p = open_calls.pop(sid)
            router.done(p)
            router.report(p, prompt_tokens=prompt, cached_tokens=cached)
    router.close()
    assert len(outcomes) == res.calls
    assert {"placed_template", "pinned"} <= set(outcomes)  # the rule's template and pin paths both ran


def test_the_bench_runs_the_redis_lua_scripts_to_the_same_decisions(redis_server) -> None:
    sessions = generate(WorkloadParams(sessions=30, rate=10, seed=4))
    cfg = FleetConfig(workers=3, capacity_tokens=15_000, replicas=2)
    memory = _Recording(3, 2, capacity=15_000)
    redis = _Recording(3, 2, capacity=15_000, redis_url=redis_server.url)
    a, b = simulate(sessions, memory, cfg), simulate(sessions, redis, cfg)
    assert memory.log == redis.log
    assert (a.cached_tokens, a.prompt_tokens) == (b.cached_tokens, b.prompt_tokens)
    import redis as redis_module

    client = redis_module.Redis.from_url(redis_server.url)
    try:
        assert not list(client.scan_iter(match="{agent-cache-bench-*"))  # the run's keys are deleted
    finally:
        client.close()


def test_pressure_is_reported_per_policy() -> None:
    sessions = generate(WorkloadParams(kind="coding", sessions=12, rate=0.5, min_steps=6, max_steps=10,
                                       early_stop=0.0, seed=3))
    roomy, tight = FleetConfig(workers=2, capacity_tokens=400_000), FleetConfig(workers=2, capacity_tokens=12_000)
    sticky = simulate(sessions, make_policies(["consistent-hash"], 2, 1, 0)[0], roomy)
    spread = simulate(sessions, make_policies(["round-robin"], 2, 1, 0)[0], roomy)
    squeezed = simulate(sessions, make_policies(["consistent-hash"], 2, 1, 0)[0], tight)
    # with room, a sticky session recomputes nothing of its own history; spreading it does
    assert sticky.recomputed_tokens == 0 and sticky.evicted_tokens == 0
    assert spread.recomputed_tokens > 10_000
    # under pressure the same policy evicts and recomputes
    assert squeezed.evicted_tokens > 0 and squeezed.recomputed_tokens > 0
    # the working set is the peak of the live sessions' contexts: more than one context, less than all of them
    longest = max(len(c.tmpl) + len(c.output) for s in sessions for c in s.start())
    total = sum(max(len(c.tmpl) + len(c.output) for c in s.start()) for s in sessions)
    assert longest < sticky.working_set_tokens <= total


def test_capacity_as_a_multiple_of_the_working_set() -> None:
    assert capacity_arg("60000") == 60_000 and capacity_arg("x1.5") == 1.5
    for bad in ("x0", "-3", "lots", "x"):
        with pytest.raises(Exception, match="positive|expected"):
            capacity_arg(bad)
    sessions = generate(WorkloadParams(sessions=20, rate=4, seed=2))
    cfg = FleetConfig(workers=4)
    assert resolve_capacity(None, 400_000, sessions, cfg, 0) == (400_000, None)
    assert resolve_capacity(5_000, 400_000, sessions, cfg, 0) == (5_000, None)
    cap, ws = resolve_capacity(1.5, 400_000, sessions, cfg, 0)
    assert ws is not None and ws > 0 and cap == -(-3 * ws // 8)  # ceil(1.5 x ws / 4 workers)


def test_coding_workload_shape() -> None:
    p = WorkloadParams(kind="coding", sessions=40, rate=1, seed=5)
    sessions = generate(p)
    steps, contexts = [], []
    for s in sessions:
        calls = list(s.start())
        steps.append(len(calls))
        contexts.append(len(calls[-1].tmpl))
        assert len({c.tmpl_template for c in calls}) == 1
        for prev, cur in zip(calls, calls[1:]):
            assert 1.0 <= cur.think_s <= 30.0
            assert cur.tmpl[:len(prev.tmpl) + len(prev.output)] == prev.tmpl + prev.output
            tool = len(cur.tmpl) - len(prev.tmpl) - len(prev.output)
            assert 200 <= tool <= 4000 + 20  # the tool output plus its chat-template framing
    assert len({next(s.start()).tmpl_template for s in sessions}) == 1  # one agent, one system prompt
    assert 2_000 <= next(sessions[0].start()).tmpl_template_tokens <= 4_000
    assert max(steps) <= 40 and sum(n >= 15 for n in steps) > 0.6 * len(steps) and min(steps) < 15
    assert max(contexts) > 30_000 and max(contexts) <= p.max_context_tokens


def _timed_trace(path: Any) -> str:
    rows = []
    for n, start in enumerate((0.0, 100.0, 200.0)):
        history = [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": f"task {n}"}]
        for k, t in enumerate((start, start + 4.0, start + 10.0)):
            rows.append({"session_id": f"s{n}", "call_index": k, "t": t, "messages": list(history),
                         "output": f"step {k}", "agent": "a"})
            history += [{"role": "assistant", "content": f"step {k}"}, {"role": "user", "content": "ok"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def test_trace_replay_at_a_chosen_rate_keeps_the_gaps_within_a_session(tmp_path) -> None:
    path = _timed_trace(tmp_path / "t.jsonl")
    recorded = load_trace(path)
    assert [s.arrival_s for s in recorded] == [0.0, 100.0, 200.0]
    replayed = load_trace(path, rate=50.0)
    faster = load_trace(path, rate=50.0, speedup=4.0)
    assert max(s.arrival_s for s in replayed) < 1.0  # starts drawn at 50 sessions/s
    for s in replayed + recorded:
        assert [c.think_s for c in s.start()] == [0.0, 4.0, 6.0]  # recorded gaps kept
    for s in faster:
        assert [c.think_s for c in s.start()] == [0.0, 1.0, 1.5]
    with pytest.raises(Exception, match="speedup"):
        load_trace(path, speedup=0)


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5] * 1000 + [1], [5] * 1000 + [2]) == 1000
