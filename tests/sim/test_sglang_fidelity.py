"""The worker model against SGLang's own source (sglang 0.5.4 wheel, python/sglang/srt/...).

Each test names the file and lines of SGLang whose behaviour it checks.
"""

from __future__ import annotations

import argparse
import threading
import time

import httpx
import pytest

from agent_cache.sim import SimFleet
from agent_cache.sim.latency import DEFAULT_LATENCY, LATENCY_PROFILES, latency_model
from agent_cache.sim.latency_flags import add_latency_args, latency_from_args
from agent_cache.sim.scheduler import SchedulerConfig, SimRequest, WorkerModel


def _prompt(n: int, base: int) -> list[int]:
    return list(range(base, base + n))


def _run(model: WorkerModel) -> float:
    now = 0.0
    while (it := model.next_iteration()) is not None:
        now += it.seconds
        model.finish_iteration(it, now)
    return now


def test_eviction_frees_the_whole_allocation_when_free_slots_are_short() -> None:
    """mem_cache/common.py:225-247 ``evict_from_tree_cache``: ``if allocator.available_size() <
    num_tokens: tree_cache.evict(num_tokens)`` -- the whole allocation, not the shortfall; called once
    per batch by ``alloc_for_extend`` (common.py:355) and ``alloc_for_decode`` (common.py:436)."""
    model = WorkerModel(SchedulerConfig(max_total_tokens=12_000))
    for i in range(10):  # ten cached 1,000-token prompts, oldest first: 2,000 slots stay free
        model.submit(SimRequest(prompt=_prompt(1000, i * 10_000), output_len=1), 0.0)
        _run(model)
    assert model.cache.total_tokens == 10_000 and model.cache.free_tokens == 2_000
    model.submit(SimRequest(prompt=_prompt(3000, 500_000), output_len=1), 0.0)
    _run(model)
    # the shortfall is 1,000 tokens (one leaf); SGLang evicts 3,000: the three least recently used
    assert model.cache.evicted_tokens == 3000
    survivors = [model.cache.match_prefix(_prompt(1000, i * 10_000)).length for i in range(10)]
    assert survivors == [0, 0, 0] + [1000] * 7


def test_a_prefill_batch_is_allocated_and_evicted_for_at_once() -> None:
    """common.py:319-355 ``alloc_for_extend``: one ``alloc_token_slots(extend_num_tokens)`` for the
    whole batch, so two 1,500-token prompts with 2,000 slots free evict 3,000 tokens (per request, the
    second would have evicted 1,000 or 1,500)."""
    model = WorkerModel(SchedulerConfig(max_total_tokens=12_000))
    for i in range(10):
        model.submit(SimRequest(prompt=_prompt(1000, i * 10_000), output_len=1), 0.0)
        _run(model)
    batch = [SimRequest(prompt=_prompt(1500, 500_000 + i * 10_000), output_len=1) for i in range(2)]
    for r in batch:
        model.submit(r, 0.0)
    it = model.next_iteration()
    assert it is not None and len(it.chunks) == 2
    assert model.cache.evicted_tokens == 3000


def test_lpm_holds_back_a_request_sharing_a_cold_prefix_with_one_ahead() -> None:
    """managers/schedule_policy.py:49-57 (thresholds 32 and 32), 167-213 ``_compute_prefix_matches``:
    a waiting request that matches <= 32 cached tokens but >= 32 tokens of a request ahead of it is
    deprioritised (sorted last, 215-227), so the shared prefix is prefilled once and then hit."""
    shared = _prompt(3000, 0)
    a1, a2 = (SimRequest(prompt=shared + _prompt(10, 900_000 + 100 * i), output_len=1, tag=f"a{i}") for i in (1, 2))
    b = SimRequest(prompt=_prompt(3010, 50_000), output_len=1, tag="b")
    cached = {}
    for policy in ("fcfs", "lpm"):
        # one batch holds two of the three prompts (max_prefill_tokens)
        model = WorkerModel(SchedulerConfig(schedule_policy=policy, max_prefill_tokens=6100,
                                            chunked_prefill_size=16384))
        reqs = [SimRequest(prompt=list(r.prompt), output_len=1, tag=r.tag) for r in (a1, a2, b)]
        for r in reqs:
            model.submit(r, 0.0)
        it = model.next_iteration()
        assert it is not None
        first_batch = sorted(str(r.tag) for r, _ in it.chunks)
        model.finish_iteration(it, it.seconds)
        _run(model)
        cached[policy] = (first_batch, reqs[1].cached)
    assert cached["fcfs"] == (["a1", "a2"], 0)  # both compute the template in one batch
    assert cached["lpm"] == (["a1", "b"], 3000)  # a2 waits one pass and hits it


def test_lpm_does_not_hold_back_a_request_with_a_cached_prefix() -> None:
    """schedule_policy.py:195: only requests with ``len(prefix_indices) <= 32`` are checked."""
    shared = _prompt(3000, 0)
    model = WorkerModel(SchedulerConfig(schedule_policy="lpm", max_prefill_tokens=6100, chunked_prefill_size=16384))
    model.submit(SimRequest(prompt=shared + [1], output_len=1), 0.0)
    _run(model)
    reqs = [SimRequest(prompt=shared + _prompt(3000, 100_000 * (i + 1)), output_len=1) for i in range(2)]
    for r in reqs:
        model.submit(r, 0.0)
    it = model.next_iteration()
    assert it is not None and len(it.chunks) == 2  # both warm: prefilled together
    model.finish_iteration(it, it.seconds)
    assert [r.cached for r in reqs] == [3000, 3000]


def test_health_under_load_answers_in_a_second_without_queueing_a_request() -> None:
    """entrypoints/http_server.py:405-470 ``health_generate`` checks every 1 s whether the scheduler
    sent anything since it asked; managers/scheduler.py:1136-1145 drops the health request while a
    batch runs and 2030-2035 signals after the next pass. So a busy worker answers in ~1 s and its
    request count does not move; before, the model queued a real generation behind the load."""
    scale = 0.2
    with SimFleet(1, time_scale=scale) as fleet:
        url = fleet.urls[0]
        engine = fleet.engine(0)

        def load(i: int) -> None:  # eight cold 30k prompts: ~8 s of prefill in model time
            httpx.post(f"{url}/generate", json={"input_ids": _prompt(30_000, i * 100_000),
                                                "sampling_params": {"max_new_tokens": 1}}, timeout=60)

        threads = [threading.Thread(target=load, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while engine.model.num_running == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        requests_before = engine.model.counters.requests
        t0 = time.monotonic()
        status = httpx.get(f"{url}/health", timeout=30).status_code
        took = time.monotonic() - t0
        queued_during = engine.model.num_waiting
        for t in threads:
            t.join()
        total = engine.model.counters.requests
    assert status == 200
    # first check after 1 s (scaled), not after the ~1.8 s of queued prefill ahead of a real probe
    assert 0.9 * scale <= took < 3.0 * scale
    assert queued_during > 0  # the worker was still loaded when it answered
    assert total == 8 and requests_before <= 8  # no health generation was ever admitted


def test_health_on_an_idle_worker_runs_a_one_token_generation() -> None:
    """http_server.py:427-450: with nothing running, the one-token request goes through the scheduler."""
    with SimFleet(1, time_scale=0.1) as fleet:
        assert httpx.get(f"{fleet.urls[0]}/health", timeout=10).status_code == 200
        assert fleet.engine(0).model.counters.requests == 1


def test_latency_profiles_bound_the_default_and_flags_override_them() -> None:
    fast, slow = latency_model("fast"), latency_model("slow")
    for n in (1024, 8192, 32768):
        assert fast.prefill_seconds(n) < DEFAULT_LATENCY.prefill_seconds(n) < slow.prefill_seconds(n)
    assert 20_000 < 8192 / slow.prefill_seconds(8192) < 30_000  # the FLOP-count estimate for long prompts
    assert 8192 / fast.prefill_seconds(8192) > 40_000  # the published 32 x 1k batch rate
    p = argparse.ArgumentParser()
    add_latency_args(p)
    model = latency_from_args(p.parse_args(["--latency-profile", "slow", "--mfu", "0.5", "--per-pass-overhead-ms", "3"]))
    assert (model.gpu.mfu, model.gpu.bandwidth_efficiency, model.overhead_s) == (0.5, LATENCY_PROFILES["slow"][1], 0.003)
    with pytest.raises(SystemExit):
        p.parse_args(["--mfu", "1.5"])
    with pytest.raises(ValueError, match="latency profile"):
        latency_model("warp")


def test_generate_errors_have_sglangs_generate_shape() -> None:
    """entrypoints/http_server.py:555-558 and 1308-1311 (``_create_error_response``): a /generate
    ValueError answers 400 with ``{"error": {"message": ...}}``, not the OpenAI-style flat
    ``ErrorResponse`` of the chat routes."""
    with SimFleet(1, time_scale=0) as fleet:
        url = fleet.urls[0]
        empty = httpx.post(f"{url}/generate", json={"input_ids": [], "sampling_params": {}})
        long = httpx.post(f"{url}/generate", json={"input_ids": list(range(300_000))})
        chat = httpx.post(f"{url}/v1/chat/completions", json={"messages": "not a list"})
    assert empty.status_code == 400 and empty.json() == {"error": {"message": "The input is empty"}}
    assert long.status_code == 400 and "context length" in long.json()["error"]["message"]
    assert chat.status_code == 400 and chat.json()["object"] == "error"  # the chat routes keep theirs
