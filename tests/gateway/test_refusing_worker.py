"""A worker that refuses every call it should serve (its SGLang ``--api-key`` differs from the fleet's:
401 on ``/v1``, ``/health`` open; or a wrong path: 404) is taken out of rotation within a few calls, costs
the callers nothing meanwhile, and comes back once it serves again. A request every worker refuses is the
request's fault: answered as it is, no worker blamed."""

from __future__ import annotations

import re
import time
import uuid
from typing import Iterator

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.sim import WorkerOptions
from agent_cache.sim.fleet import SimWorkerThread
from tests.gateway.intercepted_worker import InterceptedWorker, refusal


@pytest.fixture
def fleet() -> Iterator[tuple[list[SimWorkerThread], InterceptedWorker]]:
    good = [SimWorkerThread(WorkerOptions(time_scale=0.0)) for _ in range(2)]
    bad = InterceptedWorker(refusal(401))
    for w in good:
        w.start()
    bad.server.start()
    try:
        yield good, bad
    finally:
        for w in good:
            w.stop()
        bad.server.stop()


def _call(client: httpx.Client, session: str) -> httpx.Response:
    return client.post("/v1/chat/completions", headers={"x-session-id": session}, json={
        "model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"hello {session}"}]})


def _healthy(gateway: str, worker: str) -> float | None:
    text = httpx.get(gateway + "/metrics").text
    found = re.search(rf'^agent_cache_worker_healthy{{worker="{re.escape(worker)}"}} (\S+)$', text, re.M)
    return None if found is None else float(found.group(1))


@pytest.mark.parametrize("status", [401, 403, 404, 405])
@pytest.mark.slow
def test_a_refusing_worker_is_taken_out_and_no_call_fails(fleet, status: int) -> None:
    good, bad = fleet
    bad.intercept = refusal(status)
    urls = [bad.url, *(w.url for w in good)]
    with Processes() as procs:
        gw = AgentCacheGateways(procs, urls, args=["--prefix", f"t-{uuid.uuid4().hex[:8]}"]).urls[0]
        with httpx.Client(base_url=gw, timeout=30) as client:
            answers = [_call(client, f"s{i}") for i in range(40)]
            assert [r.status_code for r in answers] == [200] * 40  # a second opinion served each refused one
            assert bad.intercepted <= 3  # out of rotation within a few calls
            assert _healthy(gw, bad.url) == 0.0
            assert all(r.headers["x-agent-cache-worker"] != bad.url for r in answers)


@pytest.mark.slow
def test_the_refusing_worker_comes_back_once_it_serves(fleet) -> None:
    good, bad = fleet
    urls = [bad.url, *(w.url for w in good)]
    with Processes() as procs:
        gw = AgentCacheGateways(procs, urls, args=["--prefix", f"t-{uuid.uuid4().hex[:8]}"]).urls[0]
        with httpx.Client(base_url=gw, timeout=30) as client:
            for i in range(10):
                assert _call(client, f"a{i}").status_code == 200
            assert _healthy(gw, bad.url) == 0.0
            bad.intercept = None  # its key fixed
            deadline = time.monotonic() + 20  # the first cool-down is 2 s: its half-open trial decides
            served_by_it = 0
            while time.monotonic() < deadline and not served_by_it:
                r = _call(client, f"b{uuid.uuid4().hex[:6]}")
                assert r.status_code == 200
                served_by_it += r.headers["x-agent-cache-worker"] == bad.url
                time.sleep(0.2)
            assert served_by_it and _healthy(gw, bad.url) == 1.0


@pytest.mark.slow
def test_a_request_every_worker_refuses_is_answered_as_it_is_and_blames_none(fleet) -> None:
    good, bad = fleet
    bad.intercept = refusal(404)
    other = InterceptedWorker(refusal(404))
    other.server.start()
    try:
        with Processes() as procs:
            gw = AgentCacheGateways(procs, [bad.url, other.url],
                                    args=["--prefix", f"t-{uuid.uuid4().hex[:8]}"]).urls[0]
            with httpx.Client(base_url=gw, timeout=30) as client:
                r = _call(client, "all-refuse")
                assert r.status_code == 404
                assert _healthy(gw, bad.url) == _healthy(gw, other.url) == 1.0
    finally:
        other.server.stop()
