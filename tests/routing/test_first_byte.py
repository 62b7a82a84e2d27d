"""The adaptive first-byte deadline: a few times a worker's recent time to first token, bounded."""

from __future__ import annotations

import pytest

from agent_cache.errors import ConfigError
from agent_cache.routing.first_byte import FirstByteDeadlines


def test_the_caller_timeout_applies_until_a_worker_has_a_record() -> None:
    d = FirstByteDeadlines(floor=2.0, factor=3.0, min_samples=4)
    for _ in range(3):
        d.observe("w", 0.1)
    assert d.deadline("w", 30.0) == 30.0 and d.deadline("other", None) is None
    d.observe("w", 0.1)
    assert d.deadline("w", 30.0) == 2.0  # 3 x 0.1 s is under the floor


def test_the_deadline_follows_the_95th_percentile_and_stays_under_the_cap() -> None:
    d = FirstByteDeadlines(floor=1.0, factor=3.0, window=20, min_samples=4)
    for t in [0.5] * 18 + [4.0, 4.0]:
        d.observe("w", t)
    assert d.deadline("w", 60.0) == pytest.approx(12.0)  # the p95 of 20 samples is the 19th: 4 s
    assert d.deadline("w", 10.0) == 10.0
    for _ in range(20):  # the window forgets the slow calls
        d.observe("w", 0.5)
    assert d.deadline("w", 60.0) == pytest.approx(1.5)
    d.forget("w")
    assert d.deadline("w", 60.0) == pytest.approx(1.5)  # judged by every worker's last 20 calls
    assert FirstByteDeadlines(floor=1.0, factor=3.0, min_samples=4).deadline("w", 60.0) == 60.0


def test_a_worker_without_a_record_is_judged_by_every_workers_recent_calls() -> None:
    d = FirstByteDeadlines(floor=1.0, factor=3.0, min_samples=4)
    for w in ("a", "b"):
        for _ in range(2):
            d.observe(w, 0.5)
    assert d.deadline("new", 600.0) == pytest.approx(1.5)  # not the caller's 600 s: a hung new worker is left
    d.observe("new", 0.1)
    assert d.deadline("new", 600.0) == pytest.approx(1.5)  # until it has a record of its own


def test_bad_options_name_the_field() -> None:
    with pytest.raises(ConfigError, match="first_byte_floor"):
        FirstByteDeadlines(floor=0)
    with pytest.raises(ConfigError, match="first_byte_factor"):
        FirstByteDeadlines(factor=0.5)


def test_a_larger_call_or_one_queued_behind_large_ones_waits_longer():
    d = FirstByteDeadlines(floor=1.0, factor=3.0, min_samples=4)
    for _ in range(10):
        d.observe("w", 0.5, 1000)  # 1 KB calls, 0.5 s to the first byte: 1.5 s
    assert d.deadline("w", 600.0, 1000) == pytest.approx(1.5)
    assert d.deadline("w", 600.0, 40_000) == pytest.approx(60.0)  # 40 times the usual bytes
    assert d.deadline("w", 30.0, 40_000) == 30.0  # never over the cap
    assert d.waiting("w", 400_000) == 400_000  # a long prompt sent, no first byte yet
    ahead = d.waiting("w", 1000)  # a short call behind it: the long one's bytes beyond the usual count
    assert ahead == 400_000 and d.deadline("w", 600.0, ahead) == 600.0
    d.answered("w", 400_000)
    assert d.waiting("w", 1000) == 1000  # once answered, calls of the usual size ahead add nothing
    d.answered("w", 1000)
    d.answered("w", 1000)
    assert d.waiting("other", 5) == 5


def test_calls_of_the_usual_size_waiting_ahead_do_not_stretch_the_deadline() -> None:
    # a hung worker: every call sent there waits; each must still be left after the usual deadline
    d = FirstByteDeadlines(floor=1.0, factor=3.0, min_samples=4)
    for _ in range(10):
        d.observe("w", 0.5, 1000)
    assert [d.deadline("w", 600.0, d.waiting("w", 1000)) for _ in range(12)] == [pytest.approx(1.5)] * 12


def test_whole_answers_keep_their_own_record_and_queue_with_streams() -> None:
    d = FirstByteDeadlines(floor=1.0, factor=3.0, min_samples=4)
    for _ in range(4):
        d.observe("w", 0.1, 100)
        d.observe("w", 2.0, 100, whole=True)
    assert d.deadline("w", 60.0) == pytest.approx(1.0)  # streams' first bytes: the floor
    assert d.deadline("w", 60.0, whole=True) == pytest.approx(6.0)  # whole answers take their whole time
    d.forget("w")
    assert d.deadline("w", 60.0, whole=True) == pytest.approx(6.0)  # judged by every worker's
    big = d.waiting("w", 1000)  # a long prompt sent whole, still in its prefill
    assert d.waiting("w", 100) == 100 + 900  # a stream queued behind it waits for it too
    d.answered("w", 1000)
    assert big == 1000 and d.waiting("w", 100) == 100
