"""``/health`` (liveness) and ``/ready`` (readiness) of a real ``agent-cache serve`` process, in front of
simulated workers that are stopped and restarted, and of a private Redis that dies and refuses."""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any, Callable

import httpx
import pytest
import redis

from agent_cache.processes import Processes, wait_until
from agent_cache.sim import SimFleet
from tests.conftest import free_port

PROBE_WAIT = 20.0  # the gateway probes its workers every 5 s; a state change shows within one or two rounds


def _serve(procs: Processes, *args: str) -> str:
    port = free_port()
    proc = procs.start("serve", [sys.executable, "-m", "agent_cache.cli", "serve", "--port", str(port), *args])
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(url + "/health", timeout=2.0).status_code == 200, [proc], "agent-cache serve",
               timeout=60.0)
    return url


def _until(url: str, check: Callable[[httpx.Response], bool], what: str, timeout: float = PROBE_WAIT) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(url + "/ready", timeout=5.0)
        if check(r):
            return r
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: /ready still answers {r.status_code} {r.text}")
        time.sleep(0.2)


def _no_urls(*bodies: Any) -> None:
    for body in bodies:
        assert "http://" not in str(body) and "127.0.0.1" not in str(body), body


@pytest.mark.slow
def test_ready_while_any_pool_has_a_healthy_worker_and_health_stays_live():
    with SimFleet(3) as fleet, Processes() as procs:
        a, b1, b2 = fleet.urls
        url = _serve(procs, "--pool", f"a={a}", "--pool", f"b={b1},{b2}")
        ready = _until(url, lambda r: r.status_code == 200, "all workers up")
        assert ready.json() == {"status": "ready", "store": "ok"}

        fleet.stop_worker(1)  # pool b keeps one worker
        time.sleep(6)  # a probe round has seen it
        r = httpx.get(url + "/ready")
        assert r.status_code == 200, r.text

        fleet.stop_worker(2)  # pool b has none left: its calls get 503, pool a's are served, still ready
        r = _until(url, lambda r: r.json().get("pools_down") == ["b"], "pool b down")
        assert r.status_code == 200 and r.json()["status"] == "ready", r.text

        fleet.stop_worker(0)  # no pool has a healthy worker: out of the Service
        r = _until(url, lambda r: r.status_code == 503, "every pool down")
        assert r.json()["status"] == "not_ready"
        assert r.json()["reason"] == "no healthy worker in any pool ('a', 'b')"
        health = httpx.get(url + "/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"  # liveness: the process serves
        _no_urls(r.text, health.text)

        fleet.start_worker(0)
        fleet.start_worker(2)
        r = _until(url, lambda r: r.json() == {"status": "ready", "store": "ok"}, "pools a and b back")


@pytest.mark.slow
def test_ready_with_every_worker_down_and_without_pools(fleet):
    with Processes() as procs:
        url = _serve(procs, "--workers", ",".join(fleet.urls))
        _until(url, lambda r: r.status_code == 200, "workers up")
        fleet.stop()
        r = _until(url, lambda r: r.status_code == 503, "every worker down")
        assert r.json()["reason"] == "no healthy worker in any pool ('default')"
        assert httpx.get(url + "/health").status_code == 200
        _no_urls(r.text)


@pytest.mark.redis
@pytest.mark.slow
def test_ready_through_a_redis_outage_and_not_when_redis_refuses(redis_server_factory, procs):
    server = redis_server_factory(password="first-secret")
    with SimFleet(1) as fleet:
        url = _serve(procs, "--workers", fleet.urls[0], "--redis", server.url, "--prefix", f"t-{uuid.uuid4().hex[:8]}")
        assert _until(url, lambda r: r.status_code == 200, "up").json() == {"status": "ready", "store": "ok"}

        server.stop()  # unreachable: the gateway routes by hashing, so it stays ready
        r = _until(url, lambda r: r.json().get("store") == "degraded", "redis down")
        assert r.status_code == 200 and r.json()["status"] == "ready"
        call = httpx.post(url + "/v1/chat/completions", json={"model": "m", "max_tokens": 4,
                                                              "messages": [{"role": "user", "content": "hi"}]})
        assert call.status_code == 200  # what "ready" promises: calls are served, in degraded mode

        server.start()
        _until(url, lambda r: r.json().get("store") == "ok", "redis back")

        admin = redis.Redis(port=server.port, password="first-secret")
        admin.config_set("requirepass", "rotated-secret")  # the gateway still holds the old password
        admin.execute_command("CLIENT", "KILL", "TYPE", "normal")  # its connections must authenticate again
        admin.close()
        r = _until(url, lambda r: r.status_code == 503, "redis refusing")
        assert r.json() == {"status": "not_ready", "store": "refused",
                            "reason": "the metadata store refuses the gateway (see its log)"}
        assert "secret" not in r.text and httpx.get(url + "/health").status_code == 200
