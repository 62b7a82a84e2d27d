"""The real smg gateway accepts simulated workers and routes chat completions to them."""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest

from agent_cache.backends import SGLangClient
from agent_cache.sim import SimFleet

pytestmark = pytest.mark.smg

SMG = shutil.which("smg")


@pytest.mark.skipif(SMG is None, reason="the smg binary is not installed (pip install smg)")
@pytest.mark.slow
def test_smg_registers_and_routes_to_two_simulated_workers(free_port_factory, tmp_path) -> None:
    with SimFleet(2) as fleet:
        port, metrics_port = free_port_factory(), free_port_factory()
        log = open(tmp_path / "smg.log", "w")
        proc = subprocess.Popen(
            [SMG, "launch", "--worker-urls", *fleet.urls, "--policy", "cache_aware", "--host", "127.0.0.1",
             "--port", str(port), "--prometheus-port", str(metrics_port), "--prometheus-host", "127.0.0.1",
             "--log-level", "warn"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        gateway = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            workers: list = []
            while time.monotonic() < deadline:
                try:
                    workers = httpx.get(f"{gateway}/workers", timeout=1).json()["workers"]
                    if len(workers) == 2 and all(w["is_healthy"] for w in workers):
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                time.sleep(0.2)
            assert sorted(w["url"] for w in workers) == sorted(fleet.urls), (tmp_path / "smg.log").read_text()[-2000:]
            assert all(w["is_healthy"] and w["runtime_type"] == "sglang" for w in workers)
            assert {w["model_id"] for w in workers} == {"sim-llama-3.1-8b"}

            client = SGLangClient(gateway)
            for i in range(12):
                result = client.chat([{"role": "user", "content": f"question {i} " * (10 * i + 1)}], max_tokens=4, model="sim-llama-3.1-8b")
                assert result.usage and result.usage.completion_tokens == 4
            chunks = list(client.stream_chat([{"role": "user", "content": "streamed through the gateway"}], max_tokens=5, model="sim-llama-3.1-8b"))
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
            served = [fleet.engine(i).model.counters.requests for i in range(2)]
            assert sum(served) == 13
            assert min(served) > 0, f"smg sent everything to one worker: {served}"
        finally:
            proc.terminate()
            proc.wait(10)
            log.close()
