"""``agent-cache bench``: compare routing policies on agent workloads.

Two engines: ``--engine sim`` (default), a virtual-clock fleet simulation
(:mod:`agent_cache.bench.fleetsim`); ``--engine real``, real processes:
simulated worker servers, Redis, router replica processes and the smg
gateway (:mod:`agent_cache.bench.realengine`, which has its own presets).

Presets of the sim engine:

* ``quick``: 8 workers, 300 ReAct sessions, every policy, small sweeps
  (under 2 minutes on 2 cores);
* ``full``: 16 workers, 3,000 ReAct sessions, larger sweeps;
* ``seed``: no prefix caching vs agent-cache on a ReAct workload at a load
  that saturates the no-cache fleet: sessions/s, mean session latency, KV.

``python -m agent_cache.bench.runner --preset quick --out bench-out`` works
as well as ``agent-cache bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from agent_cache.bench import report
from agent_cache.bench.fleetsim import FleetConfig, RunResult, simulate, stderr_progress
from agent_cache.bench.policies import POLICIES, make_policies
from agent_cache.bench.realload import REAL_POLICIES
from agent_cache.bench.workloads import KINDS, SessionSpec, WorkloadParams, generate, load_trace
from agent_cache.errors import AgentCacheError, ConfigError
from agent_cache.placement.rule import Policy
from agent_cache.routing.config import check_policy

ALL_POLICIES = tuple(POLICIES)
_SWEEP_POLICIES = ("round-robin", "least-load", "consistent-hash", "agent-cache", "agent-cache-no-templates",
                   "oracle", "no-cache")


@dataclass(frozen=True)
class Preset:
    workers: int
    sessions: int
    rate: float
    policies: tuple[str, ...] = ALL_POLICIES
    kind: str = "react"
    capacity_tokens: int = 400_000
    capacity_sweep: tuple[int, ...] = ()
    workers_sweep: tuple[int, ...] = ()
    replicas_sweep: tuple[int, ...] = ()
    load_sweep: tuple[float, ...] = ()
    sweep_sessions: int = 0


PRESETS = {
    "quick": Preset(workers=8, sessions=300, rate=8.0, capacity_sweep=(8_000, 32_000, 128_000),
                    workers_sweep=(4, 8, 16), replicas_sweep=(1, 2, 4),
                    load_sweep=(4.0, 16.0, 64.0), sweep_sessions=150),
    "full": Preset(workers=16, sessions=3_000, rate=16.0, capacity_sweep=(8_000, 32_000, 128_000, 400_000),
                   workers_sweep=(8, 16, 32, 64), replicas_sweep=(1, 2, 4, 8),
                   load_sweep=(8.0, 32.0, 64.0, 128.0), sweep_sessions=600),
    "seed": Preset(workers=8, sessions=1_000, rate=30.0, policies=("no-cache", "agent-cache")),
    # ReAct, Reflexion and coding at KV capacity x1, x1.5, x3 of the working set, then at rising load
    "pressure": Preset(workers=8, sessions=0, rate=0.0, policies=()),
}


# An agent step should start answering within half a second, even at the tail.
DEFAULT_SLO_TTFT_P99 = 0.5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agent-cache bench",
        description="Compare routing policies on agent workloads: a virtual-clock fleet simulation (--engine sim) "
                    "or real processes (--engine real: simulated SGLang worker servers, Redis, router replica "
                    "processes and the real smg gateway; oracle and no-cache exist only in the sim engine).")
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                   help="sim: quick 8 workers/300 sessions, full 16/3,000, seed no-cache vs agent-cache, pressure "
                        "ReAct/Reflexion/coding at KV capacity x1, x1.5, x3 of the working set and rising load; "
                        "real: quick 4 workers/32 sessions, full 8/200, seed 4/60 with 4x slower modelled GPUs")
    p.add_argument("--engine", choices=("sim", "real"), default="sim",
                   help="sim: virtual-clock fleet simulation; real: real processes (simulated workers, Redis, smg)")
    p.add_argument("--trace", metavar="FILE", help="replay sessions of a JSONL trace instead of generated ones")
    p.add_argument("--workload", choices=KINDS, help="generated workload kind (default: preset's); coding: "
                   "long-context software-engineering sessions (15-40 steps, contexts past 30k tokens)")
    p.add_argument("--workers", type=int, help="workers in the fleet")
    p.add_argument("--replicas", type=int, default=1,
                   help="router replicas (sim: policies with local state; real: load-generating router processes)")
    p.add_argument("--sessions", type=int, help="sessions in the main comparison")
    p.add_argument("--rate", type=float, help="offered load in sessions/s (with --trace: replaces the recorded "
                   "session start times; the recorded gaps within a session are kept)")
    p.add_argument("--speedup", type=float, default=1.0,
                   help="--trace: divide the recorded gaps between a session's calls by this factor")
    p.add_argument("--capacity-tokens", type=capacity_arg, metavar="N|xM",
                   help="KV cache capacity per worker: N tokens, or xM, M times the workload's measured working "
                        "set (peak live sessions' context tokens) divided among the workers, e.g. x1.5")
    p.add_argument("--page-size", type=int, default=1, help="radix cache page size in tokens")
    p.add_argument("--arrivals", choices=("poisson", "bursty"), default="poisson")
    p.add_argument("--policies", help="comma-separated subset of: " + ", ".join(ALL_POLICIES)
                   + " (sim engine); " + ", ".join(REAL_POLICIES) + " (real engine)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="bench-results", metavar="DIR")
    p.add_argument("--no-sweeps", action="store_true", help="skip the capacity and offered-load sweeps (sim engine)")
    p.add_argument("--redis", metavar="URL", help="Redis for agent-cache's metadata (sim engine: the routers run "
                   "the real Lua scripts on it, default: the in-process store; real engine, default: a private "
                   "redis-server); the run's keys are deleted at the end")
    p.add_argument("--placement", type=placement_arg, metavar="FIELD=VALUE[,...]",
                   help="sim engine: agent-cache's placement Policy fields, e.g. balance_factor=1.5,quiet_factor=8 "
                        "(default: the defaults of docs/routing.md)")
    p.add_argument("--gateways", type=int, default=1, metavar="K",
                   help="real engine: smg gateways per smg policy, joined in smg's mesh, each call sent to the next "
                        "one in turn (default 1)")
    p.add_argument("--time-scale", type=float, metavar="S",
                   help="real engine: the simulated workers' latency model x S (1 = real time, 0 = instant; "
                        "default: the preset's)")
    p.add_argument("--slo-ttft-p99", type=float, default=DEFAULT_SLO_TTFT_P99, metavar="SECONDS",
                   help="sim engine: the p99 TTFT bound of 'throughput at the SLO', read off the offered-load sweep "
                        f"(default {DEFAULT_SLO_TTFT_P99:g} s)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(name, f"must be positive, got {value}")


def _check(args: argparse.Namespace) -> None:
    for flag in ("workers", "replicas", "sessions", "rate", "page_size", "slo_ttft_p99", "speedup"):
        _positive("--" + flag.replace("_", "-"), getattr(args, flag))
    if args.trace and not os.path.isfile(args.trace):
        raise ConfigError("--trace", f"no such file: {args.trace}")
    if args.engine == "real":
        if args.placement is not None:
            raise ConfigError("--placement", "applies only to --engine sim")
        from agent_cache.bench import realengine

        realengine.check(args)
        return
    if args.time_scale is not None:
        raise ConfigError("--time-scale", "applies only to --engine real")
    if args.gateways != 1:
        raise ConfigError("--gateways", "applies only to --engine real (smg runs as real processes)")
    if args.redis is not None:
        from agent_cache.bench.realengine import check_redis

        check_redis(args.redis)
    if args.policies:
        unknown = [n for n in args.policies.split(",") if n.strip() not in POLICIES]
        if unknown:
            raise ConfigError("--policies", f"unknown {', '.join(unknown)}; choose from {', '.join(ALL_POLICIES)}")


def capacity_arg(text: str) -> int | float:
    """``--capacity-tokens``: an int of tokens, or ``x<float>`` (returned as a float multiple)."""
    try:
        value: int | float = float(text[1:]) if text.startswith("x") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected tokens (e.g. 60000) or a working-set multiple (e.g. x1.5), "
                                         f"got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def placement_arg(text: str) -> Policy:
    """``--placement``: ``field=value`` pairs of :class:`Policy`, comma-separated (numbers only)."""
    fields = {f.name for f in dataclasses.fields(Policy)}
    values: dict[str, float] = {}
    for pair in filter(None, (t.strip() for t in text.split(","))):
        name, sep, raw = pair.partition("=")
        if name not in fields or not sep:
            raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with FIELD one of {', '.join(sorted(fields))}, "
                                             f"got {pair!r}")
        try:
            values[name] = float(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name}: expected a number, got {raw!r}") from None
    try:
        return check_policy(Policy(**values))
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _workload(args: argparse.Namespace, preset: Preset, sessions: int, rate: float | None,
              kind: str | None = None) -> list[SessionSpec]:
    if args.trace:
        return load_trace(args.trace, sessions=sessions, rate=rate, speedup=args.speedup,
                          arrivals=args.arrivals, seed=args.seed)
    return generate(WorkloadParams(kind=kind or args.workload or preset.kind, sessions=sessions,
                                   rate=rate or preset.rate, arrivals=args.arrivals, seed=args.seed))


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


def _run_all(sessions: list[SessionSpec], names: Sequence[str], cfg: FleetConfig, seed: int,
             log: Callable[[str], None], label: str = "", progress: bool = True,
             redis_url: str | None = None, placement: Policy | None = None) -> list[RunResult]:
    out = []
    for pol in make_policies(names, cfg.workers, cfg.replicas, seed, capacity=cfg.capacity_tokens, redis_url=redis_url,
                             placement=placement):
        tag = f"{label}{pol.name}"
        res = simulate(sessions, pol, cfg, stderr_progress(tag) if progress else None)
        log(f"{tag}: {res.sessions_done}/{res.sessions} sessions, {res.calls} calls, {res.wall_s:.1f} s")
        out.append(res)
    return out


def _hit(res: RunResult) -> float:
    return res.cached_tokens / res.prompt_tokens if res.prompt_tokens else 0.0


def _throughput(res: RunResult) -> float:
    return res.sessions_done / max(res.last_done - res.first_arrival, 1e-9)


def _at_slo(throughputs: list[float], p99s: list[float], slo: float) -> float | None:
    """The highest throughput of the load sweep whose p99 TTFT met the SLO (None: no load point met it)."""
    met = [t for t, p in zip(throughputs, p99s) if p <= slo]
    return max(met) if met else None


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the comparison (and sweeps) of ``args``; write the results; return results.json's content."""
    preset = PRESETS[args.preset]
    if args.preset == "pressure":
        return _run_pressure(args, preset)
    names = tuple(n.strip() for n in args.policies.split(",")) if args.policies else preset.policies
    if "oracle" not in names and args.preset != "seed":
        names = names + ("oracle",)  # oracle_fraction needs it
    workers = args.workers or preset.workers
    n_sessions = args.sessions or (100 if args.trace else preset.sessions)
    rate = args.rate if args.trace else (args.rate or preset.rate)
    cfg = FleetConfig(workers=workers, page_size=args.page_size, replicas=args.replicas)
    log: Callable[[str], None] = (lambda m: None) if args.quiet else (
        lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    sessions = _workload(args, preset, n_sessions, rate)
    log(f"workload: {len(sessions)} sessions ({'trace ' + args.trace if args.trace else args.workload or preset.kind})"
        f", built in {time.perf_counter() - t0:.1f} s")
    capacity, ws = resolve_capacity(args.capacity_tokens, preset.capacity_tokens, sessions, cfg, args.seed)
    cfg = dataclasses.replace(cfg, capacity_tokens=capacity)
    if ws is not None:
        log(f"working set {ws:,} tokens: {capacity:,} KV tokens per worker ({args.capacity_tokens:g} x)")
    results = _run_all(sessions, names, cfg, args.seed, log, progress=not args.quiet, redis_url=args.redis,
                       placement=args.placement)
    oracle = next((r for r in results if r.policy == "oracle"), None)
    config = {
        "preset": args.preset, "engine": "sim", "workload": "trace" if args.trace else (args.workload or preset.kind),
        "trace": args.trace, "workers": workers, "replicas": args.replicas, "sessions": len(sessions),
        "rate_sessions_per_s": rate, "speedup": args.speedup if args.trace else None,
        "working_set_tokens": ws if ws is not None else (oracle.working_set_tokens if oracle else None),
        "capacity_multiple": args.capacity_tokens if isinstance(args.capacity_tokens, float) else None,
        "metadata_store": "redis" if args.redis else "memory", "arrivals": args.arrivals, "capacity_tokens_per_worker": cfg.capacity_tokens,
        "page_size": cfg.page_size, "seed": args.seed, "model": cfg.latency.model.name, "gpu": cfg.latency.gpu.name,
        "max_running_requests": cfg.scheduler_config("radix").running_limit, "schedule_policy": cfg.schedule_policy,
        "placement": dataclasses.asdict(args.placement or Policy()),
    }
    doc: dict[str, Any] = {"config": config, "policies": report.all_metrics(results)}
    sweep_names = tuple(n for n in _SWEEP_POLICIES if n in names)
    if not args.no_sweeps and preset.sweep_sessions and sweep_names:
        small = _workload(args, preset, min(preset.sweep_sessions, n_sessions), rate)
        ys: dict[str, list[float]] = {n: [] for n in sweep_names}
        for cap in preset.capacity_sweep:
            for r in _run_all(small, sweep_names, dataclasses.replace(cfg, capacity_tokens=cap), args.seed, log,
                              f"capacity={cap} ", progress=False, redis_url=args.redis, placement=args.placement):
                ys[r.policy].append(_hit(r))
        doc["capacity_sweep"] = {"x_label": "capacity_tokens", "x": list(preset.capacity_sweep), "y": ys,
                                 "sessions": len(small), "metric": "token_hit_rate"}
        # fleet size and router replicas (replicas matter to policies with local state only)
        for key, label, values in (("workers_sweep", "workers", preset.workers_sweep),
                                   ("replicas_sweep", "replicas", preset.replicas_sweep)):
            if not values:
                continue
            ys = {n: [] for n in sweep_names}
            for x in values:
                changes: dict[str, Any] = {label: x}  # label names a FleetConfig field (workers, replicas)
                for r in _run_all(small, sweep_names, dataclasses.replace(cfg, **changes), args.seed, log,
                                  f"{label}={x} ", progress=False, redis_url=args.redis, placement=args.placement):
                    ys[r.policy].append(_hit(r))
            doc[key] = {"x_label": label, "x": list(values), "y": ys, "sessions": len(small),
                        "metric": "token_hit_rate"}
        ys = {n: [] for n in sweep_names}
        p99s: dict[str, list[float]] = {n: [] for n in sweep_names}
        for load in preset.load_sweep:
            loaded = _workload(args, preset, min(preset.sweep_sessions, n_sessions), load)
            for r in _run_all(loaded, sweep_names, cfg, args.seed, log, f"rate={load:g} ", progress=False,
                              redis_url=args.redis, placement=args.placement):
                ys[r.policy].append(_throughput(r))
                p99s[r.policy].append(report.quantile(sorted(r.ttfts), 0.99))
        doc["load_sweep"] = {"x_label": "rate", "x": list(preset.load_sweep), "y": ys, "ttft_p99_s": p99s,
                             "sessions": len(small), "metric": "throughput_sessions_per_s"}
        doc["config"]["slo_ttft_p99_s"] = args.slo_ttft_p99
        for name in sweep_names:
            doc["policies"][name]["throughput_at_slo_sessions_per_s"] = _at_slo(ys[name], p99s[name], args.slo_ttft_p99)
    doc["config"]["wall_s"] = round(time.perf_counter() - t0, 1)
    paths = report.write_results(args.out, doc)
    if not args.no_plots:
        paths += report.write_plots(args.out, {r.policy: r.ttfts for r in results}, doc)
    log("wrote " + ", ".join(paths))
    return doc


def _run_pressure(args: argparse.Namespace, preset: Preset) -> dict[str, Any]:
    from agent_cache.bench import pressure

    log: Callable[[str], None] = (lambda m: None) if args.quiet else (
        lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    doc = pressure.run(args, args.workers or preset.workers, log)
    os.makedirs(args.out, exist_ok=True)
    paths = [os.path.join(args.out, "results.json"), os.path.join(args.out, "results.md")]
    report.write_atomic(paths[0], json.dumps(doc, indent=2) + "\n")
    report.write_atomic(paths[1], pressure.markdown(doc))
    if not args.no_plots:
        paths += pressure.write_plots(args.out, doc)
    log("wrote " + ", ".join(paths))
    return doc


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit (so ``finally`` blocks run) while the real engine runs in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main_bench(argv: list[str] | None = None) -> int:
    """Entry point of ``agent-cache bench``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as e:  # bad choices (argparse printed which flag) or --help
        return int(e.code or 0)
    try:
        _check(args)
        if args.engine == "real":
            from agent_cache.bench import realengine

            with _sigterm_as_exit():  # a killed run still stops its processes
                doc = realengine.run(args)
        else:
            doc = run(args)
    except ConfigError as e:
        print(f"agent-cache bench: {e}", file=sys.stderr)
        return 2
    except AgentCacheError as e:  # e.g. TraceFormatError, BenchProcessError
        print(f"agent-cache bench: {e}", file=sys.stderr)
        return 1
    if "pressure" in doc:
        from agent_cache.bench import pressure

        print(pressure.markdown(doc), end="")
        return 0
    columns = report.REAL_COLUMNS if args.engine == "real" else report.SIM_COLUMNS
    print(report.markdown_table(doc["policies"], columns), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
