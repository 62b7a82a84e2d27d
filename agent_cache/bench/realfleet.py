"""The processes of the real-process benchmark beyond agent-cache's own servers.

Each one is a subprocess on a free loopback port that logs to a file in one
temp directory, started through a :class:`~agent_cache.processes.Processes`:
``close()`` stops every one (terminate, then kill) and removes the directory,
and the engine calls it in a ``finally``, so nothing is left running after a
failure. The simulated workers and ``agent-cache serve`` gateways are
:mod:`agent_cache.server_processes`'s (tests start them too).

* :class:`SGLangWorkers`: N real SGLang servers of a release set up by
  ``agent-cache sglang-cpu setup`` (:mod:`agent_cache.sglang_cpu`), on this
  CPU with the tiny random-weight model; the interface of
  :class:`~agent_cache.server_processes.SimWorkers`.
* :class:`GivenWorkers`: a user's own running fleet (``--worker-urls``), GPU
  or not; flushed the same way, never started or stopped.
* :func:`start_redis`: a private ``redis-server`` (no persistence).
* :class:`SmgGateways`: the real smg binary with one routing policy, in front
  of the same workers; several gateways join smg's mesh. Flags and headers are the ones ``smg launch --help``
  and smg's documentation give (docs/benchmarks.md lists them).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from typing import Any, Iterable, Sequence

import httpx

from agent_cache.errors import ConfigError
from agent_cache.sglang_cpu.workers import MODEL_DESCRIPTION, SERVED_MODEL, RealWorkers
from agent_cache.bench.registry import smg_flags
from agent_cache.processes import BenchProcessError, Proc, Processes, free_port, wait_until
from agent_cache.server_processes import SimWorkers, flush_caches

# smg names the worker that served a request in this response header (HTTP workers)
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"
# agent-cache serve names it here, and takes the session and the tenant's key from these
GATEWAY_WORKER_HEADER = "x-agent-cache-worker"
GATEWAY_SESSION_HEADER = "x-session-id"


def gateway_key(tenant: str) -> str:
    """The API key the benchmark gives each tenant of a workload (``agent-cache serve --api-keys``)."""
    return "bench-" + hashlib.sha256(tenant.encode()).hexdigest()[:16]


def write_gateway_keys(path: str, tenants: Iterable[str]) -> str:
    with open(path, "w") as f:
        # admins' keys: the gateway names the worker that served each call by its URL, which the benchmark reads
        f.writelines(f"{gateway_key(t)} {t} role=admin\n" for t in sorted(set(tenants)))
    return path


class SGLangWorkers:
    """N real SGLang servers of one set-up release (:mod:`agent_cache.sglang_cpu`) on this machine's CPU:
    pool ``capacity_tokens``, ``--sleep-on-idle``, metrics and cache report on, KV events when asked."""

    scripted = False  # a real model answers for itself: the load replays closed-loop
    model = SERVED_MODEL

    def __init__(self, procs: Processes, n: int, *, version: str, capacity_tokens: int, page_size: int = 1,
                 context_length: int | None = None, kv_events: bool = False) -> None:
        from agent_cache.sglang_cpu.install import Installed

        installed = Installed.find(version)
        if installed is None:
            raise ConfigError("--sglang-version", f"SGLang {version} is not set up on this machine "
                                                  f"(agent-cache sglang-cpu setup --version {version})")
        self.version = version
        self.fleet = RealWorkers(installed, procs=procs)
        # a request can never be longer than the pool, nor than the model's context
        context = context_length or min(max(capacity_tokens, 32768), self.fleet.max_context)
        self.fleet.start(n, max_total_tokens=capacity_tokens, page_size=page_size, context_length=context,
                         kv_events=kv_events)
        self.urls = self.fleet.urls
        self.kv_sources = ",".join(f"{w.url}={w.kv_endpoint}|{w.kv_replay_endpoint}" for w in self.fleet.workers
                                   if w.kv_endpoint)
        self._http = httpx.Client(timeout=30.0)

    def describe(self) -> dict[str, Any]:
        return {"fleet": "sglang", "engine_version": self.version, "model": MODEL_DESCRIPTION}

    def check(self) -> None:
        for w in self.fleet.workers:
            w.proc.check()

    def flush(self, timeout: float = 60.0) -> None:
        flush_caches(self._http, self.urls, [w.proc for w in self.fleet.workers], timeout)

    def kv_tokens(self) -> int | None:
        return None  # SGLang reports what its cache holds nowhere over HTTP

    def close(self) -> None:
        self._http.close()
        self.fleet.close()


class GivenWorkers:
    """A running fleet given by URL (``--worker-urls``): checked to answer, flushed before each policy, never
    started or stopped. The model is the first one ``/v1/models`` names."""

    scripted = False
    kv_sources = ""

    def __init__(self, urls: Sequence[str]) -> None:
        from agent_cache.backends.sglang import SGLangClient
        from agent_cache.errors import AgentCacheError

        self.urls = [u.rstrip("/") for u in urls]
        self._http = httpx.Client(timeout=30.0)
        models, versions = [], set()
        try:
            for url in self.urls:
                client = SGLangClient(url, timeout=30.0, http=self._http)  # its routes, older releases' included
                try:
                    models.append(client.models()["data"][0]["id"])
                except (AgentCacheError, KeyError, IndexError, TypeError) as exc:
                    raise ConfigError("--worker-urls", f"{url} does not answer GET /v1/models with a model "
                                                       f"({type(exc).__name__}: {exc})") from None
                try:
                    versions.add(str(client.server_info().get("version", "unknown")))
                except AgentCacheError:
                    versions.add("unknown")
            if len(set(models)) > 1:
                raise ConfigError("--worker-urls", f"the workers serve different models: {sorted(set(models))}")
        except ConfigError:
            self._http.close()
            raise
        self.model = models[0]
        self.versions = sorted(versions)

    def describe(self) -> dict[str, Any]:
        return {"fleet": "given", "engine_version": ",".join(self.versions), "model": self.model}

    def check(self) -> None:
        pass

    def flush(self, timeout: float = 60.0) -> None:
        try:
            flush_caches(self._http, self.urls, [], timeout)
        except BenchProcessError as exc:
            raise ConfigError("--worker-urls", f"a worker refuses /flush_cache: {exc}") from None

    def kv_tokens(self) -> int | None:
        return None

    def close(self) -> None:
        self._http.close()


Workers = SimWorkers | SGLangWorkers | GivenWorkers


def start_redis(procs: Processes) -> str:
    """A private redis-server on a free port (no persistence); returns its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise BenchProcessError("redis-server is not on the PATH: install it or pass --redis URL")
    import redis

    port = free_port()
    data = os.path.join(procs.dir, "redis")
    os.makedirs(data, exist_ok=True)
    proc = procs.start("redis-server", [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                        "--appendonly", "no", "--dir", data])
    client = redis.Redis(port=port, socket_timeout=0.5)
    try:
        wait_until(lambda: bool(client.ping()), [proc], "redis-server", timeout=15.0)
    finally:
        client.close()
    return f"redis://127.0.0.1:{port}/0"


def start_delayed(procs: Processes, redis_url: str, delay_ms: float) -> str:
    """A relay in front of ``redis_url`` holding every chunk ``delay_ms`` each way (a store on
    another host, see :mod:`agent_cache.bench.delay_relay`); returns the URL to use instead."""
    from urllib.parse import urlsplit

    import redis

    parts = urlsplit(redis_url)
    port = free_port()
    proc = procs.start("redis-delay", [sys.executable, "-m", "agent_cache.bench.delay_relay", "--port", str(port),
                                       "--to", f"{parts.hostname or '127.0.0.1'}:{parts.port or 6379}",
                                       "--delay-ms", repr(float(delay_ms))])
    auth = parts.netloc.rpartition("@")[0]
    url = parts._replace(netloc=(auth + "@" if auth else "") + f"127.0.0.1:{port}").geturl()
    client = redis.Redis.from_url(url, socket_timeout=2.0)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.exceptions.ConnectionError:
            return False  # not listening yet

    try:
        wait_until(answers, [proc], "redis delay relay", timeout=15.0)
    finally:
        client.close()
    return url


def smg_version(binary: str) -> str:
    """``smg --version`` (e.g. ``smg 1.13.0`` -> ``1.13.0``)."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise BenchProcessError(f"cannot run {binary} --version: {exc}") from exc
    return out.split()[-1] if out else "unknown"


def smg_argv(binary: str, policy: str, worker_urls: Sequence[str], port: int, metrics_port: int,
             tuning: Sequence[str] = (), mesh: Sequence[str] = ()) -> list[str]:
    """``smg launch`` command line for one policy; everything not in ``tuning`` is smg's default."""
    return [binary, "launch", "--worker-urls", *worker_urls, *smg_flags(policy, tuning), "--host", "127.0.0.1",
            "--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
            "--log-level", "warn", *mesh]


def mesh_argv(index: int, mesh_ports: Sequence[int]) -> list[str]:
    """smg's HA mesh flags for gateway ``index`` of a group: its own listener, every other one as a peer.

    The mesh gossips the worker registry and the cache-aware radix trees
    between gateways (smg docs: configuration/high-availability).
    """
    peers = [f"127.0.0.1:{p}" for i, p in enumerate(mesh_ports) if i != index]
    argv = ["--enable-mesh", "--mesh-server-name", f"gateway-{index}", "--mesh-host", "127.0.0.1",
            "--mesh-port", str(mesh_ports[index])]
    return argv + (["--mesh-peer-urls", *peers] if peers else [])


class SmgGateways:
    """``count`` smg gateways with one policy in front of the workers, joined in smg's mesh when
    there are several (what a gateway Deployment behind a Kubernetes Service runs); ready when
    every worker is healthy in every gateway."""

    def __init__(self, procs: Processes, binary: str, policy: str, worker_urls: Sequence[str],
                 tuning: Sequence[str] = (), count: int = 1) -> None:
        self._procs = procs
        ports = [free_port() for _ in range(count)]
        mesh_ports = [free_port() for _ in range(count)] if count > 1 else []
        metrics_ports = [free_port() for _ in range(count)]
        self.urls = [f"http://127.0.0.1:{port}" for port in ports]
        self.metrics_urls = [f"http://127.0.0.1:{port}/metrics" for port in metrics_ports]
        self.procs: list[Proc] = []
        want = sorted(u.rstrip("/") for u in worker_urls)
        try:
            for i, port in enumerate(ports):
                mesh = mesh_argv(i, mesh_ports) if mesh_ports else []
                self.procs.append(procs.start(f"smg-{policy}-{i}", smg_argv(binary, policy, worker_urls, port,
                                                                         metrics_ports[i], tuning, mesh)))
            for url, proc in zip(self.urls, self.procs):

                def ready(url: str = url) -> bool:
                    workers = httpx.get(url + "/workers", timeout=2.0).json()["workers"]
                    return (sorted(w["url"].rstrip("/") for w in workers) == want
                            and all(w["is_healthy"] for w in workers))

                wait_until(ready, [proc], f"smg --policy {policy} ({proc.name})", timeout=60.0)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        # smg drains for about 5 s on SIGTERM; nothing is in flight here, so it gets 1 s
        for proc in self.procs:
            self._procs.stop(proc, grace=1.0)
