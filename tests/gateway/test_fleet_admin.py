"""The fleet changed while the gateway serves: /workers admin endpoints, drains, DNS discovery, shared replicas.

Real processes: ``agent-cache serve`` replicas sharing the suite's private Redis, simulated workers on
loopback addresses, and a hosts-format file standing in for the DNS answer of a headless Service.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote

import httpx
import pytest

from agent_cache.processes import Processes, free_port, wait_until
from agent_cache.server_processes import AgentCacheGateways
from agent_cache.gateway.authz import worker_id
from agent_cache.sim import SimFleet
from agent_cache.sim.fleet import SimWorkerThread

ADMIN = {"authorization": "Bearer admin-key"}
USER = {"authorization": "Bearer user-key"}
REFRESH = "0.3"


@pytest.fixture
def keys_file(tmp_path: Path) -> str:
    path = tmp_path / "keys"
    path.write_text("admin-key ops role=admin\nuser-key team\n")
    return str(path)


def _replicas(procs: Processes, workers: list[str], redis_url: str, keys_file: str, *extra: str,
              count: int = 2) -> AgentCacheGateways:
    return AgentCacheGateways(procs, workers, redis_url=redis_url, count=count,
                              args=["--prefix", f"fleet-{uuid.uuid4().hex[:8]}", "--api-keys", keys_file,
                                    "--fleet-refresh", REFRESH, *extra])


def _chat(gateway: str, session: str, messages: list[dict[str, Any]], headers: dict[str, str]) -> httpx.Response:
    return httpx.post(gateway + "/v1/chat/completions", timeout=30.0,
                      headers={**headers, "x-session-id": session},
                      json={"model": "m", "messages": messages, "max_tokens": 8})


def _listed(gateway: str, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    r = httpx.get(gateway + "/workers", headers=headers or ADMIN, timeout=5.0)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == len(body["workers"])
    return {w["url"]: w for w in body["workers"]}


def _eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def test_the_admin_endpoints_need_an_admin_key(procs, redis_url, keys_file):
    with SimFleet(1) as fleet:
        gw = _replicas(procs, fleet.urls, redis_url, keys_file, count=1).urls[0]
        assert httpx.get(gw + "/workers").status_code == 401
        r = httpx.get(gw + "/workers", headers=USER)
        assert r.status_code == 403 and r.json()["code"] == "FORBIDDEN"
        assert httpx.post(gw + "/workers", headers=USER, json={"url": "http://127.0.0.1:1"}).status_code == 403
        assert list(_listed(gw)) == fleet.urls
        r = httpx.post(gw + "/workers", headers=ADMIN, json={"url": "not a url"})
        assert r.status_code == 400 and set(r.json()) == {"error", "code"}
        assert httpx.delete(gw + "/workers/" + quote("http://127.0.0.1:9", safe=""), headers=ADMIN).status_code == 404


@pytest.mark.slow
def test_without_keys_the_admin_endpoints_answer_only_loopback_callers_when_allowed(procs):
    with SimFleet(1) as fleet:
        closed = AgentCacheGateways(procs, fleet.urls).urls[0]
        r = httpx.get(closed + "/workers")
        assert r.status_code == 403 and r.json()["code"] == "ADMIN_DISABLED"
        opened = AgentCacheGateways(procs, fleet.urls, args=["--admin-loopback"]).urls[0]
        assert list(_listed(opened, {})) == fleet.urls


@pytest.mark.slow
def test_a_worker_added_on_one_replica_gets_new_sessions_from_the_other(procs, redis_url, keys_file):
    with SimFleet(3) as fleet:
        first, second = _replicas(procs, fleet.urls[:2], redis_url, keys_file).urls
        new = fleet.urls[2]
        r = httpx.post(first + "/workers", headers=ADMIN, json={"url": new, "pool": "default"})
        assert r.status_code == 202, r.text
        body = r.json()
        assert body["status"] == "accepted" and body["worker_id"] == body["url"] == new
        assert r.headers["location"] == body["location"] == "/workers/" + quote(new, safe="")
        assert _listed(first)[new]["state"] == "up"  # applied on the replica that took the call at once
        t0 = time.monotonic()
        _eventually(lambda: new in _listed(second), "the second replica sees the new worker")
        seen_after = time.monotonic() - t0
        assert seen_after < 3.0, seen_after  # a refresh is 0.3 s: the rest is polling on a busy machine
        info = httpx.get(second + "/workers/" + quote(new, safe=""), headers=ADMIN).json()
        assert info["source"] == "admin" and info["is_healthy"] is True and info["pool"] == "default"
        placed = [_chat(second, f"new-{i}", [{"role": "user", "content": f"task {i}"}], USER) for i in range(12)]
        assert all(p.status_code == 200 for p in placed), [p.text for p in placed if p.status_code != 200]
        workers = [p.headers["x-agent-cache-worker"] for p in placed]  # worker ids: a user key sees no URLs
        assert workers.count(worker_id(new)) >= 2, workers  # the empty worker takes its share of new sessions


@pytest.mark.slow
def test_delete_drains_a_worker_without_failing_a_step_of_running_sessions(procs, redis_url, keys_file):
    with SimFleet(3) as fleet:
        replicas = _replicas(procs, fleet.urls, redis_url, keys_file, "--worker-drain-timeout", "20").urls
        steps: list[tuple[float, str, int]] = []  # (time, worker, status)
        first_step = threading.Barrier(7)
        lock = threading.Lock()

        def agent(i: int) -> None:
            session = f"run-{i}-{uuid.uuid4().hex[:6]}"
            messages: list[dict[str, Any]] = [{"role": "system", "content": "You are agent number seven. " * 40},
                                              {"role": "user", "content": f"task {i}"}]
            for step in range(8):
                r = _chat(replicas[step % 2], session, messages, USER)  # the steps alternate between replicas
                with lock:
                    steps.append((time.monotonic(), r.headers.get("x-agent-cache-worker", ""), r.status_code))
                if step == 0:
                    first_step.wait(timeout=30)
                messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                             {"role": "user", "content": f"step {step}"}]
                time.sleep(0.15)

        threads = [threading.Thread(target=agent, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        first_step.wait(timeout=30)
        with lock:
            counts = {u: sum(1 for _, w, _ in steps if w == u) for u in fleet.urls}
        victim = max(counts, key=lambda u: counts[u])  # the worker holding the most sessions
        r = httpx.delete(replicas[0] + "/workers/" + quote(victim, safe=""), headers=ADMIN)
        assert r.status_code == 202 and r.json()["worker_id"] == victim
        deleted = time.monotonic()
        assert _listed(replicas[0])[victim]["state"] == "draining"
        for t in threads:
            t.join(timeout=60)
        assert [s for s in steps if s[2] != 200] == []  # 0 failed steps
        assert len(steps) == 6 * 8
        late = [w for at, w, _ in steps if at > deleted + 1.0]  # both replicas refreshed (0.3 s) long before
        assert late and victim not in late, late
        for gw in replicas:  # nothing in flight there any more: dropped well before the 20 s timeout
            _eventually(lambda gw=gw: victim not in _listed(gw), "the drained worker is removed", timeout=8.0)


def _port_on(*hosts: str) -> int:
    """A port free on each of these loopback addresses (a headless Service's pods share one port)."""
    for _ in range(50):
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as s:
                    s.bind((host, port))
        except OSError:
            continue
        return port
    raise RuntimeError("no common free port")


def _dns_gateways(procs: Processes, answer: Path, target: str, *extra: str, count: int = 1) -> list[str]:
    """Gateways whose only workers are those the hosts file ``answer`` gives for ``target``."""
    urls = []
    for i in range(count):
        port = free_port()
        urls.append(f"http://127.0.0.1:{port}")
        argv = [sys.executable, "-m", "agent_cache.cli", "serve", "--port", str(port), "--admin-loopback",
                "--workers-dns", target, "--workers-dns-hosts", str(answer), "--workers-dns-interval", REFRESH,
                "--fleet-refresh", REFRESH, *extra]
        proc = procs.start(f"dns-gateway-{i}", argv)
        wait_until(lambda: httpx.get(urls[-1] + "/health").status_code == 200, [proc], "gateway", timeout=60)
    return urls


LOOPBACK_ALIASES = pytest.mark.skipif(sys.platform != "linux",
                                      reason="binds 127.0.0.2 and 127.0.0.3 (all of 127/8 is loopback on Linux)")
HOSTS = ("127.0.0.2", "127.0.0.3")


@pytest.fixture
def pods() -> Iterator[int]:
    """Two simulated workers, one on each of ``HOSTS``, on the port this yields: a headless Service's pods."""
    port = _port_on(*HOSTS)
    sims = [SimWorkerThread(host=h, port=port) for h in HOSTS]
    for s in sims:
        s.start()
    try:
        yield port
    finally:
        for s in sims:
            s.stop()


@LOOPBACK_ALIASES
@pytest.mark.slow
def test_dns_discovery_adds_new_addresses_and_drains_removed_ones(procs, tmp_path, pods):
    hosts, port = HOSTS, pods
    answer = tmp_path / "hosts"
    answer.write_text(f"{hosts[0]} sglang.inference.svc.cluster.local\n")
    (gw,) = _dns_gateways(procs, answer, f"sglang.inference.svc.cluster.local:{port}")
    a, b = (f"http://{h}:{port}" for h in hosts)
    assert _listed(gw, {}) == {a: {"id": a, "url": a, "worker_type": "regular", "connection_mode": "http",
                                  "is_healthy": True, "load": 0, "pool": "default", "state": "up",
                                  "source": "dns"}}
    r = _chat(gw, "dns-1", [{"role": "user", "content": "hello"}], {})
    assert r.status_code == 200 and r.headers["x-agent-cache-worker"] == a

    answer.write_text(f"{hosts[0]} sglang.inference.svc.cluster.local\n{hosts[1]} sglang.inference.svc.cluster.local\n")
    _eventually(lambda: set(_listed(gw, {})) == {a, b}, "the new address joins")

    answer.write_text(f"{hosts[1]} sglang.inference.svc.cluster.local\n")  # the first pod went away
    _eventually(lambda: _listed(gw, {}).get(a, {}).get("state") != "up", "the removed address drains")
    r = _chat(gw, "dns-1", [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"},
                            {"role": "user", "content": "again"}], {})
    assert r.status_code == 200 and r.headers["x-agent-cache-worker"] == b  # the pinned session moved
    _eventually(lambda: set(_listed(gw, {})) == {b}, "the drained address is removed")

    answer.write_text("")  # the name no longer resolves: nothing changes
    time.sleep(1.0)
    assert set(_listed(gw, {})) == {b}


@pytest.mark.slow
def test_a_drained_worker_stays_until_its_call_in_flight_ends(procs):
    with SimFleet(2, time_scale=60.0) as fleet:  # a call of 8 tokens takes about 3.5 s
        gw = AgentCacheGateways(procs, fleet.urls, args=["--admin-loopback", "--fleet-refresh", REFRESH]).urls[0]
        result: list[httpx.Response] = []
        call = threading.Thread(target=lambda: result.append(
            _chat(gw, "slow", [{"role": "user", "content": "a long answer"}], {})))
        call.start()
        busy: list[str] = []

        def in_flight() -> bool:
            busy[:] = [url for url, w in _listed(gw, {}).items() if w["load"] == 1]
            return len(busy) == 1

        _eventually(in_flight, "the call is in flight")
        assert httpx.delete(gw + "/workers/" + quote(busy[0], safe="")).status_code == 202
        time.sleep(1.2)  # four refreshes: past the settle time, the call still running
        assert call.is_alive()
        assert _listed(gw, {})[busy[0]]["state"] == "draining"
        call.join(timeout=30)
        assert result[0].status_code == 200 and result[0].headers["x-agent-cache-worker"] == busy[0]
        _eventually(lambda: busy[0] not in _listed(gw, {}), "removed once its call ended", timeout=5.0)


@pytest.mark.slow
def test_with_redis_away_each_replica_keeps_its_workers_and_calls_go_on(procs, redis_server_factory, keys_file):
    server = redis_server_factory()
    with SimFleet(3) as fleet:
        first, second = _replicas(procs, fleet.urls[:2], server.url, keys_file).urls
        assert httpx.post(first + "/workers", headers=ADMIN, json={"url": fleet.urls[2]}).status_code == 202
        _eventually(lambda: fleet.urls[2] in _listed(second), "the second replica sees the new worker")
        server.stop()
        time.sleep(1.0)  # refreshes that find the board away
        for gw in (first, second):
            listed = _listed(gw)
            assert set(listed) == set(fleet.urls) and {w["load"] for w in listed.values()} == {-1}
            r = _chat(gw, f"away-{gw[-5:]}", [{"role": "user", "content": "hello"}], USER)
            assert r.status_code == 200  # routed by hashing over the same three workers
        r = httpx.post(first + "/workers", headers=ADMIN, json={"url": "http://127.0.0.1:9"})
        assert r.status_code == 503 and r.json()["code"] == "STORE_UNAVAILABLE"


@LOOPBACK_ALIASES
@pytest.mark.slow
def test_replicas_discovering_the_same_name_agree_through_redis(procs, tmp_path, redis_url, pods):
    hosts, port = HOSTS, pods
    answer = tmp_path / "hosts"
    answer.write_text(f"{hosts[0]} sglang\n")
    replicas = _dns_gateways(procs, answer, f"sglang:{port}", "--redis", redis_url, "--prefix",
                             f"dns-{uuid.uuid4().hex[:8]}", count=2)
    a, b = (f"http://{h}:{port}" for h in hosts)
    answer.write_text(f"{hosts[0]} sglang\n{hosts[1]} sglang\n")
    for gw in replicas:
        _eventually(lambda gw=gw: set(_listed(gw, {})) == {a, b}, "both replicas see the new address")
    answer.write_text(f"{hosts[1]} sglang\n")
    for gw in replicas:
        _eventually(lambda gw=gw: set(_listed(gw, {})) == {b}, "both replicas drop the removed address")
        r = _chat(gw, f"dns-{gw[-5:]}", [{"role": "user", "content": "hello"}], {})
        assert r.status_code == 200 and r.headers["x-agent-cache-worker"] == b


@pytest.mark.slow
def test_a_board_entry_no_replica_can_apply_is_skipped_and_stops_nothing(procs, redis_url, keys_file):
    """Anyone with write access to Redis may write the board: an entry the router refuses (a scheme it does
    not take, a bad pool) is logged once and skipped; replicas start, serve and take admin changes."""
    import redis

    prefix = f"fleet-{uuid.uuid4().hex[:8]}"
    admin = redis.Redis.from_url(redis_url)
    entry = '{"pool": "default", "since": 0, "source": "admin", "state": "up"}'
    admin.hset(f"{{{prefix}}}:fleet", mapping={"ftp://bad-entry": entry, "http://ok:1": "[[[[",
                                               "http://admin:pw@host:1": entry})
    admin.close()
    with SimFleet(2) as fleet:
        gateways = AgentCacheGateways(procs, fleet.urls[:1], redis_url=redis_url, args=[
            "--prefix", prefix, "--api-keys", keys_file, "--fleet-refresh", REFRESH])  # starts
        gw = gateways.urls[0]
        assert _chat(gw, "s1", [{"role": "user", "content": "hi"}], USER).status_code == 200
        r = httpx.post(gw + "/workers", headers=ADMIN, json={"url": fleet.urls[1], "pool": "default"})
        assert r.status_code == 202, r.text
        assert set(_listed(gw)) == set(fleet.urls)
        time.sleep(1.0)  # a few refreshes
        log = gateways.procs[0].tail(20_000)
        assert log.count("fleet board entry skipped") == 2 and "Traceback" not in log
        assert "pw@" not in log
