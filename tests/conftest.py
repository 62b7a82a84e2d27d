"""Fixtures shared by the whole suite: simulated workers on loopback ports."""

from __future__ import annotations

import socket
from typing import Iterator

import pytest

from agent_cache.sim import SimFleet


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port_factory():
    return free_port


@pytest.fixture
def fleet() -> Iterator[SimFleet]:
    """Two fresh simulated workers, instant (time_scale 0), cache report on."""
    with SimFleet(2) as f:
        yield f


@pytest.fixture
def worker(fleet: SimFleet) -> str:
    return fleet.urls[0]
