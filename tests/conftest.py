"""Fixtures shared by the whole suite: simulated workers on loopback ports."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Callable, Iterator

import pytest
import redis

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


class RedisServer:
    """A redis-server subprocess on a fixed port that can be killed and restarted."""

    def __init__(self, password: str | None = None) -> None:
        self.password = password  # requirepass: clients must authenticate
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-test-")  # a SAVEd snapshot here is loaded on restart
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
             "--dir", self.dir, *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port, password=self.password, socket_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        client.close()

    def pause(self) -> None:
        """Freeze the server: connections hang (the worst case for client timeouts)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def save(self) -> None:
        client = redis.Redis(port=self.port, password=self.password)
        client.save()
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start private redis-server processes (tests may kill them); all are stopped at the end."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server binary not found")
    started: list[RedisServer] = []

    def start(password: str | None = None) -> RedisServer:
        server = RedisServer(password)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        if server.proc is not None:
            server.resume()
        server.cleanup()


@pytest.fixture
def prefix() -> str:
    """A fresh key prefix per test: tests share one server without seeing each other."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def redis_server(redis_server_factory):
    """One private redis-server shared by the tests that do not kill theirs."""
    return redis_server_factory()
