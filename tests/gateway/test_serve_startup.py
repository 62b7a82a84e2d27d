"""``agent-cache serve`` that cannot start says why in one line and exits non-zero, without a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from agent_cache.cli import build_parser


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agent_cache.cli", "serve", "--workers", "http://127.0.0.1:1",
                           *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("case", ["port taken", "port out of range", "address not ours", "no keys file"])
def test_a_start_up_failure_is_one_line_naming_its_cause(case, tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    args, cause = {
        "port taken": (["--port", str(port)], "in use"),
        "port out of range": (["--port", "70000"], "0-65535"),
        "address not ours": (["--host", "192.0.2.1"], "assign"),
        "no keys file": (["--api-keys", str(tmp_path / "missing")], "No such file"),
    }[case]
    try:
        result = _serve(*args)
    finally:
        taken.close()
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and cause in lines[0] and "Traceback" not in result.stderr, result.stderr


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
    lines = out.stderr.strip().splitlines()
    assert lines == [f"agent-cache {command}: error: --log-level: unknown level 'verbose'; choose from critical, "
                     "error, warning (or warn), info, debug, trace"]
