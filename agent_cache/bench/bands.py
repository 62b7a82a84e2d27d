"""Bands: each policy's figures over several seeds and latency constants, and which differences hold.

A single run's timing figures move with the workload's seed and with the
latency model's uncertain constants (``sim/latency.py``). ``--seeds N`` runs
every policy over N seeds, ``--latency-band`` also at the ``fast`` and
``slow`` profiles; each figure is then reported as ``[min, median, max]``
over those runs, and a difference between two policies is claimed only
where their bands do not overlap.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from agent_cache.sim.latency import LatencyModel, latency_model

BAND_KEYS = ("token_hit_rate", "ttft_p99_s", "throughput_at_slo_sessions_per_s")
BAND_PROFILES = ("fast", "slow")  # the low and high plausible latency constants


@dataclass(frozen=True)
class Variant:
    """One run of every policy: a workload seed and a latency model."""

    seed: int
    latency_name: str
    latency: LatencyModel


def variants(seed: int, seeds: int, latency_band: bool, latency: LatencyModel, latency_name: str) -> list[Variant]:
    """The runs a band is made of, the primary run (``seed``, ``latency``) first."""
    lats = [(latency_name, latency)]
    if latency_band:
        lats += [(p, latency_model(p)) for p in BAND_PROFILES if latency_model(p) != latency]
    return [Variant(s, name, lat) for name, lat in lats for s in range(seed, seed + seeds)]


def band(values: Sequence[float | None]) -> list[float] | None:
    """``[min, median, max]`` of the values that exist (None when none does)."""
    xs = sorted(v for v in values if v is not None)
    return [xs[0], statistics.median(xs), xs[-1]] if xs else None


def bands(runs: Sequence[Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, list[float] | None]]:
    """Per policy, the band of each of :data:`BAND_KEYS` over ``runs`` (each: policy -> metrics)."""
    names = [n for n in runs[0] if all(n in r for r in runs)]
    return {n: {k: band([r[n].get(k) for r in runs]) for k in BAND_KEYS} for n in names}


def separated(a: list[float] | None, b: list[float] | None) -> bool:
    """True when two bands do not overlap (a claim about their order holds in every run)."""
    return a is not None and b is not None and (a[2] < b[0] or b[2] < a[0])


def _cell(key: str, b: list[float] | None) -> str:
    if b is None:
        return "n/a"
    if key == "token_hit_rate":
        return " / ".join(f"{v:.1%}" for v in b)
    if key == "ttft_p99_s":
        return " / ".join(f"{v * 1000:.0f}" for v in b)
    return " / ".join(f"{v:.2f}" for v in b)


def markdown(policies: Mapping[str, Mapping[str, Any]], runs: Sequence[Mapping[str, Any]]) -> str:
    """The bands table, then each pair of policies whose bands do not overlap."""
    lines = [f"## Bands over {len(runs)} runs (min / median / max)", "",
             "Runs: " + ", ".join(f"seed {r['seed']} at {r['latency']}" for r in runs), "",
             "| policy | hit rate | TTFT p99 (ms) | sessions/s at the SLO |", "| --- | ---: | ---: | ---: |"]
    banded = {n: m["bands"] for n, m in policies.items() if "bands" in m}
    for name, b in banded.items():
        lines.append(f"| {name} | " + " | ".join(_cell(k, b[k]) for k in BAND_KEYS) + " |")
    lines += ["", "Differences that hold in every run (bands apart):", ""]
    claims = []
    names = list(banded)
    for key in BAND_KEYS:
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                ba, bb = banded[a][key], banded[b][key]
                if ba is not None and bb is not None and separated(ba, bb):
                    hi, lo = (a, b) if ba[0] > bb[2] else (b, a)
                    claims.append(f"- {key}: {hi} higher than {lo}")
    lines += claims or ["- none"]
    return "\n".join(lines) + "\n"
