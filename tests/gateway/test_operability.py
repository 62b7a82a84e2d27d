"""``agent-cache serve``'s start-up line, ``--metrics-port`` and ``--log-format json``, on a real process
in front of a simulated worker."""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_cache.processes import Proc
from tests.conftest import free_port

SYSTEM = "You are a careful research agent. " * 40
BANNER = re.compile(r"agent-cache gateway on http://127\.0\.0\.1:(\d+) ")


def _log(proc: Proc) -> str:
    return Path(proc.log_path).read_text(errors="replace")


def _banner_port(proc: Proc, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = BANNER.search(_log(proc))
        if found:
            return int(found.group(1))
        proc.check()
        time.sleep(0.05)
    raise AssertionError(f"no start-up line: {_log(proc)[-1500:]}")


def _access_lines(proc: Proc) -> list[dict[str, Any]]:
    lines = []
    for line in _log(proc).splitlines():
        if line.startswith("{"):
            record = json.loads(line)  # every line the gateway writes in json format is JSON
            if record["logger"] == "agent_cache.access":
                lines.append(record)
    return lines


@pytest.mark.slow
def test_metrics_port_admin_guard_and_json_access_log(procs, worker, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("user-key team-a\nadmin-key ops role=admin\n")
    metrics_port = free_port()
    proc = procs.start("serve", [sys.executable, "-m", "agent_cache.cli", "serve", "--port", "0", "--workers", worker,
                                 "--api-keys", str(keys), "--metrics-port", str(metrics_port), "--log-format", "json"])
    port = _banner_port(proc)  # --port 0: the line names the port bound, which serves at once
    url = f"http://127.0.0.1:{port}"
    assert httpx.get(url + "/health").status_code == 200
    assert f"metrics on http://127.0.0.1:{metrics_port}/metrics" in _log(proc)

    # the main port's /metrics is for admin keys; the metrics port needs none
    assert httpx.get(url + "/metrics").status_code == 401
    denied = httpx.get(url + "/metrics", headers={"authorization": "Bearer user-key"})
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "admin_required"
    assert "agent_cache_gateway_inflight" in httpx.get(url + "/metrics",
                                                       headers={"authorization": "Bearer admin-key"}).text

    body = {"model": "sim", "max_tokens": 8,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "go"}]}
    user = {"authorization": "Bearer user-key", "x-session-id": "agent-42"}
    answers = [httpx.post(url + "/v1/chat/completions", json={**body, "stream": stream},
                          headers={**user, "x-request-id": f"req-{i}"}, timeout=30.0)
               for i, stream in enumerate((False, True))]
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.headers["x-request-id"] for a in answers] == ["req-0", "req-1"]
    assert httpx.post(url + "/v1/chat/completions", json=body).status_code == 401

    scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics").text
    assert 'agent_cache_gateway_requests_total{endpoint="/v1/chat/completions",status="200"} 2.0' in scraped

    deadline = time.monotonic() + 10
    while len(lines := _access_lines(proc)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    first, second, refused = lines
    session = hashlib.sha256(b"agent-42").hexdigest()[:16]
    for line, request_id in ((first, "req-0"), (second, "req-1")):
        assert line["request_id"] == request_id and line["status"] == 200 and line["tenant"] == "team-a"
        assert line["session_hash"] == session and line["worker"] == worker and line["attempts"] == 1
        assert line["path"] == "/v1/chat/completions" and line["latency_ms"] > 0
        assert line["prompt_tokens"] > 200 and line["level"] == "info"
    assert first["cached_tokens"] == 0 and second["cached_tokens"] > 200  # the session's prefix, cached
    assert refused["status"] == 401 and refused["tenant"] is None and len(refused["request_id"]) == 32
    assert "agent-42" not in _log(proc)  # a session id is logged only hashed
    start_up = [json.loads(line) for line in _log(proc).splitlines() if BANNER.search(line)]
    assert [(line["level"], line["logger"]) for line in start_up] == [("info", "agent_cache.gateway")]
    assert all(line.startswith("{") for line in _log(proc).splitlines()), _log(proc)  # json: every line


@pytest.mark.slow
def test_every_response_carries_a_request_id_whatever_is_logged(procs, worker):
    """At the default --log-level (here smg's spelling of it), with no access line written."""
    proc = procs.start("serve", [sys.executable, "-m", "agent_cache.cli", "serve", "--port", "0", "--workers", worker,
                                 "--log-level", "warn"])
    url = f"http://127.0.0.1:{_banner_port(proc)}"
    body = {"model": "sim", "max_tokens": 4, "messages": [{"role": "user", "content": "go"}]}
    sent = httpx.post(url + "/v1/chat/completions", json=body, headers={"x-request-id": "req-7"}, timeout=30.0)
    assert sent.status_code == 200 and sent.headers["x-request-id"] == "req-7"
    for response in (httpx.post(url + "/v1/chat/completions", json=body, timeout=30.0),
                     httpx.post(url + "/v1/chat/completions", content=b"{", timeout=30.0),
                     httpx.get(url + "/health"), httpx.get(url + "/v1/models")):
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers.get("x-request-id", "")), response
    assert "agent_cache.access" not in _log(proc)  # no access line was written


def test_no_start_up_line_when_the_port_is_taken_and_the_failure_is_one_line(procs, worker):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "serve", "--port", str(port),
                              "--workers", worker], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "agent-cache gateway on" not in out.stderr
    errors = [line for line in out.stderr.splitlines() if "rror" in line]
    assert len(errors) == 1 and "address already in use" in errors[0].lower(), out.stderr
