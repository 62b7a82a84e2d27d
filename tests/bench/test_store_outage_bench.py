"""``python -m agent_cache.bench.store_outage``: a real redis-server frozen under real agent calls."""

from __future__ import annotations

import re

from agent_cache.bench.store_outage import main


def test_a_frozen_redis_run_reports_both_faces_with_no_failed_call(capsys) -> None:
    assert main(["--calls", "8"]) == 0
    out = capsys.readouterr().out
    sync = re.search(r"Redis up ([\d.]+) ms, frozen ([\d.]+) ms \(added ([-+][\d.]+) ms\)", out)
    stall = re.search(r"Redis up ([\d.]+) ms, frozen ([\d.]+) ms; 0 failed calls", out)
    assert sync and stall, out
    up, frozen, added = (float(x) for x in sync.groups())
    assert up > 0 and frozen > 0 and abs(added - (frozen - up)) < 0.2
    assert float(stall.group(1)) >= 0 and float(stall.group(2)) >= 0


def test_too_few_calls_exit_2(capsys) -> None:
    assert main(["--calls", "3"]) == 2
    assert "--calls" in capsys.readouterr().err
