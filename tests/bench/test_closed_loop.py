"""Real workers answer for themselves: the load replays each session closed-loop.

A worker that is not scripted (``sim_output`` is not sent) answers with its own text, and each next step
carries that text as the assistant's message, so its prompt extends the cached one past the previous
prompt. The workers here are simulated ones given by URL, as a user's own fleet is (``--worker-urls``).
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agent_cache.processes import Processes
from agent_cache.server_processes import SimWorkers
from agent_cache.bench.realfleet import GivenWorkers
from agent_cache.bench.realload import Job, closed_loop, run_job
from agent_cache.bench.runner import main_bench
from agent_cache.bench.workloads import ChatCall, WorkloadParams, generate
from agent_cache.errors import ConfigError


def test_recorded_answers_are_replaced_by_the_workers_and_capped() -> None:
    chat = ChatCall(({"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                     {"role": "assistant", "content": "recorded one"}, {"role": "user", "content": "recorded one"},
                     {"role": "assistant", "content": "never answered"}), None, "next", 40)
    out = closed_loop(chat, {"recorded one": "what the worker said"}, 16)
    assert [m["content"] for m in out.messages] == ["s", "q", "what the worker said", "recorded one",
                                                    "never answered"]  # only assistant messages it answered
    assert out.output_tokens == 16 and out.output == "next"
    assert closed_loop(chat, {}, None) == chat  # nothing answered yet, no cap: the recorded call
    assert closed_loop(chat, {}, 100).output_tokens == 40  # a cap above the recorded length changes nothing


@pytest.fixture(scope="module")
def fleet():
    with Processes() as procs:
        workers = SimWorkers(procs, 2, time_scale=0, capacity_tokens=100_000)
        yield workers


def _steps(answers_fed_back: bool, urls: list[str]) -> list[tuple[int, int, int]]:
    """(prompt tokens of step k, cached tokens of step k+1, same worker) for every step of 3 ReAct sessions."""
    import agent_cache.bench.realload as realload

    sessions = generate(WorkloadParams(sessions=3, rate=50, seed=3))
    job = Job("consistent-hash", sessions, urls, time.monotonic() + 0.1, scripted=False, answer_tokens=12)
    keep = realload.closed_loop
    if not answers_fed_back:  # the load as an open-loop replay would send it: the recorded answers
        realload.closed_loop = lambda chat, answers, cap: keep(chat, {}, cap)  # type: ignore[assignment]
    try:
        result = asyncio.run(run_job(job))
    finally:
        realload.closed_loop = keep  # type: ignore[assignment]
    assert not result.errors
    by_session: dict[str, list[tuple[int, str, int, int]]] = {}
    for sid, k, worker, _, _, _, prompt, cached, _ in result.calls:
        by_session.setdefault(sid, []).append((k, worker, prompt, cached))
    steps = []
    for calls in by_session.values():
        calls.sort()
        steps += [(a[2], b[3], a[1] == b[1]) for a, b in zip(calls, calls[1:])]
    assert steps and all(same for _, _, same in steps)  # consistent hashing: one worker per session
    return steps


@pytest.mark.slow
def test_each_step_is_cached_past_the_previous_prompt(fleet) -> None:
    workers = GivenWorkers(fleet.urls)
    try:
        workers.flush()
        closed = _steps(True, workers.urls)
        workers.flush()
        recorded = _steps(False, workers.urls)
    finally:
        workers.close()
    # the previous prompt and the worker's own answer (all but its last token) are in the cache
    assert all(cached > prompt for prompt, cached, _ in closed), closed
    # with the recorded answers the prompt leaves the cached path where the answer starts
    assert all(cached <= prompt for prompt, cached, _ in recorded), recorded


@pytest.mark.slow
def test_a_given_fleet_runs_every_session_and_is_named_in_the_results(fleet, tmp_path: Path) -> None:
    rc = main_bench(["--engine", "real", "--worker-urls", ",".join(fleet.urls), "--sessions", "4", "--rate", "20",
                     "--policies", "consistent-hash,agent-cache,agent-cache-gateway", "--answer-tokens", "8",
                     "--out", str(tmp_path), "--quiet", "--no-plots"])
    assert rc == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    cfg = doc["config"]
    assert (cfg["engine"], cfg["fleet"], cfg["model"], cfg["workers"]) == ("real", "given", "sim-llama-3.1-8b", 2)
    assert cfg["replay"] == "closed-loop" and cfg["answer_tokens"] == 8 and "time_scale" not in cfg
    for name, m in doc["policies"].items():
        assert m["sessions_completed"] == 4 and m["errors"] == 0, (name, m["error_samples"])
        assert 0 < m["cached_tokens"] < m["prompt_tokens"], name
        assert m["output_tokens"] <= 8 * m["calls"], name  # every answer capped


def test_a_worker_that_does_not_answer_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    from agent_cache.processes import free_port

    rc = main_bench(["--engine", "real", "--worker-urls", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path),
                     "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--worker-urls" in err and "/v1/models" in err and "Traceback" not in err
    assert not (tmp_path / "results.json").exists()


def test_flags_of_real_workers_are_refused_where_they_do_not_apply(tmp_path: Path, capsys) -> None:
    for argv, flag in ((["--answer-tokens", "0"], "--answer-tokens"),
                       (["--fleet", "sglang", "--time-scale", "2"], "--time-scale"),
                       (["--fleet", "sglang", "--sglang-version", "0.4.0"], "--sglang-version"),
                       (["--worker-urls", "http://127.0.0.1:1", "--workers", "2"], "--workers")):
        assert main_bench(["--engine", "real", *argv, "--out", str(tmp_path), "--quiet"]) == 2, argv
        assert flag in capsys.readouterr().err, argv
    assert main_bench(["--fleet", "sglang", "--out", str(tmp_path), "--quiet"]) == 2  # the sim engine
    assert "--fleet" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--worker-urls"):
        GivenWorkers(["http://127.0.0.1:1"])
