"""Hot templates prewarmed: the rate threshold, the spread, the per-worker budget, and hits."""

from __future__ import annotations

from agent_cache.routing.prewarm import Prewarmer

WS = ["w0", "w1", "w2", "w3"]


def test_a_cold_template_is_never_prewarmed() -> None:
    p = Prewarmer(threshold=6.0)
    for i in range(5):
        assert p.plan("t", "w0", "placed_template", frozenset({"w0"}), WS, float(i)) == []
    assert p.counts.prewarms == 0


def test_a_hot_template_is_spread_to_the_cheapest_non_holder_and_bounded_per_worker() -> None:
    p = Prewarmer(threshold=3.0, per_worker_per_minute=2, spread=2)
    out = [p.plan("t", "w0", "placed_template", frozenset({"w0"}), ["w2", "w1", "w0"], float(i)) for i in range(6)]
    assert out[:2] == [[], []]  # two sessions a minute: not yet hot
    assert out[2] == ["w2"]  # the third makes it hot: the cheapest worker that does not hold it
    # its events do not show the prefill yet: w2 counts as holding it while the prewarm is pending, so it is
    # not prefilled twice, and two holders suffice
    assert out[3:6] == [[], [], []] and p.counts.prewarms == 1
    budget = Prewarmer(threshold=1.0, per_worker_per_minute=1, spread=3, pending=0.0)
    assert budget.plan("t", "w0", "placed_template", frozenset({"w0"}), ["w2"], 0.0) == ["w2"]
    assert budget.plan("t", "w0", "placed_template", frozenset({"w0"}), ["w2"], 1.0) == []  # w2's minute is spent
    assert budget.counts.prewarms == 1 and budget.counts.refused == 1
    assert p.plan("t", "w0", "pinned", frozenset({"w0"}), WS, 7.0) == []  # a pinned call is no new session
    # placed on a non-holder: that worker is never prewarmed (its own call fills it), and two holders suffice
    assert p.plan("t", "w1", "placed_least_load", frozenset({"w0"}), ["w1", "w3"], 62.0) == []


def test_a_session_placed_where_a_prewarm_put_its_template_is_a_hit() -> None:
    p = Prewarmer(threshold=1.0, spread=2)
    assert p.plan("t", "w0", "placed_template", frozenset({"w0"}), ["w1"], 0.0) == ["w1"]
    assert p.counts.hits == 0
    p.plan("t", "w1", "placed_template", frozenset({"w0", "w1"}), ["w2"], 1.0)
    assert p.counts.hits == 1
    p.plan("t", "w1", "placed_template", frozenset({"w0", "w1"}), ["w2"], 2.0)  # w1 holds it on its own now
    assert p.counts.hits == 1
    p.plan("t", "w1", "placed_template", frozenset({"w0", "w1"}), ["w2"], 500.0)  # long after: not a hit
    assert p.counts.hits == 1
