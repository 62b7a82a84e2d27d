"""``agent-cache bench --engine real --fleet sglang``: the policies on real SGLang servers, replayed closed-loop."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

from agent_cache.bench.realfleet import GivenWorkers
from agent_cache.bench.realload import Job, run_job
from agent_cache.bench.runner import main_bench
from agent_cache.bench.workloads import WorkloadParams, generate
from agent_cache.sglang_cpu.workers import MODEL_DESCRIPTION

from .conftest import ENGINE_VERSION, MODEL

SMG = shutil.which("smg")


def test_a_session_extends_what_the_real_worker_cached(real_pair) -> None:
    """Each step carries the worker's own answer, so it is served from the cache past the previous prompt."""
    workers = GivenWorkers([w.url for w in real_pair])
    try:
        assert workers.model == MODEL
        workers.flush()
        sessions = generate(WorkloadParams(sessions=2, rate=50, seed=5, fewshot_tokens=300, observation_tokens=80))
        job = Job("consistent-hash", sessions, workers.urls, time.monotonic() + 0.1, model=workers.model,
                  scripted=False, answer_tokens=8)
        result = asyncio.run(run_job(job))
    finally:
        workers.close()
    assert not result.errors, result.errors
    calls = sorted(result.calls)
    steps = [(a[6], b[7]) for a, b in zip(calls, calls[1:]) if a[0] == b[0]]
    assert steps
    # every step keeps the previous prompt (but where the answer's text merges with the tokens before it:
    # BPE re-tokenises the template's boundary), and most go on into the worker's own answer
    assert all(cached >= prompt - 2 for prompt, cached in steps), steps
    assert sum(cached > prompt for prompt, cached in steps) > len(steps) / 2, steps


def test_every_policy_runs_on_real_workers(tmp_path: Path) -> None:
    policies = ["consistent-hash", "agent-cache", "agent-cache-gateway-kv"] + (["smg-cache_aware"] if SMG else [])
    rc = main_bench(["--engine", "real", "--fleet", "sglang", "--sglang-version", ENGINE_VERSION, "--workers", "2",
                     "--sessions", "4", "--rate", "4", "--capacity-tokens", "16384", "--answer-tokens", "8",
                     "--policies", ",".join(policies), "--out", str(tmp_path), "--quiet", "--no-plots"])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    cfg = doc["config"]
    assert (cfg["fleet"], cfg["engine_version"], cfg["model"]) == ("sglang", ENGINE_VERSION, MODEL_DESCRIPTION)
    assert cfg["replay"] == "closed-loop" and cfg["capacity_tokens_per_worker"] == 16384
    assert list(doc["policies"]) == policies
    for name, m in doc["policies"].items():
        assert m["sessions_completed"] == 4 and m["errors"] == 0, (name, m["error_samples"])
        assert 0 < m["cached_tokens"] < m["prompt_tokens"], name  # RadixAttention's own counts
        assert m["kv_tokens"] is None  # SGLang says nowhere over HTTP what its cache holds
    kv = doc["policies"]["agent-cache-gateway-kv"]["kv_events"]
    assert kv["batches"] > 0 and kv["gaps"] == 0, kv


def test_the_overhead_of_every_path_is_measured_on_a_real_worker(tmp_path: Path) -> None:
    from agent_cache.bench import overhead

    out = tmp_path / "overhead.json"
    assert overhead.main(["--fleet", "sglang", "--sglang-version", ENGINE_VERSION, "--calls", "10",
                          "--out", str(out), "--quiet"]) == 0
    doc = json.loads(out.read_text())
    assert doc["worker"]["fleet"] == "sglang" and doc["answer_tokens"] == 16
    paths = doc["paths"]
    assert {"direct", "agent-cache (memory)", "agent-cache (Redis)", "agent-cache-gateway"} <= set(paths)
    assert SMG is None or {"smg-cache_aware", "smg-consistent_hashing"} <= set(paths)
    for name, row in paths.items():
        assert row["calls"] == 10 and 0 < row["ttft_p50_s"] <= row["latency_p50_s"], name
