"""Throughput of one simulated worker process at ``time_scale=0``.

Starts ``agent-cache sim-worker --time-scale 0`` as its own process (one
Python process: one core at most), then drives it from this process with
concurrent async agent sessions whose prompts are about 3k tokens and share
their prefix with the session's previous call. Prints wall-clock requests/s
(client and worker share the machine), requests per CPU-second of the
worker process (what one core sustains), and the reported hit rate.

    python -m agent_cache.bench.sim_throughput --requests 2000 --concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time

from agent_cache.backends import AsyncSGLangClient, SGLangClient
from agent_cache.errors import BackendError

_SYSTEM = "You are an agent that answers multi-hop questions with tools. " * 280  # ~3k tokens with the history


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _session(client: AsyncSGLangClient, sid: int, calls: int, stats: dict[str, float]) -> None:
    history = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": f"Question {sid}?"}]
    for step in range(calls):
        result = await client.chat(history, max_tokens=24)
        usage = result.usage
        stats["requests"] += 1
        stats["prompt"] += usage.prompt_tokens if usage else 0
        stats["cached"] += (usage.cached_tokens or 0) if usage else 0
        history = history + [{"role": "assistant", "content": result.content or ""},
                             {"role": "user", "content": f"Observation {step}: a short tool result."}]


async def _drive(url: str, requests: int, concurrency: int, calls_per_session: int) -> dict[str, float]:
    stats: dict[str, float] = {"requests": 0, "prompt": 0, "cached": 0}
    sessions = max(1, requests // calls_per_session)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for sid in range(sessions):
        queue.put_nowait(sid)
    async with AsyncSGLangClient(url, max_connections=concurrency) as client:
        async def worker() -> None:
            while not queue.empty():
                await _session(client, queue.get_nowait(), calls_per_session, stats)

        start = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        stats["seconds"] = time.perf_counter() - start
    return stats


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--calls-per-session", type=int, default=5)
    args = parser.parse_args(argv)
    port = _free_port()
    cmd = [sys.executable, "-m", "agent_cache.cli", "sim-worker", "--port", str(port), "--time-scale", "0",
           "--max-total-tokens", "2000000"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                SGLangClient(url, timeout=1).health()
                break
            except BackendError:
                if time.monotonic() > deadline:
                    raise SystemExit("simulated worker did not start")
                time.sleep(0.1)
        print(f"warming up, then {args.requests} requests at concurrency {args.concurrency}...", file=sys.stderr)
        asyncio.run(_drive(url, 100, 8, args.calls_per_session))
        cpu_before = _cpu_seconds(proc.pid)
        stats = asyncio.run(_drive(url, args.requests, args.concurrency, args.calls_per_session))
        worker_cpu = _cpu_seconds(proc.pid) - cpu_before
    finally:
        proc.terminate()
        proc.wait(10)
    mean_prompt = stats["prompt"] / max(1, stats["requests"])
    print(f"requests: {stats['requests']}  seconds: {stats['seconds']:.2f}  "
          f"throughput: {stats['requests'] / stats['seconds']:.0f} req/s  "
          f"mean prompt: {mean_prompt:.0f} tokens  hit rate: {stats['cached'] / max(1, stats['prompt']):.1%}")
    # the client shares the machine; requests per CPU-second of the worker is what one core sustains
    print(f"worker CPU: {worker_cpu:.2f} s  -> {stats['requests'] / max(worker_cpu, 1e-9):.0f} requests per worker CPU-second")
    return 0


if __name__ == "__main__":
    sys.exit(main())
