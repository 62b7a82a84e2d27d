"""What a frozen Redis costs agent calls: added latency (sync) and event-loop stalls (async).

A private redis-server is frozen with SIGSTOP (connections hang: the worst
case for client timeouts) while ``ChatSGLang`` runs agent steps against two
instant simulated workers: first sequential ``invoke`` calls, each a new
session (so each also queues a template record), compared with the same
calls while Redis answers; then concurrent ``ainvoke`` calls while a ticker
task measures how long the event loop was kept from running it (and the
same with Redis up: the machine's own noise).

    python -m agent_cache.bench.store_outage --calls 40
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
from typing import Callable, Sequence

from langchain_core.messages import HumanMessage, SystemMessage
from pydantic import SecretStr

from agent_cache import ChatSGLang
from agent_cache.processes import Processes
from agent_cache.bench.realfleet import start_redis
from agent_cache.sim import SimFleet

SYSTEM = "You are a careful assistant. Today is 2026-12-03. "
TICK = 0.005


def _sync(model: ChatSGLang, tag: str, calls: int) -> list[float]:
    out = []
    for i in range(calls):
        t0 = time.perf_counter()
        model.invoke([SystemMessage(SYSTEM + tag + str(i)), HumanMessage("step")], session_id=f"{tag}-{i}")
        out.append(time.perf_counter() - t0)
    return out


async def _async_stall(model: ChatSGLang, freeze: Callable[[], None], calls: int) -> float:
    await model.ainvoke([SystemMessage(SYSTEM), HumanMessage("warm up")], session_id="warm")
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(TICK)
            now = time.perf_counter()
            gaps.append(now - last - TICK)
            last = now

    task = asyncio.create_task(ticker())
    freeze()
    for k in range(max(1, calls // 8)):
        await asyncio.gather(*(model.ainvoke([SystemMessage(SYSTEM + str(i)), HumanMessage(f"step {k}")],
                                             session_id=f"a{i}") for i in range(8)))
    stop.set()
    await task
    await model.aclose()
    return max(gaps)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_cache.bench.store_outage", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=40, help="calls per measurement (default 40)")
    args = p.parse_args(argv)
    if args.calls < 8:
        print("error: --calls: at least 8", file=sys.stderr)
        return 2
    with Processes() as procs, SimFleet(2, time_scale=0.0) as fleet:
        url = start_redis(procs)
        redis_proc = procs._procs[-1].popen  # noqa: SLF001 - the redis-server just started

        def model() -> ChatSGLang:
            return ChatSGLang(model="sim", workers=fleet.urls, redis_url=SecretStr(url), max_tokens=4,
                              templates="templatize", health_probe_interval=None)

        sync_model = model()
        up = _sync(sync_model, "up", args.calls)
        redis_proc.send_signal(signal.SIGSTOP)
        try:
            _sync(sync_model, "first", 1)  # the first call notices: its route times out, then degraded mode
            frozen = _sync(sync_model, "frozen", args.calls)
        finally:
            redis_proc.send_signal(signal.SIGCONT)
        sync_model.close()
        baseline = asyncio.run(_async_stall(model(), lambda: None, args.calls))  # Redis up: the machine's own noise
        try:
            stall = asyncio.run(_async_stall(model(), lambda: redis_proc.send_signal(signal.SIGSTOP), args.calls))
        finally:
            redis_proc.send_signal(signal.SIGCONT)
    ms = 1000
    print(f"sync invoke, p50: Redis up {statistics.median(up) * ms:.1f} ms, frozen {statistics.median(frozen) * ms:.1f}"
          f" ms (added {(statistics.median(frozen) - statistics.median(up)) * ms:+.1f} ms); frozen max "
          f"{max(frozen) * ms:.1f} ms; 0 failed calls")
    print(f"async ainvoke, worst event-loop stall over {max(1, args.calls // 8) * 8} calls: Redis up "
          f"{baseline * ms:.1f} ms, frozen {stall * ms:.1f} ms; 0 failed calls")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
