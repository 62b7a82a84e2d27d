"""Routing fixtures: a private redis-server (shared helper with tests/store) and simulated workers."""

from __future__ import annotations

import importlib.util
import pathlib
import uuid

import pytest

_spec = importlib.util.spec_from_file_location(
    "_store_conftest", pathlib.Path(__file__).parent.parent / "store" / "conftest.py"
)
_store_conftest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_store_conftest)
RedisServer = _store_conftest.RedisServer


@pytest.fixture
def redis_server():
    """A fresh redis-server per test: these tests kill and freeze it."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server binary not found")
    server = RedisServer()
    server.start()
    yield server
    server.resume() if server.proc is not None else None
    server.stop()


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


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
