"""``--preset production``: SGLang's own KV pool arithmetic, and queue waits / decode batch sizes reported."""

from __future__ import annotations

import json

import pytest

from agent_cache.bench import report
from agent_cache.bench.fleetsim import FleetConfig, simulate
from agent_cache.bench.registry import make_policies
from agent_cache.bench.production import PRODUCTION_POOL, sglang_kv_pool
from agent_cache.bench.runner import main_bench
from agent_cache.bench.workloads import WorkloadParams, generate


def test_kv_pool_is_sized_as_sglang_sizes_it_on_an_80gb_h100() -> None:
    """server_args.py:763-799 (reserved memory, mem_fraction_static) and model_runner.py:1383-1430
    (profile_max_num_token): Llama-3.1-8B in BF16 on an H100 80 GB with default flags."""
    pool = PRODUCTION_POOL
    assert pool.reserved_mib == 13_440 and pool.mem_fraction_static == 0.835
    assert pool.bytes_per_token == 131_072
    assert pool.tokens == 414_094
    assert 380_000 < pool.tokens < 430_000
    assert len(pool.lines()) == 6 and f"{pool.tokens:,}" in pool.lines()[-1]
    # a larger GPU keeps the same reserve and gets more pool; a bigger runtime footprint less
    assert sglang_kv_pool(gpu_mib=143_771).tokens > 2 * pool.tokens
    assert sglang_kv_pool(runtime_gib=3.0).tokens == pytest.approx(pool.tokens - 2 * 8192, abs=2)


def test_queue_waits_and_decode_batches_are_counted_per_call_and_pass() -> None:
    sessions = generate(WorkloadParams(kind="react", sessions=30, rate=20.0, seed=3))
    cfg = FleetConfig(workers=1, capacity_tokens=60_000)
    (pol,) = make_policies(["least-load"], 1, 1, 3, capacity=cfg.capacity_tokens)
    res = simulate(sessions, pol, cfg)
    assert len(res.queue_waits) == res.calls and min(res.queue_waits) >= 0
    assert sum(res.decode_batches.values()) > 0
    m = report.metrics(res, None)
    assert 1 <= m["decode_batch_p50"] <= m["decode_batch_p90"] <= m["decode_batch_max"] == max(res.decode_batches)
    assert m["decode_batch_max"] > 1  # 30 sessions at 20/s on one worker batch their decodes
    assert 0 <= m["queue_wait_p50_s"] <= m["queue_wait_p99_s"] <= max(res.queue_waits)


@pytest.mark.slow
def test_production_preset_reports_the_pool_and_what_binds(tmp_path) -> None:
    argv = ["--preset", "production", "--sessions", "6", "--workers", "1", "--rate", "0.5",
            "--policies", "consistent-hash", "--no-plots", "--quiet", "--out", str(tmp_path)]
    assert main_bench(argv) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["config"]["workload"] == "coding"
    assert doc["config"]["capacity_tokens_per_worker"] == PRODUCTION_POOL.tokens
    assert doc["config"]["kv_pool"]["mem_fraction_static"] == 0.835
    for name in ("consistent-hash", "oracle"):
        m = doc["policies"][name]
        assert m["sessions_completed"] == 6 and m["decode_batch_max"] >= 1 and m["queue_wait_p99_s"] >= 0
    md = (tmp_path / "results.md").read_text()
    assert "## What binds: queue waits and decode batch sizes" in md and "mem_fraction_static = " in md
