"""One percentile definition: the demo and benchmark scripts, the benchmark reports and the router's
first-byte deadline rank values alike."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from agent_cache.bench import report
from agent_cache.percentile import histogram_percentile, percentile
from agent_cache.routing.first_byte import FirstByteDeadlines


def test_the_definition():
    assert percentile([4, 1, 3, 2], 0.5) == 3
    assert percentile(range(1, 21), 0.95) == 20 and percentile(range(1, 101), 0.99) == 100
    assert percentile([7], 0.0) == percentile([7], 1.0) == 7
    with pytest.raises(ValueError):
        percentile([], 0.5)


@pytest.mark.parametrize("seed", range(20))
def test_every_user_ranks_alike(seed):
    rng = random.Random(seed)
    values = sorted(rng.randint(1, 50) / 10 for _ in range(rng.randint(8, 64)))
    for q in (0.5, 0.9, 0.95, 0.99):
        expected = percentile(values, q)
        assert report.quantile(values, q) == expected
        ints = [int(v * 10) for v in values]
        assert histogram_percentile(Counter(ints), q) == report._hist_quantile(Counter(ints), q) == \
            percentile(ints, q)
    deadlines = FirstByteDeadlines(floor=1e-9, factor=1.0, window=len(values), min_samples=1)
    for v in rng.sample(values, len(values)):
        deadlines.observe("w", v)
    assert deadlines.deadline("w", None) == percentile(values, 0.95)
    assert report.quantile([], 0.5) == 0.0 and report._hist_quantile({}, 0.5) == 0
