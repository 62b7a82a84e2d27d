"""Metrics, results.json / results.md, and plots of a benchmark run (sim or real engine)."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any, Callable, Mapping, Sequence

from agent_cache.bench import bands, plot_style
from agent_cache.bench.fleetsim import RunResult
from agent_cache.percentile import histogram_percentile, sorted_percentile
from agent_cache.sim.latency import ModelConfig

# Columns of results.md: (key, header, format)
SIM_COLUMNS = (
    ("token_hit_rate", "hit rate", "{:.1%}"),
    ("oracle_fraction", "of oracle", "{:.1%}"),
    ("ttft_p50_s", "TTFT p50 (ms)", "ms"),
    ("ttft_p95_s", "p95 (ms)", "ms"),
    ("ttft_p99_s", "p99 (ms)", "ms"),
    ("mean_session_latency_s", "session (s)", "{:.2f}"),
    ("throughput_sessions_per_s", "sessions/s", "{:.2f}"),
    ("prompt_tokens_per_s", "prompt tok/s", "{:,.0f}"),
    ("kv_gb", "peak KV (GB)", "{:.1f}"),
    ("load_imbalance", "imbalance", "{:.2f}"),
    ("moves", "moves", "{:d}"),
)

# Columns of the real-process engine's results.md (no oracle there; KV is what the caches hold at the end)
REAL_COLUMNS = tuple(
    ("kv_gb", "KV held (GB)", "{:.1f}") if key == "kv_gb" else (key, name, fmt)
    for key, name, fmt in SIM_COLUMNS if key != "oracle_fraction"
) + (("sessions_on_one_worker", "one-worker sessions", "{:.0%}"), ("errors", "errors", "{:d}"))


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """:func:`~agent_cache.percentile.sorted_percentile` of already sorted values, 0 for none: both engines'
    TTFT percentiles."""
    return sorted_percentile(sorted_values, q) if sorted_values else 0.0


def metrics(res: RunResult, oracle_hit_rate: float | None, model: ModelConfig = ModelConfig()) -> dict[str, Any]:
    """The documented per-policy metrics of one run."""
    hit = res.cached_tokens / res.prompt_tokens if res.prompt_tokens else 0.0
    ttft = sorted(res.ttfts)
    span = max(res.last_done - res.first_arrival, 1e-9)
    lat = res.session_latencies
    return {
        "token_hit_rate": hit,
        # None when the run has no oracle (the seed preset)
        "oracle_fraction": (hit / oracle_hit_rate if oracle_hit_rate else 0.0) if oracle_hit_rate is not None else None,
        "ttft_p50_s": quantile(ttft, 0.50),
        "ttft_p95_s": quantile(ttft, 0.95),
        "ttft_p99_s": quantile(ttft, 0.99),
        "mean_session_latency_s": sum(lat) / len(lat) if lat else 0.0,
        "throughput_sessions_per_s": res.sessions_done / span,
        "prompt_tokens_per_s": res.prompt_tokens / span,
        "output_tokens_per_s": res.output_tokens / span,
        "kv_gb": model.kv_gb(res.peak_kv_tokens),
        "load_imbalance": res.imbalance_sum / res.imbalance_samples if res.imbalance_samples else 0.0,
        "moves": sum(res.moves.values()),
        "moves_by_reason": dict(res.moves),
        "placements_by_outcome": dict(res.placements),
        "kv_events": dict(res.kv_events),
        "evicted_tokens": res.evicted_tokens,
        "recomputed_tokens": res.recomputed_tokens,
        "working_set_tokens": res.working_set_tokens,
        "sessions": res.sessions,
        "sessions_completed": res.sessions_done,
        "calls": res.calls,
        "prompt_tokens": res.prompt_tokens,
        "cached_tokens": res.cached_tokens,
        "sim_wall_s": res.wall_s,
        # which resource binds: how full the GPU's decode batches ran, how long calls waited to start
        "decode_batch_p50": _hist_quantile(res.decode_batches, 0.50),
        "decode_batch_p90": _hist_quantile(res.decode_batches, 0.90),
        "decode_batch_max": max(res.decode_batches, default=0),
        "queue_wait_p50_s": quantile(sorted(res.queue_waits), 0.50),
        "queue_wait_p99_s": quantile(sorted(res.queue_waits), 0.99),
        "retractions": res.retractions,
    }


def _hist_quantile(hist: Mapping[int, int], q: float) -> int:
    """:func:`~agent_cache.percentile.histogram_percentile` of a histogram ``value -> count`` (0 when empty)."""
    return histogram_percentile(hist, q) if sum(hist.values()) else 0


def all_metrics(results: Sequence[RunResult]) -> dict[str, dict[str, Any]]:
    oracle = next((r for r in results if r.policy == "oracle"), None)
    ohit = (oracle.cached_tokens / oracle.prompt_tokens) if oracle is not None and oracle.prompt_tokens else None
    return {r.policy: metrics(r, ohit) for r in results}


def markdown_table(policies: Mapping[str, Mapping[str, Any]], columns: Sequence[tuple[str, str, str]] = SIM_COLUMNS) -> str:
    head = "| policy | " + " | ".join(h for _, h, _ in columns) + " |"
    sep = "| --- |" + " ---: |" * len(columns)
    rows = [head, sep]
    for name, m in policies.items():
        cells = []
        for key, _, fmt in columns:
            v = m.get(key, 0)
            if v is None:
                cells.append("n/a")
                continue
            cells.append(f"{v * 1000:.1f}" if fmt == "ms" else fmt.format(v))
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def results_markdown(doc: Mapping[str, Any]) -> str:
    cfg = doc["config"]
    if cfg.get("engine") == "real":
        return _real_markdown(doc)
    lines = ["# Fleet simulation results", "",
             "All figures come from the virtual-clock fleet simulator (latency model of "
             "`agent_cache.sim.latency`), not from GPUs.", "",
             "Config: " + ", ".join(f"{k}={v}" for k, v in cfg.items() if not isinstance(v, (dict, list))), "",
             markdown_table(doc["policies"])]
    for title, key in (("KV capacity sweep (token hit rate)", "capacity_sweep"),
                       ("Fleet size sweep (token hit rate)", "workers_sweep"),
                       ("Router replicas sweep (token hit rate)", "replicas_sweep"),
                       ("Offered load sweep (sessions/s completed)", "load_sweep")):
        sweep = doc.get(key)
        if sweep:
            lines += [f"## {title}", "", _sweep_table(sweep), ""]
    sweep = doc.get("load_sweep")
    if sweep and "ttft_p99_s" in sweep:
        slo = cfg["slo_ttft_p99_s"]
        lines += ["## Offered load sweep (TTFT p99, s)", "", _sweep_table({**sweep, "y": sweep["ttft_p99_s"]}), "",
                  f"## Throughput at the SLO (TTFT p99 <= {slo:g} s)", "",
                  "The highest completed sessions/s among the load sweep's points whose TTFT p99 met the bound "
                  "(none: no point met it).", "", "| policy | sessions/s |", "| --- | ---: |"]
        for name in sweep["y"]:
            value = doc["policies"][name].get("throughput_at_slo_sessions_per_s")
            lines.append(f"| {name} | {'none' if value is None else f'{value:.3f}'} |")
        lines.append("")
    if cfg.get("preset") == "production":
        from agent_cache.bench.production import PRODUCTION_COLUMNS

        lines += ["## What binds: queue waits and decode batch sizes", "",
                  "Queue wait: a call's arrival to its first prefill pass. Decode batch: requests per decode pass.",
                  "", markdown_table(doc["policies"], PRODUCTION_COLUMNS), "", "KV pool per worker, as SGLang sizes it:",
                  "", *[f"- {line}" for line in cfg["kv_pool"]["arithmetic"]], ""]
    if doc.get("band_runs"):
        lines += [bands.markdown(doc["policies"], doc["band_runs"])]
    return "\n".join(lines)


def _real_markdown(doc: Mapping[str, Any]) -> str:
    cfg = doc["config"]
    fleet = cfg.get("fleet", "sim")
    if fleet == "sim":
        fleet_text = (f"{cfg['workers']} simulated SGLang workers (`agent-cache sim-worker`: a real radix cache; latency "
                   "from the simulator's latency model `agent_cache.sim.latency` at time scale "
                   f"{cfg['time_scale']:g}, not GPUs)")
    elif fleet == "sglang":
        fleet_text = (f"{cfg['workers']} real SGLang {cfg['engine_version']} servers on this CPU ({cfg['model']}: "
                   "hit rates are RadixAttention's own; times are a toy model's on a CPU, directional only)")
    else:
        fleet_text = f"{cfg['workers']} running workers given by URL (SGLang {cfg['engine_version']}, {cfg['model']})"
    lines = ["# Real-process benchmark results", "",
             f"Real processes on this machine ({cfg.get('cpu_count')} CPUs, shared): {fleet_text}, a real Redis, "
             f"{cfg['replicas']} router replica process(es) driving {cfg.get('replay', 'recorded-answer')} sessions "
             "from an async client, and "
             f"the real smg gateway {cfg.get('smg_version') or '(not installed: smg policies skipped)'} in front of "
             "the same workers for the `smg-*` policies. Hit rates are the workers' reported `cached_tokens`; "
             "latencies are measured at the client. `oracle` and `no-cache` exist only in the sim engine.", "",
             "Config: " + ", ".join(f"{k}={v}" for k, v in cfg.items() if not isinstance(v, (dict, list))), "",
             markdown_table(doc["policies"], REAL_COLUMNS)]
    if cfg.get("smg_flags"):
        lines += ["smg configuration (flags beyond its defaults):", "",
                  *[f"- `{name}`: `{' '.join(flags)}`" for name, flags in cfg["smg_flags"].items()], ""]
    workers = sorted({w for m in doc["policies"].values() for w in m.get("calls_per_worker", {})})
    if workers:
        lines += ["## Calls per worker", "",
                  "| policy | " + " | ".join(f"w{i}" for i in range(len(workers))) + " |",
                  "| --- |" + " ---: |" * len(workers)]
        for name, m in doc["policies"].items():
            per = m.get("calls_per_worker", {})
            lines.append(f"| {name} | " + " | ".join(str(per.get(w, 0)) for w in workers) + " |")
        lines += ["", "Workers: " + ", ".join(f"w{i} = {w}" for i, w in enumerate(workers)), ""]
    return "\n".join(lines)


def _sweep_table(sweep: Mapping[str, Any]) -> str:
    xs = sweep["x"]
    rows = ["| policy | " + " | ".join(f"{sweep['x_label']}={x:g}" for x in xs) + " |",
            "| --- |" + " ---: |" * len(xs)]
    for name, ys in sweep["y"].items():
        rows.append(f"| {name} | " + " | ".join(f"{y:.3f}" for y in ys) + " |")
    return "\n".join(rows)


def write_atomic(path: str, data: str | bytes) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file. The file
    gets the mode ``open(path, "w")`` gives (0644 under the usual umask), not a private temp file's 0600."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as to any new file
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_results(out_dir: str, doc: Mapping[str, Any]) -> list[str]:
    paths = [os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.md")]
    write_atomic(paths[0], json.dumps(doc, indent=2, sort_keys=False) + "\n")
    write_atomic(paths[1], results_markdown(doc))
    return paths


# --- plots -------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str) -> None:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    write_atomic(path, buf.getvalue())


def _panelled(plt: Any, names: Sequence[str], styles: Mapping[str, plot_style.Style], title: str,
              draw: Callable[[Any, str, dict[str, Any]], None], *, xlabel: str, ylabel: str, logx: bool = False,
              legend: str = "best") -> Any:
    """A figure of :func:`plot_style.panels` side by side (shared axes): ``draw(ax, name, plot_kwargs)``
    draws one policy's line."""
    groups = plot_style.panels(names)
    fig, axes = plt.subplots(1, len(groups), figsize=(7 if len(groups) == 1 else 5.2 * len(groups), 4.5),
                             sharex=True, sharey=True, squeeze=False)
    for ax, group in zip(axes[0], groups):
        for name in group:
            draw(ax, name, {**styles[name].plot_kwargs(), "label": name})
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc=legend)
    axes[0][0].set_ylabel(ylabel)
    if len(groups) == 1:
        axes[0][0].set_title(title)
    else:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def write_plots(out_dir: str, ttfts: Mapping[str, Sequence[float]], doc: Mapping[str, Any]) -> list[str]:
    """PNG plots; returns their paths, or [] with a message when matplotlib is missing."""
    kind = "real processes, simulated workers" if doc["config"].get("engine") == "real" else "simulated"
    try:
        plt = _pyplot()
    except ImportError:
        import sys

        print("[bench] matplotlib is not installed: plots skipped (pip install matplotlib)", file=sys.stderr)
        return []
    cdf_names = [n for n, v in ttfts.items() if v]
    sweeps = [doc[key] for key in ("capacity_sweep", "load_sweep") if doc.get(key)]
    styles = plot_style.styles([cdf_names, *(list(sweep["y"]) for sweep in sweeps)])  # alike in every plot
    paths = []

    def cdf(ax: Any, name: str, kwargs: dict[str, Any]) -> None:
        v = sorted(ttfts[name])
        ax.plot([x * 1000 for x in v], [(i + 1) / len(v) for i in range(len(v))], markevery=0.1, markersize=5,
                **kwargs)

    fig = _panelled(plt, cdf_names, styles, f"TTFT CDF per policy ({kind})", cdf,
                    xlabel="TTFT (ms, log scale)", ylabel="fraction of calls", logx=True, legend="lower right")
    p = os.path.join(out_dir, "ttft_cdf.png")
    _save(fig, p)
    plt.close(fig)
    paths.append(p)
    for key, fname, xlabel, ylabel, title, logx in (
            ("capacity_sweep", "hit_rate_vs_capacity.png", "KV capacity per worker (tokens)", "token hit rate",
             "Hit rate vs KV capacity (simulated)", True),
            ("load_sweep", "throughput_vs_load.png", "offered load (sessions/s)", "completed sessions/s",
             "Throughput vs offered load (simulated)", False)):
        sweep = doc.get(key)
        if not sweep:
            continue

        def line(ax: Any, name: str, kwargs: dict[str, Any], sweep: Mapping[str, Any] = sweep) -> None:
            # hollow markers of different shapes: lines that coincide still show each policy's marker
            ax.plot(sweep["x"], sweep["y"][name], markersize=8, markerfacecolor="none", markeredgewidth=1.5,
                    **kwargs)

        fig = _panelled(plt, list(sweep["y"]), styles, title, line, xlabel=xlabel, ylabel=ylabel, logx=logx)
        p = os.path.join(out_dir, fname)
        _save(fig, p)
        plt.close(fig)
        paths.append(p)
    return paths
