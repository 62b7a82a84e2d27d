"""Smoke test of ``agent-cache bench``: correctness of a reduced quick preset, never speed."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from agent_cache.bench.registry import SIM_POLICIES
from agent_cache.bench.runner import main_bench
from agent_cache.traces import iter_trace

pytestmark = pytest.mark.slow  # its module fixture runs whole benchmarks

TRACE = Path(__file__).resolve().parents[1] / "data" / "reflexion_hotpotqa.jsonl.gz"
DOCUMENTED = ("token_hit_rate", "oracle_fraction", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
              "mean_session_latency_s", "throughput_sessions_per_s", "prompt_tokens_per_s", "output_tokens_per_s",
              "kv_gb", "load_imbalance", "moves")


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("quick")
    # the quick preset with fewer sessions (the sweeps then use as many): same code path, seconds not minutes
    assert main_bench(["--preset", "quick", "--sessions", "80", "--replicas", "2", "--out", str(out), "--quiet"]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_every_policy_completes_every_session(quick) -> None:
    _, doc = quick
    assert set(doc["policies"]) == set(SIM_POLICIES)
    for name, m in doc["policies"].items():
        assert m["sessions_completed"] == m["sessions"] == 80, name
        assert m["calls"] > 80


def test_hit_rates_bounded_by_oracle(quick) -> None:
    _, doc = quick
    pol = doc["policies"]
    oracle = pol["oracle"]["token_hit_rate"]
    for name, m in pol.items():
        assert 0.0 <= m["token_hit_rate"] <= oracle + 1e-12, name
        assert 0.0 <= m["oracle_fraction"] <= 1.0 + 1e-12, name
    assert pol["no-cache"]["token_hit_rate"] == 0.0
    assert pol["agent-cache"]["token_hit_rate"] >= pol["round-robin"]["token_hit_rate"]
    assert pol["agent-cache"]["token_hit_rate"] >= pol["agent-cache-no-templates"]["token_hit_rate"]
    for stateless in ("round-robin", "random", "least-load", "consistent-hash", "oracle", "no-cache"):
        assert pol[stateless]["moves"] == 0


def test_results_files(quick) -> None:
    out, doc = quick
    assert {"config", "policies", "capacity_sweep", "load_sweep", "workers_sweep", "replicas_sweep"} <= set(doc)
    assert doc["config"]["workers"] == 8 and doc["config"]["replicas"] == 2
    for m in doc["policies"].values():
        for key in DOCUMENTED:
            assert key in m
        assert isinstance(m["moves"], int)
        assert m["ttft_p50_s"] <= m["ttft_p95_s"] <= m["ttft_p99_s"]
    for sweep in ("capacity_sweep", "load_sweep", "workers_sweep", "replicas_sweep"):
        for ys in doc[sweep]["y"].values():
            assert len(ys) == len(doc[sweep]["x"])
    # agent-cache shares one store across replicas: its hit rate does not depend on how many there are
    rep = doc["replicas_sweep"]["y"]["agent-cache"]
    assert max(rep) - min(rep) < 1e-9, rep
    for name in ("agent-cache", "oracle", "no-cache"):
        for ys in (doc["workers_sweep"]["y"][name], rep):
            assert all(0.0 <= y <= 1.0 for y in ys)
    slo = doc["config"]["slo_ttft_p99_s"]
    assert slo == 0.5
    load = doc["load_sweep"]
    for name, ys in load["y"].items():
        met = [t for t, p in zip(ys, load["ttft_p99_s"][name]) if p <= slo]
        assert doc["policies"][name]["throughput_at_slo_sessions_per_s"] == (max(met) if met else None), name
    # caching makes the tail shorter at every load, so agent-cache sustains at least round-robin's rate
    assert (doc["policies"]["agent-cache"]["throughput_at_slo_sessions_per_s"] or 0.0) >= (
        doc["policies"]["round-robin"]["throughput_at_slo_sessions_per_s"] or 0.0)
    md = (out / "results.md").read_text()
    assert "| agent-cache |" in md and "| oracle |" in md and "Throughput at the SLO (TTFT p99 <= 0.5 s)" in md
    for png in ("ttft_cdf.png", "hit_rate_vs_capacity.png", "throughput_vs_load.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp files left
    umask = os.umask(0)
    os.umask(umask)
    for written in out.iterdir():  # readable as any file the user writes: 0644 under the usual umask 022
        assert stat.S_IMODE(written.stat().st_mode) == 0o666 & ~umask, written


def test_trace_replay_completes_every_call(tmp_path) -> None:
    first10: dict[str, int] = {}
    for c in iter_trace(str(TRACE)):
        if c.session_id in first10 or len(first10) < 10:
            first10[c.session_id] = first10.get(c.session_id, 0) + 1
    rc = main_bench(["--trace", str(TRACE), "--sessions", "10", "--workers", "4", "--no-sweeps", "--no-plots",
                     "--policies", "round-robin,agent-cache,no-cache", "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["config"]["workload"] == "trace"
    for name, m in doc["policies"].items():
        assert m["sessions_completed"] == 10, name
        assert m["calls"] == sum(first10.values()), name
    assert doc["policies"]["agent-cache"]["token_hit_rate"] > doc["policies"]["round-robin"]["token_hit_rate"]


@pytest.mark.parametrize("argv, flag", [
    (["--workers", "0"], "--workers"),
    (["--replicas", "-1"], "--replicas"),
    (["--preset", "huge"], "--preset"),
    (["--policies", "round-robin,psychic"], "--policies"),
    (["--trace", "/nonexistent/trace.jsonl"], "--trace"),
    (["--slo-ttft-p99", "0"], "--slo-ttft-p99"),
    (["--placement", "balance=2"], "--placement"),
    (["--placement", "balance_factor=high"], "balance_factor"),
    (["--engine", "real", "--placement", "balance_factor=2"], "--placement"),
    (["--preset", "pressure", "--capacity-tokens", "x1.5"], "--capacity-tokens"),
])
def test_bad_input_exits_2_naming_the_flag(argv, flag, tmp_path, capsys) -> None:
    assert main_bench([*argv, "--out", str(tmp_path), "--quiet"]) == 2
    assert flag in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_placement_tunables_reach_the_router(tmp_path) -> None:
    """--placement builds agent-cache's Policy: a larger fair share keeps more sessions on template holders."""
    placed = {}
    for factor in ("1.0", "3.0"):
        out = tmp_path / factor
        argv = ["--preset", "quick", "--sessions", "120", "--policies", "agent-cache", "--no-sweeps", "--no-plots",
                "--placement", f"balance_factor={factor},quiet_factor=4", "--out", str(out), "--quiet"]
        assert main_bench(argv) == 0
        doc = json.loads((out / "results.json").read_text())
        assert doc["config"]["placement"]["balance_factor"] == float(factor)
        placed[factor] = doc["policies"]["agent-cache"]["token_hit_rate"]
    assert placed["3.0"] > placed["1.0"], placed


def test_module_entry_point(tmp_path) -> None:
    p = subprocess.run([sys.executable, "-m", "agent_cache.bench.runner", "--workers", "0", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--workers" in p.stderr
