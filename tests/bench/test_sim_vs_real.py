"""The simulator-vs-real comparison: per policy both hit rates, their difference, and the rankings."""

from __future__ import annotations

from agent_cache.bench.sim_vs_real import compare, main, markdown


def _doc(rates: dict[str, float], **config: object) -> dict:
    return {"config": {"engine_version": "0.5.23", "workload": "react", "sessions": 4, "rate_sessions_per_s": 1,
                       "workers": 2, "capacity_tokens_per_worker": 1000, "page_size": 1, "answer_tokens": 16,
                       **config},
            "policies": {n: {"token_hit_rate": r, "mean_session_latency_s": 2.0, "errors": 0}
                         for n, r in rates.items()}}


def test_differences_in_points_and_whether_the_rankings_agree() -> None:
    real = _doc({"consistent-hash": 0.30, "agent-cache": 0.60, "smg-cache_aware": 0.35})
    doc = compare(real, _doc({"consistent-hash": 0.31, "agent-cache": 0.58, "smg-cache_aware": 0.345}, time_scale=1))
    assert round(doc["policies"]["agent-cache"]["difference_points"], 6) == -2.0
    assert doc["same_ranking"] and doc["all_within"]
    swapped = compare(real, _doc({"consistent-hash": 0.50, "agent-cache": 0.60, "smg-cache_aware": 0.35}))
    assert not swapped["same_ranking"] and not swapped["all_within"]
    assert swapped["real_ranking"] == ["agent-cache", "smg-cache_aware", "consistent-hash"]
    # a pair tied in one run (within half a point) ranks alike whichever way the other run orders it
    tied = compare(_doc({"consistent-hash": 0.926, "agent-cache": 0.926, "smg-cache_aware": 0.923}),
                   _doc({"consistent-hash": 0.926, "agent-cache": 0.926, "smg-cache_aware": 0.942}))
    assert tied["same_ranking"]
    text = markdown(doc)
    assert "| agent-cache | 60.0% | 58.0% | -2.0 | 2.0/2.0 |" in text and "tied): yes" in text


def test_flags_the_comparison_sets_itself_are_refused(capsys) -> None:
    for flags in (["--fleet", "sglang"], ["--worker-urls", "http://127.0.0.1:1"], ["--sim-tokenizer", "/x"],
                  ["--sim-time-scale", "-1"]):
        assert main(flags) == 2, flags
        assert flags[0] in capsys.readouterr().err
