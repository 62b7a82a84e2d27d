"""Routing decision cost: latency added per call, and decisions per second.

Measures ``Router.route`` + ``Router.done`` on the memory store and on the
Redis store over loopback. With Redis, ``done`` queues the in-flight release
and the next route carries it (one round trip per decision); a second row
runs with ``release_delay=0`` (a round trip of its own per release) side by
side for comparison, and a third adds ``Router.report`` (the usage feedback
``ChatSGLang`` sends after every call: a model call's whole store traffic).
Workload: sessions of ``--steps`` calls, so most decisions are pinned
lookups and one in ``--steps`` is a new placement, as in an agent fleet.

    python -m agent_cache.bench.routing_bench --redis redis://127.0.0.1:6379/0

Keys go under a fresh prefix and are deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
import uuid

from agent_cache.percentile import percentile
import redis

from agent_cache.routing.router import RouteRequest, Router
from agent_cache.store.redis_store import RedisStore

WORKERS = [f"http://10.0.0.{i}:30000" for i in range(1, 9)]  # never contacted: probes are off


def _requests(n: int, steps: int, tag: str) -> list[RouteRequest]:
    return [RouteRequest(session_id=f"{tag}-s{i // steps}", template_id=f"t{i // steps % 4}") for i in range(n)]


def _call(router: Router, request: RouteRequest, report: bool) -> None:
    placement = router.route(request)
    router.done(placement)
    if report:
        router.report(placement, prompt_tokens=2000, cached_tokens=1500)


async def _acall(router: Router, request: RouteRequest, report: bool) -> None:
    placement = await router.aroute(request)
    await router.adone(placement)
    if report:
        await router.areport(placement, prompt_tokens=2000, cached_tokens=1500)


def _latency(router: Router, n: int, steps: int, report: bool) -> list[float]:
    out = []
    for request in _requests(n, steps, uuid.uuid4().hex[:6]):
        t0 = time.perf_counter()
        _call(router, request, report)
        out.append(time.perf_counter() - t0)
    return out


def _threads(router: Router, n: int, steps: int, threads: int, report: bool) -> float:
    requests = _requests(n, steps, uuid.uuid4().hex[:6])
    chunks = [requests[i::threads] for i in range(threads)]

    def run(chunk: list[RouteRequest]) -> None:
        for request in chunk:
            _call(router, request, report)

    workers = [threading.Thread(target=run, args=(c,)) for c in chunks]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return n / (time.perf_counter() - t0)


async def _async(router: Router, n: int, steps: int, tasks: int, report: bool = False) -> float:
    requests = _requests(n, steps, uuid.uuid4().hex[:6])

    async def run(chunk: list[RouteRequest]) -> None:
        for request in chunk:
            await _acall(router, request, report)

    t0 = time.perf_counter()
    await asyncio.gather(*[run(requests[i::tasks]) for i in range(tasks)])
    return n / (time.perf_counter() - t0)


def _measure(name: str, router: Router, args: argparse.Namespace, report: bool = False) -> list[str]:
    print(f"{name}: warming up...", file=sys.stderr, flush=True)
    _latency(router, 500, args.steps, report)
    lat = _latency(router, args.decisions, args.steps, report)
    print(f"{name}: threads...", file=sys.stderr, flush=True)
    thr = _threads(router, args.decisions, args.steps, args.concurrency, report)
    print(f"{name}: asyncio...", file=sys.stderr, flush=True)
    asy = asyncio.run(_async(router, args.decisions, args.steps, args.concurrency, report))
    return [
        f"| {name} | {statistics.median(lat) * 1e3:.3f} | {percentile(lat, 0.99) * 1e3:.3f} | "
        f"{1 / statistics.mean(lat):,.0f} | {thr:,.0f} | {asy:,.0f} |"
    ]


def _evalsha_stats(url: str) -> dict[str, float]:
    client = redis.Redis.from_url(url)
    try:
        return dict(client.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0}))
    finally:
        client.close()


def _redis_context(url: str, before: dict[str, float], after: dict[str, float], n: int = 2000) -> list[str]:
    """Where Redis time goes: a bare PING round trip, and server-side script time per call."""
    calls = after.get("calls", 0) - before.get("calls", 0)
    usec = after.get("usec", 0) - before.get("usec", 0)
    client = redis.Redis.from_url(url)
    try:
        rtt = []
        for _ in range(n):
            t0 = time.perf_counter()
            client.ping()
            rtt.append(time.perf_counter() - t0)
    finally:
        client.close()
    return [
        f"redis PING round trip (same client library): p50 {statistics.median(rtt) * 1e3:.3f} ms, "
        f"p99 {percentile(rtt, 0.99) * 1e3:.3f} ms",
        f"redis server time per script call during the route + done run (INFO commandstats delta, "
        f"any client): {usec / calls if calls else float('nan'):.1f} us over {calls:,} calls",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", default=None, help="redis://host:port/db (default: memory store only)")
    parser.add_argument("--decisions", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=5, help="calls per session")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    notes: list[str] = []
    rows = ["| store, per call | p50 ms | p99 ms | sequential calls/s | threads calls/s | asyncio calls/s |",
            "| --- | --- | --- | --- | --- | --- |"]
    memory = Router(WORKERS, probe_interval=None)
    rows += _measure("memory: route + done", memory, args)
    memory.close()
    if args.redis:
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        router = Router(WORKERS, redis_url=args.redis, prefix=prefix, probe_interval=None)
        unbatched = Router(WORKERS, redis_url=args.redis, prefix=prefix, probe_interval=None, release_delay=0)
        pyclient = Router(WORKERS, probe_interval=None, store=RedisStore(
            args.redis, prefix=prefix, client=redis.Redis.from_url(args.redis, socket_timeout=0.25)))
        try:
            before = _evalsha_stats(args.redis)
            rows += _measure("redis: route + done", router, args)
            notes = _redis_context(args.redis, before, _evalsha_stats(args.redis))
            rows += _measure("redis: route + done, release_delay=0", unbatched, args)
            rows += _measure("redis: route + done + report", router, args, report=True)
            # the same through redis-py's own command path (what a client brought to RedisStore uses)
            rows += _measure("redis, redis-py client: route + done + report", pyclient, args, report=True)
        finally:
            from agent_cache.store.redis_store import delete_deployment

            delete_deployment(args.redis, prefix)
            router.close()
            unbatched.close()
            pyclient.close()
    print(f"{args.decisions} decisions per measurement, sessions of {args.steps} calls, "
          f"{len(WORKERS)} workers, concurrency {args.concurrency}")
    print("\n".join(rows))
    for line in notes:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
