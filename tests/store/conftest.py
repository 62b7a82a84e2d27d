"""Store fixtures: one private redis-server for the store tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def redis_server(redis_server_factory):
    return redis_server_factory()
