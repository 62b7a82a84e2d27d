"""Workers added while the gateway serves take new sessions only once they answered a probe: pods still
loading their model refuse connections, and a new worker looks idle, so it would otherwise draw the
next sessions first and fail them."""

from __future__ import annotations

import time
from typing import Any, Iterator

import httpx
import pytest

from agent_cache.processes import Processes, free_port
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import SimFleet, WorkerOptions
from agent_cache.sim.fleet import SimWorkerThread


@pytest.fixture
def healthy() -> Iterator[SimFleet]:
    with SimFleet(3, time_scale=0.0) as fleet:
        yield fleet


def _call(client: httpx.Client, session: str) -> httpx.Response:
    return client.post("/v1/chat/completions", headers={"x-session-id": session}, json={
        "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"hello {session}"}]})


def _listed(gateway: str) -> dict[str, dict[str, Any]]:
    r = httpx.get(gateway + "/workers", timeout=10)
    assert r.status_code == 200, r.text
    return {w["url"]: w for w in r.json()["workers"]}


@pytest.mark.slow
def test_refused_workers_added_beside_healthy_ones_fail_no_new_session(procs: Processes, healthy: SimFleet) -> None:
    gw = AgentCacheGateways(procs, healthy.urls, args=["--admin-loopback"]).urls[0]
    loading = [f"http://127.0.0.1:{free_port()}" for _ in range(30)]  # nothing listens: a model still loading
    with httpx.Client(base_url=gw, timeout=60) as client:
        for url in loading:
            assert client.post("/workers", json={"url": url}).status_code == 202
        answers = [_call(client, f"new-{i}") for i in range(60)]
    assert [r.status_code for r in answers] == [200] * 60
    assert {r.headers["x-agent-cache-worker"] for r in answers} <= set(healthy.urls)
    failovers = [line for line in httpx.get(gw + "/metrics").text.splitlines()
                 if line.startswith("agent_cache_failovers_total{")]
    assert failovers == []  # no call was even tried on a loading worker


@pytest.mark.slow
def test_a_new_worker_takes_sessions_once_it_answers(procs: Processes, healthy: SimFleet) -> None:
    gw = AgentCacheGateways(procs, healthy.urls[:1], args=["--admin-loopback"]).urls[0]
    port = free_port()
    late = f"http://127.0.0.1:{port}"
    with httpx.Client(base_url=gw, timeout=60) as client:
        assert client.post("/workers", json={"url": late}).status_code == 202
        assert _listed(gw)[late]["is_healthy"] is False  # not yet proven: out of placement
        assert all(_call(client, f"before-{i}").headers["x-agent-cache-worker"] == healthy.urls[0]
                   for i in range(10))
        worker = SimWorkerThread(WorkerOptions(time_scale=0.0), port=port)  # the model is loaded
        worker.start()
        try:
            deadline = time.monotonic() + 15  # the next probe round (5 s) at the latest
            while not _listed(gw)[late]["is_healthy"]:
                assert time.monotonic() < deadline, "the worker never became eligible"
                time.sleep(0.2)
            served = {_call(client, f"after-{i}").headers["x-agent-cache-worker"] for i in range(20)}
            assert late in served  # new sessions now spread onto it
        finally:
            worker.stop()
