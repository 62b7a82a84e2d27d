"""The one percentile definition the benchmark scripts and the demo print."""

from __future__ import annotations

from typing import Iterable


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank style: the value at index ``int(q * n)`` of the sorted values (clamped)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
