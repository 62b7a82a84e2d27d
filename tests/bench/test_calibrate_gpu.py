"""``python -m agent_cache.bench.calibrate_gpu``: the fit recovers known constants; ``--tiny`` runs on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="calibrate_gpu needs torch (the calibrate extra)")

from agent_cache.bench.calibrate_gpu import FULL, Sample, Shape, fit, predict  # noqa: E402
from agent_cache.sim.latency import GPUConfig, LatencyModel, ModelConfig  # noqa: E402


def test_llama_shape_has_llama_3_1_8b_parameter_count() -> None:
    assert Shape().params() == pytest.approx(8.03e9, rel=0.001)


def test_the_fit_recovers_the_constants_that_made_the_times() -> None:
    gpu = GPUConfig(name="H200", bf16_flops=989e12, hbm_bytes_per_s=4.8e12)
    truth = LatencyModel(model=ModelConfig(), gpu=GPUConfig(name="H200", bf16_flops=989e12, hbm_bytes_per_s=4.8e12,
                                                            mfu=0.52, bandwidth_efficiency=0.81), overhead_s=0.0017)
    shapes = [Sample("prefill", 1, n, 0.0) for n in FULL.prefill_lengths]
    shapes += [Sample("prefill", b, n, 0.0) for b, n in FULL.prefill_batches]
    shapes += [Sample("decode", b, c, 0.0) for b, c in FULL.decode]
    samples = [Sample(s.kind, s.batch, s.tokens, predict(truth, s)) for s in shapes]
    fitted = fit(samples, ModelConfig(), gpu)
    assert fitted.gpu.mfu == pytest.approx(0.52, rel=1e-6)
    assert fitted.gpu.bandwidth_efficiency == pytest.approx(0.81, rel=1e-6)
    assert fitted.overhead_s == pytest.approx(0.0017, rel=1e-6)


@pytest.mark.slow
def test_tiny_runs_on_cpu_and_prints_the_table_and_constants(tmp_path: Path) -> None:
    out = tmp_path / "cal.json"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run([sys.executable, "-m", "agent_cache.bench.calibrate_gpu", "--tiny", "--quiet", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    assert "| prefill 1 x 1,024 |" in p.stdout and "fitted:  --mfu" in p.stdout
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == 7 and all(r["measured_s"] > 0 for r in doc["rows"])
    assert doc["current"] == {"mfu": 0.7, "bandwidth_efficiency": 0.75, "per_pass_overhead_ms": pytest.approx(0.9)}


def test_without_a_gpu_the_full_run_says_so() -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run([sys.executable, "-m", "agent_cache.bench.calibrate_gpu"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 2 and "no GPU" in p.stderr
