"""The package type-checks under ``mypy --strict`` (the [tool.mypy] settings in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_strict_is_clean():
    pytest.importorskip("mypy", reason="mypy is not installed (it comes with the test extra)")
    # run from the repository root, so mypy checks this checkout's agent_cache, not an installed copy
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "agent_cache"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    print(out.stdout)
    print(out.stderr, file=sys.stderr)
    assert out.returncode == 0, out.stdout
