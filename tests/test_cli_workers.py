"""One ``--workers`` syntax for every command that takes worker URLs (``demo``, ``serve``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent_cache.cli import build_parser


@pytest.mark.parametrize("argv, expected", [
    (["serve", "--workers", "http://a:1,http://b:2/v1"], ["http://a:1", "http://b:2"]),
    (["serve", "--workers", "http://a:1", "http://b:2"], ["http://a:1", "http://b:2"]),
    (["demo", "--worker-urls", "http://a:1", "--workers", "http://b:2, http://c:3/"],
     ["http://a:1", "http://b:2", "http://c:3"]),
])
def test_one_workers_syntax_for_every_command(argv, expected) -> None:
    assert build_parser().parse_args(argv).workers == expected


@pytest.mark.parametrize("command", ["demo", "serve"])
@pytest.mark.parametrize("value, message", [("http://a:1,http://b:99999", "bad port in 'http://b:99999'"),
                                            ("ftp://a", "unsupported URL scheme 'ftp'"), (",", "no worker URL")])
def test_a_bad_worker_url_is_one_line_naming_it(command, value, message) -> None:
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", command, "--workers", value],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"agent-cache {command}: error: --workers: ") and message in lines[0]


@pytest.mark.parametrize("command", ["demo", "serve"])
def test_a_bad_url_in_the_environment_is_one_line_naming_it_too(command) -> None:
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", command], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "AGENT_CACHE_WORKERS": "http://a:1,http://b:x"})
    assert out.returncode == 2
    assert out.stderr.strip() == f"agent-cache {command}: AGENT_CACHE_WORKERS: bad port in 'http://b:x'"
