"""``agent-cache bench --engine real``: the policies compared with real processes.

N worker servers: simulated ones (:class:`~agent_cache.server_processes.SimWorkers`,
the default), real SGLang servers on this CPU (``--fleet sglang``,
:class:`~agent_cache.bench.realfleet.SGLangWorkers`), or a running fleet
(``--worker-urls``, :class:`~agent_cache.bench.realfleet.GivenWorkers`);
a real Redis (``--redis URL``, or a private ``redis-server``), K router
replica processes driving closed-loop sessions
(:mod:`agent_cache.bench.realload`), and the real smg gateway per ``smg-*``
policy, in front of the same workers. Before each policy every worker's
cache is flushed, so every policy starts cold; agent-cache policies get a
fresh Redis key prefix. Workers' latency comes from the simulator's latency
model (``--time-scale``; 1 = real time), not from GPUs. Simulated workers
answer the recorded text (``sim_output``). Real workers answer for
themselves (so do simulated ones given ``--answer-tokens``), and the sessions
are replayed closed-loop: each step's assistant message is the text the
worker returned, at most ``--answer-tokens`` long, as an agent's next prompt
extends its last one.

Its presets: :data:`agent_cache.bench.presets.REAL_PRESETS`. ``no-cache`` and
``oracle`` exist only in the sim engine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import uuid
from contextlib import ExitStack
from typing import Any, Callable, Sequence

from agent_cache.bench import report
from agent_cache.processes import Processes, free_port, wait_until
from agent_cache.server_processes import AgentCacheGateways, SimWorkers
from agent_cache.bench.realfleet import (
    GivenWorkers,
    SGLangWorkers,
    SmgGateways,
    Workers,
    smg_version,
    start_redis,
    write_gateway_keys,
)
from agent_cache.bench.realload import CallRecord, Job, ReplicaResult, Replicas
from agent_cache.bench.registry import BOUNDS, REAL, REGISTRY, check_names
from agent_cache.bench.presets import REAL_PRESETS, Preset, workload
from agent_cache.errors import ConfigError
from agent_cache.sim.engine import WorkerOptions
from agent_cache.sim.latency import DEFAULT_LATENCY
from agent_cache.sim.scheduler import default_max_running_requests
from agent_cache.sim.versions import LATEST_VERSION, SUPPORTED_VERSIONS


def check(args: argparse.Namespace) -> None:
    """Flags the real engine cannot run with (ConfigError naming the flag)."""
    if args.preset not in REAL_PRESETS:
        raise ConfigError("--preset", f"{args.preset} exists only in the sim engine; the real engine runs: "
                          f"{', '.join(sorted(REAL_PRESETS))}")
    if args.policies:
        for name in check_names(args.policies, REAL):
            if REGISTRY[name].path == "smg" and shutil.which("smg") is None:
                raise ConfigError("--policies", f"{name} needs the smg binary on the PATH (pip install smg)")
    if isinstance(args.capacity_tokens, float):
        raise ConfigError("--capacity-tokens", "a working-set multiple (xM) applies only to the sim engine; "
                          "give tokens per worker")
    if args.gateways < 1:
        raise ConfigError("--gateways", f"must be >= 1, got {args.gateways}")
    if args.gateways > 16:
        raise ConfigError("--gateways", f"at most 16 smg gateways, got {args.gateways}")
    if args.time_scale is not None and args.time_scale < 0:
        raise ConfigError("--time-scale", f"must be >= 0, got {args.time_scale}")
    if args.workers is not None and args.workers > 64:
        raise ConfigError("--workers", f"at most 64 worker processes, got {args.workers}")
    if args.redis is not None:
        check_redis(args.redis)
    real_workers = args.fleet != "sim" or args.worker_urls is not None
    if args.worker_urls is not None:
        if args.fleet != "sim":
            raise ConfigError("--worker-urls", "runs against a fleet that is already running: leave out --fleet")
        if args.workers is not None:
            raise ConfigError("--workers", "--worker-urls names the fleet; leave out --workers")
        from agent_cache.backends.sglang import normalize_worker_url

        args.worker_urls = [normalize_worker_url(u, "--worker-urls") for u in args.worker_urls.split(",") if u.strip()]
        if not args.worker_urls:
            raise ConfigError("--worker-urls", "no worker URL given")
    if args.fleet == "sglang":
        from agent_cache.sglang_cpu import ENGINE_VERSIONS

        if args.sglang_version not in ENGINE_VERSIONS:
            raise ConfigError("--sglang-version", f"the harness runs {', '.join(ENGINE_VERSIONS)}, "
                                                  f"not {args.sglang_version}")
    if real_workers and args.sim_tokenizer is not None:
        raise ConfigError("--sim-tokenizer", "applies to simulated workers (--fleet sim)")
    if args.sim_tokenizer is not None:
        from agent_cache.sim.tokenizing import ModelTokenizer

        ModelTokenizer(args.sim_tokenizer)  # a bad folder is refused here, not by N worker processes
    if args.fleet == "sim" and args.sglang_version not in SUPPORTED_VERSIONS:
        raise ConfigError("--sglang-version", f"the simulator serves 0.5.1-{LATEST_VERSION}, "
                                              f"not {args.sglang_version}")
    if real_workers and args.time_scale is not None:
        raise ConfigError("--time-scale", "scales the simulated workers' latency; real workers have their own")


def check_redis(url: str) -> None:
    import redis

    from agent_cache.redact import redact_url

    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("--redis", f"not a Redis URL: {redact_url(url)!r} (redis://host:port/db)")
    try:
        client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, ValueError) as exc:
        raise ConfigError("--redis", f"cannot reach {redact_url(url)}: {redact_url(exc)}") from None


def _names(args: argparse.Namespace, preset: Preset, smg: str | None,
           log: Callable[[str], None]) -> tuple[str, ...]:
    if args.policies:
        return tuple(n.strip() for n in args.policies.split(","))
    if smg is None:
        log("smg is not installed (pip install smg): the smg-* policies are skipped")
        return tuple(n for n in preset.policies if REGISTRY[n].path != "smg")
    return preset.policies


# --- metrics -------------------------------------------------------------------------


def _imbalance(calls: Sequence[CallRecord], workers: Sequence[str]) -> float:
    """Max / mean in-flight calls over the workers, averaged over call starts."""
    events = sorted([(c[3], 1, c[2]) for c in calls] + [(c[5], -1, c[2]) for c in calls], key=lambda e: (e[0], e[1]))
    load = {w: 0 for w in workers}
    total = samples = 0
    acc = 0.0
    for _, d, w in events:
        load[w] = load.get(w, 0) + d
        total += d
        if d > 0:
            acc += max(load.values()) * len(load) / total
            samples += 1
    return acc / samples if samples else 0.0


def metrics(results: Sequence[ReplicaResult], n_sessions: int, start: float, workers: Sequence[str],
            kv_tokens: int | None, wall_s: float) -> tuple[dict[str, Any], list[float]]:
    """The per-policy metrics of one run (and its TTFTs, for the plot)."""
    calls = [c for r in results for c in r.calls]
    done = [s for r in results for s in r.sessions]
    errors = [e for r in results for e in r.errors]
    prompt = sum(c[6] for c in calls)
    cached = sum(c[7] for c in calls)
    out = sum(c[8] for c in calls)
    ttfts = [c[4] - c[3] for c in calls]
    ttft = sorted(ttfts)
    by_session: dict[str, list[tuple[int, str]]] = {}
    for c in calls:
        by_session.setdefault(c[0], []).append((c[1], c[2]))
    moves = one_worker = 0
    for seq in by_session.values():
        seq.sort()
        moves += sum(1 for a, b in zip(seq, seq[1:]) if a[1] != b[1])
        one_worker += len({w for _, w in seq}) == 1
    per_worker: dict[str, int] = {w: 0 for w in workers}
    for c in calls:
        per_worker[c[2]] = per_worker.get(c[2], 0) + 1
    last = max((c[5] for c in calls), default=start)
    span = max(last - start, 1e-9)
    lat = [end - arrival for _, arrival, end in done]
    m = {
        "token_hit_rate": cached / prompt if prompt else 0.0,
        "ttft_p50_s": report.quantile(ttft, 0.50),
        "ttft_p95_s": report.quantile(ttft, 0.95),
        "ttft_p99_s": report.quantile(ttft, 0.99),
        "mean_session_latency_s": sum(lat) / len(lat) if lat else 0.0,
        "throughput_sessions_per_s": len(done) / span,
        "prompt_tokens_per_s": prompt / span,
        "output_tokens_per_s": out / span,
        "kv_gb": None if kv_tokens is None else DEFAULT_LATENCY.model.kv_gb(kv_tokens),
        "kv_tokens": kv_tokens,
        "load_imbalance": _imbalance(calls, workers),
        "moves": moves,
        "sessions_on_one_worker": one_worker / len(by_session) if by_session else 0.0,
        "sessions": n_sessions,
        "sessions_completed": len(done),
        "calls": len(calls),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "output_tokens": out,
        "errors": len(errors),
        "error_samples": errors[:5],
        "calls_per_worker": per_worker,
        "wall_s": wall_s,
    }
    return m, ttfts


# --- the run ---------------------------------------------------------------------------


KV_COUNTERS = ("prefixes_gone", "gaps", "batches", "token_lookups_failed")


def _follow_kv_events(workers: Workers, gateway: AgentCacheGateways,
                      metrics_ports: Sequence[int]) -> Callable[[], dict[str, float]]:
    """Wait until every gateway knows every worker's cache from its events (the workers were flushed before
    the gateway subscribed: each is flushed again until its reset is heard); returns a scrape of the
    gateways' KV counters, summed."""
    import re

    import httpx

    def scrape(port: int) -> str:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5.0).text

    def known() -> bool:
        workers.flush()
        line = re.compile(r"^agent_cache_kv_worker_known\{.*\} 1\.0$", re.M)
        return all(len(line.findall(scrape(p))) == len(workers.urls) for p in metrics_ports)

    wait_until(known, gateway.procs, "the gateways following every worker's KV events", timeout=60.0)

    def counts() -> dict[str, float]:
        out = dict.fromkeys(KV_COUNTERS, 0.0)
        for p in metrics_ports:
            text = scrape(p)
            for name in KV_COUNTERS:
                found = re.search(rf"^agent_cache_kv_{name}_total (\S+)$", text, re.M)
                out[name] += float(found.group(1)) if found else 0.0
        return out

    return counts


def _start_workers(args: argparse.Namespace, procs: Processes, n: int, capacity: int, time_scale: float,
                   kv_events: bool, log: Callable[[str], None]) -> Workers:
    """The fleet the policies run on: given by URL, real SGLang servers, or simulated ones."""
    if args.worker_urls:
        log(f"using {len(args.worker_urls)} running workers (--worker-urls)")
        workers: Workers = GivenWorkers(args.worker_urls)
        workers.flush()  # refuses to start on a worker that will not flush
        return workers
    if args.fleet == "sglang":
        log(f"starting {n} SGLang {args.sglang_version} servers on this CPU ({capacity:,}-token pools)")
        return SGLangWorkers(procs, n, version=args.sglang_version, capacity_tokens=capacity,
                             page_size=args.page_size, kv_events=kv_events)
    log(f"starting {n} simulated workers (time scale {time_scale:g})")
    return SimWorkers(procs, n, time_scale=time_scale, capacity_tokens=capacity, page_size=args.page_size,
                      kv_events=kv_events, scripted=args.answer_tokens is None, sglang_version=args.sglang_version,
                      tokenizer_path=args.sim_tokenizer)


def _delete_keys(redis_url: str, prefix: str) -> None:
    from agent_cache.store.redis_store import delete_deployment

    delete_deployment(redis_url, prefix)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every policy against one real fleet; write the results; return results.json's content."""
    preset = REAL_PRESETS[args.preset]
    log: Callable[[str], None] = (lambda m: None) if args.quiet else (
        lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    smg = shutil.which("smg")
    names = _names(args, preset, smg, log)
    n_workers = args.workers or preset.workers
    capacity = args.capacity_tokens or preset.capacity_tokens
    time_scale = preset.time_scale if args.time_scale is None else args.time_scale
    k = args.replicas
    gateways = args.gateways
    t_begin = time.perf_counter()
    sessions = workload(args, preset, args.sessions or preset.sessions,
                        args.rate if args.trace else (args.rate or preset.rate), chat=True)
    kind = "trace" if args.trace else (args.workload or preset.kind)
    log(f"workload: {len(sessions)} sessions ({'trace ' + args.trace if args.trace else kind}), "
        f"built in {time.perf_counter() - t_begin:.1f} s")
    simulated = args.fleet == "sim" and not args.worker_urls
    config: dict[str, Any] = {
        "preset": args.preset, "engine": "real", "workload": kind, "trace": args.trace,
        "workers": len(args.worker_urls) if args.worker_urls else n_workers,
        "replicas": k, "smg_gateways": gateways, "smg_mesh": gateways > 1, "sessions": len(sessions),
        "rate_sessions_per_s": args.rate or preset.rate, "arrivals": args.arrivals,
        "capacity_tokens_per_worker": capacity, "page_size": args.page_size, "seed": args.seed,
        # the simulated workers' latency model; real workers: their engine, version and model (describe())
        **({"time_scale": time_scale, "model": DEFAULT_LATENCY.model.name, "gpu": DEFAULT_LATENCY.gpu.name,
            "max_running_requests": default_max_running_requests(capacity, WorkerOptions().context_length)}
           if simulated else {}),
        "answer_tokens": args.answer_tokens,
        "replay": "recorded answers" if simulated and args.answer_tokens is None else "closed-loop",
        "smg_version": smg_version(smg) if smg else None,
        # every flag each smg policy ran with beyond smg's defaults (plus ports, log level and, with
        # several gateways, the mesh flags)
        "smg_flags": {n: REGISTRY[n].smg_flags() for n in names if REGISTRY[n].path == "smg"},
        "redis": "given (--redis)" if args.redis else "private redis-server", "cpu_count": os.cpu_count(),
        "sim_only_policies": list(BOUNDS),
    }
    run_prefix = f"agent-cache-bench-{uuid.uuid4().hex[:8]}"
    policies: dict[str, Any] = {}
    ttfts: dict[str, list[float]] = {}
    with ExitStack() as stack:
        if args.redis:  # registered first, so it runs last: after every replica has stopped writing
            stack.callback(_delete_keys, args.redis, run_prefix)
        procs = stack.enter_context(Processes())
        kv_events = any(REGISTRY[n].kv_events for n in names)
        workers = _start_workers(args, procs, n_workers, capacity, time_scale, kv_events, log)
        stack.callback(workers.close)
        config.update(workers.describe())
        log(f"starting Redis and {k} load replica(s)")
        replicas = stack.enter_context(Replicas(k))
        redis_url = args.redis or start_redis(procs)
        for name in names:
            t_policy = time.perf_counter()
            workers.flush()
            gateway: SmgGateways | AgentCacheGateways | None = None
            spec = REGISTRY[name]
            if spec.path == "smg":
                assert smg is not None  # check() and _names() admit smg-* policies only when smg is installed
                gateway = SmgGateways(procs, smg, spec.smg_policy, workers.urls, spec.smg_tuning,
                                      count=gateways)
            elif spec.path == "gateway":  # as the agent-cache policy routes: templatize, the run's Redis
                keys = write_gateway_keys(os.path.join(procs.dir, "gateway-keys"), (s.tenant for s in sessions))
                metrics_ports = [free_port() for _ in range(gateways)] if spec.kv_events else []
                kv = ["--kv-events", workers.kv_sources] if metrics_ports else []
                gateway = AgentCacheGateways(procs, workers.urls, redis_url=redis_url, count=gateways, args=[
                    "--prefix", f"{run_prefix}-{name}", "--templates", "templatize", "--api-keys", keys,
                    *(["--extra-fields", "sim_output"] if workers.scripted else []), "--timeout", "300", *kv],
                    per_gateway_args=[["--metrics-port", str(p)] for p in metrics_ports])
                if metrics_ports:
                    kv_scrape = _follow_kv_events(workers, gateway, metrics_ports)
            try:
                t0 = time.monotonic() + 0.3
                jobs = [Job(name, sessions[r::k], workers.urls, t0, replica=r, seed=args.seed,
                            gateways=gateway.urls if gateway else (), redis_url=redis_url,
                            redis_prefix=f"{run_prefix}-{name}", capacity_tokens=capacity, model=workers.model,
                            scripted=workers.scripted, answer_tokens=args.answer_tokens) for r in range(k)]

                def progress(done: int, name: str = name) -> None:
                    log(f"{name}: {done}/{len(sessions)} sessions")

                results = replicas.run(jobs, progress)
                kv_counts = kv_scrape() if spec.kv_events else None
            finally:
                if gateway is not None:
                    gateway.stop()
            workers.check()
            start = t0 + min((s.arrival_s for s in sessions), default=0.0)
            m, ttfts[name] = metrics(results, len(sessions), start, workers.urls, workers.kv_tokens(),
                                     round(time.perf_counter() - t_policy, 1))
            if kv_counts is not None:
                m["kv_events"] = kv_counts
            policies[name] = m
            log(f"{name}: {m['sessions_completed']}/{len(sessions)} sessions, {m['calls']} calls, "
                f"hit rate {m['token_hit_rate']:.1%}, {m['errors']} errors, {m['wall_s']:.1f} s")
    config["wall_s"] = round(time.perf_counter() - t_begin, 1)
    doc: dict[str, Any] = {"config": config, "policies": policies}
    paths = report.write_results(args.out, doc)
    if not args.no_plots:
        paths += report.write_plots(args.out, ttfts, doc)
    log("wrote " + ", ".join(paths))
    return doc
