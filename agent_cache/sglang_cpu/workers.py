"""Real SGLang workers on this CPU: N servers of a set-up release on free loopback ports, started and stopped.

Each one is ``python -m sglang.launch_server`` in the release's own environment, on the tiny model, with
the stub ``libcuda`` on ``LD_LIBRARY_PATH`` (SGLang's CPU path imports the CUDA kernel wheel) and the
flags SGLang needs on a CPU (``--device cpu --attention-backend torch_native --disable-cuda-graph``), plus
``--sleep-on-idle`` (otherwise an idle scheduler spins a whole core), ``--enable-cache-report`` and
``--enable-metrics``. KV events, when asked for, publish on an ``ipc://`` endpoint with a replay endpoint.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass, field

import httpx

from agent_cache.errors import ConfigError
from agent_cache.processes import Proc, Processes, free_port, wait_until
from agent_cache.sglang_cpu.install import Installed

STARTUP_TIMEOUT_S = 300.0  # healthy after 16-50 s alone; several starting at once share two cores
KV_TOPIC = "kv-events"
SERVED_MODEL = "tiny-llama"  # the name the servers answer to (--served-model-name)
MODEL_DESCRIPTION = "tiny Llama (2 layers, hidden 64, 4,096-token BPE vocabulary), random weights"
# On CPU SGLang profiles system memory for the KV pool: servers starting together see each other's weights,
# and a small fraction fails with "no memory for the KV cache". --max-total-tokens sets the pool anyway.
MEM_FRACTION_STATIC = 0.3


@dataclass
class RealWorker:
    """One running server: its URL, the process, and its KV event endpoints (None: events off)."""

    url: str
    port: int
    proc: Proc
    owner: Processes  # whose close() stops it, a restarted one included
    max_total_tokens: int
    page_size: int
    kv_endpoint: str | None = None
    kv_replay_endpoint: str | None = None
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


class RealWorkers:
    """Starts real SGLang servers of one set-up release; ``close()`` stops every one."""

    def __init__(self, installed: Installed, *, procs: Processes | None = None) -> None:
        self.installed = installed
        self.procs = procs or Processes()
        self._own_procs = procs is None
        self.workers: list[RealWorker] = []

    @property
    def urls(self) -> list[str]:
        return [w.url for w in self.workers]

    @property
    def max_context(self) -> int:
        """The model's longest context (its ``config.json``): SGLang refuses a ``--context-length`` past it."""
        config = json.loads((self.installed.model_dir / "config.json").read_text())
        return int(config["max_position_embeddings"])

    def start(self, n: int = 1, *, max_total_tokens: int = 8192, page_size: int = 1, context_length: int = 32768,
              kv_events: bool = False, extra_args: tuple[str, ...] = (), timeout: float = STARTUP_TIMEOUT_S,
              ) -> list[RealWorker]:
        """Start ``n`` servers at once and wait until every one answers ``/health``."""
        if n < 1:
            raise ConfigError("n", f"must be at least 1, got {n}")
        started = [self._launch(max_total_tokens, page_size, context_length, kv_events, extra_args)
                   for _ in range(n)]
        for w in started:
            self.wait_healthy(w, timeout)
        self.workers.extend(started)
        return started

    def _launch(self, max_total_tokens: int, page_size: int, context_length: int, kv_events: bool,
                extra_args: tuple[str, ...]) -> RealWorker:
        port = free_port()
        argv = [str(self.installed.python), "-m", "sglang.launch_server", "--model-path", str(self.installed.model_dir),
                "--host", "127.0.0.1", "--port", str(port), "--device", "cpu", "--attention-backend", "torch_native",
                "--disable-cuda-graph", "--enable-cache-report", "--enable-metrics", "--sleep-on-idle",
                "--mem-fraction-static", str(MEM_FRACTION_STATIC), "--max-total-tokens", str(max_total_tokens),
                "--page-size", str(page_size), "--context-length", str(context_length),
                "--served-model-name", SERVED_MODEL, "--log-level", "warning", *extra_args]
        endpoint = replay = None
        if kv_events:
            endpoint = f"ipc://{self.procs.dir}/kv-{port}.pub"
            replay = f"ipc://{self.procs.dir}/kv-{port}.replay"
            argv += ["--kv-events-config", json.dumps({"publisher": "zmq", "endpoint": endpoint,
                                                       "replay_endpoint": replay, "topic": KV_TOPIC})]
        env = self._env()
        proc = self.procs.start(f"sglang-{self.installed.version}-{port}", argv, env, group=True)
        return RealWorker(f"http://127.0.0.1:{port}", port, proc, self.procs, max_total_tokens, page_size, endpoint,
                          replay, argv, env)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
        stub = str(self.installed.stub_dir)
        env.update({"SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "LD_LIBRARY_PATH": stub + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else ""),
                    "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"), "TOKENIZERS_PARALLELISM": "false"})
        return env

    def wait_healthy(self, worker: RealWorker, timeout: float = STARTUP_TIMEOUT_S) -> None:
        def healthy() -> bool:
            return httpx.get(worker.url + "/health", timeout=10).status_code == 200

        wait_until(healthy, [worker.proc], f"SGLang {self.installed.version} at {worker.url}", timeout)

    def kill(self, worker: RealWorker) -> None:
        """Stop one server at once (SIGKILL to all its processes), as a crash would."""
        worker.proc.signal(signal.SIGKILL)
        worker.proc.popen.wait(30)

    def restart(self, worker: RealWorker, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Start a stopped server again on the same port and endpoints, and wait until it is healthy. It
        stays its first fleet's (that fleet's close() stops it), whichever fleet restarts it."""
        if worker.proc.alive():
            worker.owner.stop(worker.proc)
        worker.proc = worker.owner.start(worker.proc.name + "-again", worker.argv, worker.env, group=True)
        self.wait_healthy(worker, timeout)

    def close(self) -> None:
        if self._own_procs:
            self.procs.close()
        else:
            for w in self.workers:
                self.procs.stop(w.proc)
        self.workers.clear()

    def __enter__(self) -> "RealWorkers":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_idle(url: str, timeout: float = 30.0) -> None:
    """Until the worker has no request running or queued (its KV events of the last batch are out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = httpx.get(url + "/metrics", timeout=10).text
        busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(("sglang:num_running_reqs", "sglang:num_queue_reqs")))
        if busy == 0:
            return
        time.sleep(0.1)

