"""``agent-cache serve`` against private redis-servers, as a new user runs it: a Redis that refuses the
gateway (wrong password, no password, a password it does not want) or cannot be reached stops it at
start-up with one line naming the cause and no traceback; an unreachable one starts it degraded with one
warning line; a Redis that takes it serves every call through the store. Never up and failing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest
import redis

from tests.conftest import free_port

pytestmark = pytest.mark.redis


def _serve(worker: str, redis_url: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agent_cache.cli", "serve", "--workers", worker, "--port",
                             str(port), "--prefix", f"t-{uuid.uuid4().hex[:10]}", "--redis", redis_url, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    return proc, f"http://127.0.0.1:{port}"


def _stopped(worker: str, redis_url: str, *extra: str) -> tuple[int, list[str], str]:
    """Run a gateway expected to stop at start-up: its exit code, its stderr lines and all of stderr."""
    proc, url = _serve(worker, redis_url, *extra)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        health = "not answering"
        raise AssertionError(f"still running after 60 s ({health}); stderr: {err[-2000:]}")
    return proc.returncode, [line for line in err.splitlines() if line.strip()], err


def _serves(proc: subprocess.Popen[str], url: str) -> httpx.Response:
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, f"stopped: {proc.communicate()[1][-2000:]}"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "never healthy"
        time.sleep(0.1)
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    return httpx.post(url + "/v1/chat/completions", json=body, headers={"x-session-id": "s-startup"}, timeout=30)


@pytest.fixture(scope="module")
def secured(redis_server_factory):
    return redis_server_factory(password="s3cret-pw")


@pytest.mark.parametrize(("case", "auth", "named"), [
    ("wrong password", ":wrongpw@", "WRONGPASS"),
    ("no password", "", "NOAUTH"),
    ("unknown user", "nobody:wrongpw@", "WRONGPASS"),
])
@pytest.mark.slow
def test_a_redis_that_refuses_the_gateway_stops_it_with_one_line(fleet, secured, case, auth, named) -> None:
    code, lines, err = _stopped(fleet.urls[0], f"redis://{auth}127.0.0.1:{secured.port}/0")
    assert code != 0, case
    assert len(lines) == 1, err
    assert lines[0].startswith("agent-cache serve: error: --redis redis://") and named in lines[0], lines[0]
    assert "refused" in lines[0] and "Traceback" not in err, case
    assert "wrongpw" not in err and "s3cret" not in err, case  # the password is never printed


@pytest.mark.slow
def test_a_password_given_to_a_redis_without_one_is_refused_or_served_never_half(fleet, redis_server) -> None:
    # RESP2 sends AUTH <password>, which such a Redis refuses: the gateway stops at start-up
    code, lines, err = _stopped(fleet.urls[0], f"redis://:wrongpw@127.0.0.1:{redis_server.port}/0?protocol=2")
    assert code != 0 and len(lines) == 1 and "without any password configured" in lines[0], err
    assert "wrongpw" not in err and "Traceback" not in err
    # RESP3 (redis-py's HELLO ... AUTH default <password>) is let in by a default user without a
    # password: then every call is routed through the store, the session pinned in Redis
    proc, url = _serve(fleet.urls[0], f"redis://:wrongpw@127.0.0.1:{redis_server.port}/0?protocol=3")
    try:
        reply = _serves(proc, url)
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-agent-cache-worker"] in fleet.urls
        prefix = proc.args[proc.args.index("--prefix") + 1]
        admin = redis.Redis(port=redis_server.port)
        assert admin.exists(f"{{{prefix}}}:s:default:s-startup") == 1  # routed by the store, not by hashing
        admin.close()
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_unreachable_redis_starts_the_gateway_degraded_with_one_warning_line(fleet) -> None:
    # Redis may start after the gateway: it serves by hashing (as when Redis goes away while it runs)
    proc, url = _serve(fleet.urls[0], f"redis://127.0.0.1:{free_port()}/0")
    try:
        reply = _serves(proc, url)
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-agent-cache-worker"] in fleet.urls
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    warnings = [line for line in err.splitlines() if "cannot reach Redis" in line]
    assert len(warnings) == 1 and "routing degraded" in warnings[0] and "Traceback" not in err, err


def test_the_right_password_serves_through_the_store(fleet, secured) -> None:
    proc, url = _serve(fleet.urls[0], f"redis://:s3cret-pw@127.0.0.1:{secured.port}/0")
    try:
        reply = _serves(proc, url)
        assert reply.status_code == 200, reply.text
        prefix = proc.args[proc.args.index("--prefix") + 1]
        admin = redis.Redis(port=secured.port, password="s3cret-pw")
        assert admin.hget(f"{{{prefix}}}:s:default:s-startup", "worker").decode() == reply.headers[
            "x-agent-cache-worker"]
        admin.close()
    finally:
        proc.terminate()
        proc.wait(30)
