"""``python -m agent_cache.bench.overhead``: every routing path against one real worker, side by side."""

from __future__ import annotations

import json
import shutil

import pytest
import redis

from agent_cache.bench.overhead import DIRECT, GATEWAY_PATH, SMG_PATHS, main

SMG = shutil.which("smg")


@pytest.mark.slow
def test_every_path_serves_the_same_calls_and_the_run_leaves_no_keys(redis_server, tmp_path, capsys) -> None:
    out = tmp_path / "overhead.json"
    assert main(["--calls", "12", "--redis", redis_server.url, "--out", str(out), "--quiet", "--concurrency", "3"]) == 0
    doc = json.loads(out.read_text())
    paths = doc["paths"]
    want = [DIRECT, "agent-cache (memory)", "agent-cache (Redis)", GATEWAY_PATH] + (list(SMG_PATHS) if SMG else [])
    assert list(paths) == want
    for name, row in paths.items():
        assert row["calls"] == 12, name
        assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"], name
        assert row["ttft_p50_s"] <= row["latency_p50_s"] <= row["latency_p99_s"], name
        assert row["added_latency_p50_s"] == row["latency_p50_s"] - paths[DIRECT]["latency_p50_s"], name
    assert paths[DIRECT]["added_latency_p99_s"] == 0.0
    assert list(doc["calls_per_s"]) == want and all(rate > 0 for rate in doc["calls_per_s"].values())
    table = capsys.readouterr().out
    assert table.startswith("| path |") and all(f"| {name} |" in table for name in want)
    assert "| path | calls/s (3 in flight) | vs direct |" in table
    client = redis.Redis.from_url(redis_server.url)
    try:  # the agent-cache (Redis) path and the gateway wrote under their own prefixes, deleted at the end
        assert not list(client.scan_iter("agent-cache-overhead-*"))
    finally:
        client.close()


def test_too_few_calls_exit_2_naming_the_flag(capsys) -> None:
    assert main(["--calls", "3", "--quiet"]) == 2
    assert "--calls" in capsys.readouterr().err


@pytest.mark.slow
def test_a_store_delay_lies_on_the_path_of_every_route(redis_server, tmp_path) -> None:
    out = tmp_path / "overhead.json"
    assert main(["--calls", "12", "--redis", redis_server.url, "--out", str(out), "--quiet",
                 "--store-delay-ms", "5"]) == 0
    paths = json.loads(out.read_text())["paths"]
    redis_path, memory_path = paths["agent-cache (Redis)"], paths["agent-cache (memory)"]
    # the in-process Redis path waits one round trip per call, 5 ms each way at least; the memory path none
    assert redis_path["latency_p50_s"] >= 0.010
    assert redis_path["latency_p50_s"] - memory_path["latency_p50_s"] >= 0.005


def test_a_negative_store_delay_exits_2_naming_the_flag(capsys) -> None:
    assert main(["--calls", "12", "--store-delay-ms", "-1", "--quiet"]) == 2
    assert "--store-delay-ms" in capsys.readouterr().err
