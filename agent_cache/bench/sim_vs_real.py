"""The simulator held to real SGLang: one workload, one pool, every policy, on both.

Runs ``agent-cache bench --engine real`` twice with the same flags: on real
SGLang servers of a set-up release (``--fleet sglang``), then on simulated
workers that emulate that release and count tokens with the real servers'
tokenizer and chat template (``--fleet sim --sim-tokenizer``), so both pools
hold the same tokens. Both replays are closed-loop with the workers' own
answers (``--answer-tokens``, default 16). Prints, per policy, both hit rates,
their difference in points, and whether the policies rank the same; writes
``comparison.json`` and ``comparison.md`` beside each run's results
(``OUT/sglang``, ``OUT/sim``).

    python -m agent_cache.bench.sim_vs_real --workload react --workers 4 --sessions 24 --rate 1 \\
        --capacity-tokens 12000 --policies consistent-hash,agent-cache,smg-cache_aware --out sim-vs-real

The simulated workers run the simulator's latency model in real time
(``--sim-time-scale``, default 1): a GPU's timings, not the CPU's, so
sessions last longer on the real servers, more of them are live at once and
their pools are pressed harder. ``--sim-time-scale S`` slows the simulated
workers S times (to bring their session latency near the real one), and
``--sim-only`` runs only the simulated side again beside an earlier real run
in the same ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Mapping, Sequence

from agent_cache.bench import report
from agent_cache.bench.runner import build_parser, main_bench
from agent_cache.errors import ConfigError

DEFAULT_ANSWER_TOKENS = 16
AGREEMENT_POINTS = 2.0  # a difference in hit rate the comparison calls agreement
TIE_POINTS = 0.5  # two policies this close in one run are tied: either order ranks them alike


def _ranking(policies: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted(policies, key=lambda n: -policies[n]["token_hit_rate"])


def same_order(a: Mapping[str, float], b: Mapping[str, float], tie: float = TIE_POINTS) -> bool:
    """Whether hit rates ``a`` and ``b`` (points, per policy) put every pair of policies in the same order; a
    pair within ``tie`` points in either run is tied there and agrees with any order."""
    names = list(a)
    for i, x in enumerate(names):
        for y in names[i + 1:]:
            da, db = a[x] - a[y], b[x] - b[y]
            if abs(da) > tie and abs(db) > tie and (da > 0) != (db > 0):
                return False
    return True


def compare(real: Mapping[str, Any], sim: Mapping[str, Any]) -> dict[str, Any]:
    """Per policy: both hit rates and their difference (points); whether the rankings agree."""
    rows = {}
    for name, m in real["policies"].items():
        s = sim["policies"].get(name)
        if s is None:
            continue
        rows[name] = {"real_hit_rate": m["token_hit_rate"], "sim_hit_rate": s["token_hit_rate"],
                      "difference_points": 100 * (s["token_hit_rate"] - m["token_hit_rate"]),
                      "real_session_s": m["mean_session_latency_s"], "sim_session_s": s["mean_session_latency_s"],
                      "real_errors": m["errors"], "sim_errors": s["errors"]}
    both = {n: real["policies"][n] for n in rows}
    points = {side: {n: 100 * doc["policies"][n]["token_hit_rate"] for n in rows} for side, doc in
              (("real", real), ("sim", sim))}
    return {"policies": rows, "same_ranking": same_order(points["real"], points["sim"]),
            "real_ranking": _ranking(both), "sim_ranking": _ranking({n: sim["policies"][n] for n in rows}),
            "within_points": AGREEMENT_POINTS,
            "all_within": all(round(abs(r["difference_points"]), 6) <= AGREEMENT_POINTS for r in rows.values()),
            "real_config": real["config"], "sim_config": sim["config"]}


def markdown(doc: Mapping[str, Any]) -> str:
    cfg = doc["real_config"]
    lines = [f"# Simulator vs real SGLang {cfg['engine_version']}", "",
             f"{cfg['workload']} workload, {cfg['sessions']} sessions at {cfg['rate_sessions_per_s']} sessions/s, "
             f"{cfg['workers']} workers of {cfg['capacity_tokens_per_worker']:,} tokens, page size "
             f"{cfg['page_size']}, answers of at most {cfg['answer_tokens']} tokens, closed-loop; the simulated "
             f"workers count with the real model's tokenizer.", "",
             f"Simulated workers at time scale {doc['sim_config'].get('time_scale', 1):g}.", "",
             "| policy | real hit rate | sim hit rate | sim - real (points) | session s real/sim | errors real/sim |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, r in doc["policies"].items():
        lines.append(f"| {name} | {r['real_hit_rate']:.1%} | {r['sim_hit_rate']:.1%} | "
                     f"{r['difference_points']:+.1f} | {r['real_session_s']:.1f}/{r['sim_session_s']:.1f} | "
                     f"{r['real_errors']}/{r['sim_errors']} |")
    lines += ["", f"Same ranking (pairs within {TIE_POINTS:g} points count as tied): "
                  f"{'yes' if doc['same_ranking'] else 'no'} (real: {', '.join(doc['real_ranking'])}; "
                  f"sim: {', '.join(doc['sim_ranking'])}). Every difference within {doc['within_points']:g} "
                  f"points: {'yes' if doc['all_within'] else 'no'}.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--sim-time-scale", type=float, default=1.0)
    own.add_argument("--sim-only", action="store_true")
    mine, args_in = own.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if not mine.sim_time_scale >= 0:
        print(f"sim_vs_real: {ConfigError('--sim-time-scale', 'must be >= 0')}", file=sys.stderr)
        return 2
    parser = build_parser()
    parser.prog = "python -m agent_cache.bench.sim_vs_real"
    try:
        args = parser.parse_args(args_in)
    except SystemExit as exc:
        return int(exc.code or 0)
    for flag, given in (("--engine", args.engine != "sim"), ("--fleet", args.fleet != "sim"),
                        ("--worker-urls", args.worker_urls is not None),
                        ("--sim-tokenizer", args.sim_tokenizer is not None)):
        if given:  # the comparison sets these itself
            print(f"sim_vs_real: {ConfigError(flag, 'is set by the comparison: leave it out')}", file=sys.stderr)
            return 2
    from agent_cache.sglang_cpu.install import Installed

    installed = Installed.find(args.sglang_version)
    if installed is None:
        print(f"sim_vs_real: SGLang {args.sglang_version} is not set up "
              f"(agent-cache sglang-cpu setup --version {args.sglang_version})", file=sys.stderr)
        return 2
    common = list(args_in)
    if args.answer_tokens is None:
        common += ["--answer-tokens", str(DEFAULT_ANSWER_TOKENS)]
    out = args.out
    runs = {"sglang": ["--fleet", "sglang"],
            "sim": ["--sim-tokenizer", str(installed.model_dir), "--time-scale", repr(mine.sim_time_scale)]}
    docs = {}
    for fleet, extra in runs.items():
        run_out = os.path.join(out, fleet)
        if not (mine.sim_only and fleet == "sglang"):  # --sim-only: the real run's results are kept from before
            rc = main_bench(["--engine", "real", *extra, *_without_out(common), "--out", run_out])
            if rc != 0:
                return rc
        with open(os.path.join(run_out, "results.json")) as f:
            docs[fleet] = json.load(f)
    doc = compare(docs["sglang"], docs["sim"])
    report.write_atomic(os.path.join(out, "comparison.json"), json.dumps(doc, indent=1))
    text = markdown(doc)
    report.write_atomic(os.path.join(out, "comparison.md"), text)
    print(text)
    return 0


def _without_out(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--out DIR`` (each run writes under its own)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
