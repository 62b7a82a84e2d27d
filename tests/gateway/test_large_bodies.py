"""One tenant's large body (within --max-body-bytes) does not stall another tenant's calls: its
parsing, checks and templating run off the gateway's event loop."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet

CALL = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.slow
def test_a_large_body_stalls_no_other_call(procs, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("sk-a team-a\nsk-b team-b\n")
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}}
             for i in range(250_000)]
    big = json.dumps({**CALL, "tools": tools}).encode()  # 21 MB
    with SimFleet(2) as fleet:
        gw = AgentCacheGateways(procs, fleet.urls, args=["--api-keys", str(keys)]).urls[0]
        latencies: list[tuple[float, int]] = []
        done = threading.Event()

        def tenant_a() -> None:
            with httpx.Client(timeout=60, headers={"authorization": "Bearer sk-a"}) as c:
                while not done.is_set():
                    started = time.monotonic()
                    status = c.post(gw + "/v1/chat/completions", json=CALL).status_code
                    latencies.append((time.monotonic() - started, status))
                    time.sleep(0.05)

        a = threading.Thread(target=tenant_a)
        a.start()
        time.sleep(1)
        started = time.monotonic()
        r = httpx.post(gw + "/v1/chat/completions", content=big, timeout=120,
                       headers={"authorization": "Bearer sk-b", "content-type": "application/json"})
        b_took = time.monotonic() - started
        done.set()
        a.join(60)
    assert r.status_code < 500, r.text[:300]
    assert latencies and all(status == 200 for _, status in latencies), latencies
    slowest = max(t for t, _ in latencies)
    # before, A's calls waited out the whole preparation (7.3 s of B's 14.7 s); now a small share
    assert slowest < 0.25 * b_took, (slowest, b_took)
