"""CPU per call of the gateway's worker transports, and of the gateway itself, against one simulated worker.

``transport``: streamed chat calls sent one at a time straight through each
:class:`~agent_cache.calls.transport.WorkerTransport` (httpx, the fast
path); ``gateway``: the gateway app in process (under ``httpx.ASGITransport``,
the in-process store), whole and streamed, on each transport. CPU is this
process's ``time.process_time`` per call (the simulated worker runs in its
own process), after warm-up calls.

    python -m agent_cache.bench.transport_cpu --calls 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any, Sequence

import httpx

from agent_cache.processes import Processes
from agent_cache.server_processes import SimWorkers
from agent_cache.calls.httpx_transport import HttpxTransport
from agent_cache.calls.transport import WorkerTransport
from agent_cache.gateway.app import create_app
from agent_cache.gateway.config import GatewayConfig
from agent_cache.gateway.upstream import Upstream

WARMUP = 20
_MESSAGES = [{"role": "system", "content": "You are an agent. " * 100}, {"role": "user", "content": "hello"}]


def _transport(kind: str) -> WorkerTransport:
    return HttpxTransport(timeout=60.0) if kind == "httpx" else Upstream(timeout=60.0, max_connections=8)


async def transport_cpu(worker: str, kind: str, calls: int) -> float:
    """Client CPU (ms) per streamed call through one transport."""
    body = json.dumps({"model": "m", "messages": _MESSAGES, "max_tokens": 32, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    transport = _transport(kind)

    async def one() -> None:
        async for _ in transport.stream(worker, "/v1/chat/completions", body, first_byte_timeout=10.0):
            pass

    for _ in range(WARMUP):
        await one()
    c0 = time.process_time()
    for _ in range(calls):
        await one()
    cpu = (time.process_time() - c0) / calls * 1000
    await transport.aclose()
    return cpu


async def gateway_cpu(worker: str, kind: str, stream: bool, calls: int) -> float:
    """CPU (ms) per call of the gateway app in process and its test client together."""
    app = create_app(GatewayConfig([worker], transport=kind, probe_interval=None))
    body: dict[str, Any] = {"model": "m", "messages": _MESSAGES, "max_tokens": 32, "stream": stream}
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            async def one() -> None:
                r = await client.post("/v1/chat/completions", json=body, headers={"x-session-id": "s"})
                assert r.status_code == 200, r.text

            for _ in range(WARMUP):
                await one()
            c0 = time.process_time()
            for _ in range(calls):
                await one()
            return (time.process_time() - c0) / calls * 1000


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m agent_cache.bench.transport_cpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300, help="calls per measurement (default 300)")
    args = p.parse_args(argv)
    with Processes() as procs:
        workers = SimWorkers(procs, 1, time_scale=0.0, capacity_tokens=100_000)
        worker = workers.urls[0]
        print("| measurement | httpx | fast |\n|---|---:|---:|")
        row = [asyncio.run(transport_cpu(worker, kind, args.calls)) for kind in ("httpx", "fast")]
        print(f"| transport, client CPU per streamed call (ms) | {row[0]:.2f} | {row[1]:.2f} |")
        for stream in (True, False):
            row = [asyncio.run(gateway_cpu(worker, kind, stream, args.calls)) for kind in ("httpx", "fast")]
            what = "streamed" if stream else "whole"
            print(f"| gateway + test client, CPU per {what} call (ms) | {row[0]:.2f} | {row[1]:.2f} |")
        workers.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
