"""``--preset pressure``: the SLO search and a small run of the whole preset on the product's router."""

from __future__ import annotations

import json
import math

import pytest

from agent_cache.bench import pressure
from agent_cache.bench.runner import build_parser


def _linear(points_seen: list[float]):
    """A fleet whose p99 TTFT is 0.1 s per offered session/s, with throughput equal to the offered load."""

    def run_at(rate: float) -> dict:
        points_seen.append(rate)
        return {"ttft_p99_s": 0.1 * rate, "throughput_sessions_per_s": rate}

    return run_at


def test_slo_search_doubles_then_bisects_to_within_a_ninth_of_the_limit() -> None:
    seen: list[float] = []
    points, best = pressure.slo_search(_linear(seen), 0.25, 0.5)
    assert seen[:6] == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]  # doubling until 8/s fails (0.8 s > 0.5 s)
    assert len(seen) == 6 + pressure.BISECTIONS
    assert best["bounded"] is True
    assert 5.0 / 2 ** (1 / 8) <= best["rate"] <= 5.0  # the true limit is 5 sessions/s
    assert best["sessions_per_s"] == best["rate"]
    assert set(points) == set(seen)


def test_slo_search_reports_a_lower_bound_or_nothing() -> None:
    _, never = pressure.slo_search(_linear([]), 0.001, 0.5, doublings=4)
    assert never == {"rate": 0.008, "sessions_per_s": 0.008, "bounded": False}
    _, always = pressure.slo_search(_linear([]), 10.0, 0.5)
    assert always == {"rate": None, "sessions_per_s": 0.0, "bounded": True}


def test_a_small_pressure_run_reports_every_capacity_and_the_throughput_at_the_slo() -> None:
    args = build_parser().parse_args(["--preset", "pressure", "--policies", "consistent-hash,agent-cache",
                                      "--replicas", "2", "--quiet"])
    doc = pressure.run(args, 4, lambda m: None, workloads={"react": (16, 2.0)})
    entry = doc["pressure"]["react"]
    ws = entry["working_set_tokens"]
    assert ws > 0 and entry["sessions"] == 16
    for mult in pressure.MULTIPLES:
        c = entry["capacity"][f"x{mult:g}"]
        assert c["capacity_tokens_per_worker"] == math.ceil(mult * ws / 4)
        assert list(c["policies"]) == ["consistent-hash", "agent-cache"]
        for m in c["policies"].values():
            assert 0.0 < m["token_hit_rate"] < 1.0 and m["ttft_p99_s"] > 0
    # less memory never helps: the hit rate at x1 is at most the one at x3
    for name in ("consistent-hash", "agent-cache"):
        assert (entry["capacity"]["x1"]["policies"][name]["token_hit_rate"]
                <= entry["capacity"]["x3"]["policies"][name]["token_hit_rate"] + 1e-9)
    for name in ("consistent-hash", "agent-cache"):
        best = entry["throughput_at_slo"][name]
        runs = entry["load"][name]
        assert float(next(iter(runs))) == pytest.approx(0.5)  # the search starts at a quarter of the base rate
        if best["rate"] is not None:
            assert runs[f"{best['rate']:.4g}"]["ttft_p99_s"] <= doc["config"]["slo_ttft_p99_s"]
    md = pressure.markdown(doc)
    assert "Throughput at the SLO" in md and "| consistent-hash |" in md


def test_pressure_with_seeds_bands_each_capacity_and_no_sweeps_skips_the_load_search() -> None:
    args = build_parser().parse_args(["--preset", "pressure", "--policies", "agent-cache,agent-cache-kv",
                                      "--seeds", "2", "--no-sweeps", "--quiet"])
    doc = pressure.run(args, 2, lambda m: None, workloads={"react": (8, 2.0)})
    entry = doc["pressure"]["react"]
    assert entry["load"] == {} and entry["throughput_at_slo"] == {}
    for mult in pressure.MULTIPLES:
        c = entry["capacity"][f"x{mult:g}"]
        assert c["seeds"] == [0, 1] and len(c["runs"]) == 2
        for name in ("agent-cache", "agent-cache-kv"):
            lo, mid, hi = c["bands"][name]["token_hit_rate"]
            assert lo <= mid <= hi and lo == min(r[name]["token_hit_rate"] for r in c["runs"])
    assert "Bands over seeds 0, 1" in pressure.markdown(doc)


def test_the_pressure_cli_with_a_workload_runs_that_kind_only(tmp_path, monkeypatch) -> None:
    from agent_cache.bench.runner import main_bench

    monkeypatch.setattr(pressure, "WORKLOADS", {"react": (8, 2.0), "reflexion": (6, 2.0), "coding": (2, 0.5)})
    out = tmp_path / "out"
    assert main_bench(["--preset", "pressure", "--workload", "reflexion", "--policies", "agent-cache", "--workers",
                       "2", "--no-sweeps", "--no-plots", "--quiet", "--out", str(out)]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert list(doc["pressure"]) == ["reflexion"] and doc["pressure"]["reflexion"]["sessions"] == 6
