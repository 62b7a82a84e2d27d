"""The worker's scheduler model: one GPU, prefill first, token-budget admission, KV accounting.

Exact checks on the pure model (its own clock), then the same behaviour
through the simulated worker's HTTP API on loopback.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from agent_cache.backends import SGLangClient
from agent_cache.sim import SimFleet
from agent_cache.sim.latency import DEFAULT_LATENCY
from agent_cache.sim.scheduler import (
    DONE,
    FIRST_TOKEN,
    SchedulerConfig,
    SimRequest,
    WorkerModel,
    default_max_running_requests,
)


def _prompt(n: int, base: int) -> list[int]:
    return list(range(base, base + n))


def _run(model: WorkerModel, until: float | None = None) -> float:
    """Run passes back to back from t=0; returns the clock when idle (or past ``until``)."""
    now = 0.0
    while until is None or now < until:
        it = model.next_iteration()
        if it is None:
            break
        now += it.seconds
        model.finish_iteration(it, now)
    return now


def test_concurrent_cold_prompts_prefill_one_after_another() -> None:
    n, length = 8, 8000
    model = WorkerModel(SchedulerConfig())
    reqs = [SimRequest(prompt=_prompt(length, i * 10_000), output_len=2) for i in range(n)]
    for r in reqs:
        model.submit(r, 0.0)
    _run(model)
    alone = DEFAULT_LATENCY.prefill_seconds(length)
    ttfts = sorted(r.first_token_at for r in reqs)  # type: ignore[type-var]
    # one GPU: the k-th prompt waits for the k-1 before it (chunking shifts boundaries a little)
    assert ttfts[-1] == pytest.approx(n * alone, rel=0.1)
    assert ttfts[0] < 1.5 * alone
    assert model.counters.prefill_passes >= n * length // 8192


def test_decode_pauses_while_a_prefill_runs() -> None:
    model = WorkerModel(SchedulerConfig())
    decoding = SimRequest(prompt=_prompt(100, 0), output_len=50)
    model.submit(decoding, 0.0)
    now, gaps, last = 0.0, [], None
    arrived = False
    while not decoding.finished:
        it = model.next_iteration()
        assert it is not None
        now += it.seconds
        before = decoding.generated
        model.finish_iteration(it, now)
        if decoding.generated > before:
            if last is not None:
                gaps.append(now - last)
            last = now
        if decoding.generated == 10 and not arrived:  # a long prompt arrives mid-decode
            model.submit(SimRequest(prompt=_prompt(16_000, 50_000), output_len=1), now)
            arrived = True
    step = DEFAULT_LATENCY.decode_step_seconds(1, 120)
    assert min(gaps) == pytest.approx(step, rel=0.05)
    # the gap that spans the 16k prefill (two chunks of 8192) is longer than the prefill itself
    assert max(gaps) > DEFAULT_LATENCY.prefill_seconds(16_000) * 0.9


def test_admission_waits_for_kv_budget_and_max_running_requests() -> None:
    # 10k tokens of KV: a 3k prompt reserves 3k + its 2k output budget
    model = WorkerModel(SchedulerConfig(max_total_tokens=10_000))
    a = SimRequest(prompt=_prompt(3000, 0), output_len=200, max_new_tokens=2000)
    b = SimRequest(prompt=_prompt(3000, 10_000), output_len=200, max_new_tokens=2000)
    c = SimRequest(prompt=_prompt(3000, 20_000), output_len=200, max_new_tokens=2000)
    for r in (a, b, c):
        model.submit(r, 0.0)
    it = model.next_iteration()
    assert it is not None and [r for r, _ in it.chunks] == [a]  # b does not fit beside a's reservation
    model.finish_iteration(it, it.seconds)
    _run(model)
    assert a.done_at is not None and b.first_token_at is not None and b.first_token_at >= a.first_token_at
    assert c.first_token_at >= b.first_token_at  # type: ignore[operator]

    limited = WorkerModel(SchedulerConfig(max_running_requests=2))
    reqs = [SimRequest(prompt=_prompt(10, i * 100), output_len=5) for i in range(5)]
    for r in reqs:
        limited.submit(r, 0.0)
    it = limited.next_iteration()
    assert it is not None and len(it.chunks) == 2 and limited.num_waiting == 3


def test_default_max_running_requests_is_sglangs() -> None:
    assert default_max_running_requests(415_000, 131_072) == 2048  # Llama-3.1-8B on an H100
    assert default_max_running_requests(2_000, 131_072) == 1000  # max_total_tokens // 2
    assert SchedulerConfig().running_limit == default_max_running_requests(200_000, 131_072)


def test_kv_counts_running_tokens_and_idle_usage_is_zero() -> None:
    model = WorkerModel(SchedulerConfig(max_total_tokens=50_000))
    req = SimRequest(prompt=_prompt(4000, 0), output_len=100, output=_prompt(100, 90_000))
    model.submit(req, 0.0)
    now = 0.0
    for _ in range(11):  # the prefill pass, then 10 decode steps
        it = model.next_iteration()
        assert it is not None
        now += it.seconds
        model.finish_iteration(it, now)
    assert req.generated == 11
    # prompt locked in the tree, decode tokens outside it: all counted as used
    assert model.used_tokens == 4000 + 10
    assert model.cache.evictable_tokens == 0
    _run(model)
    assert req.finished and model.used_tokens == 0 and model.token_usage == 0.0
    assert model.cache.total_tokens == 4099  # prompt and output but its last token stay cached, evictable
    assert model.cache.evictable_tokens == 4099


def test_eviction_frees_what_a_prefill_needs_and_spares_running_prompts() -> None:
    model = WorkerModel(SchedulerConfig(max_total_tokens=12_000))
    old = SimRequest(prompt=_prompt(6000, 0), output_len=1)
    model.submit(old, 0.0)
    _run(model)
    assert model.cache.total_tokens >= 6000
    new = SimRequest(prompt=_prompt(8000, 100_000), output_len=1, max_new_tokens=1)
    model.submit(new, 0.0)
    _run(model)
    assert new.finished and model.cache.evicted_tokens >= 2000
    assert model.cache.evicted_tokens < 6001  # only what the allocation needed


def test_memory_pressure_retracts_and_still_finishes_everything() -> None:
    model = WorkerModel(SchedulerConfig(max_total_tokens=20_000))
    reqs = [SimRequest(prompt=_prompt(1500, i * 10_000), output_len=600, max_new_tokens=600) for i in range(12)]
    for r in reqs:
        model.submit(r, 0.0)
    _run(model)
    assert all(r.finished and r.generated == 600 for r in reqs)
    assert model.counters.retractions > 0
    assert model.used_tokens == 0


def test_lpm_runs_the_longest_cached_prefix_first() -> None:
    shared = _prompt(3000, 0)
    for policy, expect_first in (("fcfs", "cold"), ("lpm", "warm")):
        model = WorkerModel(SchedulerConfig(schedule_policy=policy, max_running_requests=1))
        model.submit(SimRequest(prompt=shared + [1], output_len=1), 0.0)
        _run(model)
        cold = SimRequest(prompt=_prompt(3000, 50_000), output_len=1, tag="cold")
        warm = SimRequest(prompt=shared + [2], output_len=1, tag="warm")
        blocker = SimRequest(prompt=_prompt(10, 90_000), output_len=20)
        model.submit(blocker, 0.0)
        it = model.next_iteration()
        assert it is not None
        model.submit(cold, 0.0)
        model.submit(warm, 0.0)
        model.finish_iteration(it, it.seconds)
        _run(model)
        first = min((cold, warm), key=lambda r: r.first_token_at)  # type: ignore[arg-type, return-value]
        assert first.tag == expect_first, policy


def test_events_report_first_token_then_done() -> None:
    model = WorkerModel(SchedulerConfig())
    req = SimRequest(prompt=_prompt(50, 0), output_len=3)
    model.submit(req, 0.0)
    seen = []
    now = 0.0
    while (it := model.next_iteration()) is not None:
        now += it.seconds
        seen += [e for r, e in model.finish_iteration(it, now) if r is req]
    assert seen == [FIRST_TOKEN, DONE] and req.generated == 3


# --- through HTTP, on loopback ------------------------------------------------------


def test_http_concurrent_cold_prompts_queue_behind_each_other() -> None:
    n, length, scale = 6, 8000, 0.5
    alone = DEFAULT_LATENCY.prefill_seconds(length) * scale
    with SimFleet(1, time_scale=scale) as fleet:
        url = fleet.urls[0]
        latencies: list[float] = []

        def call(i: int) -> None:
            t0 = time.monotonic()
            r = httpx.post(f"{url}/generate", json={"input_ids": _prompt(length, i * 10_000),
                                                    "sampling_params": {"max_new_tokens": 1}}, timeout=30)
            r.raise_for_status()
            latencies.append(time.monotonic() - t0)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # one GPU: the last waits for all the others; parallel prefill would finish all at about `alone`
    assert max(latencies) > 0.7 * n * alone
    assert max(latencies) - min(latencies) > 0.6 * (n - 1) * alone  # spaced by one prefill each


@pytest.mark.slow
def test_http_token_usage_counts_running_requests_only() -> None:
    with SimFleet(1, time_scale=1.0) as fleet:
        url = fleet.urls[0]
        done = threading.Event()

        def long_call() -> None:
            httpx.post(f"{url}/generate", json={"input_ids": _prompt(5000, 0), "sim_output": " word" * 300,
                                                "sampling_params": {"max_new_tokens": 300}}, timeout=30)
            done.set()

        thread = threading.Thread(target=long_call)
        thread.start()
        deadline = time.monotonic() + 10
        busy = None
        while time.monotonic() < deadline and not done.is_set():
            load = httpx.get(f"{url}/v1/loads").json()["loads"][0]
            if load["num_running_reqs"] == 1 and load["num_used_tokens"] >= 5000:
                busy = load
                break
            time.sleep(0.02)
        thread.join()
        idle = httpx.get(f"{url}/v1/loads").json()["loads"][0]
        metrics = SGLangClient(url).metrics()
    assert busy is not None and busy["token_usage"] == pytest.approx(busy["num_used_tokens"] / 200_000)
    assert idle["num_running_reqs"] == 0 and idle["token_usage"] == 0 and idle["num_used_tokens"] == 0
    assert metrics["sglang:token_usage"] == 0  # warm but idle: what smg's power_of_two reads


def test_http_tool_choice_changes_the_prompt_as_sglang_renders_it(worker: str) -> None:
    def tool(name: str) -> dict:
        return {"type": "function", "function": {"name": name, "description": f"the {name} tool " * 10,
                                                 "parameters": {"type": "object", "properties": {}}}}

    tools = [tool("search"), tool("calculator")]
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    client = SGLangClient(worker)

    def prompt_tokens(**kw) -> int:
        result = client.chat(msgs, max_tokens=3, **kw)
        assert result.usage is not None
        return result.usage.prompt_tokens

    plain = prompt_tokens()
    auto = prompt_tokens(tools=tools, tool_choice="auto")
    named = prompt_tokens(tools=tools, tool_choice={"type": "function", "function": {"name": "calculator"}})
    none = prompt_tokens(tools=tools, tool_choice="none")
    assert none == plain  # "none": no tools reach the template
    assert plain < named < auto  # a named tool: only that one is rendered
    bad = httpx.post(f"{worker}/v1/chat/completions", json={
        "messages": msgs, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert bad.status_code == 400


def test_http_json_schema_without_name_is_a_400(worker: str) -> None:
    r = httpx.post(f"{worker}/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}})
    assert r.status_code == 400 and "name" in r.json()["message"]
