"""Pieces every sim-engine benchmark shares: running policies, the working set, and the throughput figures.
``runner`` (flags) and ``pressure`` both build on it."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from agent_cache.bench.fleetsim import FleetConfig, RunResult, simulate, stderr_progress
from agent_cache.bench.registry import make_policies
from agent_cache.bench.workloads import SessionSpec
from agent_cache.placement.rule import Policy

def working_set(sessions: list[SessionSpec], cfg: FleetConfig, seed: int) -> int:
    """The workload's live working set in tokens, as the oracle run measures it (timing as on a real fleet)."""
    return simulate(sessions, make_policies(["oracle"], cfg.workers, 1, seed)[0], cfg).working_set_tokens


def resolve_capacity(capacity: int | float | None, default: int, sessions: list[SessionSpec], cfg: FleetConfig,
                     seed: int) -> tuple[int, int | None]:
    """Per-worker KV tokens for ``--capacity-tokens`` (a multiple is of the working set); and the working set."""
    if capacity is None or isinstance(capacity, int):
        return capacity or default, None
    ws = working_set(sessions, cfg, seed)
    return max(1, math.ceil(capacity * ws / cfg.workers)), ws


def run_all(sessions: list[SessionSpec], names: Sequence[str], cfg: FleetConfig, seed: int,
            log: Callable[[str], None], label: str = "", progress: bool = True,
            redis_url: str | None = None, placement: Policy | None = None) -> list[RunResult]:
    """Each policy of ``names`` over the same sessions, one after another."""
    out = []
    for pol in make_policies(names, cfg.workers, cfg.replicas, seed, capacity=cfg.capacity_tokens, redis_url=redis_url,
                             placement=placement):
        tag = f"{label}{pol.name}"
        res = simulate(sessions, pol, cfg, stderr_progress(tag) if progress else None)
        log(f"{tag}: {res.sessions_done}/{res.sessions} sessions, {res.calls} calls, {res.wall_s:.1f} s")
        out.append(res)
    return out


def hit_rate(res: RunResult) -> float:
    return res.cached_tokens / res.prompt_tokens if res.prompt_tokens else 0.0


def throughput(res: RunResult) -> float:
    return res.sessions_done / max(res.last_done - res.first_arrival, 1e-9)


def at_slo(throughputs: list[float], p99s: list[float], slo: float) -> float | None:
    """The highest throughput of the load sweep whose p99 TTFT met the SLO (None: no load point met it)."""
    met = [t for t, p in zip(throughputs, p99s) if p <= slo]
    return max(met) if met else None
