"""agent-cache's own servers as subprocesses on loopback ports, for tests and the benchmark.

* :class:`SimWorkers`: N ``agent-cache sim-worker`` processes (cache report
  and metrics on), a simulator with a real radix cache and the latency model
  of :mod:`agent_cache.sim.latency`, not SGLang; ``flush()`` empties every
  cache, ``kv_tokens()`` reads what the caches hold.
* :class:`AgentCacheGateways`: K ``agent-cache serve`` processes in front of
  workers, sharing one Redis when given.

Both start their processes through a :class:`~agent_cache.processes.Processes`,
which stops every one on close. (The threaded, in-process stand-in is
:class:`agent_cache.sim.SimFleet`.)
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

import httpx

from agent_cache.processes import Proc, Processes, free_port, wait_until
from agent_cache.sim.versions import LATEST_VERSION

MODEL = "sim-llama-3.1-8b"  # the simulated workers' served model name (their default)


def flush_caches(http: httpx.Client, urls: Sequence[str], procs: Sequence[Proc], timeout: float = 30.0) -> None:
    """Empty every worker's radix cache (SGLang refuses while requests run: retried until ``timeout``)."""
    for url in urls:
        wait_until(lambda: http.post(url + "/flush_cache").status_code == 200, procs, f"/flush_cache of {url}",
                   timeout)


class SimWorkers:
    """N simulated SGLang workers (``agent-cache sim-worker``) on free loopback ports."""

    model = MODEL

    def __init__(self, procs: Processes, n: int, *, time_scale: float, capacity_tokens: int, page_size: int = 1,
                 max_running_requests: int | None = None, sglang_version: str | None = None,
                 kv_events: bool = False, scripted: bool = True, tokenizer_path: str | None = None) -> None:
        self.scripted = scripted  # asked for the recorded answer (sim_output), else they answer for themselves
        self.urls: list[str] = []
        self._procs: list[Proc] = []
        self.sglang_version = sglang_version or LATEST_VERSION
        self.tokenizer_path = tokenizer_path
        sources = []  # with kv_events: each worker's publisher, as agent-cache serve --kv-events names it
        for i in range(n):
            port = free_port()
            argv = [sys.executable, "-m", "agent_cache.cli", "sim-worker", "--host", "127.0.0.1", "--port", str(port),
                    "--served-model-name", MODEL, "--time-scale", repr(float(time_scale)),
                    "--max-total-tokens", str(capacity_tokens), "--page-size", str(page_size),
                    "--enable-cache-report", "--enable-metrics", "--log-level", "warning"]
            if kv_events:
                pub, replay = free_port(), free_port()
                argv += ["--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{pub}",
                                                           "replay_endpoint": f"tcp://*:{replay}"})]
                sources.append(f"http://127.0.0.1:{port}=tcp://127.0.0.1:{pub}|tcp://127.0.0.1:{replay}")
            if max_running_requests is not None:
                argv += ["--max-running-requests", str(max_running_requests)]
            if sglang_version is not None:
                argv += ["--sglang-version", sglang_version]
            if tokenizer_path is not None:
                argv += ["--tokenizer-path", tokenizer_path]
            self._procs.append(procs.start(f"sim-worker-{i}", argv))
            self.urls.append(f"http://127.0.0.1:{port}")
        self.kv_sources = ",".join(sources)
        slower = max(1.0, time_scale)  # a slowed worker's /health runs a modelled forward pass too
        self._http = httpx.Client(timeout=5.0 * slower)

        def healthy() -> bool:
            return all(self._http.get(u + "/health").status_code == 200 for u in self.urls)

        wait_until(healthy, self._procs, f"{n} simulated workers", timeout=60.0 * slower)
        for url in self.urls:  # the tokenizer loads on first use: not inside the first policy's first call
            # /generate exists in every 0.5.x release (/tokenize only from 0.5.4); flushed before each policy
            self._http.post(url + "/generate", json={"text": "warm up", "sampling_params": {"max_new_tokens": 1}},
                            timeout=60.0 * slower).raise_for_status()

    def check(self) -> None:
        for p in self._procs:
            p.check()

    def describe(self) -> dict[str, Any]:
        # the model is the latency model's (the run's config names it)
        return {"fleet": "sim", "engine_version": self.sglang_version,
                "tokenizer": self.tokenizer_path or "the simulator's own (cl100k_base)"}

    def flush(self, timeout: float = 30.0) -> None:
        flush_caches(self._http, self.urls, self._procs, timeout)

    def kv_tokens(self) -> int | None:
        """Tokens held by the workers' radix caches now, evictable ones included; None if a worker does not say.

        Not ``/v1/loads`` ``num_used_tokens``: SGLang counts there only what
        running requests hold (``max_total - (available + evictable)``), which
        reads ~0 between runs. SGLang reports its cached tokens nowhere over
        HTTP; the simulated worker's ``/server_info`` adds ``sim_cached_tokens``.
        """
        total = 0
        for url in self.urls:
            r = self._http.get(url + "/server_info")
            if r.status_code == 404:  # before 0.5.6
                r = self._http.get(url + "/get_server_info")
            held = r.json().get("sim_cached_tokens")
            if held is None:
                return None
            total += int(held)
        return total

    def close(self) -> None:
        self._http.close()


class AgentCacheGateways:
    """``count`` ``agent-cache serve`` processes in front of the workers, sharing one Redis
    (what several gateway replicas behind a load balancer run); ready when each answers /health."""

    def __init__(self, procs: Processes, worker_urls: Sequence[str], *, redis_url: str | None = None,
                 count: int = 1, args: Sequence[str] = (), per_gateway_args: Sequence[Sequence[str]] = ()) -> None:
        self._procs = procs
        ports = [free_port() for _ in range(count)]
        self.urls = [f"http://127.0.0.1:{port}" for port in ports]
        self.procs: list[Proc] = []
        store = ["--redis", redis_url] if redis_url else []
        try:
            for i, port in enumerate(ports):
                argv = [sys.executable, "-m", "agent_cache.cli", "serve", "--workers", ",".join(worker_urls),
                        "--port", str(port), *store, *args, *(per_gateway_args[i] if per_gateway_args else ())]
                self.procs.append(procs.start(f"agent-cache-serve-{i}", argv))
            for url, proc in zip(self.urls, self.procs):

                def healthy(url: str = url) -> bool:
                    return httpx.get(url + "/health", timeout=2.0).status_code == 200

                wait_until(healthy, [proc], f"agent-cache serve ({proc.name})", timeout=60.0)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 10.0) -> None:
        for proc in self.procs:
            self._procs.stop(proc, grace=grace)
