"""State left behind when every session has its own system prompt, and what it costs.

A prompt that differs per session in a way the templater cannot see (a
customer number, say) gives every session its own template. This runs
``ChatSGLang`` (the real router, Redis store and templates) against two
instant simulated worker processes, one agent step per session, each with its own
system prompt, on a fresh key prefix and a clock the benchmark moves. After
each stage (a cumulative session count) the clock moves past every session's
TTL and every template's retention, a single agent then makes steps until
the routing script has purged what expired, and the benchmark reads:

* the deployment's Redis keys, and how many of them have no TTL;
* the Prometheus series of the router's registry;
* the process RSS;
* ``store.stats()`` time (median of 5), right after the load and after expiry.

::

    python -m agent_cache.bench.bounded_state --redis redis://127.0.0.1:6379/0 --sessions 2000 10000

The stages run in one process, one after another, so RSS and series at the
larger stage include everything the smaller one left.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

import redis
from langchain_core.messages import HumanMessage, SystemMessage

from agent_cache import ChatSGLang
from agent_cache.processes import Processes
from agent_cache.server_processes import SimWorkers
from agent_cache.routing.router import Router
from agent_cache.store import keys
from agent_cache.store.base import DEFAULT_TEMPLATE_WINDOW, template_retention
from agent_cache.store.redis_store import RedisStore, delete_deployment


@dataclass(frozen=True)
class Stage:
    sessions: int  # sessions run so far
    keys_loaded: int  # the deployment's keys right after the load
    stats_loaded_ms: float
    keys_after: int  # after expiry and the purge
    no_ttl_after: int  # of those, keys without a TTL
    purge_steps: int  # agent steps it took the routing script to purge what expired
    series: int  # Prometheus series of the router's registry
    rss_mb: float
    stats_after_ms: float


def rss_mb() -> float:
    """Resident set size of this process now (Linux), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("VmRSS not found in /proc/self/status")


def series(router: Router) -> int:
    return sum(len(metric.samples) for metric in router.metrics.registry.collect())


def deployment_keys(client: redis.Redis, prefix: str) -> tuple[int, int]:
    """(keys of the deployment, those without a TTL), read in batches of 1,000: the count itself
    must not hold every key name at once, or the process's RSS would grow with the keys counted."""
    total = no_ttl = 0
    batch: list[bytes] = []

    def count(names: list[bytes]) -> int:
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.pttl(name)
        return sum(1 for t in pipe.execute() if t == -1)

    for name in client.scan_iter(match=keys.tag(prefix) + ":*", count=1000):
        batch.append(name)
        if len(batch) == 1000:
            total, no_ttl, batch = total + len(batch), no_ttl + count(batch), []
    if batch:
        total, no_ttl = total + len(batch), no_ttl + count(batch)
    return total, no_ttl


def stats_ms(router: Router, now: float) -> float:
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        router.store.stats(now)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def _step(model: ChatSGLang, session: str, prompt: str) -> None:
    model.invoke([SystemMessage(prompt), HumanMessage("What is my balance?")], session_id=session)


def run(redis_url: str, stages: Sequence[int], session_ttl: float = 5.0, progress: Any = None) -> list[Stage]:
    """Run the stages against Redis at ``redis_url``; the deployment's keys are deleted at the end."""
    prefix = f"bounded-{uuid.uuid4().hex[:8]}"
    now = [time.time()]
    client = redis.Redis.from_url(redis_url)
    out: list[Stage] = []
    retention = template_retention(session_ttl, DEFAULT_TEMPLATE_WINDOW)
    with Processes() as procs:  # workers in their own processes: the RSS read is the agent's alone
        fleet = SimWorkers(procs, 2, time_scale=0.0, capacity_tokens=1_000_000)
        store = RedisStore(redis_url, prefix=prefix, session_ttl=session_ttl)
        router = Router(fleet.urls, store=store, probe_interval=None, clock=lambda: now[0])
        model = ChatSGLang(workers=fleet.urls, router=router)
        try:
            done = 0
            for target in stages:
                for i in range(done, target):
                    now[0] += 0.01
                    _step(model, f"customer-{i}", f"You are the support agent for customer {i}. Be brief.")
                    if progress is not None and (i + 1) % 1000 == 0:
                        print(f"  {i + 1}/{target} sessions", file=progress, flush=True)
                done = target
                model._registry.flush()  # the template records queued in the background, written now
                router.flush()
                loaded, _ = deployment_keys(client, prefix)
                loaded_ms = stats_ms(router, now[0])
                now[0] += retention + session_ttl + 1
                steps = 0
                while True:  # one agent keeps working; each of its steps purges up to 512 expired sessions
                    _step(model, "steady", "You are the billing agent. Be brief.")
                    steps += 1
                    router.flush()
                    if client.zcard(keys.live(prefix)) <= 1:
                        break
                total, no_ttl = deployment_keys(client, prefix)
                out.append(Stage(target, loaded, loaded_ms, total, no_ttl, steps, series(router), rss_mb(),
                                 stats_ms(router, now[0])))
        finally:
            model.close()
            router.close()
            delete_deployment(redis_url, prefix)
            client.close()
    return out


def report(stages: Sequence[Stage]) -> str:
    lines = [
        "| sessions (each its own prompt) | keys after load | stats() after load | keys after expiry "
        "| without TTL | purge steps | Prometheus series | RSS | stats() after expiry |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in stages:
        lines.append(f"| {s.sessions:,} | {s.keys_loaded:,} | {s.stats_loaded_ms:.1f} ms | {s.keys_after:,} "
                     f"| {s.no_ttl_after} | {s.purge_steps} | {s.series} | {s.rss_mb:.1f} MiB "
                     f"| {s.stats_after_ms:.2f} ms |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis", required=True, help="redis://host:port/db")
    parser.add_argument("--sessions", type=int, nargs="+", default=[2000, 10_000],
                        help="cumulative session counts to measure at (increasing)")
    parser.add_argument("--session-ttl", type=float, default=5.0)
    args = parser.parse_args(argv)
    if any(n <= 0 for n in args.sessions) or list(args.sessions) != sorted(set(args.sessions)):
        parser.error("--sessions: positive counts in increasing order")
    if args.session_ttl <= 0:
        parser.error("--session-ttl: must be > 0")
    print(report(run(args.redis, args.sessions, args.session_ttl, progress=sys.stderr)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
