"""``agent-cache bench``: compare routing policies on agent workloads.

Two engines: ``--engine sim`` (default), a virtual-clock fleet simulation
(:mod:`agent_cache.bench.fleetsim`); ``--engine real``, real processes:
worker servers (simulated, real SGLang on this CPU with ``--fleet sglang``,
or a running fleet with ``--worker-urls``), Redis, router replica processes
and the smg gateway (:mod:`agent_cache.bench.realengine`).

Presets of both engines: :mod:`agent_cache.bench.presets`.

``python -m agent_cache.bench.runner --preset quick --out bench-out`` works
as well as ``agent-cache bench``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sys
import textwrap
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from agent_cache.bench import bands, pressure, report
from agent_cache.bench.experiment import at_slo, hit_rate, resolve_capacity, run_all, throughput
from agent_cache.bench.fleetsim import FleetConfig
from agent_cache.bench.presets import PRESETS, Preset, workload
from agent_cache.bench.production import PRODUCTION_COLUMNS, PRODUCTION_POOL
from agent_cache.bench.registry import REAL_POLICIES, SIM, SIM_POLICIES, SWEEP_POLICIES, check_names, help_text
from agent_cache.bench.workloads import KINDS
from agent_cache.errors import AgentCacheError, ConfigError
from agent_cache.placement.rule import Policy
from agent_cache.routing.config import check_policy
from agent_cache.sglang_cpu import LATEST_ENGINE
from agent_cache.sim.latency import LatencyModel
from agent_cache.sim.latency_flags import add_latency_args, latency_from_args

__all__ = ["build_parser", "capacity_arg", "main_bench", "placement_arg", "resolve_capacity", "run"]


# An agent step should start answering within half a second, even at the tail.
DEFAULT_SLO_TTFT_P99 = 0.5


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agent-cache bench", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Compare routing policies on agent workloads: a virtual-clock fleet simulation (--engine sim) or real "
            "processes (--engine real: simulated SGLang worker servers, Redis, router replica processes and the "
            "real smg gateway; oracle and no-cache exist only in the sim engine).", 79),
        epilog=help_text())
    p.add_argument("--preset", choices=sorted(PRESETS), default="quick",
                   help="sim: quick 8 workers/300 sessions, full 16/3,000, seed no-cache vs agent-cache, pressure "
                        "ReAct/Reflexion/coding at KV capacity x1, x1.5, x3 of the working set and rising load, "
                        "production 4 workers with SGLang's own KV pool (414k tokens: Llama-3.1-8B, 80 GB H100) and "
                        "120 coding sessions at 0.8/s; "
                        "real: quick 4 workers/32 sessions, full 8/200, seed 4/60 with 4x slower modelled GPUs")
    p.add_argument("--engine", choices=("sim", "real"), default="sim",
                   help="sim: virtual-clock fleet simulation; real: real processes (simulated workers, Redis, smg)")
    p.add_argument("--trace", metavar="FILE", help="replay sessions of a JSONL trace instead of generated ones")
    p.add_argument("--workload", choices=KINDS, help="generated workload kind (default: preset's; pressure: that "
                   "kind only, not all three); coding: long-context software-engineering sessions (15-40 steps, "
                   "contexts past 30k tokens)")
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
    p.add_argument("--policies", help="comma-separated subset of: " + ", ".join(SIM_POLICIES)
                   + " (sim engine); " + ", ".join(REAL_POLICIES) + " (real engine); every one is listed "
                   "below the options")
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
    p.add_argument("--fleet", choices=("sim", "sglang"), default="sim",
                   help="real engine: the workers it starts: simulated ones (agent-cache sim-worker) or real SGLang "
                        "servers on this CPU, set up by 'agent-cache sglang-cpu setup' (default sim)")
    p.add_argument("--sglang-version", default=LATEST_ENGINE, metavar="0.5.N",
                   help=f"real engine: the set-up release to run (--fleet sglang), or the release the simulated "
                        f"workers emulate (default {LATEST_ENGINE})")
    p.add_argument("--sim-tokenizer", metavar="DIR",
                   help="real engine, --fleet sim: the workers count tokens with this model folder's tokenizer and "
                        "chat template, as a real server of that model does (needs agent-cache[bench])")
    p.add_argument("--worker-urls", metavar="URL[,URL...]",
                   help="real engine: run against these running workers (your own fleet, GPU or not) instead of "
                        "starting any; each one's cache is flushed before every policy")
    p.add_argument("--answer-tokens", type=int, metavar="N",
                   help="real engine: workers answer for themselves, at most N tokens per call, and each session "
                        "is replayed closed-loop (real workers always are; without it, simulated workers answer "
                        "the recorded text)")
    p.add_argument("--time-scale", type=float, metavar="S",
                   help="real engine: the simulated workers' latency model x S (1 = real time, 0 = instant; "
                        "default: the preset's)")
    p.add_argument("--slo-ttft-p99", type=float, default=DEFAULT_SLO_TTFT_P99, metavar="SECONDS",
                   help="sim engine: the p99 TTFT bound of 'throughput at the SLO', read off the offered-load sweep "
                        f"(default {DEFAULT_SLO_TTFT_P99:g} s)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="sim engine: also run every policy over seeds --seed+1 .. --seed+N-1; results.json gets "
                        "per policy bands [min, median, max] of hit rate, p99 TTFT and throughput at the SLO")
    p.add_argument("--latency-band", action="store_true",
                   help="sim engine: also run every policy at the fast and slow latency profiles (the low and "
                        "high plausible constants) and report bands over all runs")
    add_latency_args(p)
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise ConfigError(name, f"must be positive, got {value}")


def _check(args: argparse.Namespace) -> None:
    for flag in ("workers", "replicas", "sessions", "rate", "page_size", "slo_ttft_p99", "speedup", "seeds",
                 "answer_tokens"):
        _positive("--" + flag.replace("_", "-"), getattr(args, flag))
    if args.trace and not os.path.isfile(args.trace):
        raise ConfigError("--trace", f"no such file: {args.trace}")
    if args.engine == "real":
        for flag, value in (("--placement", args.placement is not None), ("--seeds", args.seeds != 1),
                            ("--latency-band", args.latency_band),
                            ("--latency-profile", latency_from_args(args) != LatencyModel())):
            if value:
                raise ConfigError(flag, "applies only to --engine sim")
        from agent_cache.bench import realengine

        realengine.check(args)
        return
    for flag, given in (("--time-scale", args.time_scale is not None), ("--fleet", args.fleet != "sim"),
                        ("--worker-urls", args.worker_urls is not None),
                        ("--answer-tokens", args.answer_tokens is not None),
                        ("--sim-tokenizer", args.sim_tokenizer is not None),
                        ("--sglang-version", args.sglang_version != LATEST_ENGINE)):
        if given:
            raise ConfigError(flag, "applies only to --engine real")
    if args.preset == "pressure" and args.capacity_tokens is not None:  # it would be ignored: say so
        multiples = ", ".join(f"x{m:g}" for m in pressure.MULTIPLES)
        raise ConfigError("--capacity-tokens", f"--preset pressure runs its own capacities ({multiples} of the "
                                               "working set); leave it out")
    if args.gateways != 1:
        raise ConfigError("--gateways", "applies only to --engine real (smg runs as real processes)")
    if args.redis is not None:
        from agent_cache.bench.realengine import check_redis

        check_redis(args.redis)
    if args.policies:
        check_names(args.policies, SIM)


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
    latency = latency_from_args(args)
    cfg = FleetConfig(workers=workers, page_size=args.page_size, replicas=args.replicas, latency=latency)
    log = _logger(args)
    t0 = time.perf_counter()
    sessions = workload(args, preset, n_sessions, rate)
    log(f"workload: {len(sessions)} sessions ({'trace ' + args.trace if args.trace else args.workload or preset.kind})"
        f", built in {time.perf_counter() - t0:.1f} s")
    capacity, ws = resolve_capacity(args.capacity_tokens, preset.capacity_tokens, sessions, cfg, args.seed)
    cfg = dataclasses.replace(cfg, capacity_tokens=capacity)
    if ws is not None:
        log(f"working set {ws:,} tokens: {capacity:,} KV tokens per worker ({args.capacity_tokens:g} x)")
    results = run_all(sessions, names, cfg, args.seed, log, progress=not args.quiet, redis_url=args.redis,
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
        "latency": latency_record(args.latency_profile, latency),
        "max_running_requests": cfg.scheduler_config("radix").running_limit, "schedule_policy": cfg.schedule_policy,
        "placement": dataclasses.asdict(args.placement or Policy()),
    }
    if args.preset == "production":
        config["kv_pool"] = PRODUCTION_POOL.as_dict()
    doc: dict[str, Any] = {"config": config, "policies": report.all_metrics(results)}
    sweep_names = tuple(n for n in SWEEP_POLICIES if n in names)
    sweeps = not args.no_sweeps and preset.sweep_sessions and sweep_names
    if sweeps:
        small = workload(args, preset, min(preset.sweep_sessions, n_sessions), rate)
        ys: dict[str, list[float]] = {n: [] for n in sweep_names}
        for cap in preset.capacity_sweep:
            for r in run_all(small, sweep_names, dataclasses.replace(cfg, capacity_tokens=cap), args.seed, log,
                             f"capacity={cap} ", progress=False, redis_url=args.redis, placement=args.placement):
                ys[r.policy].append(hit_rate(r))
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
                for r in run_all(small, sweep_names, dataclasses.replace(cfg, **changes), args.seed, log,
                                 f"{label}={x} ", progress=False, redis_url=args.redis, placement=args.placement):
                    ys[r.policy].append(hit_rate(r))
            doc[key] = {"x_label": label, "x": list(values), "y": ys, "sessions": len(small),
                        "metric": "token_hit_rate"}
        ys, p99s = _load_sweep(args, preset, cfg, sweep_names, n_sessions, args.seed, log)
        doc["load_sweep"] = {"x_label": "rate", "x": list(preset.load_sweep), "y": ys, "ttft_p99_s": p99s,
                             "sessions": len(small), "metric": "throughput_sessions_per_s"}
        doc["config"]["slo_ttft_p99_s"] = args.slo_ttft_p99
        for name in sweep_names:
            doc["policies"][name]["throughput_at_slo_sessions_per_s"] = at_slo(ys[name], p99s[name], args.slo_ttft_p99)
    if args.seeds > 1 or args.latency_band:
        _add_bands(args, preset, cfg, names, sweep_names if sweeps else (), n_sessions, rate, doc, log)
    doc["config"]["wall_s"] = round(time.perf_counter() - t0, 1)
    paths = report.write_results(args.out, doc)
    if not args.no_plots:
        paths += report.write_plots(args.out, {r.policy: r.ttfts for r in results}, doc)
    log("wrote " + ", ".join(paths))
    return doc


def _logger(args: argparse.Namespace) -> Callable[[str], None]:
    return (lambda m: None) if args.quiet else (lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))


def latency_record(profile: str, latency: LatencyModel) -> dict[str, Any]:
    """The latency constants a run used, for results.json."""
    return {"profile": profile, "mfu": latency.gpu.mfu, "bandwidth_efficiency": latency.gpu.bandwidth_efficiency,
            "per_pass_overhead_ms": round(latency.overhead_s * 1e3, 4)}


def _load_sweep(args: argparse.Namespace, preset: Preset, cfg: FleetConfig, names: Sequence[str], n_sessions: int,
                seed: int, log: Callable[[str], None]) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Completed sessions/s and p99 TTFT of each policy at each offered load of the preset's sweep."""
    ys: dict[str, list[float]] = {n: [] for n in names}
    p99s: dict[str, list[float]] = {n: [] for n in names}
    for load in preset.load_sweep:
        loaded = workload(args, preset, min(preset.sweep_sessions, n_sessions), load, seed=seed)
        for r in run_all(loaded, names, cfg, seed, log, f"rate={load:g} ", progress=False,
                         redis_url=args.redis, placement=args.placement):
            ys[r.policy].append(throughput(r))
            p99s[r.policy].append(report.quantile(sorted(r.ttfts), 0.99))
    return ys, p99s


def _add_bands(args: argparse.Namespace, preset: Preset, cfg: FleetConfig, names: Sequence[str],
               sweep_names: Sequence[str], n_sessions: int, rate: float | None, doc: dict[str, Any],
               log: Callable[[str], None]) -> None:
    """Every policy again over the other seeds and latency profiles (the fleet and capacity as the primary
    run's); per policy ``bands`` of hit rate, p99 TTFT and throughput at the SLO over all runs."""
    runs = [doc["policies"]]
    variants = bands.variants(args.seed, args.seeds, args.latency_band, cfg.latency, args.latency_profile)
    for v in variants[1:]:
        vcfg = dataclasses.replace(cfg, latency=v.latency)
        sessions = workload(args, preset, n_sessions, rate, seed=v.seed)
        results = run_all(sessions, names, vcfg, v.seed, log, f"seed={v.seed} {v.latency_name} ", progress=False,
                          redis_url=args.redis, placement=args.placement)
        metrics = report.all_metrics(results)
        if sweep_names:
            ys, p99s = _load_sweep(args, preset, vcfg, sweep_names, n_sessions, v.seed, log)
            for name in sweep_names:
                metrics[name]["throughput_at_slo_sessions_per_s"] = at_slo(ys[name], p99s[name], args.slo_ttft_p99)
        runs.append(metrics)
    for name, b in bands.bands(runs).items():
        doc["policies"][name]["bands"] = b
    doc["band_runs"] = [{"seed": v.seed, "latency": v.latency_name, **latency_record(v.latency_name, v.latency)}
                        for v in variants]


def _run_pressure(args: argparse.Namespace, preset: Preset) -> dict[str, Any]:
    log = _logger(args)
    workloads = {args.workload: pressure.WORKLOADS[args.workload]} if args.workload else pressure.WORKLOADS
    doc = pressure.run(args, args.workers or preset.workers, log, workloads)
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
        print(pressure.markdown(doc), end="")
        return 0
    columns = report.REAL_COLUMNS if args.engine == "real" else report.SIM_COLUMNS
    print(report.markdown_table(doc["policies"], columns), end="")
    if args.preset == "production" and args.engine == "sim":
        print("\n" + report.markdown_table(doc["policies"], PRODUCTION_COLUMNS), end="")
    if "band_runs" in doc:
        print("\n" + bands.markdown(doc["policies"], doc["band_runs"]), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main_bench())
