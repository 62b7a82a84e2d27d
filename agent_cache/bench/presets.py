"""``--preset``: what each named run of either engine defaults to, and the sessions a run replays.

One :class:`Preset` for both engines: the sweep fields are the sim engine's, ``time_scale`` the real
engine's (its simulated workers' latency model x S).

Presets of the sim engine (:data:`PRESETS`):

* ``quick``: 8 workers, 300 ReAct sessions, every policy, small sweeps
  (under 2 minutes on 2 cores);
* ``full``: 16 workers, 3,000 ReAct sessions, larger sweeps;
* ``seed``: no prefix caching vs agent-cache on a ReAct workload at a load
  that saturates the no-cache fleet: sessions/s, mean session latency, KV;
* ``pressure``: :mod:`agent_cache.bench.pressure`;
* ``production``: 4 workers, each with the KV pool SGLang allocates for
  Llama-3.1-8B on an 80 GB H100 (:mod:`agent_cache.bench.production`),
  120 coding sessions at 0.8/s; queue waits and decode batch sizes reported.

Presets of the real engine (:data:`REAL_PRESETS`), sized for a small machine (2 cores):

* ``quick``: 4 workers, 32 ReAct sessions at 2 sessions/s, every policy
  (a few minutes);
* ``full``: 8 workers, 200 sessions at 4 sessions/s;
* ``seed``: round-robin, least-load and agent-cache on 4 workers whose
  modelled GPU is 4x slower (time scale 4), 60 sessions at 4 sessions/s,
  so prefill weighs more in every call. The simulated worker does not
  serialise prefills, so this does not saturate the fleet as the sim
  engine's ``seed`` does.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from agent_cache.bench.production import PRODUCTION_POOL
from agent_cache.bench.registry import REAL_POLICIES, SIM_POLICIES
from agent_cache.bench.trace_replay import load_trace
from agent_cache.bench.workloads import SessionSpec, WorkloadParams, generate


@dataclass(frozen=True)
class Preset:
    workers: int
    sessions: int
    rate: float
    policies: tuple[str, ...] = ()
    kind: str = "react"
    capacity_tokens: int = 400_000
    capacity_sweep: tuple[int, ...] = ()  # the sweeps: sim engine
    workers_sweep: tuple[int, ...] = ()
    replicas_sweep: tuple[int, ...] = ()
    load_sweep: tuple[float, ...] = ()
    sweep_sessions: int = 0
    time_scale: float = 1.0  # real engine: the simulated workers' latency model x S


PRESETS = {
    "quick": Preset(workers=8, sessions=300, rate=8.0, policies=SIM_POLICIES, capacity_sweep=(8_000, 32_000, 128_000),
                    workers_sweep=(4, 8, 16), replicas_sweep=(1, 2, 4),
                    load_sweep=(4.0, 16.0, 64.0), sweep_sessions=150),
    "full": Preset(workers=16, sessions=3_000, rate=16.0, policies=SIM_POLICIES,
                   capacity_sweep=(8_000, 32_000, 128_000, 400_000), workers_sweep=(8, 16, 32, 64),
                   replicas_sweep=(1, 2, 4, 8), load_sweep=(8.0, 32.0, 64.0, 128.0), sweep_sessions=600),
    "seed": Preset(workers=8, sessions=1_000, rate=30.0, policies=("no-cache", "agent-cache")),
    # ReAct, Reflexion and coding at KV capacity x1, x1.5, x3 of the working set, then at rising load
    "pressure": Preset(workers=8, sessions=0, rate=0.0,
                       policies=("least-load", "consistent-hash", "agent-cache", "oracle")),
    # SGLang's own KV pool for Llama-3.1-8B on an 80 GB H100, pressed by concurrent coding-agent sessions
    "production": Preset(workers=4, sessions=120, rate=0.8, kind="coding", capacity_tokens=PRODUCTION_POOL.tokens,
                         policies=("least-load", "consistent-hash", "agent-cache")),
}

REAL_PRESETS = {
    "quick": Preset(workers=4, sessions=32, rate=2.0, policies=REAL_POLICIES, capacity_tokens=200_000),
    "full": Preset(workers=8, sessions=200, rate=4.0, policies=REAL_POLICIES, capacity_tokens=200_000),
    "seed": Preset(workers=4, sessions=60, rate=4.0, policies=("round-robin", "least-load", "agent-cache"),
                   capacity_tokens=200_000, time_scale=4.0),
}


def workload(args: argparse.Namespace, preset: Preset, sessions: int, rate: float | None,
             kind: str | None = None, seed: int | None = None, *, chat: bool = False) -> list[SessionSpec]:
    """The sessions of ``args`` (a trace, or generated); ``seed`` replaces ``args.seed``; ``rate`` None keeps
    a trace's recorded session starts; ``chat``: with their chat form too (the real engine sends it)."""
    seed = args.seed if seed is None else seed
    if args.trace:
        return load_trace(args.trace, sessions=sessions, rate=rate, speedup=args.speedup,
                          arrivals=args.arrivals, seed=seed, chat=chat)
    return generate(WorkloadParams(kind=kind or args.workload or preset.kind, sessions=sessions,
                                   rate=rate or preset.rate, arrivals=args.arrivals, seed=seed))
