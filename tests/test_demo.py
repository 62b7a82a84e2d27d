"""`agent-cache demo` runs its three columns to completion; routing beats round-robin, templates add to it."""

from __future__ import annotations

import re
import subprocess
import sys


def test_quick_demo_output() -> None:
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "demo", "--quick", "--time-scale", "0.2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    assert "simulated SGLang workers (a simulator, not SGLang)" in text
    completed = re.search(r"^sessions completed\s+(\d+)\s+(\d+)\s+(\d+)$", text, re.M)
    assert completed and completed.groups() == ("6", "6", "6")
    rates = re.search(r"^token cache hit rate\s+([\d.]+)%\s+([\d.]+)%\s+([\d.]+)%", text, re.M)
    assert rates, text
    round_robin, routing, agent_cache = map(float, rates.groups())
    assert round_robin < routing < agent_cache
    pinned = re.search(r"^sessions on one worker\s+(\d+)/6\s+(\d+)/6\s+(\d+)/6$", text, re.M)
    assert pinned and pinned.group(2) == "6" and pinned.group(3) == "6"
    recomputed = re.search(r"^tokens recomputed\s+(\d+)\s+(\d+)\s+(\d+)$", text, re.M)
    assert recomputed and int(recomputed.group(3)) < int(recomputed.group(2)) < int(recomputed.group(1))
    assert "routing alone recomputed" in text
