"""The simulator held to real SGLang: the same agent replay on one simulated and one real worker.

Four agent sessions that share a template, interleaved, six steps each, every step resending the history
with a new observation, as token ids through ``/generate`` (so tokenizers are out of the comparison: what
is compared is the cache). Each call generates one token, which each worker samples itself (a random-weight
model and the simulator do not agree on it), so the history carries no answer: what each worker keeps of
its own answer shows in the resident count (SGLang 0.5.9 keeps the last output token in the tree, 0.5.23
does not). Both workers have the same pool, page size and release. Compared per call: ``cached_tokens``;
after each step: the tokens resident, counted from each worker's own KV events. Once with room for
everything, once with a pool that forces evictions.
"""

from __future__ import annotations

import json
import random
from typing import Iterator

import httpx
import pytest

from agent_cache.sglang_cpu.workers import RealWorker, wait_idle
from agent_cache.sim import SimWorkerThread, WorkerOptions
from tests.sglang.conftest import ENGINE_VERSION
from tests.sglang.test_kv_events_real import _raw_resident

SESSIONS, STEPS = 4, 6


@pytest.fixture
def sim_worker(tmp_path) -> Iterator:  # type: ignore[no-untyped-def]
    started: list[SimWorkerThread] = []

    def start(pool: int, page_size: int = 1) -> tuple[SimWorkerThread, str]:
        replay = f"ipc://{tmp_path}/sim-{len(started)}.replay"
        config = {"publisher": "zmq", "endpoint": f"ipc://{tmp_path}/sim-{len(started)}.pub",
                  "replay_endpoint": replay}
        w = SimWorkerThread(WorkerOptions(time_scale=0.0, max_total_tokens=pool, page_size=page_size,
                                          sglang_version=ENGINE_VERSION, kv_events_config=json.dumps(config)))
        w.start()
        started.append(w)
        return w, replay

    yield start
    for w in started:
        w.stop()


def _replay_agents(real: RealWorker, sim_url: str, sim_replay: str, seed: int) -> tuple[list, list]:
    rng = random.Random(seed)
    template = [rng.randrange(10, 4000) for _ in range(150)]
    prompts = [template + [rng.randrange(10, 4000) for _ in range(100)] for _ in range(SESSIONS)]
    calls, steps = [], []
    with httpx.Client(timeout=120) as client:
        for url in (real.url, sim_url):  # the real server's warm-up requests left tokens in its cache
            client.post(url + "/flush_cache").raise_for_status()
        for step in range(STEPS):
            for s in range(SESSIONS):
                body = {"input_ids": prompts[s], "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
                got_real = client.post(real.url + "/generate", json=body).json()
                got_sim = client.post(sim_url + "/generate", json=body).json()
                calls.append((got_real["meta_info"]["cached_tokens"], got_sim["meta_info"]["cached_tokens"],
                              len(prompts[s])))
                assert got_sim["meta_info"]["completion_tokens"] == got_real["meta_info"]["completion_tokens"] == 1
                prompts[s] = prompts[s] + [rng.randrange(10, 4000) for _ in range(40)]
            wait_idle(real.url)
            real_resident, size, _ = _raw_resident(real.kv_replay_endpoint or "")
            sim_resident, sim_size, _ = _raw_resident(sim_replay)
            steps.append((len(real_resident) * size, len(sim_resident) * sim_size))
    return calls, steps


@pytest.mark.parametrize("pool", [8192, 1024])
def test_the_simulator_agrees_with_real_sglang_on_cached_tokens(start_workers, sim_worker, pool: int) -> None:
    (real,) = start_workers(1, max_total_tokens=pool, kv_events=True)
    sim, sim_replay = sim_worker(pool)
    calls, steps = _replay_agents(real, sim.url, sim_replay, seed=pool)
    same = sum(r == s for r, s, _ in calls)
    same_resident = sum(r == s for r, s in steps)
    print(f"\nSGLang {ENGINE_VERSION}, pool {pool}: cached_tokens equal on {same}/{len(calls)} calls, "
          f"resident tokens equal after {same_resident}/{len(steps)} steps")
    print("  per call (real, sim, prompt):", calls)
    print("  per step (real resident, sim resident):", steps)
    if pool < SESSIONS * 400:  # the sessions outgrow the pool: evictions are part of the comparison
        assert max(r for r, _ in steps) <= pool and sum(p for *_, p in calls[-SESSIONS:]) > pool
    assert same >= 0.99 * len(calls), calls
    # resident tokens: equal after most steps, and never apart by more than 1 % of the pool (on 0.5.9, once
    # the pool is full, one step's eviction takes 3 tokens fewer on the real server: docs/real-sglang.md)
    assert same_resident >= 0.8 * len(steps) and all(abs(r - s) <= pool // 100 for r, s in steps), steps


def test_the_simulator_counts_chat_prompts_as_the_real_server_does(real_pair, engine) -> None:
    """With ``--tokenizer-path`` the simulated worker renders and tokenises a chat as the real server of that
    model: the same ``prompt_tokens`` for every step of agent sessions (system prompt, tools, history), and
    the same ids from ``/tokenize``."""
    from agent_cache.bench.workloads import WorkloadParams, generate

    sim = SimWorkerThread(WorkerOptions(time_scale=0.0, sglang_version=ENGINE_VERSION,
                                        tokenizer_path=str(engine.model_dir)))
    sim.start()
    own = SimWorkerThread(WorkerOptions(time_scale=0.0))  # the simulator's own tokenizer counts otherwise
    own.start()
    try:
        counted = []
        with httpx.Client(timeout=120) as client:
            for spec in generate(WorkloadParams(sessions=2, seed=4, observation_tokens=60)):
                for call in spec.start(chat=True):
                    assert call.chat is not None
                    body = {"model": "tiny-llama", "messages": list(call.chat.messages), "max_tokens": 1,
                            "tools": list(call.chat.tools or []) or None}
                    counts = [client.post(url + "/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
                              for url in (real_pair[0].url, sim.url, own.url)]
                    counted.append(counts)
            text = {"prompt": "def f(x):\n    return x  # ünïcode"}
            assert (client.post(real_pair[0].url + "/tokenize", json=text).json()["tokens"]
                    == client.post(sim.url + "/tokenize", json=text).json()["tokens"])
    finally:
        sim.stop()
        own.stop()
    assert len(counted) > 4
    assert all(real == simulated for real, simulated, _ in counted), counted
    assert any(real != own_count for real, _, own_count in counted)  # a test of the tokenizer, not of the chats
