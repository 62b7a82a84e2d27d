"""``--seeds`` and ``--latency-band``: every policy over several runs, each figure as [min, median, max]."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from agent_cache.bench import bands
from agent_cache.bench.runner import main_bench
from agent_cache.sim.latency import latency_model

pytestmark = pytest.mark.slow  # its module fixture runs a benchmark over several seeds


def test_band_is_min_median_max_of_what_exists() -> None:
    assert bands.band([3.0, 1.0, None, 2.0, 10.0]) == [1.0, 2.5, 10.0]
    assert bands.band([None]) is None
    assert bands.separated([1, 2, 3], [3.5, 4, 5]) and bands.separated([3.5, 4, 5], [1, 2, 3])
    assert not bands.separated([1, 2, 3.5], [3.5, 4, 5]) and not bands.separated(None, [1, 2, 3])


def test_variants_cover_seeds_and_the_latency_profiles() -> None:
    v = bands.variants(7, 2, True, latency_model(), "default")
    assert [(x.seed, x.latency_name) for x in v] == [(7, "default"), (8, "default"), (7, "fast"), (8, "fast"),
                                                      (7, "slow"), (8, "slow")]
    # a primary run at the slow profile is not run twice
    assert [x.latency_name for x in bands.variants(0, 1, True, latency_model("slow"), "slow")] == ["slow", "fast"]


@pytest.fixture(scope="module")
def banded(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("bands")
    argv = ["--preset", "quick", "--sessions", "40", "--workers", "4", "--policies", "consistent-hash,agent-cache",
            "--no-plots", "--seeds", "2", "--latency-band", "--out", str(out), "--quiet"]
    assert main_bench(argv) == 0
    return out, json.loads((out / "results.json").read_text())


def test_results_carry_bands_over_every_run(banded) -> None:
    out, doc = banded
    assert [(r["seed"], r["latency"]) for r in doc["band_runs"]] == [
        (0, "default"), (1, "default"), (0, "fast"), (1, "fast"), (0, "slow"), (1, "slow")]
    assert doc["band_runs"][4]["mfu"] == 0.45 and doc["config"]["latency"]["profile"] == "default"
    for name in ("consistent-hash", "agent-cache", "oracle"):
        b = doc["policies"][name]["bands"]
        assert set(b) == {"token_hit_rate", "ttft_p99_s", "throughput_at_slo_sessions_per_s"}
        for key in ("token_hit_rate", "ttft_p99_s", "throughput_at_slo_sessions_per_s"):
            lo, mid, hi = b[key]
            assert lo <= mid <= hi, (name, key)
        # the primary run lies inside its band; slow constants stretch the tail well past fast ones
        assert b["ttft_p99_s"][0] <= doc["policies"][name]["ttft_p99_s"] <= b["ttft_p99_s"][2]
        assert b["ttft_p99_s"][2] > 1.3 * b["ttft_p99_s"][0], name
    md = (out / "results.md").read_text()
    assert "## Bands over 6 runs" in md and "| agent-cache | " in md


def test_band_flags_apply_to_the_sim_engine_only(tmp_path, capsys) -> None:
    for argv, flag in ((["--seeds", "2"], "--seeds"), (["--latency-band"], "--latency-band"),
                       (["--mfu", "0.5"], "--latency-profile")):
        assert main_bench(["--engine", "real", *argv, "--out", str(tmp_path), "--quiet"]) == 2
        assert flag in capsys.readouterr().err
    assert main_bench(["--seeds", "0", "--out", str(tmp_path), "--quiet"]) == 2
    assert "--seeds" in capsys.readouterr().err


def test_pressure_does_not_import_the_runner() -> None:
    """The shared pieces live in bench/experiment.py: pressure and runner no longer import each other."""
    src = Path(__file__).resolve().parents[2] / "agent_cache" / "bench"
    for name, other in (("pressure", "runner"), ("experiment", "runner"), ("experiment", "pressure")):
        tree = ast.parse((src / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert f"agent_cache.bench.{other}" not in imported, name
