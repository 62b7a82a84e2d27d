"""``agent-cache bench --preset pressure``: policies under KV-memory pressure and at load.

For each workload (generated ReAct, Reflexion and coding sessions; with
``--trace``, the trace as well) the fleet's KV capacity is set to a multiple
of the workload's live working set (x1.0, x1.5, x3: measured on the oracle
run, see :func:`agent_cache.bench.runner.working_set`), then the offered load
is doubled at capacity x1.5, from a quarter of the workload's base rate,
until least-load's p99 TTFT passes the SLO (at most five steps).
Every figure comes from the virtual-clock fleet simulator.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from typing import Any, Callable

from agent_cache.bench import report
from agent_cache.bench.fleetsim import FleetConfig, RunResult, simulate
from agent_cache.bench.policies import make_policies

POLICIES = ("least-load", "consistent-hash", "agent-cache", "oracle")
MULTIPLES = (1.0, 1.5, 3.0)
MAX_LOAD_STEPS = 5
# workload -> (sessions, base rate in sessions/s); coding sessions are 10x longer and larger
WORKLOADS = {"react": (300, 8.0), "reflexion": (200, 4.0), "coding": (100, 0.5)}
TRACE_SESSIONS, TRACE_RATE = 100, 8.0


def _row(r: RunResult) -> dict[str, Any]:
    m = report.metrics(r, None)
    keep = ("token_hit_rate", "ttft_p50_s", "ttft_p99_s", "load_imbalance", "throughput_sessions_per_s",
            "evicted_tokens", "recomputed_tokens", "moves", "moves_by_reason", "working_set_tokens")
    return {k: m[k] for k in keep}


def run(args: argparse.Namespace, workers: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The pressure runs; returns results.json's content (``pressure`` holds the tables)."""
    from agent_cache.bench.runner import Preset, _workload, working_set

    t0 = time.perf_counter()
    names = tuple(n.strip() for n in args.policies.split(",")) if args.policies else POLICIES
    if "least-load" not in names:
        names = ("least-load",) + names  # the load sweep stops on its p99
    base = FleetConfig(workers=workers, page_size=args.page_size, replicas=args.replicas)
    kinds: list[tuple[str, str | None, int, float]] = [(k, None, n, r) for k, (n, r) in WORKLOADS.items()]
    if args.trace:
        kinds.append(("trace", args.trace, args.sessions or TRACE_SESSIONS, args.rate or TRACE_RATE))
    out: dict[str, Any] = {}
    for kind, trace, n, rate in kinds:
        preset = Preset(workers=workers, sessions=n, rate=rate)
        ns = argparse.Namespace(**{**vars(args), "trace": trace})

        def build(r: float) -> list:
            return _workload(ns, preset, n, r, kind=kind)  # kind is ignored for the trace

        sessions = build(rate)
        ws = working_set(sessions, base, args.seed)
        log(f"{kind}: {len(sessions)} sessions at {rate:g}/s, working set {ws:,} tokens")
        entry: dict[str, Any] = {"sessions": len(sessions), "rate": rate, "working_set_tokens": ws,
                                 "capacity": {}, "load": {}}
        for mult in MULTIPLES:
            cap = max(1, math.ceil(mult * ws / workers))
            cfg = dataclasses.replace(base, capacity_tokens=cap)
            rows = {}
            for pol in make_policies(names, workers, base.replicas, args.seed, capacity=cap, redis_url=args.redis):
                rows[pol.name] = _row(simulate(sessions, pol, cfg))
                log(f"{kind} x{mult:g} ({cap:,} tokens/worker) {pol.name}: hit "
                    f"{rows[pol.name]['token_hit_rate']:.1%}, p99 {rows[pol.name]['ttft_p99_s'] * 1000:.0f} ms")
            entry["capacity"][f"x{mult:g}"] = {"capacity_tokens_per_worker": cap, "policies": rows}
        cfg = dataclasses.replace(base, capacity_tokens=max(1, math.ceil(1.5 * ws / workers)))
        r = rate / 4  # from a light load, doubling until least-load's p99 passes the SLO
        for _ in range(MAX_LOAD_STEPS):
            loaded = build(r)
            rows = {}
            for pol in make_policies(names, workers, base.replicas, args.seed, capacity=cfg.capacity_tokens,
                                     redis_url=args.redis):
                rows[pol.name] = _row(simulate(loaded, pol, cfg))
            entry["load"][f"{r:g}"] = rows
            p99 = rows["least-load"]["ttft_p99_s"]
            log(f"{kind} rate {r:g}/s: least-load p99 {p99 * 1000:.0f} ms")
            if p99 > args.slo_ttft_p99:
                break
            r *= 2
        out[kind] = entry
    config = {"preset": "pressure", "engine": "sim", "workers": workers, "replicas": args.replicas,
              "multiples": list(MULTIPLES), "slo_ttft_p99_s": args.slo_ttft_p99, "seed": args.seed,
              "metadata_store": "redis" if args.redis else "memory", "wall_s": round(time.perf_counter() - t0, 1)}
    return {"config": config, "pressure": out}


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
        lines += ["", "| rate (sessions/s) | policy | hit rate | p99 TTFT (ms) | sessions/s |",
                  "| ---: | --- | ---: | ---: | ---: |"]
        for rate, rows in entry["load"].items():
            for name, m in rows.items():
                lines.append(f"| {rate} | {name} | {m['token_hit_rate']:.1%} | {m['ttft_p99_s'] * 1000:.1f} | "
                             f"{m['throughput_sessions_per_s']:.2f} |")
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
    for fname, title, series in (
            ("hit_rate_vs_capacity_multiple.png", "hit rate vs KV capacity (x working set)", "capacity"),
            ("p99_ttft_vs_load.png", "p99 TTFT vs offered load", "load")):
        fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 4), squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            entry = doc["pressure"][kind]
            xs = list(entry[series])
            rows = [entry[series][x]["policies"] if series == "capacity" else entry[series][x] for x in xs]
            for name in rows[0]:
                if series == "capacity":
                    ax.plot([float(x[1:]) for x in xs], [r[name]["token_hit_rate"] for r in rows], marker="o", label=name)
                else:
                    ax.plot([float(x) for x in xs], [r[name]["ttft_p99_s"] * 1000 for r in rows], marker="o", label=name)
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
