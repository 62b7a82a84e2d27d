"""``agent-cache bench --preset pressure``: policies under KV-memory pressure and at load.

For each workload (generated ReAct, Reflexion and coding sessions, or only
the ``--workload`` given; with ``--trace``, the trace as well) the fleet's KV capacity is set to a multiple
of the workload's live working set (x1.0, x1.5, x3: measured on the oracle
run, see :func:`agent_cache.bench.experiment.working_set`). Then, at the capacity
of x1.5 of the base load's working set (a fixed fleet), each policy's
throughput at the SLO is searched: the offered load doubles from a quarter
of the workload's base rate until the policy's p99 TTFT passes the SLO (at
most six steps), then three geometric bisections between the last rate that
met it and the first that did not narrow the bound to a factor of 2^(1/8)
(9 %). Every figure comes from the virtual-clock fleet simulator.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from typing import Any, Callable

from agent_cache.bench import bands, plot_style, report
from agent_cache.bench.experiment import working_set
from agent_cache.bench.presets import PRESETS, Preset
from agent_cache.bench.presets import workload as build_workload
from agent_cache.bench.fleetsim import FleetConfig, RunResult, simulate
from agent_cache.bench.registry import make_policies
from agent_cache.bench.workloads import SessionSpec
from agent_cache.placement.rule import Policy
from agent_cache.sim.latency_flags import latency_from_args

MULTIPLES = (1.0, 1.5, 3.0)
MAX_DOUBLINGS = 6
BISECTIONS = 3
# workload -> (sessions, base rate in sessions/s); coding sessions are 10x longer and larger
WORKLOADS = {"react": (300, 8.0), "reflexion": (200, 4.0), "coding": (100, 0.5)}
TRACE_SESSIONS, TRACE_RATE = 100, 8.0


def _row(r: RunResult) -> dict[str, Any]:
    m = report.metrics(r, None)
    keep = ("token_hit_rate", "ttft_p50_s", "ttft_p99_s", "load_imbalance", "throughput_sessions_per_s",
            "evicted_tokens", "recomputed_tokens", "moves", "moves_by_reason", "working_set_tokens", "kv_events")
    return {k: m[k] for k in keep}


def slo_search(run_at: Callable[[float], dict[str, Any]], start: float, slo: float, doublings: int = MAX_DOUBLINGS,
               bisections: int = BISECTIONS) -> tuple[dict[float, dict[str, Any]], dict[str, Any]]:
    """The highest offered load whose p99 TTFT meets ``slo``: double from ``start`` until it fails, then
    bisect geometrically. Returns every run by rate, and ``rate`` (None: even ``start`` failed), its
    ``sessions_per_s``, and ``bounded`` (False: it never failed, so the rate is a lower bound)."""
    points: dict[float, dict[str, Any]] = {}

    def meets(r: float) -> bool:
        points[r] = run_at(r)
        return bool(points[r]["ttft_p99_s"] <= slo)

    lo: float | None = None
    hi: float | None = None
    r = start
    for _ in range(doublings):
        if not meets(r):
            hi = r
            break
        lo, r = r, r * 2
    if lo is not None and hi is not None:
        for _ in range(bisections):
            mid = math.sqrt(lo * hi)
            if meets(mid):
                lo = mid
            else:
                hi = mid
    best = {"rate": lo, "sessions_per_s": points[lo]["throughput_sessions_per_s"] if lo is not None else 0.0,
            "bounded": hi is not None}
    return points, best


def run(args: argparse.Namespace, workers: int, log: Callable[[str], None],
        workloads: dict[str, tuple[int, float]] = WORKLOADS) -> dict[str, Any]:
    """The pressure runs; returns results.json's content (``pressure`` holds the tables).

    ``workloads``: generated workload kind -> (sessions, base rate in sessions/s).
    """
    t0 = time.perf_counter()
    names = tuple(n.strip() for n in args.policies.split(",")) if args.policies else PRESETS["pressure"].policies
    base = FleetConfig(workers=workers, page_size=args.page_size, replicas=args.replicas,
                       latency=latency_from_args(args))
    kinds: list[tuple[str, str | None, int, float]] = [(k, None, n, r) for k, (n, r) in workloads.items()]
    if args.trace:
        kinds.append(("trace", args.trace, args.sessions or TRACE_SESSIONS, args.rate or TRACE_RATE))
    out: dict[str, Any] = {}
    for kind, trace, n, rate in kinds:
        preset = Preset(workers=workers, sessions=n, rate=rate)
        ns = argparse.Namespace(**{**vars(args), "trace": trace})

        def build(r: float) -> list[SessionSpec]:
            return build_workload(ns, preset, n, r, kind=kind)  # kind is ignored for the trace

        sessions = build(rate)
        ws = working_set(sessions, base, args.seed)
        log(f"{kind}: {len(sessions)} sessions at {rate:g}/s, working set {ws:,} tokens")
        entry: dict[str, Any] = {"sessions": len(sessions), "rate": rate, "working_set_tokens": ws,
                                 "capacity": {}, "load": {}, "throughput_at_slo": {}}
        others = [(seed, build_workload(ns, preset, n, rate, kind=kind, seed=seed))
                  for seed in range(args.seed + 1, args.seed + max(1, getattr(args, "seeds", 1)))]
        other_ws = [working_set(ss, base, seed) for seed, ss in others]
        for mult in MULTIPLES:
            cap = max(1, math.ceil(mult * ws / workers))
            rows = _capacity_rows(args, names, workers, base, sessions, cap, args.seed)
            for name, row in rows.items():
                log(f"{kind} x{mult:g} ({cap:,} tokens/worker) {name}: hit "
                    f"{row['token_hit_rate']:.1%}, p99 {row['ttft_p99_s'] * 1000:.0f} ms")
            c: dict[str, Any] = {"capacity_tokens_per_worker": cap, "policies": rows}
            if others:  # --seeds N: the same multiple of each seed's own working set
                runs = [rows] + [_capacity_rows(args, names, workers, base, ss, max(1, math.ceil(mult * w / workers)),
                                                seed) for (seed, ss), w in zip(others, other_ws)]
                c["seeds"] = [args.seed] + [seed for seed, _ in others]
                c["bands"] = {name: {k: b[k] for k in ("token_hit_rate", "ttft_p99_s")}
                              for name, b in bands.bands(runs).items()}
                c["runs"] = [{name: {k: r[name][k] for k in ("token_hit_rate", "ttft_p99_s")} for name in r}
                             for r in runs]
            entry["capacity"][f"x{mult:g}"] = c
        cfg = dataclasses.replace(base, capacity_tokens=max(1, math.ceil(1.5 * ws / workers)))
        for name in names if not getattr(args, "no_sweeps", False) else ():

            def run_at(r: float, name: str = name) -> dict[str, Any]:
                (pol,) = make_policies((name,), workers, base.replicas, args.seed, capacity=cfg.capacity_tokens,
                                       redis_url=args.redis, placement=args.placement)
                row = _row(simulate(build(r), pol, cfg))
                log(f"{kind} rate {r:.3g}/s {name}: p99 {row['ttft_p99_s'] * 1000:.0f} ms")
                return row

            points, best = slo_search(run_at, rate / 4, args.slo_ttft_p99)
            entry["load"][name] = {f"{r:.4g}": row for r, row in sorted(points.items())}
            entry["throughput_at_slo"][name] = best
        out[kind] = entry
    config = {"preset": "pressure", "engine": "sim", "workers": workers, "replicas": args.replicas,
              "multiples": list(MULTIPLES), "slo_ttft_p99_s": args.slo_ttft_p99, "seed": args.seed,
              "metadata_store": "redis" if args.redis else "memory",
              "placement": dataclasses.asdict(args.placement or Policy()), "wall_s": round(time.perf_counter() - t0, 1)}
    return {"config": config, "pressure": out}


def _capacity_rows(args: argparse.Namespace, names: tuple[str, ...], workers: int, base: FleetConfig,
                   sessions: list[SessionSpec], cap: int, seed: int) -> dict[str, dict[str, Any]]:
    cfg = dataclasses.replace(base, capacity_tokens=cap)
    return {pol.name: _row(simulate(sessions, pol, cfg))
            for pol in make_policies(names, workers, base.replicas, seed, capacity=cap, redis_url=args.redis,
                                     placement=args.placement)}


def markdown(doc: dict[str, Any]) -> str:
    """results.md of a pressure run: per workload, hit rate and p99 TTFT per capacity multiple and per load."""
    lines = ["# Memory-pressure and load results (simulated)", "",
             "All figures come from the virtual-clock fleet simulator (latency model of `agent_cache.sim.latency`).",
             "", "Config: " + ", ".join(f"{k}={v}" for k, v in doc["config"].items()), ""]
    for kind, entry in doc["pressure"].items():
        lines += [f"## {kind} ({entry['sessions']} sessions, working set {entry['working_set_tokens']:,} tokens)", "",
                  "| capacity | policy | hit rate | TTFT p50 (ms) | p99 (ms) | imbalance | evicted | recomputed | moves |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for mult, c in entry["capacity"].items():
            for name, m in c["policies"].items():
                lines.append(f"| {mult} | {name} | {m['token_hit_rate']:.1%} | {m['ttft_p50_s'] * 1000:.1f} | "
                             f"{m['ttft_p99_s'] * 1000:.1f} | {m['load_imbalance']:.2f} | {m['evicted_tokens']:,} | "
                             f"{m['recomputed_tokens']:,} | {m['moves']} |")
        banded = {mult: c for mult, c in entry["capacity"].items() if "bands" in c}
        if banded:
            seeds = next(iter(banded.values()))["seeds"]
            lines += ["", f"Bands over seeds {', '.join(map(str, seeds))} (min / median / max):", "",
                      "| capacity | policy | hit rate | TTFT p99 (ms) |", "| --- | --- | ---: | ---: |"]
            for mult, c in banded.items():
                for name, b in c["bands"].items():
                    hit = " / ".join(f"{v:.1%}" for v in b["token_hit_rate"] or [])
                    p99 = " / ".join(f"{v * 1000:.0f}" for v in b["ttft_p99_s"] or [])
                    lines.append(f"| {mult} | {name} | {hit} | {p99} |")
        if not entry["throughput_at_slo"]:
            lines.append("")
            continue
        lines += ["", f"Throughput at the SLO (p99 TTFT <= {doc['config']['slo_ttft_p99_s']:g} s), capacity x1.5:", "",
                  "| policy | offered sessions/s | completed sessions/s | runs (rate: p99 ms) |",
                  "| --- | ---: | ---: | --- |"]
        for name, best in entry["throughput_at_slo"].items():
            rate = "none met it" if best["rate"] is None else (
                f"{best['rate']:.3g}" + ("" if best["bounded"] else " (never failed: a lower bound)"))
            runs = ", ".join(f"{r}: {m['ttft_p99_s'] * 1000:.0f}" for r, m in entry["load"][name].items())
            lines.append(f"| {name} | {rate} | {best['sessions_per_s']:.3g} | {runs} |")
        lines.append("")
    return "\n".join(lines)


def write_plots(out_dir: str, doc: dict[str, Any]) -> list[str]:
    """Hit rate vs capacity multiple, and p99 TTFT vs load, one panel per workload."""
    try:
        plt = report._pyplot()
    except ImportError:
        print("[bench] matplotlib is not installed: plots skipped (pip install matplotlib)", file=sys.stderr)
        return []
    import os

    paths = []
    kinds = list(doc["pressure"])
    styles = plot_style.styles([  # a policy looks the same in every panel
        [*dict.fromkeys(n for c in entry["capacity"].values() for n in c["policies"]), *entry["load"]]
        for entry in doc["pressure"].values()])
    for fname, title, series in (
            ("hit_rate_vs_capacity_multiple.png", "hit rate vs KV capacity (x working set)", "capacity"),
            ("p99_ttft_vs_load.png", "p99 TTFT vs offered load", "load")):
        if not any(entry[series] for entry in doc["pressure"].values()):
            continue  # not run (--no-sweeps skips the load runs): no empty picture
        fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 4), squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            entry = doc["pressure"][kind]
            if series == "capacity":
                xs = list(entry["capacity"])
                rows = [entry["capacity"][x]["policies"] for x in xs]
                for name in rows[0]:
                    ax.plot([float(x[1:]) for x in xs], [r[name]["token_hit_rate"] for r in rows], label=name,
                            markerfacecolor="none", **styles[name].plot_kwargs())
            else:
                for name, points in entry["load"].items():
                    ax.plot([float(x) for x in points], [m["ttft_p99_s"] * 1000 for m in points.values()],
                            label=name, markerfacecolor="none", **styles[name].plot_kwargs())
                ax.axhline(doc["config"]["slo_ttft_p99_s"] * 1000, color="grey", linestyle="--", linewidth=1)
                ax.set_yscale("log")
            ax.set_title(kind)
            ax.set_xlabel("capacity (x working set)" if series == "capacity" else "sessions/s")
            ax.set_ylabel("token hit rate" if series == "capacity" else "p99 TTFT (ms)")
            ax.grid(True, alpha=0.3)
        axes[0][0].legend(fontsize=8)
        fig.suptitle(f"{title} (simulated)")
        p = os.path.join(out_dir, fname)
        report._save(fig, p)
        plt.close(fig)
        paths.append(p)
    return paths
