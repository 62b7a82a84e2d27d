"""Routing fixtures: a private redis-server per test and simulated workers."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Iterator

import pytest


@pytest.fixture
def redis_server(redis_server_factory):
    """A fresh redis-server per test: these tests kill and freeze it."""
    server = redis_server_factory()
    yield server
    if server.proc is not None:
        server.resume()
    server.stop()


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    """Whatever a test opens, closed at its end in reverse order."""
    with ExitStack() as s:
        yield s


class Clients:
    """One SGLang client per worker URL, closed at the end."""

    def __init__(self) -> None:
        from agent_cache.backends.sglang import SGLangClient

        self._cls = SGLangClient
        self._clients: dict = {}

    def __call__(self, url: str):
        c = self._clients.get(url)
        if c is None:
            c = self._clients[url] = self._cls(url, timeout=5.0)
        return c

    def close(self) -> None:
        for c in self._clients.values():
            c.close()


@pytest.fixture
def clients():
    c = Clients()
    yield c
    c.close()


@pytest.fixture
def fleet():
    from agent_cache.sim import SimFleet

    with SimFleet(3, time_scale=0) as f:
        yield f
