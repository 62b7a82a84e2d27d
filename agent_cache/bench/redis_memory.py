"""Redis memory per live session: what to size ``maxmemory`` by.

Each session makes one agent step (route, done, report with usage) on a
fresh key prefix; ``INFO memory`` ``used_memory`` is read before and after,
then the prefix's keys are deleted::

    python -m agent_cache.bench.redis_memory --redis redis://127.0.0.1:6379/0 --sessions 100000
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

import redis

from agent_cache.routing.router import RouteRequest, Router
from agent_cache.store.redis_store import delete_deployment

WORKERS = [f"http://10.0.0.{i}:30000" for i in range(1, 5)]  # never contacted: probes are off


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", required=True, help="redis://host:port/db")
    parser.add_argument("--sessions", type=int, default=100_000)
    args = parser.parse_args(argv)
    if args.sessions <= 0:
        parser.error("--sessions: must be positive")
    prefix = f"mem-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(args.redis)
    router = Router(WORKERS, redis_url=args.redis, prefix=prefix, probe_interval=None)
    try:
        warm = router.route(RouteRequest("warm-up", template_id="tmpl-1"))  # fixed per-deployment keys
        router.done(warm)
        router.report(warm, prompt_tokens=1500, cached_tokens=1024)
        before = _used(client)
        t0 = time.perf_counter()
        for i in range(args.sessions):
            placement = router.route(RouteRequest(f"thread-{uuid.uuid4()}", template_id="tmpl-1"))
            router.done(placement)
            router.report(placement, prompt_tokens=1500, cached_tokens=1024)
            if (i + 1) % 20_000 == 0:
                print(f"{i + 1}/{args.sessions} sessions, {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
        router.flush()
        after = _used(client)
    finally:
        router.close()
        client.close()
        delete_deployment(args.redis, prefix)
    delta = after - before
    print(f"used_memory before {before} after {after} delta {delta} "
          f"bytes/session {delta / args.sessions:.1f} ({args.sessions} sessions, redis {_version(args.redis)})")
    return 0


def _version(url: str) -> str:
    client = redis.Redis.from_url(url)
    try:
        return str(client.info("server")["redis_version"])
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
