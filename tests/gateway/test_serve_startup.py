"""``agent-cache serve`` that cannot start says why in one line and exits non-zero, without a traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest


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
