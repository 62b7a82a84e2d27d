"""In-flight counts are leases: killed clients' counts come back, live routers keep theirs.

Real Redis, real client processes killed with SIGKILL mid-call, and a slow
simulated worker (time scale 50), so calls are still running when killed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Iterator

import pytest
import redis

from agent_cache.routing import RouteRequest, Router
from agent_cache.sim import SimFleet

LEASE = 2.0

_CLIENT = r"""
import sys
from langchain_core.messages import HumanMessage
from agent_cache import ChatSGLang
from agent_cache.routing import Router
worker, redis_url, prefix, lease, sid = sys.argv[1:6]
router = Router([worker], redis_url=redis_url, prefix=prefix, probe_interval=None, lease=float(lease))
model = ChatSGLang(model="sim", workers=[worker], router=router, max_tokens=2000, timeout=600)
print("calling", flush=True)
model.invoke([HumanMessage("a long answer, please")], session_id=sid)
"""


@pytest.fixture(scope="module")
def slow_worker() -> Iterator[str]:
    with SimFleet(1, time_scale=50.0) as fleet:
        yield fleet.urls[0]


def _stats_inflight(url: str, prefix: str, worker: str) -> int:
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "stats", "--redis", url, "--prefix", prefix,
                          "--json"], capture_output=True, text=True, timeout=60, check=True).stdout
    return json.loads(out)["workers"].get(worker, {}).get("inflight", 0)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.slow
def test_counts_of_clients_killed_mid_call_are_reclaimed_after_the_lease(slow_worker, redis_server, prefix) -> None:
    procs = [subprocess.Popen([sys.executable, "-c", _CLIENT, slow_worker, redis_server.url, prefix, str(LEASE),
                               f"killed-{i}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(8)]
    raw = redis.Redis.from_url(redis_server.url)
    try:
        _wait_for(lambda: int(raw.hget(f"{{{prefix}}}:inflight", slow_worker) or 0) == 8, 60,
                  "8 calls never got in flight")
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.wait(10)
        killed_at = time.monotonic()
        assert int(raw.hget(f"{{{prefix}}}:inflight", slow_worker)) == 8  # nobody released them
        # within the lease (plus this machine's slack), `agent-cache stats` shows them gone
        _wait_for(lambda: _stats_inflight(redis_server.url, prefix, slow_worker) == 0, LEASE + 10,
                  "killed clients' counts never came back")
        assert time.monotonic() - killed_at < LEASE + 10
        # and the next decision by any router takes them out of the store for good
        with Router([slow_worker], redis_url=redis_server.url, prefix=prefix, probe_interval=None) as router:
            p = router.route(RouteRequest("after"))
            router.done(p)
        assert int(raw.hget(f"{{{prefix}}}:inflight", slow_worker)) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        raw.close()


def test_a_live_router_keeps_its_counts_past_the_lease_and_renewal_corrects_a_lost_reply(
        slow_worker, redis_server, prefix) -> None:
    raw = redis.Redis.from_url(redis_server.url)
    lease = 0.6
    router = Router([slow_worker], redis_url=redis_server.url, prefix=prefix, probe_interval=None, lease=lease)
    other = Router([slow_worker], redis_url=redis_server.url, prefix=prefix, probe_interval=None)
    try:
        p = router.route(RouteRequest("long-call"))  # in flight for longer than its lease
        routed_at = time.time()
        source = router.outbox.pending.current_source()
        # a route whose reply was lost: counted in the store, never known to the router
        raw.hincrby(f"{{{prefix}}}:inflight", slow_worker, 1)
        raw.hincrby(f"{{{prefix}}}:lease:{source}", slow_worker, 1)

        def renewed_past_two_leases() -> bool:
            # only the background renewals keep the call counted this long; one of them has set the
            # lease's count to what the router has in flight (1, not the lost reply's 2), and the
            # lease's end (ms) is well ahead, so the next decision cannot find it expired
            end = raw.zscore(f"{{{prefix}}}:leases", source)
            return (time.time() > routed_at + 2 * lease and end is not None and end / 1000 > time.time() + lease / 2
                    and int(raw.hget(f"{{{prefix}}}:lease:{source}", slow_worker) or 0) == 1)

        _wait_for(renewed_past_two_leases, 30, "the background renewals never renewed the lease")
        q = other.route(RouteRequest("other"))  # reclaims expired leases first
        other.done(q)
        other.close()  # writes its release
        # the renewal set the count to what the router has in flight: 1, not the lost reply's 2
        assert int(raw.hget(f"{{{prefix}}}:inflight", slow_worker)) == 1
        router.done(p)
        router.close()  # its last renewal ends its lease
        assert int(raw.hget(f"{{{prefix}}}:inflight", slow_worker)) == 0
        assert raw.zscore(f"{{{prefix}}}:leases", source) is None
    finally:
        router.close()
        other.close()
        raw.close()


@pytest.mark.slow
def test_a_killed_gateways_counts_stop_steering_within_seconds(slow_worker, redis_server, prefix) -> None:
    """`agent-cache serve` with its default lease (renewed every 2 s, 6 s expiry), killed mid-call."""
    import threading

    import httpx

    from agent_cache.processes import Processes
    from agent_cache.server_processes import AgentCacheGateways

    raw = redis.Redis.from_url(redis_server.url)
    with Processes() as procs:
        gw = AgentCacheGateways(procs, [slow_worker], redis_url=redis_server.url, args=["--prefix", prefix])
        body = {"model": "m", "messages": [{"role": "user", "content": "a long answer, please"}],
                "max_tokens": 2000}

        def call(i: int) -> None:
            try:
                httpx.post(gw.urls[0] + "/v1/chat/completions", json=body, headers={"x-session-id": f"g-{i}"},
                           timeout=60)
            except httpx.HTTPError:
                pass  # the gateway is killed under it

        threads = [threading.Thread(target=call, args=(i,), daemon=True) for i in range(4)]
        for t in threads:
            t.start()
        _wait_for(lambda: int(raw.hget(f"{{{prefix}}}:inflight", slow_worker) or 0) == 4, 60,
                  "4 calls never got in flight")
        time.sleep(3)  # renewed at least once
        gw.procs[0].popen.send_signal(signal.SIGKILL)
        gw.procs[0].popen.wait(10)
        killed_at = time.monotonic()
        _wait_for(lambda: _stats_inflight(redis_server.url, prefix, slow_worker) == 0, 15,
                  "a killed gateway's counts stood for more than 15 s")
        assert time.monotonic() - killed_at < 12
