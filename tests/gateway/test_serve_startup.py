"""``agent-cache serve`` (and ``sim-worker``) that cannot start says why in one line and exits non-zero, without
a traceback; every option is checked before anything is bound, so a port taken never hides a bad option."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Iterator

import pytest

from agent_cache.cli import build_parser
from tests.conftest import free_port


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent_cache.cli", "serve", *args], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("case", ["port taken", "port out of range", "address not ours", "no keys file",
                                  "metrics port taken", "metrics port is the port", "metrics port out of range"])
def test_a_start_up_failure_is_one_line_naming_its_cause(case, taken, tmp_path):
    port = free_port()
    args, cause = {
        "port taken": (["--port", str(taken)], f"--port {taken}: cannot listen on 127.0.0.1:{taken}: Address "
                                               "already in use"),
        "port out of range": (["--port", "70000"], "--port: a port is 0-65535"),
        "address not ours": (["--host", "192.0.2.1"], "assign"),
        "no keys file": (["--api-keys", str(tmp_path / "missing")], "No such file"),
        "metrics port taken": (["--metrics-port", str(taken)],
                               f"--metrics-port {taken}: cannot listen on 127.0.0.1:{taken}: Address already in use"),
        "metrics port is the port": (["--port", str(port), "--metrics-port", str(port)],
                                     f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}: Address already in use"),
        "metrics port out of range": (["--metrics-port", "65536"], "--metrics-port: a port is 0-65535"),
    }[case]
    result = _serve("--workers", "http://127.0.0.1:1", *args)
    assert result.returncode != 0
    assert cause in _one_line(result)


def test_a_bad_worker_url_in_the_environment_is_told_before_the_port_is_tried(taken):
    result = _serve("--port", str(taken), env={**os.environ, "AGENT_CACHE_WORKERS": "http://a:1,http://b:x"})
    assert result.returncode == 2
    assert _one_line(result) == "agent-cache serve: AGENT_CACHE_WORKERS: bad port in 'http://b:x'"


def test_sim_worker_tells_its_url_only_once_bound(taken):
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "sim-worker", "--port", str(taken)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert _one_line(out) == (f"agent-cache sim-worker: error: --port {taken}: cannot listen on 127.0.0.1:{taken}: "
                              "Address already in use")


@pytest.mark.parametrize("command", [["serve", "--workers", "http://a:1"], ["sim-worker"]])
@pytest.mark.parametrize("given, level", [("warn", "warning"), ("WARN", "warning"), ("Info", "info"),
                                          ("trace", "trace")])
def test_log_level_takes_smgs_spelling_and_any_case(command, given, level):
    assert build_parser().parse_args([*command, "--log-level", given]).log_level == level


@pytest.mark.parametrize("command", ["serve", "sim-worker"])
def test_an_unknown_log_level_is_one_line_naming_the_flag_and_the_choices(command):
    workers = ["--workers", "http://a:1"] if command == "serve" else []
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", command, *workers, "--log-level", "verbose"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert _one_line(out) == (f"agent-cache {command}: error: --log-level: unknown level 'verbose'; choose from "
                              "critical, error, warning (or warn), info, debug, trace")
