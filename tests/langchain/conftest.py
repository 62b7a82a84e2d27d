"""Simulated SGLang workers for the LangChain tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from agent_cache.sim import SimFleet


@pytest.fixture(scope="session")
def lc_fleet() -> Iterator[SimFleet]:
    """Two instant simulated workers shared by the LangChain tests (cache report on)."""
    with SimFleet(2, time_scale=0.0) as fleet:
        yield fleet
