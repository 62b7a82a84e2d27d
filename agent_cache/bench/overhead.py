"""Routing overhead side by side: the latency a router adds to one call.

One simulated worker with an instant latency model (``--time-scale 0``), so a
call costs only HTTP, the worker's tokenizer and radix cache, and the routing
path in front of it; or, with ``--fleet sglang``, one real SGLang server on
this CPU (the tiny model, answers capped at ``--answer-tokens``), so the
paths are compared on the real HTTP and SSE stack. The same ReAct calls go, one at a time, through:

* ``direct``: the client straight to the worker (the baseline);
* ``agent-cache (memory)``: the product's client path in process
  (``ChatSGLang.astream``, or ``ainvoke`` with ``--no-stream``: templates,
  routing, the call pipeline and the served hook) over the in-process store;
* ``agent-cache (Redis)``: the same over the Redis store (its Lua scripts, one
  round trip per decision plus the usage report);
* ``agent-cache-gateway``: ``agent-cache serve`` (the same routing over the
  same Redis, as its own process), an HTTP hop in front of the same worker;
  with ``--transports httpx,fast``, one gateway per transport to the worker
  (``agent-cache-gateway (httpx)``, ``agent-cache-gateway (fast)``);
* ``smg-cache_aware``, ``smg-consistent_hashing``: the real smg gateway, an
  HTTP hop in front of the same worker.

The paths take turns call by call (in rotating order), so machine noise falls
on all of them alike. Added latency = a path's percentile minus the direct
path's percentile, for the whole streamed call and for TTFT.

With ``--concurrency N`` the run then measures throughput: each path in turn
serves ``--calls`` calls from N sessions in flight at once, closed-loop;
calls per second and the ratio to the direct path are reported.

    python -m agent_cache.bench.overhead --calls 400 [--no-stream] [--concurrency 32] [--transports httpx,fast]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import sys
import time
import uuid
from contextlib import ExitStack
from typing import Any, Callable, Sequence

from agent_cache.percentile import percentile
from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways, SimWorkers
from agent_cache.bench.realfleet import (
    SGLangWorkers,
    SmgGateways,
    start_delayed,
    start_redis,
    write_gateway_keys,
)
from agent_cache.bench.realload import ChatClient, Job, call_path, closed_loop
from agent_cache.bench.registry import REGISTRY
from agent_cache.bench.workloads import SessionSpec, WorkloadParams, generate
from agent_cache.errors import AgentCacheError, ConfigError
from agent_cache.sglang_cpu import LATEST_ENGINE

DIRECT = "direct"
SMG_PATHS = ("smg-cache_aware", "smg-consistent_hashing")
GATEWAY_PATH = "agent-cache-gateway"
WARMUP_CALLS = 10


class _Direct:
    """The client straight to the worker: no routing at all."""

    def __init__(self, worker: str, client: ChatClient) -> None:
        self.worker = worker
        self.client = client

    async def call(self, session: SessionSpec, call: Any, chat: Any) -> Any:
        return await self.client.send(self.worker, chat)

    def session_done(self, session_id: str) -> None:
        pass

    async def aclose(self) -> None:
        pass


def _summary(latencies: Sequence[float], ttfts: Sequence[float]) -> dict[str, float]:
    return {"calls": len(latencies),
            "latency_p50_s": percentile(latencies, 0.50), "latency_p99_s": percentile(latencies, 0.99),
            "ttft_p50_s": percentile(ttfts, 0.50), "ttft_p99_s": percentile(ttfts, 0.99)}


async def measure(paths: dict[str, Any], sessions: Sequence[SessionSpec], calls: int,
                  log: Callable[[str], None], warmup: int = WARMUP_CALLS,
                  answer_tokens: int | None = None) -> dict[str, dict[str, float]]:
    """Send the sessions' calls through every path in turn until ``calls`` per path (after ``warmup``
    unrecorded ones: connections, scripts, tokenizer); per-path summaries."""
    names = list(paths)
    lat: dict[str, list[float]] = {n: [] for n in names}
    ttft: dict[str, list[float]] = {n: [] for n in names}
    turn = 0
    for spec in sessions:
        own = {n: dataclasses.replace(spec, session_id=f"{n}-{spec.session_id}") for n in names}
        for call in spec.start(chat=True):
            if turn >= calls + warmup:
                break
            assert call.chat is not None
            chat = closed_loop(call.chat, {}, answer_tokens)
            order = names[turn % len(names):] + names[:turn % len(names)]
            for name in order:
                t0 = time.monotonic()
                reply = await paths[name].call(own[name], call, chat)
                end = time.monotonic()
                if turn >= warmup:
                    lat[name].append(end - t0)
                    ttft[name].append(reply.t_first - t0)
            turn += 1
            if (turn - warmup) % 100 == 0 and turn > warmup:
                log(f"{turn - warmup}/{calls} calls per path")
        for name in names:
            paths[name].session_done(own[name].session_id)
        if turn >= calls + warmup:
            break
    out = {n: _summary(lat[n], ttft[n]) for n in names}
    base = out[DIRECT]
    for row in out.values():
        for key in ("latency_p50_s", "latency_p99_s", "ttft_p50_s", "ttft_p99_s"):
            row["added_" + key] = row[key] - base[key]
    return out


async def throughput(paths: dict[str, Any], sessions: Sequence[SessionSpec], calls: int, concurrency: int,
                     log: Callable[[str], None], answer_tokens: int | None = None) -> dict[str, float]:
    """Calls per second of each path, in turn, with ``concurrency`` sessions in flight (closed loop)."""
    out: dict[str, float] = {}
    for name, path in paths.items():
        queue = list(sessions)
        done = 0

        async def lane(lane_id: int) -> None:
            nonlocal done
            while queue and done < calls:
                spec = dataclasses.replace(queue.pop(), session_id=f"tp-{name}-{lane_id}-{uuid.uuid4().hex[:8]}")
                for call in spec.start(chat=True):
                    if done >= calls:
                        break
                    assert call.chat is not None
                    await path.call(spec, call, closed_loop(call.chat, {}, answer_tokens))
                    done += 1
                path.session_done(spec.session_id)

        t0 = time.monotonic()
        await asyncio.gather(*(lane(i) for i in range(concurrency)))
        out[name] = done / (time.monotonic() - t0)
        log(f"{name}: {out[name]:.0f} calls/s with {concurrency} in flight")
    return out


def throughput_table(rates: dict[str, float], concurrency: int) -> str:
    lines = [f"| path | calls/s ({concurrency} in flight) | vs direct |", "|---|---:|---:|"]
    for name, rate in rates.items():
        lines.append(f"| {name} | {rate:.0f} | {rate / rates[DIRECT]:.2f} |")
    return "\n".join(lines)


def table(results: dict[str, dict[str, float]]) -> str:
    """Markdown: per path, TTFT and whole-call percentiles and what each adds over the direct path, in ms."""
    lines = ["| path | TTFT p50 | TTFT p99 | call p50 | call p99 | added TTFT p50 | added TTFT p99 "
             "| added call p50 | added call p99 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        ms = {k: v * 1000 for k, v in r.items() if k.endswith("_s")}
        keys = ("ttft_p50_s", "ttft_p99_s", "latency_p50_s", "latency_p99_s")
        added = ["-"] * 4 if name == DIRECT else [f"{ms['added_' + k]:+.2f}" for k in keys]
        lines.append(f"| {name} | " + " | ".join(f"{ms[k]:.2f}" for k in keys) + " | " + " | ".join(added) + " |")
    return "\n".join(lines)


def _sessions(calls: int, seed: int) -> list[SessionSpec]:
    return generate(WorkloadParams(kind="react", sessions=max(8, (calls + WARMUP_CALLS) // 3), rate=1.0, seed=seed))


async def _run(workers: SimWorkers | SGLangWorkers, redis_url: str, gateways: dict[str, str],
               sessions: Sequence[SessionSpec], calls: int, seed: int, log: Callable[[str], None], stream: bool = True,
               concurrency: int = 0, delete_url: str | None = None,
               answer_tokens: int | None = None) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    worker = workers.urls[0]
    client = ChatClient(timeout=60.0, stream=stream, model=workers.model, scripted=workers.scripted)
    prefix = f"agent-cache-overhead-{uuid.uuid4().hex[:8]}"
    paths: dict[str, Any] = {DIRECT: _Direct(worker, client)}

    def job(policy: str, **kwargs: Any) -> Job:
        return Job(policy, (), [worker], 0.0, seed=seed, model=workers.model, scripted=workers.scripted, **kwargs)

    paths["agent-cache (memory)"] = call_path(job("agent-cache"), client)
    paths["agent-cache (Redis)"] = call_path(job("agent-cache", redis_url=redis_url, redis_prefix=prefix), client)
    for name, url in gateways.items():
        paths[name] = call_path(job(GATEWAY_PATH if name.startswith(GATEWAY_PATH) else name, gateways=(url,)),
                                client)
    try:
        latency = await measure(paths, sessions, calls, log, answer_tokens=answer_tokens)
        rates = (await throughput(paths, sessions, calls, concurrency, log, answer_tokens)
                 if concurrency > 0 else {})
        return latency, rates
    finally:
        for path in paths.values():
            await path.aclose()
        await client.aclose()
        _delete_deployment(delete_url or redis_url, prefix)


def _delete_deployment(redis_url: str, prefix: str) -> None:
    from agent_cache.store.redis_store import delete_deployment

    delete_deployment(redis_url, prefix)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_cache.bench.overhead", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=400, help="calls per path (default 400)")
    p.add_argument("--redis", metavar="URL", help="Redis for the agent-cache (Redis) path (default: a private "
                   "redis-server); the run's keys are deleted at the end")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-stream", action="store_true",
                   help="non-streamed calls (TTFT is then the whole call)")
    p.add_argument("--concurrency", type=int, default=0, metavar="N",
                   help="then measure throughput with N calls in flight per path (default 0: skip)")
    p.add_argument("--store-delay-ms", type=float, default=0.0, metavar="MS",
                   help="hold every packet to and from Redis this long each way, as a store on another host "
                        "(default 0: Redis on this host)")
    p.add_argument("--gateway-args", default="", metavar="ARGS",
                   help="extra flags for agent-cache serve, e.g. '--http h11 --loop asyncio'")
    p.add_argument("--transports", default="", metavar="NAMES",
                   help="one gateway per transport to the worker, e.g. 'httpx,fast' (default: one gateway, "
                        "its default transport)")
    p.add_argument("--fleet", choices=("sim", "sglang"), default="sim",
                   help="the worker: simulated with an instant latency model (default), or a real SGLang server on "
                        "this CPU (agent-cache sglang-cpu setup), so the real HTTP and SSE stack is measured")
    p.add_argument("--sglang-version", default=LATEST_ENGINE, metavar="0.5.N",
                   help=f"--fleet sglang: the set-up release (default {LATEST_ENGINE})")
    p.add_argument("--answer-tokens", type=int, default=None, metavar="N",
                   help="cap every answer at N tokens (default: the recorded length; 16 with --fleet sglang)")
    p.add_argument("--out", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    log: Callable[[str], None] = (lambda m: None) if args.quiet else (
        lambda m: print(f"[overhead] {m}", file=sys.stderr, flush=True))
    try:
        if args.calls < 10:
            raise ConfigError("--calls", f"at least 10 calls per path, got {args.calls}")
        if args.concurrency < 0:
            raise ConfigError("--concurrency", f"must be >= 0, got {args.concurrency}")
        if args.answer_tokens is not None and args.answer_tokens < 1:
            raise ConfigError("--answer-tokens", f"must be >= 1, got {args.answer_tokens}")
        if args.fleet == "sglang" and args.answer_tokens is None:
            args.answer_tokens = 16  # a CPU decodes slowly: short answers keep the run about the path
        if not args.store_delay_ms >= 0:
            raise ConfigError("--store-delay-ms", f"must be >= 0, got {args.store_delay_ms}")
        if args.redis is not None:
            from agent_cache.bench.realengine import check_redis

            check_redis(args.redis)
        smg = shutil.which("smg")
        if smg is None:
            log("smg is not installed (pip install smg): the smg paths are skipped")
        with ExitStack() as stack:
            procs = stack.enter_context(Processes())
            workers: SimWorkers | SGLangWorkers
            if args.fleet == "sglang":
                log(f"starting one SGLang {args.sglang_version} server on this CPU" + (" and smg" if smg else ""))
                workers = SGLangWorkers(procs, 1, version=args.sglang_version, capacity_tokens=200_000)
            else:
                log("starting one simulated worker (time scale 0)" + (" and smg" if smg else ""))
                workers = SimWorkers(procs, 1, time_scale=0.0, capacity_tokens=1_000_000)
            stack.callback(workers.close)
            redis_url = args.redis or start_redis(procs)
            routed_url = redis_url  # what the routing paths use; the run's keys are deleted through redis_url
            if args.store_delay_ms > 0:
                log(f"Redis behind a relay adding {args.store_delay_ms:g} ms each way")
                routed_url = start_delayed(procs, redis_url, args.store_delay_ms)
            gateways: dict[str, str] = {}
            log("starting agent-cache serve")
            sessions = _sessions(args.calls, args.seed)
            keys = write_gateway_keys(procs.dir + "/gateway-keys", (s.tenant for s in sessions))
            gw_prefix = f"agent-cache-overhead-gw-{uuid.uuid4().hex[:8]}"
            stack.callback(_delete_deployment, redis_url, gw_prefix)  # runs after the gateway stopped
            transports = [t.strip() for t in args.transports.split(",") if t.strip()]
            for transport in transports or [None]:
                extra = ["--transport", transport] if transport else []
                ours = AgentCacheGateways(procs, workers.urls, redis_url=routed_url, args=[
                    "--prefix", gw_prefix, "--templates", "templatize", "--api-keys", keys,
                    *(["--extra-fields", "sim_output"] if workers.scripted else []), *extra,
                    *args.gateway_args.split()])
                stack.callback(ours.stop)
                gateways[f"{GATEWAY_PATH} ({transport})" if transport else GATEWAY_PATH] = ours.urls[0]
            if smg:
                for name in SMG_PATHS:
                    group = SmgGateways(procs, smg, REGISTRY[name].smg_policy, workers.urls)
                    stack.callback(group.stop)
                    gateways[name] = group.urls[0]
            results, rates = asyncio.run(_run(workers, routed_url, gateways, sessions, args.calls, args.seed,
                                              log, stream=not args.no_stream, concurrency=args.concurrency,
                                              delete_url=redis_url, answer_tokens=args.answer_tokens))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except AgentCacheError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(table(results))
    if rates:
        print("\n" + throughput_table(rates, args.concurrency))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"calls_per_path": args.calls, "streamed": not args.no_stream, "paths": results,
                       "worker": workers.describe(), "answer_tokens": args.answer_tokens,
                       "concurrency": args.concurrency, "calls_per_s": rates}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
