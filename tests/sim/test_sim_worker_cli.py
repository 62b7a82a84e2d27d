"""`agent-cache sim-worker` serves SGLang's API with the flags it was given."""

from __future__ import annotations

import subprocess
import sys
import time

from agent_cache.backends import SGLangClient
from agent_cache.errors import BackendError


def test_sim_worker_command(free_port_factory) -> None:
    port = free_port_factory()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_cache.cli", "sim-worker", "--port", str(port), "--time-scale", "0",
         "--max-total-tokens", "5000", "--page-size", "4", "--radix-eviction-policy", "lfu",
         "--served-model-name", "tiny", "--no-enable-cache-report"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        client = SGLangClient(f"http://127.0.0.1:{port}", timeout=2)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.health()
                break
            except BackendError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.1)
        info = client.server_info()
        assert (info["max_total_num_tokens"], info["page_size"], info["radix_eviction_policy"]) == (5000, 4, "lfu")
        assert info["enable_cache_report"] is False
        assert client.models()["data"][0]["id"] == "tiny"
    finally:
        proc.terminate()
        proc.wait(10)


def test_sim_worker_rejects_bad_flags() -> None:
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "sim-worker", "--page-size", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--page-size" in out.stderr


def test_sim_worker_names_a_bad_kv_events_config_before_it_starts() -> None:
    from agent_cache.cli import build_parser

    parser = build_parser()
    ok = parser.parse_args(["sim-worker", "--kv-events-config", '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'])
    assert ok.kv_events_config == '{"publisher": "zmq", "endpoint": "tcp://*:5557"}'
    for bad, why in (('{"publisher": "kafka"}', "Unknown event publisher 'kafka'"), ('{"hwm": "x"}', "hwm:"),
                     ("{bad", "Invalid JSON")):
        out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "sim-worker", "--kv-events-config", bad],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and "--kv-events-config" in out.stderr and why in out.stderr, out.stderr
