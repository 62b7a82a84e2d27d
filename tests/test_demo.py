"""`agent-cache demo` runs its three columns to completion; routing beats round-robin, templates add to it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.slow
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


@pytest.mark.slow
def test_progress_counts_each_session_once_in_order() -> None:
    """Sessions ending together (instant workers, all six at once) are each told once: "3/6" follows "2/6"."""
    out = subprocess.run([sys.executable, "-m", "agent_cache.cli", "demo", "--quick", "--time-scale", "0",
                          "--concurrency", "6"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    for column in ("round-robin", "routing only", "agent-cache"):
        progress = re.findall(rf"^  {column}: session (\d+)/6$", out.stderr, re.M)
        assert progress == [str(n) for n in range(1, 7)], out.stderr


def test_runs_on_given_workers_each_start_cold_and_leave_no_redis_keys(fleet, redis_url) -> None:
    """Workers given by URL (separate servers) are flushed before each run: each run's first call hits nothing."""
    import redis

    from agent_cache.cli import build_parser
    from agent_cache.demo import compare

    args = build_parser().parse_args(["demo", "--workers", ",".join(fleet.urls), "--redis", redis_url])
    assert args.workers == fleet.urls
    results = compare(args.workers, sessions=2, concurrency=1, model="m", redis_url=args.redis)
    assert [r.sessions for r in results] == [2, 2, 2]
    assert [r.first_call_cached for r in results] == [0, 0, 0]  # unflushed, the 2nd run's first call would hit
    assert all(r.cached_tokens > 0 for r in results)  # later calls of each run do hit
    assert list(redis.Redis.from_url(redis_url).scan_iter(match="*agent-cache-demo-*")) == []


def test_a_worker_refusing_the_flush_stops_the_demo_with_one_line(capsys) -> None:
    import threading
    import time

    import httpx

    from agent_cache.cli import main
    from agent_cache.sim import SimFleet

    with SimFleet(1, time_scale=200) as busy:  # one decode step takes seconds: a request stays running
        url = busy.urls[0]
        body = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64}
        threading.Thread(target=lambda: httpx.post(url + "/v1/chat/completions", json=body, timeout=30),
                         daemon=True).start()
        deadline = time.monotonic() + 10
        while busy.engine(0).model.num_running + busy.engine(0).model.num_waiting == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert main(["demo", "--workers", url, "--quick"]) == 1
        err = capsys.readouterr().err.strip().splitlines()  # read before the busy worker's shutdown logs
    assert len(err) == 1 and url in err[0] and "did not flush its cache" in err[0] and "requests run" in err[0]
