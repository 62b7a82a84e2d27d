"""``agent-cache bench --engine real``: a tiny run with real processes.

Two simulated worker processes, a private redis-server, two load replica
processes and (when installed) two real smg gateways joined in smg's mesh. Nothing is mocked: the
hit rates are the workers' reported cached tokens.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import SimWorkers
from agent_cache.bench.realfleet import SmgGateways, mesh_argv, smg_argv
from agent_cache.bench.registry import REGISTRY
from agent_cache.bench.runner import main_bench

pytestmark = pytest.mark.slow  # its module fixture runs every policy on real processes

SMG = shutil.which("smg")
POLICIES = ["round-robin", "consistent-hash", "agent-cache", "agent-cache-gateway-kv"] + (
    ["smg-consistent_hashing"] if SMG else [])
SESSIONS = 8
DOCUMENTED = ("token_hit_rate", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "mean_session_latency_s",
              "throughput_sessions_per_s", "prompt_tokens_per_s", "output_tokens_per_s", "kv_gb", "load_imbalance",
              "moves", "sessions_on_one_worker", "sessions", "sessions_completed", "calls", "errors")


def _live_descendants(pid: int) -> set[int]:
    """Live (non-zombie) descendants of ``pid``, from /proc.

    multiprocessing's resource tracker is left out: the spawn start method
    starts one per interpreter, and it exits with the interpreter.
    """
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and b"multiprocessing.resource_tracker" not in cmdline:
            parent[int(entry)] = int(fields[1])
    out: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {p for p, pp in parent.items() if pp in frontier} - out
        out |= frontier
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict, set[int], set[int]]:
    out = tmp_path_factory.mktemp("real")
    before = _live_descendants(os.getpid())
    rc = main_bench(["--engine", "real", "--workers", "2", "--replicas", "2", "--sessions", str(SESSIONS),
                     "--rate", "20", "--time-scale", "0.05", "--policies", ",".join(POLICIES), "--out", str(out),
                     "--gateways", "2", "--quiet"])
    assert rc == 0
    after = _live_descendants(os.getpid())
    return out, json.loads((out / "results.json").read_text()), before, after


def test_every_policy_completes_every_session(tiny) -> None:
    _, doc, _, _ = tiny
    pol = doc["policies"]
    assert list(pol) == POLICIES
    calls = {m["calls"] for m in pol.values()}
    assert len(calls) == 1 and calls.pop() > SESSIONS  # the same sessions, every call answered
    for name, m in pol.items():
        assert m["sessions_completed"] == m["sessions"] == SESSIONS, name
        assert m["errors"] == 0, (name, m["error_samples"])
        assert 0.0 <= m["token_hit_rate"] <= 1.0, name
        assert 0 < m["cached_tokens"] < m["prompt_tokens"], name
        assert 0 < m["ttft_p50_s"] <= m["ttft_p95_s"] <= m["ttft_p99_s"], name
        assert sum(m["calls_per_worker"].values()) == m["calls"], name
        assert m["kv_tokens"] > 0, name  # what the caches hold after the run, evictable tokens included


def test_the_kv_gateway_follows_every_workers_events(tiny) -> None:
    _, doc, _, _ = tiny
    kv = doc["policies"]["agent-cache-gateway-kv"]["kv_events"]  # summed over the run's 2 gateways
    assert kv["batches"] > 0 and kv["gaps"] == 0 and kv["token_lookups_failed"] == 0, kv
    assert "kv_events" not in doc["policies"]["agent-cache"]


def test_agent_cache_hits_more_and_sessions_stay_on_one_worker(tiny) -> None:
    _, doc, _, _ = tiny
    pol = doc["policies"]
    assert pol["agent-cache"]["token_hit_rate"] >= pol["round-robin"]["token_hit_rate"]
    assert pol["round-robin"]["moves"] > 0 and pol["round-robin"]["sessions_on_one_worker"] < 1.0
    sticky = ["consistent-hash", "agent-cache", "agent-cache-gateway-kv"] + (["smg-consistent_hashing"] if SMG else [])
    for name in sticky:
        assert pol[name]["sessions_on_one_worker"] == 1.0, name
        assert pol[name]["moves"] == 0, name
    if SMG:  # smg named the workers it used: the fleet's own URLs; both gateways hash a session alike
        assert len(pol["smg-consistent_hashing"]["calls_per_worker"]) == 2


def test_results_files_and_config(tiny) -> None:
    out, doc, _, _ = tiny
    cfg = doc["config"]
    assert cfg["engine"] == "real" and cfg["workers"] == 2 and cfg["replicas"] == 2 and cfg["time_scale"] == 0.05
    assert cfg["smg_gateways"] == 2 and cfg["smg_mesh"] is True
    if SMG is None:
        assert cfg["smg_version"] is None
    else:  # what the installed binary says of itself, e.g. "1.13.0"
        installed = subprocess.run([SMG, "--version"], capture_output=True, text=True).stdout
        assert re.fullmatch(r"\d+\.\d+\.\d+\S*", cfg["smg_version"]) and cfg["smg_version"] in installed
    assert cfg["sim_only_policies"] == ["oracle", "no-cache"]
    if SMG:
        assert cfg["smg_flags"] == {"smg-consistent_hashing": ["--policy", "consistent_hashing",
                                                               "--routing-key-headers", "x-smg-routing-key"]}
    for m in doc["policies"].values():
        for key in DOCUMENTED:
            assert key in m, key
        assert isinstance(m["moves"], int)
    md = (out / "results.md").read_text()
    assert "# Real-process benchmark results" in md and "| agent-cache |" in md
    assert "exist only in the sim engine" in md
    if SMG:
        assert "- `smg-consistent_hashing`: `--policy consistent_hashing --routing-key-headers x-smg-routing-key`" in md
    assert (out / "ttft_cdf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_process_is_left_running(tiny) -> None:
    _, _, before, after = tiny
    assert after <= before, f"left running: {sorted(after - before)}"


def test_processes_are_stopped_and_temp_dir_removed_on_failure() -> None:
    before = _live_descendants(os.getpid())
    with pytest.raises(RuntimeError, match="boom"):
        with Processes() as procs:
            workers = SimWorkers(procs, 1, time_scale=0, capacity_tokens=10_000)
            assert httpx.get(workers.urls[0] + "/health").status_code == 200
            tmp = procs.dir
            assert _live_descendants(os.getpid()) - before
            workers.close()
            raise RuntimeError("boom")
    assert not os.path.exists(tmp)
    assert _live_descendants(os.getpid()) <= before


def test_smg_flags_are_the_documented_ones() -> None:
    argv = smg_argv("smg", "consistent_hashing", ["http://127.0.0.1:1"], 2, 3)
    assert argv[argv.index("--policy") + 1] == "consistent_hashing"
    assert argv[argv.index("--routing-key-headers") + 1] == "x-smg-routing-key"
    assert "--routing-key-headers" not in smg_argv("smg", "prefix_hash", ["http://127.0.0.1:1"], 2, 3)
    # the documented tuning variant is cache_aware with its low threshold, the rest at smg's defaults
    conversational = REGISTRY["smg-cache_aware-conversational"]
    tuned = smg_argv("smg", conversational.smg_policy, ["http://127.0.0.1:1"], 2, 3, conversational.smg_tuning)
    assert tuned[tuned.index("--policy") + 1] == "cache_aware"
    assert tuned[tuned.index("--cache-threshold") + 1] == "0.1"
    assert "--cache-threshold" not in smg_argv("smg", "cache_aware", ["http://127.0.0.1:1"], 2, 3)


def test_mesh_flags_name_every_other_gateway_as_a_peer() -> None:
    assert mesh_argv(0, [7001]) == ["--enable-mesh", "--mesh-server-name", "gateway-0", "--mesh-host", "127.0.0.1",
                                    "--mesh-port", "7001"]
    argv = mesh_argv(1, [7001, 7002, 7003])
    assert argv[argv.index("--mesh-port") + 1] == "7002"
    assert argv[argv.index("--mesh-peer-urls") + 1:] == ["127.0.0.1:7001", "127.0.0.1:7003"]


@pytest.mark.smg
@pytest.mark.skipif(SMG is None, reason="needs the smg binary")
def test_gateways_join_one_mesh_and_serve_calls() -> None:
    with Processes() as procs:
        workers = SimWorkers(procs, 2, time_scale=0, capacity_tokens=10_000)
        gateways = SmgGateways(procs, SMG, "cache_aware", workers.urls, count=2)
        try:
            for url in gateways.urls:
                reply = httpx.post(url + "/v1/chat/completions", timeout=30, json={
                    "model": "sim-llama-3.1-8b", "max_tokens": 3,
                    "messages": [{"role": "user", "content": "hello through " + url}]})
                assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
            # each gateway syncs with the other one: smg's mesh reports a sync round per peer
            for own, peer in ((0, "gateway-1"), (1, "gateway-0")):
                deadline = time.monotonic() + 20
                while f'peer="{peer}"' not in httpx.get(gateways.metrics_urls[own], timeout=5).text:
                    assert time.monotonic() < deadline, f"gateway-{own} never synced with {peer}"
                    time.sleep(0.5)
        finally:
            gateways.stop()
            workers.close()


@pytest.mark.parametrize("argv, flag, words", [
    (["--policies", "round-robin,oracle"], "--policies", "only in the sim engine"),
    (["--policies", "round-robin,psychic"], "--policies", "unknown psychic"),
    (["--time-scale", "-1"], "--time-scale", "must be >= 0"),
    (["--redis", "127.0.0.1:6379"], "--redis", "not a Redis URL"),
    (["--redis", "redis://127.0.0.1:1/0"], "--redis", "cannot reach"),
    (["--workers", "0"], "--workers", "must be positive"),
    (["--gateways", "0"], "--gateways", "must be >= 1"),
])
def test_bad_real_engine_flags_exit_2_naming_the_flag(argv, flag, words, tmp_path, capsys) -> None:
    before = _live_descendants(os.getpid())
    assert main_bench(["--engine", "real", *argv, "--out", str(tmp_path), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert flag in err and words in err, err
    assert not (tmp_path / "results.json").exists()
    assert _live_descendants(os.getpid()) <= before


@pytest.mark.parametrize("flag, value", [("--time-scale", "1"), ("--redis", "http://127.0.0.1:6379/0"),
                                         ("--capacity-tokens", "x0"), ("--gateways", "2")])
def test_bad_or_real_only_flags_rejected_by_the_sim_engine(flag, value, tmp_path, capsys) -> None:
    assert main_bench([flag, value, "--out", str(tmp_path), "--quiet"]) == 2
    assert flag.lstrip("-") in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_working_set_multiple_rejected_by_the_real_engine(tmp_path, capsys) -> None:
    assert main_bench(["--engine", "real", "--capacity-tokens", "x1.5", "--out", str(tmp_path), "--quiet"]) == 2
    assert "--capacity-tokens" in capsys.readouterr().err
