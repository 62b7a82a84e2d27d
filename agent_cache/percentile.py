"""The one percentile definition of the package: the demo, the benchmarks' reports and the router's
adaptive first-byte deadline all rank values this way.

The q-th percentile of n sorted values is the value at index ``int(q * n)``, clamped to the last: the
smallest value with more than ``q * n`` values at or below it (p50 of 1, 2, 3, 4 is 3; p95 of 20 values
is the largest).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

__all__ = ["histogram_percentile", "percentile", "rank", "sorted_percentile"]


def rank(n: int, q: float) -> int:
    """The index of the ``q``-th percentile (0 <= q <= 1) among ``n`` > 0 sorted values."""
    if n <= 0:
        raise ValueError("percentile of no values")
    return min(n - 1, max(0, int(q * n)))


def sorted_percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of values already sorted ascending."""
    return ordered[rank(len(ordered), q)]


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (any order); ValueError for none."""
    return sorted_percentile(sorted(values), q)


def histogram_percentile(hist: Mapping[int, int], q: float) -> int:
    """The ``q``-th percentile of a histogram ``value -> count``; ValueError when it counts nothing."""
    remaining = rank(sum(hist.values()), q)
    for value in sorted(hist):
        remaining -= hist[value]
        if remaining < 0:
            return value
    return max(hist)
